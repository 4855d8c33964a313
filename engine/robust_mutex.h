// Robust, process-shared pthread mutexes in a segment, and the two ways the
// engine holds them.
//
// A robust mutex tells its next locker that the holder died (EOWNERDEAD):
// the queue and the batch ring use that to learn of a dead process (each
// client holds its own "life" mutex for as long as it is open) and to
// recover a half-done admin change. Segments are not trusted: every mutex
// read from one is checked to be a robust mutex of the kind InitRobustMutex
// makes before any pthread call touches it (glibc trusts the kind field; a
// bad one can select lock elision and die with SIGILL), and every blocking
// lock has a deadline (a hostile segment can claim a holder that never lets
// go).
//
// Thread-safety: the functions are as the pthread calls they wrap.
// LifeHolder and RobustLock are for one thread at a time.
#ifndef TAILCUT_ENGINE_ROBUST_MUTEX_H_
#define TAILCUT_ENGINE_ROBUST_MUTEX_H_

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace tailcut::detail {

void InitRobustMutex(pthread_mutex_t* mu);
// True if *mu carries exactly the kind InitRobustMutex gives.
bool IsRobustMutex(const pthread_mutex_t* mu) noexcept;
// pthread_mutex_trylock behind IsRobustMutex: EINVAL for a damaged mutex.
int TryLockRobust(pthread_mutex_t* mu) noexcept;
// Locks with a deadline. Returns 0 (locked), ETIMEDOUT or another errno (a
// damaged mutex); sets *died if the previous holder died (the mutex is made
// consistent and locked).
int LockRobustFor(pthread_mutex_t* mu, std::chrono::milliseconds timeout, bool* died);

// Holds a client's life mutex on a thread of its own, so the mutex lives as
// long as the object that opened it (a WorkQueue, a BatchRing) rather than
// the thread that opened it: robust mutexes belong to threads, and Python
// threads come and go. Given a beat, the same thread calls it every period
// while it holds the mutex: a heartbeat apart from the process's work, which
// stops only when the whole process does (SIGSTOP, a frozen container).
class LifeHolder {
 public:
  LifeHolder() = default;
  LifeHolder(const LifeHolder&) = delete;
  LifeHolder& operator=(const LifeHolder&) = delete;
  ~LifeHolder() { Stop(); }

  // Locks *life on the holder's thread. Returns false if another holds it
  // (or it is damaged); then no thread is left running. beat (if any) runs
  // on that thread once the mutex is held, then every period until Stop;
  // it must not throw.
  bool Start(pthread_mutex_t* life, std::function<void()> beat = nullptr,
             std::chrono::nanoseconds period = std::chrono::seconds(1));
  // Unlocks it and ends the thread. Idempotent.
  void Stop();

 private:
  pthread_mutex_t* life_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, locked_ = false, release_ = false;
};

// A scoped lock of a robust mutex (a segment's admin mutex): Lock with a
// deadline, unlocked at the latest when it goes out of scope.
class RobustLock {
 public:
  explicit RobustLock(pthread_mutex_t* mu) : mu_(mu) {}
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;
  ~RobustLock() { Unlock(); }

  // As LockRobustFor.
  int Lock(std::chrono::milliseconds timeout, bool* died) {
    int rc = LockRobustFor(mu_, timeout, died);
    locked_ = rc == 0;
    return rc;
  }
  void Unlock() {
    if (locked_) pthread_mutex_unlock(mu_);
    locked_ = false;
  }

 private:
  pthread_mutex_t* mu_;
  bool locked_ = false;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_ROBUST_MUTEX_H_
