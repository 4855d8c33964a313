// tests/engine/test_basics.h: small helpers every engine and io test uses:
// errno and error texts, substring checks, clocks, busy waits, and numbers and
// seeds from the environment.
#ifndef TAILCUT_TESTS_ENGINE_TEST_BASICS_H_
#define TAILCUT_TESTS_ENGINE_TEST_BASICS_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "tailcut/error.h"

namespace tailcut::test {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

inline std::string ErrnoText(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

inline bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

inline bool ContainsNoCase(std::string_view haystack, std::string_view needle) {
  std::string h(haystack), n(needle);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h.find(n) != std::string::npos;
}

inline bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

inline double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Busy-waits about `us` microseconds (sleeping is too coarse for per-item work).
inline void Spin(uint64_t us) {
  const auto end = Clock::now() + microseconds(us);
  while (Clock::now() < end) {
  }
}

// A number from the environment (decimal, 0x hex or 0 octal), else fallback.
inline uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 0) : fallback;
}

// A seed for randomized tests: TAILCUT_TEST_SEED if set, else the clock. Tests
// print it on failure so a run can be repeated.
inline uint64_t TestSeed() {
  return EnvU64("TAILCUT_TEST_SEED",
                static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                    (static_cast<uint64_t>(::getpid()) << 32));
}

inline std::string ErrorText(const tailcut::Error& e) {
  return std::string("tailcut::Error(") + ErrorKindName(e.kind()) + "): " + e.what();
}

}  // namespace tailcut::test

#endif  // TAILCUT_TESTS_ENGINE_TEST_BASICS_H_
