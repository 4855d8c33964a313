// WorkQueue::Commit: what a process handed on survives it. An item whose
// owner committed an offset and then died, gave it back or lost it to a lease
// timeout is handed out again from that offset; without a commit, or once it
// was claimed for splitting, from its begin.
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
  EXPECT_EQ(q->Commit(item, item.begin + 1000), AckStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.end + 1), AckStatus::kOutOfRange);
  ASSERT_EQ(q->GiveBack(item), AckStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.ticket, item.ticket);
  EXPECT_EQ(again.begin, item.begin + 1000);
  EXPECT_EQ(again.end, item.end);
  // The new owner decides anew: without a commit of its own, its give-back
  // hands the rest out from where it got it.
  ASSERT_EQ(q->GiveBack(again), AckStatus::kOk);
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin + 1000);
  EXPECT_EQ(q->Ack(again), AckStatus::kOk);
}

TEST_F(CommitTest, ProgressAloneDoesNotMoveTheBegin) {
  auto q = WorkQueue::Open(Options(NewName("progress")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  EXPECT_EQ(q->Progress(item, item.begin + 1000), AckStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), AckStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin);
}

TEST_F(CommitTest, AClaimedItemResumesAtItsBegin) {
  auto q = WorkQueue::Open(Options(NewName("claimed")));
  WorkItem item;
  ASSERT_EQ(q->Take(&item), TakeStatus::kOk);
  uint64_t end = 0;
  ASSERT_EQ(q->Claim(item, item.begin + 4096, &end), AckStatus::kOk);
  EXPECT_EQ(q->Commit(item, item.begin + 1000), AckStatus::kOk);
  ASSERT_EQ(q->GiveBack(item), AckStatus::kOk);
  WorkItem again;
  ASSERT_EQ(q->Take(&again), TakeStatus::kOk);
  EXPECT_EQ(again.begin, item.begin);
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
    if (q->Commit(item, item.begin + 12345) != AckStatus::kOk) _exit(3);
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
  EXPECT_EQ(q->Ack(item), AckStatus::kOk);
  EXPECT_EQ(q->Take(&item, std::chrono::steady_clock::now() + milliseconds(100)), TakeStatus::kEnd);
}

}  // namespace
}  // namespace tailcut::test
