// Resume points: WorkQueue::Commit and Progress. An item whose owner
// committed an offset and then died, gave it back or lost it to a lease
// timeout is handed out again from the highest offset committed, claimed
// (Reader) or not; without a commit, from where it was handed out. A
// checkpoint (SaveState) resumes an item at its commit, or, while its owner
// never committed, at its highest Progress. Neither point ever moves back.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

class CommitTest : public QueueTest {
 protected:
  WorkQueueOptions Options(const std::string& name) {
    WorkQueueOptions o = BaseOptions(name, {dir_.File("data", 1 << 20)});
    o.num_clients = 2;
    o.shuffle = false;
    return o;
  }
};

TEST_F(CommitTest, AnItemGivenBackResumesAtItsCommitNotItsBegin) {
  auto q = WorkQueue::Open(Options(NewName("giveback")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 1000), ItemStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.end + 1), ItemStatus::kOutOfRange);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.ticket, item.ticket);
  EXPECT_EQ(again.begin, item.begin + 1000);
  EXPECT_EQ(again.end, item.end);
  // The new owner decides anew: without a commit of its own, its give-back
  // hands the rest out from where it got it.
  ASSERT_EQ(q->GiveBack(again), ItemStatus::kOk);
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 1000);
  EXPECT_EQ(q->Ack(again), ItemStatus::kOk);
}

TEST_F(CommitTest, ProgressAloneDoesNotMoveTheBegin) {
  auto q = WorkQueue::Open(Options(NewName("progress")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Progress(item, item.begin + 1000), ItemStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin);
}

TEST_F(CommitTest, AClaimedItemResumesAtItsCommit) {
  auto q = WorkQueue::Open(Options(NewName("claimed")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  uint64_t end = 0;
  ASSERT_EQ(q->Claim(item, item.begin + 4096, &end), ItemStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 1000), ItemStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 1000) << "the Reader claims every item it reads";
  EXPECT_EQ(again.end, item.end);
  EXPECT_EQ(q->Ack(again), ItemStatus::kOk);
}

TEST_F(CommitTest, ABackwardsCommitIsRefusedAndMovesNothing) {
  auto q = WorkQueue::Open(Options(NewName("monotonic")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 3000), ItemStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 3000), ItemStatus::kOk);  // the same point again
  EXPECT_EQ(q->Commit(item, item.begin + 1000), ItemStatus::kOutOfRange);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 3000);
  // Its next owner cannot move it below where it got the item either.
  EXPECT_EQ(q->Commit(again, item.begin + 2000), ItemStatus::kOutOfRange);
  ASSERT_EQ(q->GiveBack(again), ItemStatus::kOk);
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 3000);
}

TEST_F(CommitTest, AnItemCommittedToItsEndIsDoneWhenGivenBack) {
  auto q = WorkQueue::Open(Options(NewName("to_end")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.end), ItemStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  EXPECT_EQ(q->Take(&item, std::chrono::steady_clock::now() + milliseconds(100)), TakeStatus::kEnd);
}

// The split point is past what the owner claimed, and what its item
// resumed from counts as claimed: a Claim that claims nothing yet (up_to
// below the range) must not let a thief take committed bytes again.
TEST_F(CommitTest, ASplitNeverTakesBytesBelowWhereAnItemResumed) {
  WorkQueueOptions o = Options(NewName("split_floor"));
  o.min_split_bytes = 4096;
  auto owner = WorkQueue::Open(o);
  auto thief = WorkQueue::Open(o);
  WorkItem item;
  ASSERT_EQ(owner->Take(&item), TakeStatus::kOk);
  ASSERT_EQ(owner->Commit(item, item.begin + 5000), ItemStatus::kOk);
  ASSERT_EQ(owner->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(owner->Take(&again), TakeStatus::kOk);
  ASSERT_EQ(again.begin, item.begin + 5000);
  uint64_t end = 0;
  ASSERT_EQ(owner->Claim(again, 0, &end), ItemStatus::kOk);
  WorkItem piece;
  ASSERT_EQ(thief->Take(&piece, std::chrono::steady_clock::now() + milliseconds(100)),
            TakeStatus::kOk);
  ASSERT_TRUE(piece.piece);
  EXPECT_GE(piece.begin, again.begin) << "a split took committed bytes";
  ASSERT_EQ(owner->Claim(again, again.end, &end), ItemStatus::kOk);
  EXPECT_EQ(end, piece.begin);
  EXPECT_EQ(thief->Ack(piece), ItemStatus::kOk);
  EXPECT_EQ(owner->Ack(again), ItemStatus::kOk);
}

// The one item of a fresh queue restored from `state`: where it resumes.
uint64_t ResumeOf(const WorkQueueOptions& options, const std::string& state, std::string name) {
  WorkQueueOptions o = options;
  o.name = std::move(name);
  o.restore_state = state;
  o.num_clients = 1;
  QueueGuard guard(o.name);
  auto q = WorkQueue::Open(o);
  WorkItem item;
  if (q->TryTake(&item) != TakeStatus::kOk) return ~uint64_t{0};
  return item.begin;
}

TEST_F(CommitTest, ACheckpointResumesAtTheCommitOnceThereIsOne) {
  WorkQueueOptions o = Options(NewName("ckpt"));
  auto q = WorkQueue::Open(o);
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  const uint64_t b = item.begin;
  ASSERT_EQ(q->Progress(item, b + 4000), ItemStatus::kOk);
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_a")), b + 4000);
  ASSERT_EQ(q->Progress(item, b + 1000), ItemStatus::kOk);  // never back
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_b")), b + 4000);
  // A process that commits hands on what it reads: what it parsed (Progress)
  // is not used yet, and from its first commit on only commits count.
  ASSERT_EQ(q->Commit(item, b + 800), ItemStatus::kOk);
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_c")), b + 800);
  ASSERT_EQ(q->Progress(item, b + 6000), ItemStatus::kOk);
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_d")), b + 800);
  ASSERT_EQ(q->Commit(item, b + 1200), ItemStatus::kOk);
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_e")), b + 1200);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("ckpt_f")), b + 1200);
}

TEST_F(CommitTest, OffsetsInsideAFixedSizeRecordAreRefused) {
  WorkQueueOptions o = BaseOptions(NewName("fixed"), {dir_.File("data", 8 * 10000)});
  o.format = "fixed:8";
  o.shuffle = false;
  auto q = WorkQueue::Open(o);
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 803), ItemStatus::kOutOfRange);
  EXPECT_EQ(q->Progress(item, item.begin + 803), ItemStatus::kOutOfRange);
  EXPECT_EQ(q->Commit(item, item.begin + 800), ItemStatus::kOk);
  EXPECT_EQ(q->Progress(item, item.begin + 8000), ItemStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), ItemStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 800);
  EXPECT_EQ(q->Commit(again, again.end), ItemStatus::kOk);
  EXPECT_EQ(q->Ack(again), ItemStatus::kOk);
}

TEST_F(CommitTest, AnItemOfAProcessKilledAfterACommitResumesThere) {
  WorkQueueOptions o = Options(NewName("killed"));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    auto q = WorkQueue::Open(o);
    WorkItem item;
    if (q->Take(&item) != TakeStatus::kOk) _exit(2);
    if (q->Commit(item, item.begin + 12345) != ItemStatus::kOk) _exit(3);
    uint64_t begin = item.begin;
    if (write(ready[1], &begin, sizeof(begin)) != sizeof(begin)) _exit(4);
    pause();
    _exit(0);
  }
  close(ready[1]);
  uint64_t begin = 0;
  ASSERT_EQ(read(ready[0], &begin, sizeof(begin)), static_cast<ssize_t>(sizeof(begin)));
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  auto q = WorkQueue::Open(o);
  WorkItem item;
  ASSERT_EQ(q->Take(&item, std::chrono::steady_clock::now() + milliseconds(10000)),
            TakeStatus::kOk);
  EXPECT_EQ(item.begin, begin + 12345)
      << "the dead process's committed bytes were handed out again";
  EXPECT_EQ(q->Ack(item), ItemStatus::kOk);
  EXPECT_EQ(q->Take(&item, std::chrono::steady_clock::now() + milliseconds(100)), TakeStatus::kEnd);
}

// The loss this guards against: commit(800), progress(4000), SIGKILL handed
// the item out again from 4000, and the records between were never used.
TEST_F(CommitTest, AProgressPastTheCommitDoesNotMoveWhereAKilledProcessesItemResumes) {
  WorkQueueOptions o = Options(NewName("commit_progress"));
  auto q = WorkQueue::Open(o);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    auto mine = WorkQueue::Open(o);
    WorkItem item;
    if (mine->Take(&item) != TakeStatus::kOk) _exit(2);
    if (mine->Commit(item, item.begin + 800) != ItemStatus::kOk) _exit(3);
    if (mine->Progress(item, item.begin + 4000, 5) != ItemStatus::kOk) _exit(3);
    uint64_t begin = item.begin;
    if (write(ready[1], &begin, sizeof(begin)) != sizeof(begin)) _exit(4);
    pause();
    _exit(0);
  }
  close(ready[1]);
  uint64_t begin = 0;
  ASSERT_EQ(read(ready[0], &begin, sizeof(begin)), static_cast<ssize_t>(sizeof(begin)));
  close(ready[0]);
  // A checkpoint taken now resumes at the commit too.
  EXPECT_EQ(ResumeOf(o, q->SaveState(), UniqueQueueName("commit_progress_ckpt")), begin + 800);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  WorkItem item;
  ASSERT_EQ(q->Take(&item, std::chrono::steady_clock::now() + milliseconds(10000)),
            TakeStatus::kOk);
  EXPECT_EQ(item.begin, begin + 800) << "bytes between the commit and the progress were lost";
  EXPECT_EQ(q->Ack(item), ItemStatus::kOk);
}

}  // namespace
}  // namespace tailcut::test
