// The pread backend: a few worker threads, each running one pread(2) per
// request. Requests and results travel through two oneTBB bounded queues;
// their blocking push/pop spin briefly and then sleep on a futex, so an idle
// worker costs nothing and a hot one never takes a lock we hold.
#include <tbb/concurrent_queue.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "io_backend.h"
#include "tailcut/error.h"

namespace tailcut::detail {
namespace {

class PreadBackend final : public IoBackend {
 public:
  PreadBackend(uint32_t threads, uint32_t queue_depth) {
    // Bounded by what the caller may have outstanding, so pushes never block.
    requests_.set_capacity(queue_depth + threads);
    results_.set_capacity(queue_depth + threads);
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
    if (wait && max > 0) {
      results_.pop(out[0]);
      n = 1;
    }
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
    }
  }

  void Stop() noexcept {
    for (size_t i = 0; i < workers_.size(); ++i) requests_.push(ReadRequest{});
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  tbb::concurrent_bounded_queue<ReadRequest> requests_;
  tbb::concurrent_bounded_queue<ReadResult> results_;
  std::vector<ReadRequest> staged_;  // prepared, not yet submitted
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> MakePreadBackend(uint32_t threads, uint32_t queue_depth) {
  return std::make_unique<PreadBackend>(threads == 0 ? 2 : threads, queue_depth);
}

}  // namespace tailcut::detail
