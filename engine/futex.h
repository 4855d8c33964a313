// Futex waits and wakes on a 32-bit word, the engine's only sleep.
//
// Shared futexes work across processes on a word in a MAP_SHARED segment (the
// queue's wake and step sequences, the batch ring's); private ones only
// between threads of a process, and cost less. A wait returns when woken,
// when the word no longer holds `expected`, after timeout_ns, or on a signal:
// callers always look at their condition again, so a spurious return is
// harmless. Waits are bounded by the caller's slice: a process that dies
// wakes nobody.
#ifndef TAILCUT_ENGINE_FUTEX_H_
#define TAILCUT_ENGINE_FUTEX_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

namespace tailcut::detail {

enum class FutexScope { kShared, kPrivate };

// `Word` is an atomic (std::atomic<uint32_t> or SharedAtomic<uint32_t>)
// whose storage is the 32-bit word itself.
template <class Word>
void FutexWait(Word& word, uint32_t expected, uint64_t timeout_ns,
               FutexScope scope = FutexScope::kShared) noexcept {
  static_assert(sizeof(Word) == sizeof(uint32_t), "a futex is one 32-bit word");
  struct timespec ts = {static_cast<time_t>(timeout_ns / 1000000000ull),
                        static_cast<long>(timeout_ns % 1000000000ull)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word),
            scope == FutexScope::kShared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
            0);
}

// Wakes up to `count` waiters (INT_MAX: all).
template <class Word>
void FutexWake(Word& word, int count, FutexScope scope = FutexScope::kShared) noexcept {
  static_assert(sizeof(Word) == sizeof(uint32_t), "a futex is one 32-bit word");
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word),
            scope == FutexScope::kShared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, count, nullptr, nullptr,
            0);
}

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_FUTEX_H_
