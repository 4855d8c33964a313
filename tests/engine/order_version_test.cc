// A queue made by a build with another shuffle order (engine/permutation.h,
// kPermutationVersion) is refused by name, never read in this build's order:
// the order version is part of the configuration fingerprint, and an attacher
// compares the fingerprint once every field has matched.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/permutation.h"
#include "engine/segment.h"
#include "engine/segment_layout.h"
#include "tests/engine/work_queue_fixture.h"

namespace tailcut::test {
namespace {

using detail::kPermutationVersion;
using detail::Segment;

TEST_F(WorkQueueTest, ASegmentMadeWithAnotherShuffleOrderIsRefused) {
  auto o = Options("order_version", dir_.Files("f", 3, {kMiB}));
  o.num_slices = 12;
  o.seed = 5;
  auto live = WorkQueue::Open(o);
  {
    // Every field as this build writes it but the fingerprint: what a build
    // with another order version leaves behind.
    auto segment = Segment::OpenExisting(o.name, std::chrono::milliseconds(100));
    ASSERT_TRUE(segment);
    segment->header().fingerprint ^= 0x5a5a;
  }
  EXPECT_TRUE(FailsWith(
      [&] { WorkQueue::Open(o); }, ErrorKind::kConfigMismatch,
      {"the shuffle order differs", "not version " + std::to_string(kPermutationVersion)}));
}

TEST_F(WorkQueueTest, ASegmentOfTheSameOrderStillAttaches) {
  auto o = Options("order_same", dir_.Files("f", 3, {kMiB}));
  o.seed = 5;
  auto live = WorkQueue::Open(o);
  auto joined = WorkQueue::Open(o);
  WorkItem item;
  EXPECT_EQ(joined->TryTake(&item), TakeStatus::kOk);
}

}  // namespace
}  // namespace tailcut::test
