// BatchRing across real processes (fork; more processes than cores), with
// kill -9 at random points.
//
// Children log to anonymous shared memory the parent reads after they exit
// or were killed: per batch (loader, seq), how often its Publish was about to
// run / returned kOk, and how often a trainer was about to Release it / got
// kOk. The promises checked after every trial:
//  * no batch is released twice, and no batch that was never published is
//    popped (the stamp of every popped batch is checked byte for byte);
//  * every published batch is released once, or is still READY at the end
//    (reported), or a trainer was killed inside its Release;
//  * no slot leaks: once every child is gone, all slots are FREE or READY.
//
// batch_ring_process_test runs TAILCUT_CRASH_TRIALS (default 30) kill
// trials; batch_ring_process_stress_test (TAILCUT_CRASH_STRESS) as many as
// fit in TAILCUT_STRESS_SECONDS (default 120), at least 200.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"

namespace tailcut {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#ifdef TAILCUT_CRASH_STRESS
constexpr bool kStress = true;
#else
constexpr bool kStress = false;
#endif

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

constexpr uint64_t kMaxBatches = 4096;
constexpr size_t kBatchBytes = 2048;

struct BatchLog {
  std::atomic<uint32_t> publishing, published, popped, releasing, released;
};

struct SharedLog {
  BatchLog batch[kMaxBatches];
  std::atomic<uint32_t> corrupt;  // popped batches whose bytes were wrong
  std::atomic<uint32_t> unknown;  // popped batches nobody was about to publish
  std::atomic<uint32_t> errors;   // unexpected statuses
};

// Anonymous shared memory: survives the children, SIGKILL included.
SharedLog* MapLog() {
  void* p =
      ::mmap(nullptr, sizeof(SharedLog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return new (p) SharedLog();
}

unsigned char Pattern(uint64_t key, size_t i) {
  uint64_t x = (key + 1) * 0x9E3779B97F4A7C15ull ^ i * 0xC2B2AE3D27D4EB4Full;
  return static_cast<unsigned char>(x ^ (x >> 31));
}

struct Trial {
  std::string name;
  uint32_t loaders, trainers, slots;
  uint64_t per_loader;
};

BatchRingOptions Options(const Trial& t) {
  BatchRingOptions o;
  o.name = t.name;
  o.slot_bytes = kBatchBytes;
  o.num_slots = t.slots;
  o.max_clients = 32;
  return o;
}

[[noreturn]] void LoaderChild(const Trial& t, uint32_t index, SharedLog* log) {
  int rc = 0;
  try {
    auto ring = BatchRing::Open(Options(t), RingRole::kLoader);
    for (uint64_t seq = 0; seq < t.per_loader; ++seq) {
      uint64_t key = index * t.per_loader + seq;
      WritableBatch w;
      if (ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(30)) != RingStatus::kOk) {
        log->errors.fetch_add(1);
        rc = 2;
        break;
      }
      size_t bytes = 16 + key % (kBatchBytes - 16);
      for (size_t i = 0; i < bytes; ++i) w.data[i] = std::byte{Pattern(key, i)};
      // Filling takes a while: kills land in a slot's FILLING time too.
      std::this_thread::sleep_for(std::chrono::microseconds(key % 7 * 20));
      log->batch[key].publishing.fetch_add(1);
      if (ring->Publish(w.token, 0, key, bytes) != RingStatus::kOk) {
        log->errors.fetch_add(1);
        rc = 2;
        break;
      }
      log->batch[key].published.fetch_add(1);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader %u: %s\n", index, e.what());
    rc = 3;
  }
  ::_exit(rc);
}

[[noreturn]] void TrainerChild(const Trial& t, SharedLog* log) {
  int rc = 0;
  try {
    auto ring = BatchRing::Open(Options(t), RingRole::kTrainer);
    for (;;) {
      ReadyBatch r;
      RingStatus st = ring->Pop(BatchRing::kAllEpochs, &r, Clock::now() + std::chrono::seconds(30));
      if (st == RingStatus::kEnd) break;
      if (st != RingStatus::kOk || r.records >= t.loaders * t.per_loader) {
        log->errors.fetch_add(1);
        rc = 2;
        break;
      }
      BatchLog& b = log->batch[r.records];
      if (b.publishing.load() == 0) log->unknown.fetch_add(1);
      if (r.data.size() != 16 + r.records % (kBatchBytes - 16)) log->corrupt.fetch_add(1);
      for (size_t i = 0; i < r.data.size(); ++i)
        if (r.data[i] != std::byte{Pattern(r.records, i)}) {
          log->corrupt.fetch_add(1);
          break;
        }
      b.popped.fetch_add(1);
      // Using the batch takes a while: kills land in its POPPED time too.
      std::this_thread::sleep_for(std::chrono::microseconds(r.records % 5 * 40));
      b.releasing.fetch_add(1);
      if (ring->Release(r.token) != RingStatus::kOk) {
        log->errors.fetch_add(1);
        rc = 2;
        break;
      }
      b.released.fetch_add(1);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    rc = 3;
  }
  ::_exit(rc);
}

// Waits for `pid` up to the deadline; SIGKILLs it then. Returns the wait
// status, or -1 when it hung.
int Reap(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return status;
}

// One trial: loaders and trainers in processes; with kills, up to two
// children (never the last loader or the last trainer) get SIGKILL at a
// random moment. Returns "" or what went wrong.
std::string RunTrial(const Trial& t, uint64_t seed, bool kills, std::string* note) {
  RemoveBatchRing(t.name);
  SharedLog* log = MapLog();
  if (log == nullptr) return "mmap failed";
  struct Unmap {
    SharedLog* log;
    ~Unmap() { ::munmap(log, sizeof(SharedLog)); }
  } unmap{log};
  // The parent's loader client keeps the ring alive and closes it at the end.
  auto closer = BatchRing::Open(Options(t), RingRole::kLoader);
  std::vector<pid_t> loaders, trainers;
  for (uint32_t i = 0; i < t.loaders; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) LoaderChild(t, i, log);
    loaders.push_back(pid);
  }
  for (uint32_t i = 0; i < t.trainers; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) TrainerChild(t, log);
    trainers.push_back(pid);
  }
  std::mt19937_64 rng(seed);
  std::vector<pid_t> killed;
  if (kills) {
    int n = 1 + rng() % 2;
    for (int k = 0; k < n; ++k) {
      std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 15000));
      // Index 0 of each side is never killed: someone must finish the job.
      bool loader = rng() % 2 == 0;
      auto& side = loader ? loaders : trainers;
      pid_t victim = side[1 + rng() % (side.size() - 1)];
      if (std::find(killed.begin(), killed.end(), victim) != killed.end()) continue;
      ::kill(victim, SIGKILL);
      killed.push_back(victim);
    }
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  std::string error;
  auto reap = [&](pid_t pid, const char* what) {
    int status = Reap(pid, deadline);
    bool was_killed = std::find(killed.begin(), killed.end(), pid) != killed.end();
    if (status == -1 && error.empty()) error = std::string(what) + " hung";
    if (status != -1 && !was_killed && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
        error.empty())
      error = std::string(what) + " failed (status " + std::to_string(status) + ")";
  };
  for (pid_t pid : loaders) reap(pid, "a loader");
  closer->Close();
  for (pid_t pid : trainers) reap(pid, "a trainer");
  if (!error.empty()) return error;
  if (log->errors.load() != 0) return std::to_string(log->errors.load()) + " unexpected statuses";
  if (log->corrupt.load() != 0) return std::to_string(log->corrupt.load()) + " corrupt batches";
  if (log->unknown.load() != 0) return "a batch nobody published was popped";

  // Batches left READY are reported: the parent pops them as a trainer.
  std::vector<uint32_t> reported(t.loaders * t.per_loader, 0);
  {
    auto drain = BatchRing::Open(Options(t), RingRole::kTrainer);
    ReadyBatch r;
    while (drain->Pop(BatchRing::kAllEpochs, &r, Clock::now() + milliseconds(100)) ==
           RingStatus::kOk) {
      if (r.records < reported.size()) ++reported[r.records];
      drain->Release(r.token);
    }
    BatchRingStats s = drain->Stats();
    if (s.free != t.slots)
      return std::to_string(t.slots - s.free) + " slot(s) leaked (filling " +
             std::to_string(s.filling) + ", popped " + std::to_string(s.popped) + ")";
    if (s.redelivered + s.reclaimed > 0)
      *note = "reclaimed " + std::to_string(s.reclaimed) + ", redelivered " +
              std::to_string(s.redelivered);
  }
  bool trainer_killed = false;
  for (pid_t pid : killed)
    trainer_killed |= std::find(trainers.begin(), trainers.end(), pid) != trainers.end();
  for (uint64_t k = 0; k < t.loaders * t.per_loader; ++k) {
    const BatchLog& b = log->batch[k];
    uint32_t released = b.released.load(), published = b.published.load();
    // A trainer killed inside Release (after its kOk, before the log) may
    // have released it without saying so.
    bool release_unlogged = trainer_killed && b.releasing.load() > released;
    if (released + reported[k] > 1)
      return "batch " + std::to_string(k) + " released " + std::to_string(released) +
             " times and reported " + std::to_string(reported[k]) + " times";
    if (published == 1 && released + reported[k] == 0 && !release_unlogged)
      return "published batch " + std::to_string(k) + " was lost";
    if (b.publishing.load() == 0 && released + reported[k] > 0)
      return "batch " + std::to_string(k) + " was never published but came out";
  }
  closer.reset();
  RemoveBatchRing(t.name);
  return "";
}

std::string Name(const char* what) {
  return std::string("ringproc.") + what + "." + std::to_string(::getpid());
}

TEST(BatchRingProcessTest, EveryBatchOnceAcrossMoreProcessesThanCores) {
  Trial t{Name("plain"), 4, 4, 6, 150};
  std::string note;
  EXPECT_EQ(RunTrial(t, 1, false, &note), "");
}

TEST(BatchRingProcessTest, ADeadLoadersSlotIsReclaimedAndADeadTrainersBatchRedelivered) {
  Trial t{Name("deaths"), 1, 1, 2, 1};
  RemoveBatchRing(t.name);
  auto trainer = BatchRing::Open(Options(t), RingRole::kTrainer);
  auto loader = BatchRing::Open(Options(t), RingRole::kLoader);
  pid_t pid = ::fork();
  if (pid == 0) {  // a loader that dies holding a slot
    auto ring = BatchRing::Open(Options(t), RingRole::kLoader);
    WritableBatch w;
    if (ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(5)) == RingStatus::kOk)
      ::raise(SIGKILL);
    ::_exit(1);
  }
  ASSERT_TRUE(WIFSIGNALED(Reap(pid, Clock::now() + std::chrono::seconds(10))));
  WritableBatch w;
  ASSERT_EQ(loader->AcquireSlot(&w, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
  ASSERT_EQ(loader->Publish(w.token, 0, 99, 0), RingStatus::kOk);
  // The second slot came back from the dead loader while we waited.
  ASSERT_EQ(loader->AcquireSlot(&w, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
  ASSERT_EQ(loader->Abandon(w.token), RingStatus::kOk);
  EXPECT_EQ(trainer->Stats().reclaimed, 1u);

  pid = ::fork();
  if (pid == 0) {  // a trainer that dies holding the batch
    auto ring = BatchRing::Open(Options(t), RingRole::kTrainer);
    ReadyBatch r;
    if (ring->Pop(0, &r, Clock::now() + std::chrono::seconds(5)) == RingStatus::kOk)
      ::raise(SIGKILL);
    ::_exit(1);
  }
  ASSERT_TRUE(WIFSIGNALED(Reap(pid, Clock::now() + std::chrono::seconds(10))));
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(0, &r, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
  EXPECT_EQ(r.records, 99u);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
  BatchRingStats s = InspectBatchRing(t.name);
  EXPECT_EQ(s.redelivered, 1u);
  EXPECT_EQ(s.free, 2u);
  EXPECT_EQ(s.clients.size(), 2u);
  loader->Close();
}

TEST(BatchRingProcessTest, ARingWhoseClientsAllDiedIsAdoptedWithItsSlots) {
  Trial t{Name("stale"), 1, 1, 3, 1};
  RemoveBatchRing(t.name);
  pid_t pid = ::fork();
  if (pid == 0) {  // the only client: publishes one batch, dies filling another
    auto ring = BatchRing::Open(Options(t), RingRole::kLoader);
    WritableBatch w;
    if (ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(5)) != RingStatus::kOk ||
        ring->Publish(w.token, 0, 7, 0) != RingStatus::kOk ||
        ring->AcquireSlot(&w, Clock::now() + std::chrono::seconds(5)) != RingStatus::kOk)
      ::_exit(1);
    ::raise(SIGKILL);
  }
  ASSERT_TRUE(WIFSIGNALED(Reap(pid, Clock::now() + std::chrono::seconds(10))));
  auto trainer = BatchRing::Open(Options(t), RingRole::kTrainer);
  BatchRingStats s = trainer->Stats();
  EXPECT_EQ(s.reclaimed, 1u);
  EXPECT_EQ(s.ready, 1u);
  EXPECT_EQ(s.free, 2u);
  ReadyBatch r;
  ASSERT_EQ(trainer->Pop(0, &r, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
  EXPECT_EQ(r.records, 7u);
  EXPECT_EQ(trainer->Release(r.token), RingStatus::kOk);
  trainer->Close();
  trainer.reset();
  EXPECT_FALSE(RemoveBatchRing(t.name)) << "the last client of a closed ring leaves it behind";
}

TEST(BatchRingProcessTest, KillNineAtRandomPointsLosesNothingAndDoublesNothing) {
  const uint64_t trials = kStress ? ~0ull : EnvU64("TAILCUT_CRASH_TRIALS", 30);
  const uint64_t min_trials = kStress ? 200 : 0;
  const auto budget =
      std::chrono::seconds(kStress ? EnvU64("TAILCUT_STRESS_SECONDS", 120) : 100000);
  const auto start = Clock::now();
  uint64_t ran = 0, recovered = 0;
  for (uint64_t seed = 1; seed <= trials && (ran < min_trials || Clock::now() - start < budget);
       ++seed, ++ran) {
    std::mt19937_64 rng(seed);
    Trial t{Name("kill"), 2 + static_cast<uint32_t>(rng() % 3),
            2 + static_cast<uint32_t>(rng() % 3), 1 + static_cast<uint32_t>(rng() % 6),
            60 + rng() % 100};
    std::string note;
    std::string e = RunTrial(t, seed, true, &note);
    ASSERT_EQ(e, "") << "trial " << seed << " (" << t.loaders << " loaders, " << t.trainers
                     << " trainers, " << t.slots << " slots)";
    recovered += !note.empty();
  }
  std::printf("%llu trials, %llu with slots recovered from killed processes\n",
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(recovered));
}

}  // namespace
}  // namespace tailcut
