#include "tests/engine/deterministic_schedule.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <semaphore>
#include <thread>

#include "engine/shared_atomic.h"

namespace tailcut {
namespace {

// The run in progress: who has finished, and one semaphore per thread that
// is released when it is that thread's turn (one wakeup per switch).
struct Turns {
  std::mutex mu;
  std::vector<std::unique_ptr<std::binary_semaphore>> go;
  std::vector<bool> done;
  std::vector<uint64_t> asleep_until;  // in points: paused until then
  std::mt19937_64 rng;
  double stay = 0;  // chance that the running thread keeps the turn
  uint64_t points = 0;
  test::DeterministicSchedule::Pauses pauses;
  std::mt19937_64 pause_rng;  // apart, so that seeds without pauses keep their interleavings
};

Turns* g_turns = nullptr;
// The logical clock: 1 us per schedule point, 1 ns per read, from a start far
// from 0 (0 means "never" in the segment's stamps).
std::atomic<uint64_t> g_clock_ns{uint64_t{1} << 40};
thread_local int t_id = -1;  // index of the body this thread runs; -1: not scheduled

// The next thread to run (mu held): the current one with chance `stay`,
// else any unfinished one that is not paused, uniformly; when all are
// paused, time skips to the first that wakes. -1 when all are done.
int PickLocked(Turns& s, int current) {
  if (current >= 0 && s.pauses.chance > 0 &&
      std::uniform_real_distribution<double>(0, 1)(s.pause_rng) < s.pauses.chance) {
    s.asleep_until[current] = s.points + s.pauses.min_points +
                              s.pause_rng() % (s.pauses.max_points - s.pauses.min_points + 1);
  }
  const auto awake = [&](size_t i) { return !s.done[i] && s.asleep_until[i] <= s.points; };
  if (current >= 0 && awake(current) &&
      std::uniform_real_distribution<double>(0, 1)(s.rng) < s.stay) {
    return current;
  }
  std::vector<int> alive;
  for (size_t i = 0; i < s.done.size(); ++i) {
    if (awake(i)) alive.push_back(static_cast<int>(i));
  }
  if (alive.empty()) {
    uint64_t first = ~uint64_t{0};
    for (size_t i = 0; i < s.done.size(); ++i) {
      if (!s.done[i]) first = std::min(first, s.asleep_until[i]);
    }
    if (first == ~uint64_t{0}) return -1;
    g_clock_ns.fetch_add((first - s.points) * 1000, std::memory_order_relaxed);
    s.points = first;
    for (size_t i = 0; i < s.done.size(); ++i) {
      if (awake(i)) alive.push_back(static_cast<int>(i));
    }
  }
  return alive[s.rng() % alive.size()];
}

void HandOff() noexcept {
  Turns& s = *g_turns;
  int next;
  g_clock_ns.fetch_add(1000, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.points;
    next = PickLocked(s, t_id);
  }
  if (next == t_id) return;
  s.go[next]->release();
  s.go[t_id]->acquire();
}

}  // namespace

namespace detail {
void SchedulePoint() noexcept {
  if (t_id >= 0) HandOff();
}
uint64_t ScheduleClockNs() noexcept { return g_clock_ns.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

namespace test {

void DeterministicSchedule::Yield() noexcept { detail::SchedulePoint(); }

uint64_t DeterministicSchedule::Run(std::vector<std::function<void()>> bodies) {
  Turns turns;
  turns.rng.seed(seed_);
  const double stays[] = {0.0, 0.5, 0.9};
  turns.stay = stays[turns.rng() % 3];
  turns.done.assign(bodies.size(), false);
  turns.asleep_until.assign(bodies.size(), 0);
  turns.pauses = pauses_;
  turns.pause_rng.seed(seed_ ^ 0x5DEECE66Dull);
  for (size_t i = 0; i < bodies.size(); ++i)
    turns.go.push_back(std::make_unique<std::binary_semaphore>(0));
  g_turns = &turns;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i) {
    threads.emplace_back([&turns, &bodies, i] {
      turns.go[i]->acquire();
      t_id = static_cast<int>(i);
      bodies[i]();
      t_id = -1;
      int next;
      {
        std::lock_guard<std::mutex> lock(turns.mu);
        turns.done[i] = true;
        next = PickLocked(turns, -1);
      }
      if (next >= 0) turns.go[next]->release();
    });
  }
  int first;
  {
    std::lock_guard<std::mutex> lock(turns.mu);
    first = PickLocked(turns, -1);
  }
  if (first >= 0) turns.go[first]->release();
  for (std::thread& t : threads) t.join();
  g_turns = nullptr;
  return turns.points;
}

}  // namespace test
}  // namespace tailcut
