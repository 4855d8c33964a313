// Threads of one process on a WorkQueue: exactly once per epoch with many
// threads on one object, and with threads of two objects on the same queue.
// No fork here, so the binary also runs under ThreadSanitizer in CI.
#include <latch>
#include <map>
#include <mutex>
#include <thread>

#include "tests/engine/queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1 << 20;

class WorkQueueThreadTest : public QueueTest {};

// What one thread saw.
struct ThreadLog {
  std::vector<std::pair<uint64_t, uint64_t>> acked;  // (epoch, index)
  uint64_t given_back = 0;
  std::string error;
  bool ended = false;
};

// Waits for every worker to be ready, then takes until kEnd; gives back
// about every 16th item; reports progress on some; spins a little per item
// so that every thread gets a share; reads Stats now and then (the counters
// must be safe to read while others write).
void Work(WorkQueue& q, ThreadLog& log, uint64_t salt, std::latch& start) {
  std::mt19937_64 rng(salt);
  start.arrive_and_wait();
  for (uint64_t i = 0;; ++i) {
    WorkItem it;
    const TakeStatus st = q.Take(&it, Clock::now() + milliseconds(20000));
    if (st == TakeStatus::kEnd) {
      log.ended = true;
      return;
    }
    if (st != TakeStatus::kOk) {
      log.error = std::string("Take returned ") + StatusName(st) + " (deadline 20 s)";
      return;
    }
    if (std::string bad = CheckItem(q, it); !bad.empty()) {
      log.error = bad;
      return;
    }
    if (rng() % 16 == 0) {
      if (q.GiveBack(it) != ItemStatus::kOk) {
        log.error = "GiveBack refused";
        return;
      }
      ++log.given_back;
      continue;
    }
    if (rng() % 4 == 0 &&
        q.Progress(it, it.begin + (it.end - it.begin) / 2, 1) != ItemStatus::kOk) {
      log.error = "Progress refused";
      return;
    }
    if (q.Ack(it) != ItemStatus::kOk) {
      log.error = "Ack refused for ticket " + std::to_string(it.ticket);
      return;
    }
    log.acked.emplace_back(it.epoch, it.index);
    Spin(2);
    if (i % 257 == 0) (void)q.Stats();
  }
}

void CheckLogs(const std::vector<ThreadLog>& logs, uint64_t n, uint64_t epochs) {
  std::vector<uint32_t> counts(n * epochs);
  size_t busy = 0;
  for (size_t t = 0; t < logs.size(); ++t) {
    EXPECT_EQ(logs[t].error, "") << "thread " << t;
    EXPECT_TRUE(logs[t].ended) << "thread " << t << " never saw kEnd";
    for (const auto& [e, i] : logs[t].acked) {
      ASSERT_LT(Key(n, e, i), counts.size());
      counts[Key(n, e, i)]++;
    }
    busy += !logs[t].acked.empty();
  }
  EXPECT_EQ(ExactlyOnce(counts, n), "");
  EXPECT_GE(busy, 2u) << "only one thread got any work";
}

TEST_F(WorkQueueThreadTest, EightThreadsOnOneObjectAckEachItemOncePerEpoch) {
  auto o = BaseOptions(NewName("threads8"), dir_.Files("f", 5, {kMiB, 2 * kMiB}));
  o.num_slices = 3000;
  o.num_epochs = 2;
  auto q = WorkQueue::Open(o);
  const uint64_t n = q->num_items();
  std::vector<ThreadLog> logs(8);
  std::vector<std::thread> threads;
  std::latch start(8);
  for (size_t t = 0; t < logs.size(); ++t)
    threads.emplace_back([&, t] { Work(*q, logs[t], 100 + t, start); });
  for (auto& th : threads) th.join();
  CheckLogs(logs, n, 2);
  const QueueStats s = q->Stats();
  EXPECT_EQ(s.done, 2 * n);
  EXPECT_EQ(s.in_flight, 0u);
  ASSERT_EQ(s.clients.size(), 1u) << "threads of one object are one client";
  uint64_t given_back = 0;
  for (const auto& l : logs) given_back += l.given_back;
  EXPECT_EQ(s.clients[0].items_given_back, given_back);
  EXPECT_EQ(s.clients[0].items_acked, 2 * n);
  EXPECT_EQ(s.clients[0].items_taken, 2 * n + given_back);
}

TEST_F(WorkQueueThreadTest, ThreadsOfTwoObjectsOnOneQueueShareIt) {
  auto o = BaseOptions(NewName("two_objects"), dir_.Files("f", 4, {kMiB}));
  o.num_slices = 2000;
  o.num_epochs = 2;
  o.num_clients = 2;
  auto a = WorkQueue::Open(o);
  auto b = WorkQueue::Open(o);
  ASSERT_EQ(a->num_items(), b->num_items());
  ASSERT_EQ(a->seed(), b->seed());
  const uint64_t n = a->num_items();
  std::vector<ThreadLog> logs(8);
  std::vector<std::thread> threads;
  std::latch start(8);
  for (size_t t = 0; t < logs.size(); ++t) {
    WorkQueue& q = t % 2 == 0 ? *a : *b;
    threads.emplace_back([&, t] { Work(q, logs[t], 200 + t, start); });
  }
  for (auto& th : threads) th.join();
  CheckLogs(logs, n, 2);
  EXPECT_EQ(a->Stats().clients.size(), 2u) << "two objects are two clients";
  const std::string seg = SegmentPath(o.name);
  a->Close();
  EXPECT_TRUE(PathExists(seg));
  b.reset();
  EXPECT_FALSE(PathExists(seg));
}

TEST_F(WorkQueueThreadTest, StatsWhileThreadsTakeIsConsistent) {
  auto o = BaseOptions(NewName("stats_race"), dir_.Files("f", 2, {kMiB}));
  o.num_slices = 1500;
  auto q = WorkQueue::Open(o);
  std::atomic<bool> stop{false};
  std::string problem;
  std::thread watcher([&] {
    uint64_t last_done = 0;
    while (!stop.load()) {
      const QueueStats s = q->Stats();
      if (s.done < last_done) {
        problem = "done went backwards from " + std::to_string(last_done) + " to " +
                  std::to_string(s.done) + " (in flight " + std::to_string(s.in_flight) + ")";
      }
      if (s.done > s.total) problem = "done > total";
      if (s.in_flight > 8) problem = "more in flight than lease slots";
      last_done = s.done;
    }
  });
  std::vector<ThreadLog> logs(4);
  std::vector<std::thread> threads;
  std::latch start(4);
  for (size_t t = 0; t < logs.size(); ++t)
    threads.emplace_back([&, t] { Work(*q, logs[t], 300 + t, start); });
  for (auto& th : threads) th.join();
  stop = true;
  watcher.join();
  EXPECT_EQ(problem, "");
  CheckLogs(logs, q->num_items(), 1);
}

// Threads give items back at the end of the data while others look for
// one: a given-back item must never become invisible (Take would then wait
// for it forever).
TEST_F(WorkQueueThreadTest, ItemsGivenBackAtTheEndOfTheDataAreNeverLost) {
  const auto works = dir_.Files("g", 2, {kMiB});
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto o = BaseOptions(NewName("thread_giveback"), works);
    o.num_slices = 16;
    o.leases_per_client = 16;
    auto q = WorkQueue::Open(o);
    std::vector<std::string> errors(8);
    std::vector<std::vector<uint64_t>> acked(8);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(round * 8 + t);
        for (;;) {
          WorkItem it;
          const TakeStatus st = q->Take(&it, Clock::now() + milliseconds(5000));
          if (st == TakeStatus::kEnd) return;
          if (st != TakeStatus::kOk) {
            errors[t] = std::string("Take returned ") + StatusName(st) + " after 5 s";
            return;
          }
          if (rng() % 2 == 0) {
            q->GiveBack(it);
          } else if (q->Ack(it) == ItemStatus::kOk) {
            acked[t].push_back(it.index);
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    std::vector<uint32_t> counts(q->num_items());
    for (size_t t = 0; t < 8; ++t) {
      EXPECT_EQ(errors[t], "") << "thread " << t;
      for (uint64_t i : acked[t]) counts[i]++;
    }
    EXPECT_EQ(ExactlyOnce(counts, q->num_items()), "");
    if (HasFailure()) break;
  }
}

TEST_F(WorkQueueThreadTest, TakeSleepingAtTheEndWakesWhenAnotherThreadAcks) {
  auto o = BaseOptions(NewName("thread_wake"), dir_.Files("f", 2, {100}));
  auto q = WorkQueue::Open(o);
  WorkItem a, b;
  ASSERT_EQ(q->TryTake(&a), TakeStatus::kOk);
  ASSERT_EQ(q->TryTake(&b), TakeStatus::kOk);
  ASSERT_EQ(q->Ack(a), ItemStatus::kOk);
  std::atomic<int64_t> acked_at{0};
  std::thread acker([&] {
    std::this_thread::sleep_for(milliseconds(200));
    acked_at = Clock::now().time_since_epoch().count();
    EXPECT_EQ(q->Ack(b), ItemStatus::kOk);
  });
  WorkItem c;
  const TakeStatus st = q->Take(&c, Clock::now() + milliseconds(20000));
  const auto woke = Clock::now();
  acker.join();
  EXPECT_EQ(st, TakeStatus::kEnd);
  const double latency = std::chrono::duration<double, std::milli>(
                             woke - Clock::time_point{Clock::duration(acked_at.load())})
                             .count();
  EXPECT_LT(latency, 5000.0);
  RecordProperty("wake_after_ack_ms", std::to_string(latency));
}

}  // namespace
}  // namespace tailcut::test
