// io/io_backend.h: the two ways the Reader reads: io_uring and pread threads.
//
// A backend runs reads of whole buffers and reports each one's result, like
// io_uring does: Prepare queues a read, Submit hands the queued reads over,
// Reap collects results. One result per read, in any order; the result is
// what read(2) would return (bytes, 0 at end of file, or -errno). The caller
// (the Reader) handles short reads, -EAGAIN/-EINTR and errors, so both
// backends behave alike by construction.
//
// Contract: one thread at a time calls Prepare/Submit/Reap (the Reader's).
// The caller keeps at most max_in_flight() reads outstanding and keeps each
// read's buffer and fd alive until its result was reaped; the destructor
// requires that nothing is outstanding.
#ifndef TAILCUT_IO_IO_BACKEND_H_
#define TAILCUT_IO_IO_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tailcut::detail {

struct ReadRequest {
  int fd = -1;
  std::byte* buf = nullptr;  // inside the arena
  uint32_t len = 0;
  uint64_t offset = 0;
  uint64_t tag = 0;     // handed back with the result
  bool direct = false;  // the fd was opened O_DIRECT
};

struct ReadResult {
  uint64_t tag = 0;
  int32_t res = 0;  // bytes read, 0 at EOF, or -errno
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  // Queues one read; it starts no later than the next Submit or Reap.
  virtual void Prepare(const ReadRequest& request) noexcept = 0;
  // Starts the queued reads. Returns 0 or -errno.
  virtual int Submit() noexcept = 0;
  // Collects up to max results; with wait, blocks until at least one is there
  // (starting queued reads first) or about a second has passed. Returns how
  // many (0 after such a timeout), or -errno.
  virtual int Reap(ReadResult* out, int max, bool wait) noexcept = 0;
  virtual const char* name() const noexcept = 0;
  // Whether reads go to fixed (registered) buffers.
  virtual bool registered() const noexcept { return false; }
};

struct UringSettings {
  uint32_t queue_depth = 8;
  std::byte* arena = nullptr;  // registered as one fixed buffer when possible
  uint64_t arena_bytes = 0;
  bool async_buffered = true;      // IOSQE_ASYNC on reads from buffered fds
  unsigned max_async_workers = 2;  // io-wq bounded workers (0: the kernel's default)
};

// Sets up a ring. Returns nullptr and sets *error_number (positive errno) and
// *problem when the ring cannot be set up (ENOSYS, EPERM, ENOMEM, ...).
// A failed buffer registration is not fatal: reads then use plain buffers and
// *problem describes why (with *error_number 0).
std::unique_ptr<IoBackend> MakeUringBackend(const UringSettings& settings, int* error_number,
                                            std::string* problem);

// Starts `threads` pread workers. Throws tailcut::Error if a thread cannot start.
std::unique_ptr<IoBackend> MakePreadBackend(uint32_t threads, uint32_t queue_depth);

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_IO_BACKEND_H_
