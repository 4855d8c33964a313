// The Reader's chunk arena: mapping, locking, CUDA registration.
#include "buffer_arena.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tailcut/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace tailcut::detail {
namespace {

// The CUDA runtime API as documented (cuda_runtime_api.h); cudaError_t is an
// int-sized enum whose success value is 0.
using CudaGetDeviceCount = int (*)(int* count);
using CudaHostRegister = int (*)(void* ptr, size_t size, unsigned int flags);
using CudaHostUnregister = int (*)(void* ptr);
using CudaGetErrorString = const char* (*)(int error);
constexpr unsigned int kCudaHostRegisterPortable = 1;

struct CudaApi {
  CudaGetDeviceCount get_device_count = nullptr;
  CudaHostRegister host_register = nullptr;
  CudaHostUnregister host_unregister = nullptr;
  CudaGetErrorString get_error_string = nullptr;
};

// Loads the CUDA runtime, if any. TAILCUT_CUDART names a library to load
// instead of searching the usual sonames (for tests and odd installs). The
// handle is never closed: unloading a CUDA runtime is not safe.
// *not_found: no runtime was found where one is searched for by default.
bool LoadCuda(CudaApi* api, std::string* problem, bool* not_found) {
  *not_found = false;
  static const char* const kSonames[] = {"libcudart.so",      "libcudart.so.13",
                                         "libcudart.so.12",   "libcudart.so.11.0",
                                         "libcudart.so.10.2", "libcudart.so.10.1"};
  void* handle = nullptr;
  const char* forced = std::getenv("TAILCUT_CUDART");
  if (forced && *forced) {
    handle = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      *problem = std::string("cannot load TAILCUT_CUDART='") + forced + "': " + (why ? why : "?");
      return false;
    }
  } else {
    for (const char* soname : kSonames) {
      handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
    if (!handle) {
      *problem = "no CUDA runtime (libcudart.so not found)";
      *not_found = true;
      return false;
    }
  }
  api->get_device_count = reinterpret_cast<CudaGetDeviceCount>(dlsym(handle, "cudaGetDeviceCount"));
  api->host_register = reinterpret_cast<CudaHostRegister>(dlsym(handle, "cudaHostRegister"));
  api->host_unregister = reinterpret_cast<CudaHostUnregister>(dlsym(handle, "cudaHostUnregister"));
  api->get_error_string = reinterpret_cast<CudaGetErrorString>(dlsym(handle, "cudaGetErrorString"));
  if (!api->get_device_count || !api->host_register || !api->host_unregister) {
    *problem = "the CUDA runtime lacks cudaGetDeviceCount/cudaHostRegister/cudaHostUnregister";
    return false;
  }
  return true;
}

// cudaGetDeviceCount's answers on a host without a usable GPU.
constexpr int kCudaErrorInsufficientDriver = 35;  // also: no driver at all
constexpr int kCudaErrorNoDevice = 100;

// Whether an NVIDIA kernel driver is loaded (its control device exists). A
// runtime that is missing or finds no driver on such a host is worth a notice.
bool NvidiaDriverPresent() { return access("/dev/nvidiactl", F_OK) == 0; }

std::string CudaErrorText(const CudaApi& api, int error) {
  const char* text = api.get_error_string ? api.get_error_string(error) : nullptr;
  return "CUDA error " + std::to_string(error) + (text ? std::string(" (") + text + ")" : "");
}

}  // namespace

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
    CudaApi api;
    std::string problem;
    bool not_found = false;
    // No GPU to pin for: a CPU-only host is normal, so stay silent about it
    // (memory_state() still says why the buffers are not CUDA-pinned).
    bool no_gpu = false;
    if (LoadCuda(&api, &problem, &not_found)) {
      int count = 0;
      int status = api.get_device_count(&count);
      no_gpu = status == kCudaErrorNoDevice || (status == 0 && count <= 0) ||
               (status == kCudaErrorInsufficientDriver && !NvidiaDriverPresent());
      if (status != 0 || count <= 0) {
        problem = status != 0
                      ? "no CUDA device (cudaGetDeviceCount: " + CudaErrorText(api, status) + ")"
                      : "no CUDA device";
      } else {
        status = api.host_register(base_, size_, kCudaHostRegisterPortable);
        if (status == 0) {
          cuda_pinned_ = true;
          cuda_unregister_ = reinterpret_cast<void*>(api.host_unregister);
        } else {
          problem = "cudaHostRegister failed: " + CudaErrorText(api, status);
        }
      }
    } else {
      no_gpu = not_found && !NvidiaDriverPresent();
    }
    if (!cuda_pinned_) {
      cuda_state_ = problem;
      // A GPU that the arena could not be registered with: once per process.
      static std::atomic<bool> said{false};
      if (notice && !no_gpu && !said.exchange(true, std::memory_order_relaxed)) {
        notice("tailcut reader: buffers not CUDA-pinned: " + problem +
               "; host-to-device copies will be staged by the driver");
      }
    }
  }
}

BufferArena::~BufferArena() {
  if (cuda_unregister_) reinterpret_cast<CudaHostUnregister>(cuda_unregister_)(base_);
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
