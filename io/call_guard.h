// io/call_guard.h: catches two threads in a reader's Next* calls at once.
//
// A reader (Reader, GlobalOrderReader) is used by one thread at a time; it
// may move between threads, not be shared by them. Each Next* call begins
// with Enter(): false when another call is under way, and the call then
// returns kError at once, touching nothing. The call under way sees
// overlapped() before it ends and fails the reader (a sticky error, its
// items given back), then Leave()s. Relaxed throughout: the flags only
// detect an overlap and order nothing; the caller's own synchronisation hands
// a reader from thread to thread.
#ifndef TAILCUT_IO_CALL_GUARD_H_
#define TAILCUT_IO_CALL_GUARD_H_

#include <atomic>

namespace tailcut::detail {

class CallGuard {
 public:
  bool Enter() noexcept {
    if (!in_use_.exchange(true, std::memory_order_relaxed)) return true;
    overlapped_.store(true, std::memory_order_relaxed);
    return false;
  }
  // Whether a call overlapped one of this reader's, ever (sticky, as the
  // reader's error is).
  bool overlapped() const noexcept { return overlapped_.load(std::memory_order_relaxed); }
  void Leave() noexcept { in_use_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> in_use_{false};      // a Next* call is under way
  std::atomic<bool> overlapped_{false};  // two were
};

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_CALL_GUARD_H_
