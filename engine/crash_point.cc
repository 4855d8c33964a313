#include "engine/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tailcut::detail {

std::atomic<bool> g_crash_points_armed{false};

namespace {
char g_crash_point[64];
std::atomic<long> g_crash_countdown{1};
}  // namespace

void LoadCrashPointFromEnvironment() {
  // Read at every Open, not once per process: a test's child process may
  // set the variable after its parent (whose memory it copies) opened a queue.
  const char* spec = std::getenv("TAILCUT_CRASH_AT");
  if (spec == nullptr || *spec == '\0' || g_crash_points_armed.load()) return;
  std::string s(spec);
  size_t colon = s.find(':');
  std::string point = s.substr(0, colon);
  if (point.size() >= sizeof(g_crash_point)) return;
  std::memcpy(g_crash_point, point.c_str(), point.size() + 1);
  if (colon != std::string::npos)
    g_crash_countdown = std::max(1L, std::atol(s.c_str() + colon + 1));
  g_crash_points_armed.store(true);
}

void CrashPointSlow(const char* point) noexcept {
  if (std::strcmp(g_crash_point, point) != 0) return;
  if (g_crash_countdown.fetch_sub(1) == 1) ::kill(::getpid(), SIGKILL);
}

}  // namespace tailcut::detail
