#include "tailcut/sample_order.h"

#include <string>

#include "engine/permutation.h"

namespace tailcut {

namespace {

// Salts the seed so that the sample order is not the permutation of the
// items (queue_core.cc) over another n: the two stay independent.
constexpr uint64_t kSampleSalt = 0x5a4d91e7c3b20f61ull;

}  // namespace

SampleOrder::SampleOrder(const WorkQueue& queue, uint64_t epoch)
    : num_samples_(queue.num_samples()) {
  if (num_samples_ == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + queue.name() +
                    "' is a queue of files, not of samples by index; open it with num_samples "
                    "to walk sample indices");
  if (epoch >= queue.num_epochs())
    throw Error(ErrorKind::kInvalidArgument, "queue '" + queue.name() + "': epoch " +
                                                 std::to_string(epoch) + " is past its " +
                                                 std::to_string(queue.num_epochs()) + " epochs");
  if (queue.shuffle())
    permutation_ = std::make_unique<const detail::Permutation>(
        num_samples_, detail::SplitMix64(queue.seed() ^ kSampleSalt), epoch);
}

SampleOrder::~SampleOrder() = default;
SampleOrder::SampleOrder(SampleOrder&&) noexcept = default;
SampleOrder& SampleOrder::operator=(SampleOrder&&) noexcept = default;

void SampleOrder::Fill(uint64_t begin, uint64_t end, uint64_t* out) const noexcept {
  if (permutation_) {
    permutation_->Fill(begin, end, out);
    return;
  }
  for (uint64_t p = begin; p < end; ++p) out[p - begin] = p;
}

uint64_t SampleOrder::operator[](uint64_t position) const noexcept {
  return permutation_ ? (*permutation_)(position) : position;
}

}  // namespace tailcut
