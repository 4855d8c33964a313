// tailcut/sample_order.h: which sample each position of an index work holds.
//
// A queue opened with WorkQueueOptions::num_samples = N (an index work: a
// map-style data set, no file) hands out items that are ranges [begin, end)
// of positions in its epoch's order of the samples 0..N-1. With shuffle, that
// order is a seeded permutation (a Feistel network with cycle walking): a
// pure function of (N, seed, epoch), computed, never stored, so every
// process of the queue agrees on it in O(1) memory; without shuffle,
// position p holds sample p. Walking an item:
//
//   tailcut::SampleOrder order(*queue, item.epoch);
//   for (uint64_t p = item.begin; p < item.end; ++p) Use(order[p]);
//
// Commit and Progress take positions (p + 1 after using position p), the way
// a file queue takes byte offsets, so exactly once, resume points, tail
// splitting and checkpoints hold as they do for files.
//
// Contract
//  * Construction is the control path: it throws tailcut::Error
//    (kInvalidArgument) naming the queue when the queue is not an index work
//    or the epoch is not one of its epochs.
//  * operator[] is the hot path: noexcept, no allocation, no system call, a
//    few hash rounds. A SampleOrder is immutable: any thread may use it, and
//    it keeps no reference to the queue (it may outlive it).
#ifndef TAILCUT_SAMPLE_ORDER_H_
#define TAILCUT_SAMPLE_ORDER_H_

#include <cstdint>
#include <memory>

#include "tailcut/export.h"
#include "tailcut/work_queue.h"

namespace tailcut {

namespace detail {
class Permutation;
}

class TAILCUT_EXPORT SampleOrder {
 public:
  SampleOrder(const WorkQueue& queue, uint64_t epoch);
  ~SampleOrder();
  SampleOrder(SampleOrder&&) noexcept;
  SampleOrder& operator=(SampleOrder&&) noexcept;

  // The sample at `position`. REQUIRES: position < num_samples().
  uint64_t operator[](uint64_t position) const noexcept;
  // out[k] = (*this)[begin + k] for k < end - begin: a batch's samples, the
  // same values several times faster than one by one (hot path too).
  // REQUIRES: begin <= end <= num_samples().
  void Fill(uint64_t begin, uint64_t end, uint64_t* out) const noexcept;
  uint64_t num_samples() const noexcept { return num_samples_; }

 private:
  uint64_t num_samples_;
  std::unique_ptr<const detail::Permutation> permutation_;  // null: no shuffle
};

}  // namespace tailcut

#endif  // TAILCUT_SAMPLE_ORDER_H_
