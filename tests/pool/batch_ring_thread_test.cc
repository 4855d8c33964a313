// BatchRing across threads of one process (no fork: the suite for
// ThreadSanitizer): every batch stamped with its loader's pattern, checked
// byte for byte on the way out and seen exactly once; backpressure both ways.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"

namespace tailcut {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kBatchBytes = 8192;

struct RingGuard {
  explicit RingGuard(std::string n) : name(std::move(n)) { RemoveBatchRing(name); }
  ~RingGuard() { RemoveBatchRing(name); }
  std::string name;
};

BatchRingOptions Options(const std::string& name, uint32_t slots) {
  BatchRingOptions o;
  o.name = name;
  o.slot_bytes = kBatchBytes;
  o.num_slots = slots;
  o.max_clients = 16;
  return o;
}

// The byte at offset i of batch (loader, seq): differs between loaders,
// batches and offsets, so a torn or mixed-up batch shows.
unsigned char Pattern(uint64_t loader, uint64_t seq, size_t i) {
  uint64_t x = (loader + 1) * 0x9E3779B97F4A7C15ull ^ (seq + 1) * 0xC2B2AE3D27D4EB4Full ^ i;
  return static_cast<unsigned char>(x ^ (x >> 29) ^ (x >> 47));
}

struct Run {
  uint64_t loaders, per_loader, trainers;
  uint32_t slots;
  std::chrono::microseconds loader_pause{0}, trainer_pause{0};
};

// Runs the loaders and trainers (threads over 2 loader and 2 trainer
// objects); returns the stats after.
BatchRingStats RunRing(const std::string& name, const Run& run) {
  auto l0 = BatchRing::Open(Options(name, run.slots), RingRole::kLoader);
  auto l1 = BatchRing::Open(Options(name, run.slots), RingRole::kLoader);
  auto t0 = BatchRing::Open(Options(name, run.slots), RingRole::kTrainer);
  auto t1 = BatchRing::Open(Options(name, run.slots), RingRole::kTrainer);
  std::mutex mu;
  std::set<std::pair<uint64_t, uint64_t>> seen;
  std::atomic<uint64_t> duplicates{0}, corrupt{0}, loaders_done{0};
  std::vector<std::thread> threads;
  for (uint64_t l = 0; l < run.loaders; ++l) {
    threads.emplace_back([&, l] {
      BatchRing& ring = l % 2 ? *l1 : *l0;
      for (uint64_t seq = 0; seq < run.per_loader; ++seq) {
        WritableBatch w;
        ASSERT_EQ(ring.AcquireSlot(&w, Clock::now() + std::chrono::seconds(20)), RingStatus::kOk);
        size_t bytes = 64 + (seq * 977 + l * 131) % (kBatchBytes - 64);
        for (size_t i = 0; i < bytes; ++i) w.data[i] = std::byte{Pattern(l, seq, i)};
        std::memcpy(w.user_header.data(), &bytes, sizeof(bytes));
        ASSERT_EQ(ring.Publish(w.token, 0, l * run.per_loader + seq, bytes), RingStatus::kOk);
        if (run.loader_pause.count() > 0) std::this_thread::sleep_for(run.loader_pause);
      }
      if (++loaders_done == run.loaders) ring.Close();
    });
  }
  for (uint64_t t = 0; t < run.trainers; ++t) {
    threads.emplace_back([&, t] {
      BatchRing& ring = t % 2 ? *t1 : *t0;
      for (;;) {
        ReadyBatch r;
        RingStatus st =
            ring.Pop(BatchRing::kAllEpochs, &r, Clock::now() + std::chrono::seconds(20));
        if (st == RingStatus::kEnd) return;
        ASSERT_EQ(st, RingStatus::kOk);
        uint64_t l = r.records / run.per_loader, seq = r.records % run.per_loader;
        size_t bytes;
        std::memcpy(&bytes, r.user_header.data(), sizeof(bytes));
        if (bytes != r.data.size()) ++corrupt;
        for (size_t i = 0; i < r.data.size(); ++i)
          if (r.data[i] != std::byte{Pattern(l, seq, i)}) {
            ++corrupt;
            break;
          }
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!seen.emplace(l, seq).second) ++duplicates;
        }
        if (run.trainer_pause.count() > 0) std::this_thread::sleep_for(run.trainer_pause);
        ASSERT_EQ(ring.Release(r.token), RingStatus::kOk);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(duplicates.load(), 0u);
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_EQ(seen.size(), run.loaders * run.per_loader);
  return t0->Stats();
}

std::string Name(const char* what) {
  return std::string("ringthreads.") + what + "." + std::to_string(::getpid());
}

TEST(BatchRingThreadTest, EveryStampedBatchArrivesIntactExactlyOnce) {
  RingGuard g(Name("mpmc"));
  BatchRingStats s = RunRing(g.name, {6, 400, 5, 4});
  EXPECT_EQ(s.published, 2400u);
  EXPECT_EQ(s.released, 2400u);
  EXPECT_EQ(s.free, 4u);
}

TEST(BatchRingThreadTest, OneSlotStillPassesEveryBatch) {
  RingGuard g(Name("oneslot"));
  BatchRingStats s = RunRing(g.name, {3, 200, 3, 1});
  EXPECT_EQ(s.released, 600u);
}

TEST(BatchRingThreadTest, SlowTrainersMakeLoadersWait) {
  RingGuard g(Name("slowtrainers"));
  BatchRingStats s =
      RunRing(g.name, {2, 60, 2, 2, std::chrono::microseconds(0), std::chrono::microseconds(2000)});
  double loader_wait = 0, trainer_wait = 0;
  for (const auto& c : s.clients)
    (c.role == RingRole::kLoader ? loader_wait : trainer_wait) += c.wait_seconds;
  EXPECT_GT(loader_wait, 0.02) << "loaders never waited for a free slot";
}

TEST(BatchRingThreadTest, SlowLoadersMakeTrainersWait) {
  RingGuard g(Name("slowloaders"));
  BatchRingStats s =
      RunRing(g.name, {2, 60, 2, 4, std::chrono::microseconds(2000), std::chrono::microseconds(0)});
  double loader_wait = 0, trainer_wait = 0;
  for (const auto& c : s.clients)
    (c.role == RingRole::kLoader ? loader_wait : trainer_wait) += c.wait_seconds;
  EXPECT_GT(trainer_wait, 0.02) << "trainers never waited for a batch";
}

}  // namespace
}  // namespace tailcut
