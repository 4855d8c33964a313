// Tail splitting with real processes: consumers that claim before they read
// (as the Reader does) and report the byte ranges of the items they acked;
// idle processes split the tails of slow ones. The ranges of every item of
// every epoch must tile it exactly once, with thieves or owners killed at
// any point of a split.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kStep = 64 << 10;

struct Range {
  uint64_t ticket, begin, end;
};

class SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tailcut-split-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    name_ = "split_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
  }
  void TearDown() override {
    try {
      RemoveQueue(name_, true);
    } catch (const Error&) {
    }
    std::system(("rm -rf " + dir_).c_str());
  }
  std::vector<std::string> Files(int n, uint64_t size) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      std::string p = dir_ + "/f" + std::to_string(i);
      int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
      EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
      ::close(fd);
      out.push_back(p);
    }
    return out;
  }
  WorkQueueOptions Options(const std::vector<std::string>& works) {
    WorkQueueOptions o;
    o.works = works;
    o.num_epochs = 2;
    o.seed = 7;
    o.name = name_;
    o.min_split_bytes = 128 << 10;
    o.on_notice = [](const std::string&) {};
    return o;
  }

  // Forks a consumer that reads each item in kStep steps, claiming before
  // each, sleeping `us_per_step`; writes the ranges of each acked item to
  // a pipe at ack time. Returns {pid, read end}.
  std::pair<pid_t, int> Consumer(const WorkQueueOptions& o, int us_per_step, const char* crash_at) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      if (crash_at != nullptr) ::setenv("TAILCUT_CRASH_AT", crash_at, 1);
      try {
        auto q = WorkQueue::Open(o);
        WorkItem it;
        while (q->Take(&it, std::chrono::steady_clock::now() + std::chrono::seconds(30)) ==
               TakeStatus::kOk) {
          std::vector<Range> mine;
          uint64_t pos = it.begin;
          bool stale = false;
          while (true) {
            uint64_t end = 0;
            uint64_t up_to = std::min(pos + kStep, it.end);
            if (q->Claim(it, up_to, &end) != ItemStatus::kOk) {
              stale = true;
              break;
            }
            if (pos >= end) break;
            uint64_t stop = std::min(up_to, end);
            mine.push_back({it.ticket, pos, stop});
            pos = stop;
            if (us_per_step > 0)
              std::this_thread::sleep_for(std::chrono::microseconds(us_per_step));
            if (pos >= it.end) break;
          }
          if (stale || q->Ack(it) != ItemStatus::kOk) continue;
          for (const Range& r : mine)
            if (::write(fds[1], &r, sizeof(r)) != sizeof(r)) std::_Exit(3);
        }
        q->Close();
      } catch (const Error& e) {
        std::fprintf(stderr, "consumer: %s\n", e.what());
        std::_Exit(2);
      }
      std::_Exit(0);
    }
    ::close(fds[1]);
    return {pid, fds[0]};
  }

  // Checks that the ranges tile every item of every epoch exactly once.
  void ExpectTiled(const WorkQueue& q, std::vector<Range> ranges) {
    std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> by_ticket;
    for (const Range& r : ranges) by_ticket[r.ticket].push_back({r.begin, r.end});
    uint64_t n = q.num_items();
    ASSERT_EQ(by_ticket.size(), n * q.num_epochs()) << "tickets with no ranges at all";
    for (auto& [ticket, rs] : by_ticket) {
      std::sort(rs.begin(), rs.end());
      const WorkQueue::Item& item = q.items()[q.ItemAt(ticket / n, ticket % n)];
      uint64_t at = item.begin;
      for (auto& [b, e] : rs) {
        ASSERT_EQ(b, at) << "ticket " << ticket << ": gap or overlap at " << at;
        at = e;
      }
      ASSERT_EQ(at, item.end) << "ticket " << ticket << " not read to its end";
    }
  }

  std::vector<Range> Drain(int fd) {
    std::vector<Range> out;
    Range r;
    while (::read(fd, &r, sizeof(r)) == sizeof(r)) out.push_back(r);
    ::close(fd);
    return out;
  }

  std::string dir_, name_;
  static inline int counter_ = 0;
};

TEST_F(SplitTest, IdleProcessesSplitTheSlowOnesTailsAndEveryByteIsReadOnce) {
  auto works = Files(3, 4 << 20);
  auto o = Options(works);
  o.num_slices = 6;  // few, large items: the slow process's tail matters
  o.num_clients = 4;
  auto q = WorkQueue::Open(o);  // holds the queue open for the check
  std::vector<std::pair<pid_t, int>> kids;
  kids.push_back(Consumer(o, 2000, nullptr));  // slow
  for (int i = 0; i < 3; ++i) kids.push_back(Consumer(o, 50, nullptr));
  std::vector<Range> all;
  for (auto& [pid, fd] : kids) {
    auto part = Drain(fd);
    all.insert(all.end(), part.begin(), part.end());
    int status;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ExpectTiled(*q, all);
  EXPECT_GT(q->Stats().splits, 0u) << "nobody split the slow process's tail";
}

TEST_F(SplitTest, AThiefKilledAtAnyPointOfASplitLosesNoBytesAndDoublesNone) {
  auto works = Files(2, 4 << 20);
  for (const char* point : {"split.after_reserve", "split.after_cas", "split.after_open"}) {
    for (int trial = 0; trial < 2; ++trial) {  // each split halves the tail: 2-3 per item
      SCOPED_TRACE(std::string(point) + " trial " + std::to_string(trial));
      name_ = "split_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
      auto o = Options(works);
      o.num_slices = 4;
      o.num_epochs = 1;
      o.num_clients = 3;
      auto q = WorkQueue::Open(o);
      std::vector<Range> all;
      auto collect = [&](std::pair<pid_t, int> kid) {
        auto part = Drain(kid.second);
        all.insert(all.end(), part.begin(), part.end());
        int status = 0;
        EXPECT_EQ(::waitpid(kid.first, &status, 0), kid.first);
        return status;
      };
      auto owner = Consumer(o, 5000, nullptr);  // slow: its tails get split
      std::this_thread::sleep_for(milliseconds(30));
      // The only thief, killed at its n-th pass through the point.
      std::string crash = std::string(point) + ":" + std::to_string(trial + 1);
      int status = collect(Consumer(o, 20, crash.c_str()));
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          << "the thief did not reach " << crash << " (status " << status
          << "); the trial proves nothing";
      auto finisher = Consumer(o, 20, nullptr);
      collect(owner);
      collect(finisher);
      ExpectTiled(*q, all);
      q->Close();
    }
  }
}

TEST_F(SplitTest, AnItemThatIsNeverClaimedIsNeverSplit) {
  auto works = Files(1, 8 << 20);
  auto o = Options(works);
  o.num_slices = 1;
  o.num_epochs = 1;
  auto owner = WorkQueue::Open(o);
  auto idle = WorkQueue::Open(o);
  WorkItem it, other;
  ASSERT_EQ(owner->TryTake(&it), TakeStatus::kOk);
  EXPECT_EQ(idle->TryTake(&other), TakeStatus::kTimeout);
  uint64_t end = 0;
  ASSERT_EQ(owner->Claim(it, it.begin + kStep, &end), ItemStatus::kOk);
  EXPECT_EQ(end, it.end);
  ASSERT_EQ(idle->TryTake(&other), TakeStatus::kOk);
  EXPECT_TRUE(other.piece);
  EXPECT_EQ(other.ticket, it.ticket);
  EXPECT_GT(other.begin, it.begin + kStep - 1);
  EXPECT_EQ(other.end, it.end);
  ASSERT_EQ(owner->Claim(it, it.end, &end), ItemStatus::kOk);
  EXPECT_EQ(end, other.begin) << "the owner must stop where the thief starts";
  EXPECT_EQ(owner->Ack(it), ItemStatus::kOk);
  WorkItem none;
  EXPECT_EQ(owner->TryTake(&none), TakeStatus::kTimeout) << "the piece is still out";
  EXPECT_EQ(idle->Ack(other), ItemStatus::kOk);
  EXPECT_EQ(owner->TryTake(&none), TakeStatus::kEnd);
}

TEST_F(SplitTest, ACheckpointWithSplitsRestoresEveryUnreadByteOnce) {
  auto works = Files(1, 8 << 20);
  auto o = Options(works);
  o.num_slices = 1;
  o.num_epochs = 1;
  o.keep_unfinished = true;  // closed unfinished, then removed by hand: kept until then
  std::string state;
  uint64_t split_at = 0, owner_at = 0, thief_at = 0, thief_end = 0;
  {
    auto owner = WorkQueue::Open(o);
    auto thief = WorkQueue::Open(o);
    WorkItem it, piece;
    ASSERT_EQ(owner->TryTake(&it), TakeStatus::kOk);
    uint64_t end;
    ASSERT_EQ(owner->Claim(it, it.begin + 3 * kStep, &end), ItemStatus::kOk);
    ASSERT_EQ(thief->TryTake(&piece), TakeStatus::kOk);
    ASSERT_TRUE(piece.piece);
    split_at = piece.begin;
    thief_end = piece.end;
    owner_at = it.begin + 2 * kStep;
    thief_at = piece.begin + kStep;
    owner->Progress(it, owner_at);
    thief->Progress(piece, thief_at);
    state = owner->SaveState();
  }  // both close: their items go back, the queue is left unfinished
  RemoveQueue(o.name, true);
  auto r = o;
  r.restore_state = state;
  auto q = WorkQueue::Open(r);
  std::vector<std::pair<uint64_t, uint64_t>> got;
  WorkItem it;
  while (q->TryTake(&it) == TakeStatus::kOk) {
    got.push_back({it.begin, it.end});
    q->Ack(it);
  }
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(owner_at, split_at));
  EXPECT_EQ(got[1], std::make_pair(thief_at, thief_end));
  EXPECT_EQ(q->TryTake(&it), TakeStatus::kEnd);
}

}  // namespace
}  // namespace tailcut
