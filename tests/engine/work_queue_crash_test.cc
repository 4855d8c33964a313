// kill -9 at random points: a process of a WorkQueue is SIGKILLed after a
// random delay, or kills itself at a crash point the engine injects
// (TAILCUT_CRASH_AT=<point>[:<n>]); survivors and processes that join later
// must finish the queue, every (epoch, item) acked exactly once, nobody hung.
// In half the trials processes read like tailcut's Reader (Claim before each
// chunk), so idle processes split the tails of others' items; then "exactly
// once" means the acked byte ranges of each (epoch, item) tile it exactly.
//
// A victim logs "about to ack" before Ack and "acked" after it (shared
// memory, so the log survives the kill). An item whose Ack the victim may or
// may not have finished counts once from the victim or once from a survivor:
// never twice, never zero times.
//
// Built twice: work_queue_crash_test (fast: TAILCUT_CRASH_TRIALS trials,
// default 200) and work_queue_crash_stress_test (TAILCUT_CRASH_STRESS: as many
// larger trials as fit in TAILCUT_STRESS_SECONDS, default 120). One trial can
// be repeated with TAILCUT_CRASH_TRIAL_SEED=<seed from a failure message> (in
// the same binary); TAILCUT_CRASH_ONLY=<point> puts every trial at one crash
// point; TAILCUT_CRASH_KEEP_DIR=<dir> keeps the segment of a failed trial.
#include <map>
#include <set>

#include "tests/engine/queue_test_util.h"

namespace tailcut::test {
namespace {

using std::chrono::milliseconds;

#ifdef TAILCUT_CRASH_STRESS
constexpr bool kStress = true;
#else
constexpr bool kStress = false;
#endif

const std::vector<std::string> kCrashPoints = {
    "create.after_excl",    "create.after_mutex", "create.before_ready", "take.after_reserve",
    "take.after_fetch_add", "take.after_ticket",  "ack.after_mark",      "ack.after_bit",
    "giveback.after_mark",  "recover.after_claim", "recover.mid_leases", "close.after_unregister",
    "split.after_reserve",  "split.after_cas",    "split.after_open"};

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 0) : fallback;
}

// One randomized scenario, fully determined by its seed.
struct Trial {
  uint64_t seed = 0;
  bool alone = false;        // victim runs alone first; fresh processes finish after it
  int workers = 3;           // survivors (together) or fresh processes (alone)
  uint64_t slices = 100;
  uint64_t epochs = 1;
  std::string point;         // crash point of the victim ("" = timer kill)
  uint64_t point_n = 1;
  int64_t kill_us = -1;      // timer kill of the victim after this many microseconds
  int64_t other_kill_us = -1;  // together: also kill worker 0; alone: a first victim killed this late
  uint64_t other_takes = 0;    // instead: that other victim kills itself after this many takes
  bool late_joiner = false;  // together: a fresh process joins after the victims are gone
  bool gate = false;         // together: start everyone at one instant
  uint32_t victim_batch = 1;
  double victim_give_back = 0.05;
  uint64_t spin_us = 10;
  bool reader = false;       // processes Claim chunks, so idle ones split others' tails
  uint64_t chunk_spin_us = 2;

  std::string Describe() const {
    std::ostringstream out;
    out << "trial seed " << seed << " (repeat: TAILCUT_CRASH_TRIAL_SEED=" << seed << "): "
        << (alone ? "alone" : "together") << ", " << workers << " workers, num_slices " << slices << ", "
        << epochs << " epochs, victim ";
    if (!point.empty()) {
      out << "crashes at " << point << ":" << point_n;
    } else {
      out << "SIGKILLed after " << kill_us << " us";
    }
    if (other_kill_us >= 0) {
      out << (alone ? ", after a first victim killed at " : ", worker 0 killed at ") << other_kill_us << " us";
    }
    if (other_takes > 0) {
      out << (alone ? ", after a first victim that died" : ", worker 0 dies") << " holding items after " << other_takes
          << " takes";
    }
    out << ", batch " << victim_batch << ", give back " << victim_give_back << ", spin " << spin_us << " us"
        << (late_joiner ? ", late joiner" : "") << (gate ? ", gate" : "")
        << (reader ? ", readers that Claim (tails split), chunk spin " + std::to_string(chunk_spin_us) + " us" : "");
    return out.str();
  }
};

Trial MakeTrial(uint64_t seed, int forced_point, int forced_alone) {
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  Trial t;
  t.seed = seed;
  t.alone = forced_alone >= 0 ? forced_alone == 1 : pick(0, 2) == 0;
  t.workers = static_cast<int>(kStress ? pick(1, 5) : pick(2, 3));
  t.slices = kStress ? pick(20, 500) : pick(50, 200);
  t.epochs = kStress ? pick(1, 3) : pick(1, 2);
  t.spin_us = pick(0, 30);
  t.victim_batch = static_cast<uint32_t>(pick(1, 3));
  t.gate = pick(0, 1) == 1;
  const bool crash = forced_point >= 0 || pick(0, 1) == 1;
  t.reader = pick(0, 1) == 1;
  if (crash) {
    t.point = kCrashPoints[forced_point >= 0 ? forced_point : pick(0, kCrashPoints.size() - 1)];
    if (t.point.rfind("split.", 0) == 0) t.reader = true;
    const uint64_t per = std::max<uint64_t>(1, t.slices * t.epochs / (t.workers + 1));
    if (t.point.rfind("take.", 0) == 0 || t.point.rfind("ack.", 0) == 0) {
      t.point_n = pick(1, per);
    } else if (t.point.rfind("giveback.", 0) == 0) {
      t.victim_give_back = 0.3;
      t.point_n = pick(1, std::max<uint64_t>(1, per / 4));
    } else if (t.point.rfind("split.", 0) == 0) {
      t.point_n = pick(1, 2);
    } else if (t.point.rfind("recover.", 0) == 0) {
      // The victim must find a dead client to recover: another process dies
      // holding items (after its first takes) before or while it runs.
      t.point_n = t.alone ? 1 : pick(1, 2);
      t.other_takes = pick(1, 4);
    }
  } else {
    t.kill_us = static_cast<int64_t>(pick(0, 4000));
    if (pick(0, 3) == 0) t.other_kill_us = static_cast<int64_t>(pick(0, 4000));
  }
  if (t.reader) {  // fewer, larger items: room to split tails
    t.slices = kStress ? pick(4, 40) : pick(6, 24);
    t.chunk_spin_us = pick(1, 8);
  }
  t.late_joiner = !t.alone && pick(0, 1) == 1;
  // Someone must be left to finish: with worker 0 dying too, keep another.
  if (!t.alone && (t.other_kill_us >= 0 || t.other_takes > 0)) t.workers = std::max(t.workers, 2);
  // The victim is spawned first: without a gate it is the likely creator.
  if (t.point.rfind("create.", 0) == 0) t.gate = false;
  return t;
}

enum class Role { kWorker, kVictim, kOtherVictim, kLateJoiner };

const char* RoleName(Role r) {
  switch (r) {
    case Role::kWorker: return "worker";
    case Role::kVictim: return "victim";
    case Role::kOtherVictim: return "other victim";
    case Role::kLateJoiner: return "late joiner";
  }
  return "?";
}

struct TrialResult {
  std::string failure;  // "" when the trial passed
  uint64_t pieces = 0;  // acked pieces split off other processes' items
  bool victim_died = false;
  bool point_fired = false;
  double ms = 0;
};

class CrashTrialRunner {
 public:
  CrashTrialRunner() : works_(dir_.Files("w", 3, {1 << 20, 3 << 20, 2 << 20})) {}

  // The item table for a num_slices (cached: a probe queue per value).
  const std::vector<WorkQueue::Item>& items_for(uint64_t slices) {
    auto it = tables_.find(slices);
    if (it == tables_.end()) it = tables_.emplace(slices, ItemTable(works_, slices)).first;
    return it->second;
  }

  TrialResult Run(const Trial& t) {
    const auto t0 = Clock::now();
    TrialResult out;
    QueueGuard guard(UniqueQueueName("crash"));
    WorkQueueOptions o = BaseOptions(guard.name(), works_);
    o.num_slices = t.slices;
    o.num_epochs = t.epochs;
    o.leases_per_client = 4;
    o.attach_timeout = milliseconds(1000);
    o.min_split_bytes = 64 << 10;
    const bool other = t.other_kill_us >= 0 || t.other_takes > 0;
    // Everyone who will ever join counts, so no early finisher removes the
    // queue before a later process has seen it.
    o.num_clients = static_cast<uint32_t>(1 + t.workers + (t.late_joiner ? 1 : 0) + (t.alone && other ? 1 : 0));
    const uint64_t cap = 6 * (t.slices + works_.size()) * t.epochs + 64;
    Children kids(t.workers + 3, cap);
    std::vector<Role> roles;
    std::mt19937_64 rng(t.seed ^ 0xA5A5A5A5u);

    auto spawn = [&](Role role, const std::string& crash_at, StartGate* gate) {
      WorkerOptions w;
      w.spin_us = t.spin_us;
      w.progress = 0.2;
      w.take_timeout = milliseconds(15000);
      w.rng_seed = t.seed + roles.size();
      if (t.reader) {
        w.claim_chunk = 16 << 10;
        w.chunk_spin_us = t.chunk_spin_us;
        // A victim meant to die while splitting must be the one that runs
        // dry first: it reads fast, the others slowly.
        if (t.point.rfind("split.", 0) == 0) {
          if (role == Role::kVictim) {
            w.chunk_spin_us = 0;
            w.spin_us = 0;
          } else {
            w.chunk_spin_us = t.chunk_spin_us + 6;
          }
        }
      }
      if (role == Role::kVictim) {
        w.batch = t.victim_batch;
        w.give_back = t.victim_give_back;
      } else if (role == Role::kOtherVictim && t.other_takes > 0) {
        w.batch = 3;
        w.die_after_takes = t.other_takes;
      } else {
        w.batch = static_cast<uint32_t>(1 + rng() % 2);
        w.give_back = 0.02;
      }
      roles.push_back(role);
      return kids.Spawn([&o, w, crash_at, gate](ChildContext& c) {
        if (!crash_at.empty()) ::setenv("TAILCUT_CRASH_AT", crash_at.c_str(), 1);
        if (gate != nullptr && !gate->Wait(milliseconds(20000))) return c.Fail("start gate never opened");
        auto q = WorkQueue::Open(o);
        return RunWorker(*q, c, w);  // the destructor closes
      });
    };
    auto kill_after = [&](size_t i, Clock::time_point start, int64_t us) {
      const auto when = start + std::chrono::microseconds(us);
      while (Clock::now() < when) {
        if (kids.Poll(i)) return;
        ::usleep(50);
      }
      kids.Kill(i, SIGKILL);
    };
    const std::string crash_at = t.point.empty() ? "" : t.point + ":" + std::to_string(t.point_n);

    size_t victim = 0;
    const auto deadline = Clock::now() + milliseconds(40000);
    if (t.alone) {
      if (other) {  // a first victim dies alone, holding items
        const size_t first = spawn(Role::kOtherVictim, "", nullptr);
        if (t.other_kill_us >= 0) kill_after(first, Clock::now(), t.other_kill_us);
        kids.Wait(first, deadline);
      }
      victim = spawn(Role::kVictim, crash_at, nullptr);
      if (t.kill_us >= 0) kill_after(victim, Clock::now(), t.kill_us);
      kids.Wait(victim, deadline);
      for (int k = 0; k < t.workers; ++k) spawn(Role::kWorker, "", nullptr);
    } else {
      StartGate gate;
      StartGate* g = t.gate ? &gate : nullptr;
      victim = spawn(Role::kVictim, crash_at, g);
      for (int k = 0; k < t.workers; ++k) spawn(k == 0 && other ? Role::kOtherVictim : Role::kWorker, "", g);
      gate.Open();
      const auto start = Clock::now();
      // Timer kills, earliest first.
      std::vector<std::pair<int64_t, size_t>> kills;
      if (t.kill_us >= 0) kills.push_back({t.kill_us, victim});
      if (t.other_kill_us >= 0) kills.push_back({t.other_kill_us, victim + 1});
      std::sort(kills.begin(), kills.end());
      for (const auto& [us, i] : kills) kill_after(i, start, us);
      if (t.late_joiner) {
        kids.Wait(victim, deadline);
        if (other) kids.Wait(victim + 1, deadline);
        spawn(Role::kLateJoiner, "", nullptr);
      }
    }
    std::vector<ChildResult> results;
    for (size_t i = 0; i < kids.size(); ++i) results.push_back(kids.Wait(i, deadline));
    out.ms = MillisSince(t0);
    out.victim_died = results[victim].Killed();
    out.point_fired = out.victim_died && t.kill_us < 0;

    std::ostringstream fail;
    for (size_t i = 0; i < kids.size(); ++i) {
      const ChildResult& r = results[i];
      const bool may_die = roles[i] == Role::kVictim || roles[i] == Role::kOtherVictim;
      if (r.Ok() && kids.Value(i, kValueTakeEnd) == 1) continue;
      if (may_die && (r.Killed() || r.Ok())) continue;
      fail << "\n  " << RoleName(roles[i]) << " " << i << ": " << r.Describe();
    }
    // Byte ranges acked per (epoch, item): confirmed ones, and the one
    // in-flight Ack of each process that was killed.
    Coverage cov(items_for(t.slices), t.epochs);
    uint64_t pieces = 0;
    for (size_t i = 0; i < kids.size(); ++i) {
      std::optional<Record> pending;
      for (const Record& r : kids.Records(i)) {
        if (r.kind == Rec::kIntent) pending = r;
        if (r.kind == Rec::kAcked) {
          if (!cov.Add(r.epoch, r.index, r.begin, r.end)) fail << "\n  child " << i << " acked an item outside the queue";
          pieces += r.flags;
          pending.reset();
        }
        if (r.kind == Rec::kStale) fail << "\n  child " << i << ": kStale ack without a lease timeout";
      }
      if (pending && results[i].Killed()) cov.AddUncertain(pending->epoch, pending->index, pending->begin, pending->end);
      if (kids.Overflowed(i)) fail << "\n  child " << i << " overflowed its log";
    }
    out.pieces = pieces;
    if (std::string bad = cov.Check(); !bad.empty()) fail << "\n  " << bad;
    // A segment that is still there (not every expected client ended
    // cleanly) must be readable and finished.
    if (PathExists(SegmentPath(o.name)) && fail.str().empty()) {
      try {
        const QueueStats s = InspectQueue(o.name);
        if (s.done != s.total || s.in_flight != 0) {
          fail << "\n  leftover segment: done " << s.done << " of " << s.total << ", in flight " << s.in_flight;
        }
      } catch (const tailcut::Error& e) {
        fail << "\n  leftover segment cannot be inspected: " << ErrorText(e);
      }
    }
    if (!fail.str().empty()) {
      out.failure = t.Describe() + fail.str();
      // Keep the segment for a post-mortem when asked to.
      if (const char* keep = std::getenv("TAILCUT_CRASH_KEEP_DIR"); keep != nullptr && PathExists(SegmentPath(o.name))) {
        const std::string to = std::string(keep) + "/crash_" + std::to_string(t.seed) + ".seg";
        std::error_code ec;
        std::filesystem::copy_file(SegmentPath(o.name), to, std::filesystem::copy_options::overwrite_existing, ec);
        out.failure += "\n  segment copied to " + (ec ? "(failed: " + ec.message() + ")" : to);
      }
    }
    return out;
  }

 private:
  TempDir dir_;
  std::vector<std::string> works_;
  std::map<uint64_t, std::vector<WorkQueue::Item>> tables_;
};

TEST(WorkQueueCrashTest, KillAtRandomPointsLosesNothingAndNobodyHangs) {
  CrashTrialRunner runner;
  if (const uint64_t one = EnvU64("TAILCUT_CRASH_TRIAL_SEED", 0); one != 0) {
    const TrialResult r = runner.Run(MakeTrial(one, -1, -1));
    EXPECT_EQ(r.failure, "");
    return;
  }
  // TAILCUT_CRASH_ONLY=<point> runs every trial at that crash point.
  int only = -1;
  if (const char* p = std::getenv("TAILCUT_CRASH_ONLY"); p != nullptr && *p != '\0') {
    const auto it = std::find(kCrashPoints.begin(), kCrashPoints.end(), std::string(p));
    ASSERT_NE(it, kCrashPoints.end()) << "unknown crash point " << p;
    only = static_cast<int>(it - kCrashPoints.begin());
  }
  const uint64_t base = TestSeed();
  RecordProperty("base_seed", std::to_string(base));
  const uint64_t trials = kStress ? ~0ull : EnvU64("TAILCUT_CRASH_TRIALS", 200);
  const auto budget = std::chrono::seconds(kStress ? EnvU64("TAILCUT_STRESS_SECONDS", 120) : 100000);
  const auto start = Clock::now();
  std::map<std::string, std::pair<int, int>> by_point;  // point -> (trials, fired)
  int failures = 0, victims_died = 0;
  uint64_t pieces = 0;
  uint64_t ran = 0;
  double slowest = 0;
  for (uint64_t i = 0; i < trials && Clock::now() - start < budget; ++i) {
    // The first trials visit every crash point twice, together and alone.
    const int forced = only >= 0 ? only : i < 2 * kCrashPoints.size() ? static_cast<int>(i / 2) : -1;
    const int forced_alone = i < 2 * kCrashPoints.size() ? static_cast<int>(i % 2) : -1;
    const Trial t = MakeTrial(base + i * 0x9E3779B97F4A7C15ull, forced, forced_alone);
    const TrialResult r = runner.Run(t);
    ++ran;
    slowest = std::max(slowest, r.ms);
    victims_died += r.victim_died;
    pieces += r.pieces;
    if (!t.point.empty()) {
      by_point[t.point].first++;
      by_point[t.point].second += r.point_fired;
    }
    if (!r.failure.empty()) {
      ADD_FAILURE() << r.failure;
      if (++failures >= (kStress ? 10 : 5)) break;
    }
  }
  std::ostringstream coverage;
  for (const auto& [point, tf] : by_point) coverage << point << "=" << tf.second << "/" << tf.first << " ";
  RecordProperty("trials", std::to_string(ran));
  RecordProperty("victims_died", std::to_string(victims_died));
  RecordProperty("split_pieces_acked", std::to_string(pieces));
  RecordProperty("crash_points_fired", coverage.str());
  RecordProperty("slowest_trial_ms", std::to_string(slowest));
  RecordProperty("elapsed_s", std::to_string(MillisSince(start) / 1000));
  std::printf("%llu trials, %d victims died, %llu split pieces acked, %d failed; crash points fired/tried: %s\n",
              static_cast<unsigned long long>(ran), victims_died, static_cast<unsigned long long>(pieces), failures,
              coverage.str().c_str());
  // Totals in the form soak reports are read in: a trial passes when nothing
  // was lost, nothing was acked twice and nobody hung.
  std::printf("crash soak: %llu passed, %d failed\n",
              static_cast<unsigned long long>(ran - static_cast<uint64_t>(failures)), failures);
  for (const std::string& p : kCrashPoints) {
    if (by_point[p].first > 0 && by_point[p].second == 0) {
      std::printf("note: crash point %s never fired in %d trials\n", p.c_str(), by_point[p].first);
    }
  }
}

}  // namespace
}  // namespace tailcut::test
