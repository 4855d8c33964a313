#include "engine/clock.h"

#include <time.h>

#include "engine/shared_atomic.h"  // ScheduleClockNs, in a scheduled build

namespace tailcut::detail {

namespace {

uint64_t Read(clockid_t clock) noexcept {
  struct timespec ts;
  ::clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

uint64_t MonotonicNs() noexcept {
#ifdef TAILCUT_DETERMINISTIC_SCHEDULE
  return ScheduleClockNs();
#else
  return Read(CLOCK_MONOTONIC);
#endif
}

uint64_t CoarseNs() noexcept {
#ifdef TAILCUT_DETERMINISTIC_SCHEDULE
  return ScheduleClockNs();
#else
  return Read(CLOCK_MONOTONIC_COARSE);
#endif
}

uint64_t RealtimeNs() noexcept { return Read(CLOCK_REALTIME); }

}  // namespace tailcut::detail
