// The Reader's chunk arena: mapping, locking, CUDA registration.
#include "io/buffer_arena.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "tailcut/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace tailcut::detail {

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (value == static_cast<double>(static_cast<uint64_t>(value))) {
    snprintf(text, sizeof text, "%" PRIu64 " %s", static_cast<uint64_t>(value), kUnits[unit]);
  } else {
    snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  }
  return text;
}

BufferArena::BufferArena(uint64_t chunk_bytes, uint32_t num_chunks, bool cuda_register,
                         const std::function<void(const std::string&)>& notice)
    : size_(chunk_bytes * num_chunks), chunk_bytes_(chunk_bytes) {
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    throw Error(ErrorKind::kNoSpace, "reader: cannot map " + FormatBytes(size_) +
                                         " of chunk buffers: " + strerror(err) +
                                         "; lower buffer_budget_bytes");
  }
  base_ = static_cast<std::byte*>(p);
  // A forked child must open its own Reader; without this, fork would copy
  // (pinned pages are copied eagerly) or share buffers the kernel writes to.
  madvise(base_, size_, MADV_DONTFORK);

  struct rlimit limit {};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  memlock_limit_ = limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
  if (mlock(base_, size_) == 0) {
    locked_ = true;
  } else {
    lock_errno_ = errno;
    // Fault the pages in anyway, so the first reads do not pay for it
    // (MADV_WILLNEED does nothing for anonymous memory).
    if (madvise(base_, size_, MADV_POPULATE_WRITE) != 0) {
      const long page = sysconf(_SC_PAGESIZE);  // before Linux 5.14: by hand
      for (uint64_t off = 0; off < size_; off += static_cast<uint64_t>(page))
        static_cast<volatile std::byte*>(base_)[off] = std::byte{0};
    }
    if (notice) notice("tailcut reader: " + Describe(false, false));
  }

  if (cuda_register) {
    cuda_ = std::make_unique<CudaHostRegistration>(base_, size_);
    cuda_pinned_ = cuda_->pinned();
    if (!cuda_pinned_) {
      cuda_state_ = cuda_->problem();
      // A GPU that the arena could not be registered with: once per process.
      // No GPU to pin for is normal on a CPU-only host: silent (memory_state()
      // still says why the buffers are not CUDA-pinned).
      static std::atomic<bool> said{false};
      if (notice && !cuda_->no_gpu() && !said.exchange(true, std::memory_order_relaxed)) {
        notice("tailcut reader: buffers not CUDA-pinned: " + cuda_state_ +
               "; host-to-device copies will be staged by the driver");
      }
    }
  }
}

BufferArena::~BufferArena() {
  cuda_.reset();  // unregistered while still mapped
  if (base_) munmap(base_, size_);
}

std::string BufferArena::Describe(bool registered, bool uring) const {
  std::string line = "buffers: " + FormatBytes(size_);
  if (locked_ || cuda_pinned_) {
    line += cuda_pinned_ && !locked_ ? " pinned" : " locked";
  } else {
    line += " not locked";
  }
  if (registered) line += " + io_uring-registered";
  if (cuda_pinned_) line += " + CUDA-pinned";
  if (!locked_ && !cuda_pinned_) {
    std::string limit = memlock_limit_ == UINT64_MAX ? "unlimited" : FormatBytes(memlock_limit_);
    line += ": RLIMIT_MEMLOCK is " + limit;
    if (lock_errno_ != 0 && lock_errno_ != ENOMEM && lock_errno_ != EPERM) {
      line += std::string(" (mlock: ") + strerror(lock_errno_) + ")";
    }
    line += "; raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity (systemd)";
  }
  if (uring && !registered) line += "; not io_uring-registered";
  if (!cuda_pinned_ && !cuda_state_.empty()) {
    line += "; not CUDA-pinned: " + cuda_state_;
  }
  return line;
}

CarryBuffer::CarryBuffer(uint64_t capacity) : capacity_(capacity) {
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    throw Error(ErrorKind::kNoSpace, "reader: cannot reserve " + FormatBytes(capacity_) +
                                         " for records that cross chunks: " + strerror(err) +
                                         "; lower format.max_record_bytes");
  }
  base_ = static_cast<std::byte*>(p);
  madvise(base_, capacity_, MADV_DONTFORK);
}

CarryBuffer::~CarryBuffer() {
  if (base_) munmap(base_, capacity_);
}

void CarryBuffer::Trim() noexcept {
  constexpr uint64_t kKeep = 1ull << 20;
  if (high_water_ <= kKeep) return;
  madvise(base_ + kKeep, high_water_ - kKeep, MADV_DONTNEED);
  high_water_ = kKeep;
}

}  // namespace tailcut::detail
