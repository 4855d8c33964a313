// What this process finished itself, to tell a second Ack or GiveBack of an
// item (kAlreadyDone) from an item the queue took away (kStale).
//
// The shared lease word cannot tell them apart: a lease given back and one
// reassigned after a lease timeout both move on to ORPHAN, one generation
// later. So each process remembers, per lease slot (an item recovered from
// another process keeps that process's slot), the generation of the last
// item it acked or gave back there. Slots are reused: a second
// ack of an item from before the slot's last reuse is no longer recognised,
// and then says kStale (with no lease timeout nothing can be reassigned, and
// WorkQueue says kAlreadyDone without looking here).
#ifndef TAILCUT_ENGINE_FINISHED_LEASES_H_
#define TAILCUT_ENGINE_FINISHED_LEASES_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace tailcut::detail {

class FinishedLeases {
 public:
  // The queue's lease slots: [0, count).
  void Reset(uint64_t count) {
    count_ = count;
    generation_ = std::make_unique<std::atomic<uint64_t>[]>(count);
  }
  bool Valid(uint64_t lease) const noexcept { return lease < count_; }
  // After this process acked or gave back the item at (lease, generation).
  void Record(uint64_t lease, uint64_t generation) noexcept {
    // relaxed: read only by this process's own later calls about the same
    // item, which the caller orders (a second ack after the first returned).
    if (Valid(lease)) generation_[lease].store(generation, std::memory_order_relaxed);
  }
  bool Finished(uint64_t lease, uint64_t generation) const noexcept {
    // relaxed: as Record.
    return Valid(lease) && generation_[lease].load(std::memory_order_relaxed) == generation;
  }

 private:
  uint64_t count_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> generation_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_FINISHED_LEASES_H_
