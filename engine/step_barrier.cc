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
  // The bump after the publish pairs with a waiter's load of step_seq before
  // its scan: a waiter that scanned too early sleeps on an old value and
  // the futex returns at once.
  c.step_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(c.step_seq, INT_MAX);
  for (;;) {
    uint32_t seq = c.step_seq.load(std::memory_order_seq_cst);
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
    uint64_t slice = slice_ns;
    if (left < std::chrono::nanoseconds(slice))
      slice =
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
    FutexWait(c.step_seq, seq, slice);
  }
}

}  // namespace tailcut::detail
