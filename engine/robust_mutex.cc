#include "engine/robust_mutex.h"

#include <time.h>

#include <cerrno>

namespace tailcut::detail {

void InitRobustMutex(pthread_mutex_t* mu) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mu, &attr);
  pthread_mutexattr_destroy(&attr);
}

namespace {

int RobustMutexKind() {
  static const int kind = [] {
    pthread_mutex_t mu;
    InitRobustMutex(&mu);
    int k = mu.__data.__kind;
    pthread_mutex_destroy(&mu);
    return k;
  }();
  return kind;
}

}  // namespace

bool IsRobustMutex(const pthread_mutex_t* mu) noexcept {
  // Relaxed: the kind is written once, by InitRobustMutex before the segment
  // is published; a damaged one is what this check is for.
  return __atomic_load_n(&mu->__data.__kind, __ATOMIC_RELAXED) == RobustMutexKind();
}

int TryLockRobust(pthread_mutex_t* mu) noexcept {
  if (!IsRobustMutex(mu)) return EINVAL;
  return pthread_mutex_trylock(mu);
}

int LockRobustFor(pthread_mutex_t* mu, std::chrono::milliseconds timeout, bool* died) {
  *died = false;
  if (!IsRobustMutex(mu)) return EINVAL;
  // Wait in short slices: when a holder dies while others wait, glibc may
  // wake none of them (glibc bug 19402), so each slice tries again.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    struct timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);  // pthread_mutex_timedlock's clock
    ts.tv_nsec += 5'000'000;
    if (ts.tv_nsec >= 1'000'000'000) {
      ts.tv_sec += 1;
      ts.tv_nsec -= 1'000'000'000;
    }
    int rc = pthread_mutex_timedlock(mu, &ts);
    if (rc == EOWNERDEAD) {
      *died = true;
      pthread_mutex_consistent(mu);
      return 0;
    }
    if (rc != ETIMEDOUT || std::chrono::steady_clock::now() >= deadline) return rc;
  }
}

bool LifeHolder::Start(pthread_mutex_t* life, std::function<void()> beat,
                       std::chrono::nanoseconds period) {
  life_ = life;
  started_ = locked_ = release_ = false;
  thread_ = std::thread([this, beat = std::move(beat), period] {
    int rc = TryLockRobust(life_);
    if (rc == EOWNERDEAD) {
      // Its last holder died after its recoverer freed the slot: nothing
      // left to repair.
      pthread_mutex_consistent(life_);
      rc = 0;
    }
    std::unique_lock<std::mutex> lock(mu_);
    locked_ = rc == 0;
    started_ = true;
    cv_.notify_all();
    if (!locked_) return;
    if (beat) {
      beat();
      while (!cv_.wait_for(lock, period, [this] { return release_; })) beat();
    } else {
      cv_.wait(lock, [this] { return release_; });
    }
    pthread_mutex_unlock(life_);
  });
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return started_; });
  if (!locked_) {
    lock.unlock();
    thread_.join();
  }
  return locked_;
}

void LifeHolder::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    release_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace tailcut::detail
