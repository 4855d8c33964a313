#include "engine/step_barrier.h"

#include <climits>

#include "engine/futex.h"

namespace tailcut::detail {

StepStatus AgreeStep(Segment& segment, uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                     std::chrono::steady_clock::time_point deadline, uint64_t slice_ns) noexcept {
  if (ranks == 0 || rank >= ranks || ranks > segment.geometry().max_clients ||
      step >= (uint64_t{1} << 62))
    return StepStatus::kInvalid;
  // Published as (step + 1) << 1 | has_batch, so that 0 means "nothing yet".
  SharedAtomic<uint64_t>& mine = segment.step(rank).word;
  // Only this rank writes its word: the load reads our own last publish, to
  // refuse a step lower than it (acquire is more than that needs).
  uint64_t published = mine.load(std::memory_order_acquire);
  if (published != 0 && (published >> 1) - 1 > step) return StepStatus::kInvalid;
  mine.store(((step + 1) << 1) | (has_batch ? 1 : 0), std::memory_order_seq_cst);
  Counters& c = segment.counters();
  // step_seq counts publishes in steps of 2; bit 0 says that a rank may be
  // asleep on it. A wake (a system call) is made only when the bit was set:
  // a step whose ranks find each other there without sleeping costs none.
  if (c.step_seq.fetch_add(2, std::memory_order_seq_cst) & 1u) {
    // Cleared before the wake: a rank that sets it again after this has not
    // slept yet, and its scan sees our publish (or its futex our bump).
    c.step_seq.fetch_and(~1u, std::memory_order_seq_cst);
    FutexWake(c.step_seq, INT_MAX);
  }
  // Before it sleeps a rank sets bit 0, then scans again (Dekker, seq_cst): a
  // publish before the set is seen by that scan; one after it sees the bit
  // and wakes us, or changed step_seq, so that the futex returns at once.
  bool announced = false;
  uint32_t seq = 0;
  for (;;) {
    bool arrived = true, all_have = true;
    for (uint32_t r = 0; r < ranks && arrived; ++r) {
      uint64_t w = segment.step(r).word.load(std::memory_order_seq_cst);
      uint64_t their = w == 0 ? 0 : (w >> 1);  // their step + 1
      if (their < step + 1) {
        arrived = false;
      } else if (their == step + 1) {
        all_have &= (w & 1) != 0;
      } else {
        // Already past `step`: it decided `step` before publishing its next.
        uint64_t d = segment.step(r).decided.load(std::memory_order_seq_cst);
        if ((d >> 1) == step + 1) all_have &= (d & 1) != 0;
      }
    }
    if (arrived) {
      segment.step(rank).decided.store(((step + 1) << 1) | (all_have ? 1 : 0),
                                       std::memory_order_seq_cst);
      return all_have ? StepStatus::kAllHaveBatch : StepStatus::kEndEpoch;
    }
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) return StepStatus::kTimeout;
    if (!announced) {
      seq = c.step_seq.fetch_or(1u, std::memory_order_seq_cst) | 1u;
      announced = true;
      continue;  // the scan again
    }
    announced = false;
    uint64_t slice = slice_ns;
    if (left < std::chrono::nanoseconds(slice))
      slice =
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
    FutexWait(c.step_seq, seq, slice);
  }
}

}  // namespace tailcut::detail
