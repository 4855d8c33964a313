// WorkQueue handles: fork safety, calls after Close, the statuses that say
// what happened, and the queue's Dependents (work_queue.h: Fork, Handles).
// Forked children use the parent's WorkQueue object; the parent must be
// unaffected and finish its epoch exactly once.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/queue_test_util.h"
#include "fork_child.h"
#include "tailcut/work_queue.h"

namespace tailcut::test {
namespace {

using tailcut::testing::InChild;

class WorkQueueHandleTest : public QueueTest {
 protected:
  WorkQueueOptions Options(const std::string& tag, size_t files = 6) {
    WorkQueueOptions o = BaseOptions(NewName(tag), dir_.Files("f", files, {4096}));
    o.shuffle = false;
    return o;
  }
  // Takes and acks the rest of the epoch; each item must come exactly once,
  // `held` (already taken) included.
  static std::string FinishEpoch(WorkQueue& q, const WorkItem& held) {
    std::multiset<uint64_t> seen{held.index};
    if (q.Ack(held) != ItemStatus::kOk) return "the parent's ack of its held item was refused";
    for (const WorkItem& it : Drain(q)) seen.insert(it.index);
    if (seen.size() != q.num_items()) return std::to_string(seen.size()) + " items taken";
    for (uint64_t i = 0; i < q.num_items(); ++i)
      if (seen.count(i) != 1)
        return "item " + std::to_string(i) + " taken " + std::to_string(seen.count(i)) + " times";
    WorkItem none;
    if (q.TryTake(&none) != TakeStatus::kEnd) return "no kEnd after the epoch";
    return "";
  }
};

TEST_F(WorkQueueHandleTest, AForkedChildThatDestroysItsInheritedQueueLeavesTheParentAlone) {
  auto q = WorkQueue::Open(Options("fork_destroy"));
  WorkItem held;
  ASSERT_EQ(q->TryTake(&held), TakeStatus::kOk);
  const std::string segment = q->Stats().segment_path;
  EXPECT_EQ(InChild([&] {
              q.reset();  // the child's copy: must not close the parent's queue
              return std::string();
            }),
            "");
  ASSERT_TRUE(PathExists(segment)) << "the child removed the parent's segment";
  QueueStats st = q->Stats();
  ASSERT_EQ(st.clients.size(), 1u);
  EXPECT_TRUE(st.clients[0].alive) << "the child released the parent's client slot";
  EXPECT_EQ(st.in_flight, 1u) << "the child gave back the parent's item";
  EXPECT_EQ(FinishEpoch(*q, held), "");
  q.reset();
  EXPECT_FALSE(PathExists(segment)) << "the finished queue is removed by its last process";
}

TEST_F(WorkQueueHandleTest, AForkedChildThatUsesItsInheritedQueueIsRefusedEveryCall) {
  auto q = WorkQueue::Open(Options("fork_use"));
  WorkItem held;
  ASSERT_EQ(q->TryTake(&held), TakeStatus::kOk);
  const int parent = ::getpid();
  EXPECT_EQ(InChild([&]() -> std::string {
              WorkItem it;
              uint64_t end = 0;
              std::string bad;
              auto expect = [&](auto got, auto want, const char* call) {
                if (got != want) bad += std::string(call) + " was not refused as forked; ";
              };
              expect(q->Take(&it, Clock::now()), TakeStatus::kForked, "Take");
              expect(q->TryTake(&it), TakeStatus::kForked, "TryTake");
              expect(q->Ack(held), ItemStatus::kForked, "Ack");
              expect(q->GiveBack(held), ItemStatus::kForked, "GiveBack");
              expect(q->Progress(held, held.begin), ItemStatus::kForked, "Progress");
              expect(q->Commit(held, held.begin), ItemStatus::kForked, "Commit");
              expect(q->Claim(held, held.end, &end), ItemStatus::kForked, "Claim");
              expect(q->AgreeStep(0, 1, 0, true, Clock::now()), StepStatus::kForked, "AgreeStep");
              auto says = FailsWith(
                  [&] { q->SaveState(); }, ErrorKind::kInvalidArgument,
                  {"queue '" + q->name() + "' was opened by process " + std::to_string(parent),
                   "(a forked child must open its own WorkQueue)"});
              if (!says) bad += std::string("SaveState: ") + says.message() + "; ";
              if (!FailsWith([&] { q->Stats(); }, ErrorKind::kInvalidArgument, {"forked child"}))
                bad += "Stats did not throw; ";
              q->Close();
              q.reset();
              return bad;
            }),
            "");
  QueueStats st = q->Stats();
  EXPECT_EQ(st.done, 0u) << "the child's ack went through";
  EXPECT_EQ(st.in_flight, 1u);
  EXPECT_EQ(FinishEpoch(*q, held), "");
}

TEST_F(WorkQueueHandleTest, AChildThatOpensItsOwnQueueSharesTheEpochWithItsParent) {
  WorkQueueOptions o = Options("fork_own");
  auto q = WorkQueue::Open(o);
  WorkItem held;
  ASSERT_EQ(q->TryTake(&held), TakeStatus::kOk);
  EXPECT_EQ(InChild([&]() -> std::string {
              auto mine = WorkQueue::Open(o);
              WorkItem it;
              if (mine->TryTake(&it) != TakeStatus::kOk) return "the child's own queue refused";
              if (mine->Ack(it) != ItemStatus::kOk) return "the child's ack was refused";
              return "";
            }),
            "");
  EXPECT_EQ(q->Stats().done, 1u);
}

TEST_F(WorkQueueHandleTest, CallsAfterCloseReturnClosedNotEnd) {
  auto q = WorkQueue::Open(Options("closed"));
  WorkItem it;
  ASSERT_EQ(q->TryTake(&it), TakeStatus::kOk);
  q->Close();
  uint64_t end = 0;
  EXPECT_EQ(q->Take(&it, Clock::now()), TakeStatus::kClosed);
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kClosed);
  EXPECT_EQ(q->Ack(it), ItemStatus::kClosed);
  EXPECT_EQ(q->GiveBack(it), ItemStatus::kClosed);
  EXPECT_EQ(q->Progress(it, it.begin), ItemStatus::kClosed);
  EXPECT_EQ(q->Claim(it, it.end, &end), ItemStatus::kClosed);
  EXPECT_EQ(q->AgreeStep(0, 1, 0, true, Clock::now()), StepStatus::kClosed);
}

TEST_F(WorkQueueHandleTest, AckStatusesSayWhatHappened) {
  auto q = WorkQueue::Open(Options("statuses"));
  WorkItem a, b;
  ASSERT_EQ(q->TryTake(&a), TakeStatus::kOk);
  ASSERT_EQ(q->TryTake(&b), TakeStatus::kOk);
  EXPECT_EQ(q->TryTake(nullptr), TakeStatus::kInvalidArgument);
  EXPECT_EQ(q->Ack(a), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(a), ItemStatus::kAlreadyDone) << "a second ack";
  EXPECT_EQ(q->GiveBack(a), ItemStatus::kAlreadyDone) << "give back after ack";
  EXPECT_EQ(q->GiveBack(b), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(b), ItemStatus::kAlreadyDone) << "ack after give back";
  EXPECT_EQ(q->Ack(WorkItem{}), ItemStatus::kInvalid) << "a default item";
  EXPECT_EQ(q->Stats().stale_acks, 0u) << "none of these is stale";
  EXPECT_EQ(q->Stats().done, 1u);
}

TEST_F(WorkQueueHandleTest, AnAckAfterALeaseTimeoutIsStaleAndASecondAckIsAlreadyDone) {
  WorkQueueOptions o = Options("timeout", 2);
  o.lease_timeout = milliseconds(50);
  auto q = WorkQueue::Open(o);
  WorkItem slow, mine;
  ASSERT_EQ(q->TryTake(&slow), TakeStatus::kOk);
  // Another process takes `slow` over once we look hung past the timeout.
  EXPECT_EQ(InChild([&]() -> std::string {
              auto other = WorkQueue::Open(o);
              std::set<uint64_t> got;
              for (WorkItem it;
                   other->Take(&it, Clock::now() + milliseconds(5000)) == TakeStatus::kOk;) {
                got.insert(it.index);
                if (other->Ack(it) != ItemStatus::kOk) return "the taker's ack was refused";
              }
              return got.count(slow.index) ? "" : "the hung item was never reassigned";
            }),
            "");
  EXPECT_EQ(q->Ack(slow), ItemStatus::kStale);
  EXPECT_EQ(q->TryTake(&mine), TakeStatus::kEnd);
}

TEST(StatusNameTest, EveryStatusHasAName) {
  EXPECT_STREQ(TakeStatusName(TakeStatus::kClosed), "closed");
  EXPECT_STREQ(TakeStatusName(TakeStatus::kForked), "forked");
  EXPECT_STREQ(TakeStatusName(TakeStatus::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(ItemStatusName(ItemStatus::kAlreadyDone), "already done");
  EXPECT_STREQ(ItemStatusName(ItemStatus::kStale), "stale");
  EXPECT_STREQ(StepStatusName(StepStatus::kEndEpoch), "end epoch");
  for (int s = 0; s <= static_cast<int>(TakeStatus::kInvalidArgument); ++s)
    EXPECT_STRNE(TakeStatusName(static_cast<TakeStatus>(s)), "?") << s;
  for (int s = 0; s <= static_cast<int>(ItemStatus::kForked); ++s)
    EXPECT_STRNE(ItemStatusName(static_cast<ItemStatus>(s)), "?") << s;
  for (int s = 0; s <= static_cast<int>(StepStatus::kForked); ++s)
    EXPECT_STRNE(StepStatusName(static_cast<StepStatus>(s)), "?") << s;
}

// A passed deadline is kTimeout in every status enum; the old spellings
// (AckStatus, AckStatusName, TakeStatus::kEmpty) still compile and mean the same.
TEST(StatusNameTest, OldSpellingsAreAliasesOfTheNewNames) {
  static_assert(std::is_same_v<AckStatus, ItemStatus>);
  static_assert(TakeStatus::kEmpty == TakeStatus::kTimeout);
  EXPECT_STREQ(TakeStatusName(TakeStatus::kTimeout), "timeout");
  EXPECT_STREQ(StepStatusName(StepStatus::kTimeout), "timeout");
  EXPECT_STREQ(AckStatusName(AckStatus::kOutOfRange), ItemStatusName(ItemStatus::kOutOfRange));
}

TEST_F(WorkQueueHandleTest, DestroyingAQueueWhileADependentLivesAbortsNamingIt) {
  WorkQueueOptions o = Options("dependent");
  EXPECT_DEATH(
      {
        auto q = WorkQueue::Open(o);
        WorkQueue::Dependent reader(*q);
        q.reset();
      },
      "queue '.*dependent' destroyed while 1 Reader\\(s\\) still use it");
  auto q = WorkQueue::Open(o);
  { WorkQueue::Dependent gone(*q); }
  q.reset();  // no Dependent left: a clean close
}

}  // namespace
}  // namespace tailcut::test
