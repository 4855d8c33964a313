// The pread backend: a few worker threads, each running one pread(2) per
// request. Requests travel through a oneTBB bounded queue whose blocking pop
// spins briefly and then sleeps on a futex, so an idle worker costs nothing.
// Results come back through a lock-free queue; a waiting Reap sleeps on a
// futex word the workers bump after each result, with a timeout, so that the
// Reader can tell a stalled device from a slow one (as with io_uring).
#include <tbb/concurrent_queue.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/futex.h"
#include "io/io_backend.h"
#include "tailcut/error.h"

namespace tailcut::detail {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class PreadBackend final : public IoBackend {
 public:
  PreadBackend(uint32_t threads, uint32_t queue_depth) {
    // Bounded by what the caller may have outstanding, so pushes never block.
    requests_.set_capacity(queue_depth + threads);
    staged_.reserve(queue_depth);
    try {
      for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
    } catch (const std::system_error& e) {
      Stop();
      throw Error(ErrorKind::kIo, std::string("reader: cannot start pread threads: ") + e.what());
    }
  }

  ~PreadBackend() override { Stop(); }

  void Prepare(const ReadRequest& request) noexcept override { staged_.push_back(request); }

  int Submit() noexcept override {
    for (const ReadRequest& request : staged_) requests_.push(request);
    staged_.clear();
    return 0;
  }

  int Reap(ReadResult* out, int max, bool wait) noexcept override {
    Submit();
    int n = 0;
    while (n < max && results_.try_pop(out[n])) ++n;
    if (n > 0 || !wait || max <= 0) return n;
    // A read of a hot chunk takes tens of microseconds: poll a little before
    // paying for a sleep and a wake-up.
    for (int spin = 0; spin < kSpins; ++spin) {
      if (results_.try_pop(out[0])) {
        n = 1;
        while (n < max && results_.try_pop(out[n])) ++n;
        return n;
      }
      CpuRelax();
    }
    const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
    for (;;) {
      // Acquire pairs with the worker's release increment after its push: a
      // result pushed before the value we saw is visible to try_pop; one
      // pushed after changes the value, so the wait returns at once.
      uint32_t seen = completions_.load(std::memory_order_acquire);
      if (results_.try_pop(out[0])) break;
      auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds::zero()) return 0;
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      detail::FutexWait(completions_, seen, static_cast<uint64_t>(ns),
                        detail::FutexScope::kPrivate);
    }
    n = 1;
    while (n < max && results_.try_pop(out[n])) ++n;
    return n;
  }

  const char* name() const noexcept override { return "pread"; }

 private:
  void Work() {
    ReadRequest request;
    for (;;) {
      requests_.pop(request);
      if (request.fd < 0) return;  // Stop()
      ssize_t n = pread(request.fd, request.buf, request.len, static_cast<off_t>(request.offset));
      results_.push(ReadResult{request.tag, n < 0 ? -errno : static_cast<int32_t>(n)});
      // Release pairs with Reap's acquire load; the wake is one cheap system
      // call per read of a whole chunk.
      completions_.fetch_add(1, std::memory_order_release);
      detail::FutexWake(completions_, 1, detail::FutexScope::kPrivate);
    }
  }

  void Stop() noexcept {
    for (size_t i = 0; i < workers_.size(); ++i) requests_.push(ReadRequest{});
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  tbb::concurrent_bounded_queue<ReadRequest> requests_;
  static constexpr std::chrono::seconds kWaitTimeout{1};
  static constexpr int kSpins = 4000;  // pause is ~10-40 ns: well under 200 us

  tbb::concurrent_queue<ReadResult> results_;
  std::atomic<uint32_t> completions_{0};  // futex word: results pushed, mod 2^32
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);
  std::vector<ReadRequest> staged_;  // prepared, not yet submitted
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> MakePreadBackend(uint32_t threads, uint32_t queue_depth) {
  return std::make_unique<PreadBackend>(threads == 0 ? 2 : threads, queue_depth);
}

}  // namespace tailcut::detail
