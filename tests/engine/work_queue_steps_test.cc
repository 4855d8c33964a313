// Equal steps: ranks with different amounts of data agree, step by step,
// through the segment, and all end each epoch at the same step.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using Clock = std::chrono::steady_clock;

// Removes the queue when the test ends, passed or failed: these queues hand
// out no items, so they stay unfinished and would outlive their last Close.
struct RemoveOnExit {
  std::string name;
  ~RemoveOnExit() {
    try {
      RemoveQueue(name, /*force=*/true);
    } catch (const Error&) {
    }
  }
};

WorkQueueOptions Options(const std::string& dir, const std::string& name) {
  std::string p = dir + "/f";
  int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  ::close(fd);
  WorkQueueOptions o;
  o.works = {p};
  o.name = name;
  o.on_notice = [](const std::string&) {};
  return o;
}

TEST(StepsTest, RanksWithDifferentAmountsOfDataEndEveryEpochAtTheSameStep) {
  char tmpl[] = "/tmp/tailcut-steps-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string name = "steps_" + std::to_string(::getpid());
  auto o = Options(dir, name);
  RemoveOnExit remove{name};
  auto keep = WorkQueue::Open(o);
  constexpr int kRanks = 4, kEpochs = 3;
  // batches[epoch][rank]: what each rank could produce.
  const int batches[kEpochs][kRanks] = {{5, 9, 7, 6}, {3, 3, 3, 3}, {0, 4, 8, 2}};
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      auto q = WorkQueue::Open(o);
      for (uint64_t e = 0; e < kEpochs; ++e) {
        int steps = 0;
        for (uint64_t s = 0;; ++s) {
          StepStatus st =
              q->AgreeStep(r, kRanks, (e << 32) | s, static_cast<int>(s) < batches[e][r],
                           Clock::now() + std::chrono::seconds(20));
          if (st == StepStatus::kEndEpoch) break;
          if (st != StepStatus::kAllHaveBatch) std::_Exit(3);
          ++steps;
        }
        if (::write(p[1], &steps, sizeof(steps)) != sizeof(steps)) std::_Exit(4);
      }
      q->Close();
      std::_Exit(0);
    }
    ::close(p[1]);
    fds.push_back(p[0]);
    pids.push_back(pid);
  }
  for (int r = 0; r < kRanks; ++r) {
    for (int e = 0; e < kEpochs; ++e) {
      int steps = -1;
      ASSERT_EQ(::read(fds[r], &steps, sizeof(steps)), static_cast<ssize_t>(sizeof(steps)));
      int expect = *std::min_element(batches[e], batches[e] + kRanks);
      EXPECT_EQ(steps, expect) << "rank " << r << " epoch " << e;
    }
    int status;
    ASSERT_EQ(::waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r;
  }
  keep->Close();
  std::system(("rm -rf " + dir).c_str());
}

TEST(StepsTest, AMissingRankIsATimeoutNotAHang) {
  char tmpl[] = "/tmp/tailcut-steps-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  RemoveOnExit remove{"steps_missing_" + std::to_string(::getpid())};
  auto q = WorkQueue::Open(Options(dir, remove.name));
  auto t0 = Clock::now();
  EXPECT_EQ(q->AgreeStep(0, 2, 0, true, Clock::now() + std::chrono::milliseconds(200)),
            StepStatus::kTimeout);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(q->AgreeStep(2, 2, 0, true), StepStatus::kInvalid);
  EXPECT_EQ(q->AgreeStep(0, 1, 5, true), StepStatus::kAllHaveBatch);
  EXPECT_EQ(q->AgreeStep(0, 1, 4, true), StepStatus::kInvalid) << "steps must not go backwards";
  q->Close();
  std::system(("rm -rf " + dir).c_str());
}

// A rank asleep at a step is woken by the last rank's arrival, not by its
// wait slice (50 ms): the wake-up made only when a rank may sleep is never
// lost. Rank 1 arrives 2 ms after rank 0 went to sleep, 40 times: about 0.1 s
// when every wake-up lands, 40 slices (2 s) if they were lost.
TEST(StepsTest, ARankAsleepAtAStepIsWokenByTheLastArrival) {
  char tmpl[] = "/tmp/tailcut-steps-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string name = "steps_wake_" + std::to_string(::getpid());
  auto o = Options(dir, name);
  RemoveOnExit remove{name};
  auto q0 = WorkQueue::Open(o);
  auto q1 = WorkQueue::Open(o);
  constexpr int kSteps = 40;
  auto deadline = [] { return Clock::now() + std::chrono::seconds(20); };
  auto t0 = Clock::now();
  std::thread late([&] {
    for (uint64_t s = 0; s < kSteps; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_EQ(q1->AgreeStep(1, 2, s, true, deadline()), StepStatus::kAllHaveBatch);
    }
  });
  for (uint64_t s = 0; s < kSteps; ++s)
    EXPECT_EQ(q0->AgreeStep(0, 2, s, true, deadline()), StepStatus::kAllHaveBatch);
  late.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000))
      << "a rank asleep at a step waited for its slice, not for the last rank";
  q1->Close();
  q0->Close();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace tailcut
