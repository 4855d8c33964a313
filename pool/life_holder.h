// Holds a client's robust life mutex on a thread of its own, so the mutex
// lives as long as the BatchRing rather than the thread that opened it
// (robust mutexes belong to threads; Python threads come and go).
#ifndef TAILCUT_POOL_LIFE_HOLDER_H_
#define TAILCUT_POOL_LIFE_HOLDER_H_

#include <pthread.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/queue_core.h"

namespace tailcut::detail {

class RingLifeHolder {
 public:
  // Returns false if the mutex is held by someone else (or damaged).
  bool Start(pthread_mutex_t* life) {
    life_ = life;
    started_ = locked_ = release_ = false;
    thread_ = std::thread([this] {
      int rc = TryLockRobust(life_);
      if (rc == EOWNERDEAD) {
        // Its last holder died after its recoverer freed the slot.
        pthread_mutex_consistent(life_);
        rc = 0;
      }
      std::unique_lock<std::mutex> lock(mu_);
      locked_ = rc == 0;
      started_ = true;
      cv_.notify_all();
      if (!locked_) return;
      cv_.wait(lock, [this] { return release_; });
      pthread_mutex_unlock(life_);
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return started_; });
    if (!locked_) thread_.join();
    return locked_;
  }

  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  ~RingLifeHolder() { Stop(); }

 private:
  pthread_mutex_t* life_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, locked_ = false, release_ = false;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_POOL_LIFE_HOLDER_H_
