// A seeded scheduler for the queue's atomics, in the manner of folly's
// DeterministicSchedule.
//
// Run(bodies) starts one thread per body but lets exactly one of them run at
// a time. The engine, built with TAILCUT_DETERMINISTIC_SCHEDULE, calls
// detail::SchedulePoint() before every operation on a shared atomic; there
// the running thread hands the turn to a thread the seeded generator picks
// (possibly itself). One seed is one interleaving of every atomic operation
// of the bodies; running the seed again runs it again, as long as the
// bodies themselves make the same choices (seed their generators from it)
// and do not block in the kernel while holding the turn.
//
// With pauses, a thread may be put to sleep at any schedule point, inside an
// engine call as well, for a number of points: the others run meanwhile, as
// they would beside a process stopped by SIGSTOP or a long GC pause. The
// logical clock (1 us per point) runs on, so lease timeouts expire.
//
// Threads the scheduler did not start (e.g. a WorkQueue's holder thread) pass
// through SchedulePoint() untouched. One Run at a time per process.
#ifndef TAILCUT_TESTS_ENGINE_DETERMINISTIC_SCHEDULE_H_
#define TAILCUT_TESTS_ENGINE_DETERMINISTIC_SCHEDULE_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace tailcut::test {

class DeterministicSchedule {
 public:
  struct Pauses {
    double chance = 0;  // per schedule point of the running thread
    uint64_t min_points = 0, max_points = 0;
  };

  explicit DeterministicSchedule(uint64_t seed) : seed_(seed) {}
  DeterministicSchedule(uint64_t seed, Pauses pauses) : seed_(seed), pauses_(pauses) {}

  // Runs every body to its end, interleaved at the schedule points. Returns
  // the number of schedule points passed.
  uint64_t Run(std::vector<std::function<void()>> bodies);

  // From a running body: a schedule point of its own (e.g. in a loop that
  // waits for others without touching a shared atomic).
  static void Yield() noexcept;

 private:
  uint64_t seed_;
  Pauses pauses_;
};

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_DETERMINISTIC_SCHEDULE_H_
