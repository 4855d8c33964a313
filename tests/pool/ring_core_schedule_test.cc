// The batch ring's atomics under a seeded scheduler (deterministic_schedule.h):
// this binary builds pool/ring_core.cc once more with
// TAILCUT_DETERMINISTIC_SCHEDULE, so every operation on a slot word, ring
// cell or position is a point where the scheduler may switch threads. Each
// seed is one interleaving of
//  * two loaders that fill slots with a stamp (loader, sequence) and publish
//    them, or abandon some;
//  * two trainers that pop, check the stamp against the slot header, and
//    release;
//  * a loader and a trainer that "die" at a point chosen by the seed (after
//    taking a slot, between the push and the CAS of a publish or a release,
//    or holding a popped batch), and a recoverer that recovers them once
//    they stopped, as the life mutex would report them.
// Every seed must deliver each published batch to exactly one live release
// (or, for a batch a dying trainer held, at most one), and end with every
// slot in the free ring exactly once: nothing leaked, nothing doubled.
//
// TAILCUT_SCHEDULE_SEEDS (default 1000) seeds per run, or as many as fit in
// TAILCUT_SCHEDULE_SECONDS (default 120: each switch between threads is a
// wakeup, which a machine busy with other work makes wait for a core; about
// 10 s on a quiet 2-core machine, over 180 s beside two CPU hogs); the
// stress build runs as many as fit in TAILCUT_STRESS_SECONDS.
// TAILCUT_SCHEDULE_SEED=<seed> repeats one (the failure message names it).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pool/ring_core.h"
#include "tests/engine/deterministic_schedule.h"

namespace tailcut::test {
namespace {

using detail::RingCore;

#ifdef TAILCUT_SCHEDULE_STRESS
constexpr bool kStress = true;
#else
constexpr bool kStress = false;
#endif

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

struct Stamp {
  uint64_t loader, seq;
  bool operator<(const Stamp& o) const {
    return loader != o.loader ? loader < o.loader : seq < o.seq;
  }
};

// Ring memory on the heap, page aligned like a mapping.
struct Memory {
  explicit Memory(const detail::RingGeometry& g)
      : bytes(static_cast<char*>(std::aligned_alloc(4096, g.total)), &std::free) {
    std::memset(bytes.get(), 0, g.total);
  }
  std::unique_ptr<char, decltype(&std::free)> bytes;
};

enum class Death { kAfterTake, kMidPublish, kHoldingBatch, kMidRelease };

std::string RunSeed(uint64_t seed) {
  std::mt19937_64 setup(seed);
  const uint32_t num_slots = 1 + setup() % 4;
  const auto g = detail::ComputeRingGeometry(64, num_slots, 8);
  Memory mem(g);
  RingCore::Initialize(mem.bytes.get(), g);
  RingCore core(mem.bytes.get(), g);
  const uint64_t per_loader = 4 + setup() % 4;
  const Death loader_death = setup() % 2 ? Death::kAfterTake : Death::kMidPublish;
  const Death trainer_death = setup() % 2 ? Death::kHoldingBatch : Death::kMidRelease;

  std::vector<Stamp> published[2];           // by the two live loaders
  std::vector<Stamp> released[2];            // by the two live trainers
  std::optional<Stamp> dying_loader_batch;   // published by the dying loader, maybe
  std::optional<Stamp> dying_trainer_batch;  // popped by the dying trainer
  std::string error;
  int loaders_left = 3;
  bool dead_loader = false, dead_trainer = false, recovered = false;
  auto fail = [&](const std::string& what) {
    if (error.empty()) error = what;
  };

  auto fill = [&](uint32_t slot, Stamp s) {
    std::memcpy(core.slot_data(slot), &s, sizeof(s));
    core.slot(slot).epoch.store(s.loader, std::memory_order_relaxed);
    core.slot(slot).records.store(s.seq, std::memory_order_relaxed);
  };
  // Waits are bounded: a slot that leaked would make them wait forever.
  constexpr int kMaxYields = 20000;
  auto take_free = [&](uint64_t self, uint32_t* slot, uint64_t* gen) {
    for (int yields = 0; error.empty(); ++yields) {
      if (yields == kMaxYields) fail("no slot came free: a slot leaked or a ring is stuck");
      auto r = core.TakeFree(self, slot, gen);
      if (r == RingCore::Result::kOk) return true;
      if (r != RingCore::Result::kEmpty) {
        fail("TakeFree was not ok or empty");
        return false;
      }
      DeterministicSchedule::Yield();
    }
    return false;
  };
  auto loader = [&](uint64_t self, int index) {
    std::mt19937_64 rng(seed * 31 + self);
    for (uint64_t i = 0; i < per_loader && error.empty(); ++i) {
      uint32_t slot;
      uint64_t gen;
      if (!take_free(self, &slot, &gen)) break;
      Stamp s{self, i};
      fill(slot, s);
      if (rng() % 5 == 0) {
        if (core.Abandon(self, slot, gen) != RingCore::Result::kOk) fail("Abandon of an own slot");
        continue;
      }
      if (core.Publish(self, slot, gen) != RingCore::Result::kOk) fail("Publish of an own slot");
      published[index].push_back(s);
      // A second publish with the same token is refused (R1).
      if (core.Publish(self, slot, gen) != RingCore::Result::kStale)
        fail("second Publish not stale");
    }
    --loaders_left;
  };
  auto dying_loader = [&] {
    const uint64_t self = 4;
    uint32_t slot;
    uint64_t gen;
    if (take_free(self, &slot, &gen)) {
      fill(slot, Stamp{self, 0});
      if (loader_death == Death::kMidPublish) {
        core.Push(RingCore::Which::kReady, slot, gen + 1);  // then dies before its CAS
        dying_loader_batch = Stamp{self, 0};
      }
    }
    dead_loader = true;
    --loaders_left;
  };
  auto trainer = [&](uint64_t self, int index) {
    for (int yields = 0;;) {
      bool producers_done = loaders_left == 0 && recovered;
      uint32_t slot;
      uint64_t gen;
      auto r = core.TakeReady(self, &slot, &gen);
      if (r == RingCore::Result::kEmpty) {
        if (producers_done || !error.empty()) return;
        if (++yields == kMaxYields)
          return fail("no batch and no end: a batch leaked or a ring is stuck");
        DeterministicSchedule::Yield();
        continue;
      }
      if (r != RingCore::Result::kOk) return fail("TakeReady was not ok or empty");
      yields = 0;
      Stamp s;
      std::memcpy(&s, core.slot_data(slot), sizeof(s));
      if (core.slot(slot).epoch.load(std::memory_order_relaxed) != s.loader ||
          core.slot(slot).records.load(std::memory_order_relaxed) != s.seq)
        return fail("slot header and data disagree: the data was not published with it");
      released[index].push_back(s);
      if (core.Release(self, slot, gen) != RingCore::Result::kOk)
        return fail("Release of own batch");
      if (core.Release(self, slot, gen) != RingCore::Result::kStale)
        return fail("second Release not stale");
    }
  };
  auto dying_trainer = [&] {
    const uint64_t self = 5;
    for (int tries = 0; tries < 200 && !dead_loader; ++tries) DeterministicSchedule::Yield();
    for (int tries = 0; tries < 200; ++tries) {
      uint32_t slot;
      uint64_t gen;
      if (core.TakeReady(self, &slot, &gen) != RingCore::Result::kOk) {
        DeterministicSchedule::Yield();
        continue;
      }
      std::memcpy(&dying_trainer_batch.emplace(), core.slot_data(slot), sizeof(Stamp));
      if (trainer_death == Death::kMidRelease) core.Push(RingCore::Which::kFree, slot, gen + 1);
      break;
    }
    dead_trainer = true;
  };
  auto recoverer = [&] {
    // Each as soon as it stopped: the other may be waiting for its slot.
    uint64_t reclaimed = 0, redelivered = 0;
    while (!dead_trainer) DeterministicSchedule::Yield();
    core.RecoverClient(5, &reclaimed, &redelivered);
    while (!dead_loader) DeterministicSchedule::Yield();
    core.RecoverClient(4, &reclaimed, &redelivered);
    // Recovery is idempotent: once more changes nothing.
    uint64_t again = 0;
    core.RecoverClient(4, &again, &again);
    core.RecoverClient(5, &again, &again);
    if (again != 0) fail("a second recovery moved slots again");
    recovered = true;
  };

  DeterministicSchedule sched(seed);
  sched.Run({[&] { loader(0, 0); }, [&] { loader(1, 1); }, [&] { trainer(2, 0); },
             [&] { trainer(3, 1); }, dying_loader, dying_trainer, recoverer});
  if (!error.empty()) return error;

  // Exactly once: each live publish released once by a live trainer; the
  // dying trainer's batch at most once more (it may have been released by it).
  std::map<Stamp, int> count;
  for (auto& v : released)
    for (Stamp s : v) ++count[s];
  for (auto& v : published)
    for (Stamp s : v) {
      bool held_by_dead =
          dying_trainer_batch && !(s < *dying_trainer_batch) && !(*dying_trainer_batch < s);
      int n = count[s];
      if (n > 1 || (n == 0 && !held_by_dead))
        return "batch (" + std::to_string(s.loader) + ", " + std::to_string(s.seq) + ") released " +
               std::to_string(n) + " times";
      if (n == 0 && trainer_death == Death::kHoldingBatch)
        return "batch held by a dead trainer was not redelivered";
      count.erase(s);
    }
  if (dying_loader_batch) {  // 0 or 1: reclaimed, or its publish completed by a popper
    if (count[*dying_loader_batch] > 1) return "the dying loader's batch was released twice";
    count.erase(*dying_loader_batch);
  }
  if (!count.empty()) return "a batch nobody published was released";

  // Nothing leaked: every slot is FREE and comes out of the free ring once.
  std::set<uint32_t> slots;
  for (;;) {
    uint32_t slot;
    uint64_t gen;
    auto r = core.TakeFree(7, &slot, &gen);
    if (r == RingCore::Result::kEmpty) break;
    if (r != RingCore::Result::kOk) return "free ring corrupt at the end";
    if (!slots.insert(slot).second) return "slot " + std::to_string(slot) + " free twice";
  }
  if (slots.size() != num_slots)
    return std::to_string(num_slots - slots.size()) + " slot(s) leaked";
  uint32_t slot;
  uint64_t gen;
  if (core.TakeReady(7, &slot, &gen) != RingCore::Result::kEmpty) return "ready ring not empty";
  return "";
}

TEST(RingCoreScheduleTest, EveryBatchOnceAndNoSlotLeaksUnderManyInterleavings) {
  if (const char* one = std::getenv("TAILCUT_SCHEDULE_SEED")) {
    uint64_t seed = std::strtoull(one, nullptr, 10);
    EXPECT_EQ(RunSeed(seed), "") << "seed " << seed;
    return;
  }
  const uint64_t seeds = kStress ? ~0ull : EnvU64("TAILCUT_SCHEDULE_SEEDS", 1000);
  const auto budget = std::chrono::seconds(
      EnvU64(kStress ? "TAILCUT_STRESS_SECONDS" : "TAILCUT_SCHEDULE_SECONDS", 120));
  const auto start = std::chrono::steady_clock::now();
  uint64_t ran = 0;
  for (uint64_t seed = 1; seed <= seeds && std::chrono::steady_clock::now() - start < budget;
       ++seed, ++ran) {
    std::string e = RunSeed(seed);
    ASSERT_EQ(e, "") << "seed " << seed << " (TAILCUT_SCHEDULE_SEED=" << seed << " repeats it)";
  }
  std::printf("%llu seeds\n", static_cast<unsigned long long>(ran));
}

}  // namespace
}  // namespace tailcut::test
