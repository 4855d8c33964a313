// Crash injection for tests of kill -9 at exact points.
//
// TAILCUT_CRASH_AT=<point>[:<n>] makes the process SIGKILL itself the n-th
// time (default 1st) it reaches <point>. Read when a queue is opened, until
// one is armed; costs one predictable branch per point when unset.
#ifndef TAILCUT_ENGINE_CRASH_POINT_H_
#define TAILCUT_ENGINE_CRASH_POINT_H_

#include <atomic>

namespace tailcut::detail {

extern std::atomic<bool> g_crash_points_armed;
void LoadCrashPointFromEnvironment();
void CrashPointSlow(const char* point) noexcept;

inline void CrashPoint(const char* point) noexcept {
  if (g_crash_points_armed.load(std::memory_order_relaxed)) [[unlikely]]
    CrashPointSlow(point);
}

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_CRASH_POINT_H_
