// Tests of engine/housekeeper.h that look into the segment. Housekeeper::Stats
// fills QueueStats and ClientStats field by field; the field list
// (tailcut/stats_fields.h) checks at compile time that the structs and the
// list agree, and these tests check that Stats fills every listed field.
#include "engine/housekeeper.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <string_view>
#include <type_traits>

#include "engine/segment.h"
#include "tailcut/stats_fields.h"
#include "tests/engine/queue_test_util.h"

namespace tailcut::detail {
namespace {

using test::BaseOptions;

// A field Stats never sets keeps its zero value.
template <typename T>
bool Filled(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return !value.empty();
  } else {
    return value != T{};
  }
}

class HousekeeperStatsTest : public test::QueueTest {};

// Every counter of the segment is made nonzero, by calls or by hand, so a
// listed field that Stats leaves unset reads zero and fails here.
TEST_F(HousekeeperStatsTest, StatsFillsEveryFieldOfTheList) {
  auto o = BaseOptions(NewName("stats"), dir_.Files("f", 2, {1 << 20}));
  o.num_epochs = 2;
  o.seed = 7;
  o.shuffle = true;
  auto first = WorkQueue::Open(o);  // slot 0
  auto q = WorkQueue::Open(o);      // slot 1, the one checked: its slot number is not 0
  WorkItem items[3];
  for (WorkItem& it : items) ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);  // into epoch 1
  ASSERT_EQ(q->Progress(items[1], items[1].begin, 5), ItemStatus::kOk);
  ASSERT_EQ(q->Ack(items[0]), ItemStatus::kOk);

  // The counters no call above moves, each its own value.
  Attachment a = AttachSegment(o.name, AttachMode::kInspect, std::chrono::milliseconds(0));
  ASSERT_EQ(a.state, AttachState::kAttached);
  Counters& c = a.segment->counters();
  c.recovered_items.store(11, std::memory_order_relaxed);
  c.stale_acks.store(12, std::memory_order_relaxed);
  c.splits.store(13, std::memory_order_relaxed);
  ClientEntry& cs = a.segment->client(1);
  cs.items_given_back.store(21, std::memory_order_relaxed);
  cs.items_recovered.store(22, std::memory_order_relaxed);
  cs.stale_acks.store(23, std::memory_order_relaxed);
  cs.splits.store(24, std::memory_order_relaxed);
  cs.idle_ns.store(25, std::memory_order_relaxed);

  const QueueStats s = q->Stats();
  // num_samples is an index work's (0 for files): checked below.
#define TAILCUT_EXPECT_FILLED(type, name, series, doc)                    \
  EXPECT_TRUE(Filled(s.name) || std::string_view(#name) == "num_samples") \
      << "QueueStats::" #name " is listed but never filled";
  TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_EXPECT_FILLED)
#undef TAILCUT_EXPECT_FILLED
  EXPECT_EQ(s.num_samples, 0u) << "a queue of files has no samples by index";
  WorkQueueOptions index;
  index.name = NewName("stats_index");
  index.num_samples = 12345;
  index.on_notice = [](const std::string&) {};
  EXPECT_EQ(WorkQueue::Open(index)->Stats().num_samples, 12345u);
  ASSERT_EQ(s.clients.size(), 2u);
  const ClientStats& cl = s.clients[1];
#define TAILCUT_EXPECT_FILLED(type, name, series, doc) \
  EXPECT_TRUE(Filled(cl.name)) << "ClientStats::" #name " is listed but never filled";
  TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_EXPECT_FILLED)
#undef TAILCUT_EXPECT_FILLED

  // Each from its own counter.
  EXPECT_EQ(s.recovered_items, 11u);
  EXPECT_EQ(s.stale_acks, 12u);
  EXPECT_EQ(s.splits, 13u);
  EXPECT_EQ(cl.items_given_back, 21u);
  EXPECT_EQ(cl.items_recovered, 22u);
  EXPECT_EQ(cl.stale_acks, 23u);
  EXPECT_EQ(cl.splits, 24u);
  EXPECT_EQ(cl.idle_ns, 25u);
  // And those the calls above moved.
  EXPECT_EQ(cl.slot, 1u);
  EXPECT_EQ(s.total, 4u);
  EXPECT_EQ(s.done, 1u);
  EXPECT_EQ(s.in_flight, 2u);
  EXPECT_EQ(s.handed_out, 3u);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.clients_joined, 2u);
  EXPECT_EQ(cl.items_taken, 3u);
  EXPECT_EQ(cl.items_acked, 1u);
  EXPECT_EQ(cl.bytes_acked, items[0].end - items[0].begin);
  EXPECT_EQ(cl.records, 5u);
  EXPECT_EQ(cl.open_items, 2u);
}

}  // namespace
}  // namespace tailcut::detail
