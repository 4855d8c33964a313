// The atomic type of every word the queue shares through its segment.
//
// In the library it is std::atomic. A test build of the engine that defines
// TAILCUT_DETERMINISTIC_SCHEDULE gets an atomic of the same size and layout
// that calls detail::SchedulePoint() before each operation: a seeded
// scheduler (tests/engine/deterministic_schedule.h) then decides which
// thread runs next, so one seed is one interleaving of the queue's atomics,
// run again by running the seed again. The engine's clocks then read the
// scheduler's logical clock (ScheduleClockNs), so that decisions made on
// time (split shares, housekeeping, lease timeouts) repeat with the seed.
//
// Every operation on a shared word names its memory order and, where it
// synchronises, the operation it pairs with; the seq_cst defaults below only
// mirror std::atomic's and pass the caller's order through unchanged.
#ifndef TAILCUT_ENGINE_SHARED_ATOMIC_H_
#define TAILCUT_ENGINE_SHARED_ATOMIC_H_

#include <atomic>

namespace tailcut::detail {

#ifndef TAILCUT_DETERMINISTIC_SCHEDULE

template <class T>
using SharedAtomic = std::atomic<T>;

#else

// Defined by the scheduler of the test; a no-op in threads it does not run.
void SchedulePoint() noexcept;
// Advances with every schedule point, and a little with every read.
uint64_t ScheduleClockNs() noexcept;

template <class T>
class SharedAtomic {
 public:
  SharedAtomic() noexcept = default;
  SharedAtomic(const SharedAtomic&) = delete;
  SharedAtomic& operator=(const SharedAtomic&) = delete;

  T load(std::memory_order o = std::memory_order_seq_cst) const noexcept {
    SchedulePoint();
    return a_.load(o);
  }
  void store(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    a_.store(v, o);
  }
  T exchange(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.exchange(v, o);
  }
  bool compare_exchange_strong(T& expected, T desired,
                               std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.compare_exchange_strong(expected, desired, o);
  }
  bool compare_exchange_strong(T& expected, T desired, std::memory_order success,
                               std::memory_order failure) noexcept {
    SchedulePoint();
    return a_.compare_exchange_strong(expected, desired, success, failure);
  }
  bool compare_exchange_weak(T& expected, T desired,
                             std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.compare_exchange_weak(expected, desired, o);
  }
  bool compare_exchange_weak(T& expected, T desired, std::memory_order success,
                             std::memory_order failure) noexcept {
    SchedulePoint();
    return a_.compare_exchange_weak(expected, desired, success, failure);
  }
  T fetch_add(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.fetch_add(v, o);
  }
  T fetch_sub(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.fetch_sub(v, o);
  }
  T fetch_or(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.fetch_or(v, o);
  }
  T fetch_and(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
    SchedulePoint();
    return a_.fetch_and(v, o);
  }

 private:
  std::atomic<T> a_;
};

#endif

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_SHARED_ATOMIC_H_
