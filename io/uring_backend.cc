// The io_uring backend: one ring, reads into the arena as one fixed buffer.
#include <liburing.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "io/io_backend.h"

namespace tailcut::detail {
namespace {

constexpr long kWaitTimeoutSeconds = 1;

class UringBackend final : public IoBackend {
 public:
  explicit UringBackend(const UringSettings& settings) : settings_(settings) {}

  // Returns 0 or -errno.
  int Init(std::string* problem) {
    unsigned entries = 1;
    while (entries < settings_.queue_depth) entries <<= 1;
    // Default setup flags on purpose: COOP_TASKRUN/DEFER_TASKRUN save an IPI
    // per completion, which is noise at one completion per chunk, and
    // SINGLE_ISSUER would tie the ring to the thread that opened the Reader.
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) {
      *problem = std::string("io_uring_setup: ") + strerror(-rc);
      return rc;
    }
    ready_ = true;
    if (settings_.async_buffered && settings_.max_async_workers > 0) {
      // IOSQE_ASYNC reads run on io-wq's bounded workers, up to one per read
      // in flight. More copiers than cores only time-slice: cap them like
      // the pread pool (kernel 5.15+; older kernels keep their default).
      unsigned values[2] = {settings_.max_async_workers, 0};  // 0: unbounded unchanged
      io_uring_register_iowq_max_workers(&ring_, values);
    }
    if (settings_.arena) {
      struct iovec iov {
        settings_.arena, settings_.arena_bytes
      };
      int reg = io_uring_register_buffers(&ring_, &iov, 1);
      if (reg == 0) {
        registered_ = true;
      } else {
        *problem = std::string("io_uring_register_buffers: ") + strerror(-reg) +
                   (reg == -ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
      }
    }
    return 0;
  }

  ~UringBackend() override {
    if (ready_) io_uring_queue_exit(&ring_);
  }

  void Prepare(const ReadRequest& request) noexcept override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) {
      // The SQ holds queue_depth entries and the caller keeps at most that
      // many reads outstanding, so this only happens with unsubmitted entries.
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    if (registered_) {
      io_uring_prep_read_fixed(sqe, request.fd, request.buf, request.len, request.offset, 0);
    } else {
      io_uring_prep_read(sqe, request.fd, request.buf, request.len, request.offset);
    }
    // Page-cache-hot buffered reads complete inline in io_uring_enter, on this
    // thread, one after another; IOSQE_ASYNC hands them to io-wq workers that
    // copy in parallel while the consumer parses. Direct reads are async in
    // the block layer already and would only pay for the punt.
    if (!request.direct && settings_.async_buffered) sqe->flags |= IOSQE_ASYNC;
    io_uring_sqe_set_data64(sqe, request.tag);
    ++pending_;
  }

  int Submit() noexcept override {
    while (pending_) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0) {
        pending_ = 0;
      } else if (rc == -EAGAIN || rc == -EBUSY) {
        return 0;  // out of kernel memory for now; Reap(wait) tries again
      } else if (rc != -EINTR) {
        return rc;
      }
    }
    return 0;
  }

  int Reap(ReadResult* out, int max, bool wait) noexcept override {
    io_uring_cqe* cqe = nullptr;
    if (wait) {
      for (;;) {
        // Bounded, so that the Reader can tell a stalled device from a slow
        // one (Reap returns 0 after kWaitTimeout without a completion).
        __kernel_timespec timeout{kWaitTimeoutSeconds, 0};
        int rc = pending_ ? io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &timeout, nullptr)
                          : io_uring_wait_cqe_timeout(&ring_, &cqe, &timeout);
        if (rc >= 0) {
          pending_ = 0;
          break;
        }
        if (rc == -ETIME) {
          if (pending_ && io_uring_sq_ready(&ring_) == 0) pending_ = 0;
          return 0;
        }
        if (rc == -EAGAIN || rc == -EBUSY) {
          sched_yield();
        } else if (rc != -EINTR) {
          return rc;
        }
      }
    } else if (pending_) {
      int rc = Submit();
      if (rc < 0) return rc;
    }
    int n = 0;
    while (n < max && io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe) {
      out[n].tag = io_uring_cqe_get_data64(cqe);
      out[n].res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      ++n;
    }
    return n;
  }

  const char* name() const noexcept override { return "io_uring"; }
  bool registered() const noexcept override { return registered_; }

 private:
  UringSettings settings_;
  io_uring ring_{};
  bool ready_ = false;
  bool registered_ = false;
  unsigned pending_ = 0;  // prepared, not yet submitted
};

}  // namespace

std::unique_ptr<IoBackend> MakeUringBackend(const UringSettings& settings, int* error_number,
                                            std::string* problem) {
  auto backend = std::make_unique<UringBackend>(settings);
  problem->clear();
  int rc = backend->Init(problem);
  *error_number = rc < 0 ? -rc : 0;
  if (rc < 0) return nullptr;
  return backend;
}

}  // namespace tailcut::detail
