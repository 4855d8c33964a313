// Host memory registered with a CUDA runtime found at run time.
#include "io/cuda_host.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>

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
// instead of searching the usual sonames. *not_found: no runtime was found
// where one is searched for by default.
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

CudaHostRegistration::CudaHostRegistration(void* base, uint64_t bytes) : base_(base) {
  CudaApi api;
  bool not_found = false;
  if (!LoadCuda(&api, &problem_, &not_found)) {
    no_gpu_ = not_found && !NvidiaDriverPresent();
    return;
  }
  int count = 0;
  int status = api.get_device_count(&count);
  no_gpu_ = status == kCudaErrorNoDevice || (status == 0 && count <= 0) ||
            (status == kCudaErrorInsufficientDriver && !NvidiaDriverPresent());
  if (status != 0 || count <= 0) {
    problem_ = status != 0
                   ? "no CUDA device (cudaGetDeviceCount: " + CudaErrorText(api, status) + ")"
                   : "no CUDA device";
    return;
  }
  status = api.host_register(base, static_cast<size_t>(bytes), kCudaHostRegisterPortable);
  if (status != 0) {
    problem_ = "cudaHostRegister failed: " + CudaErrorText(api, status);
    return;
  }
  unregister_ = reinterpret_cast<void*>(api.host_unregister);
}

CudaHostRegistration::~CudaHostRegistration() {
  if (unregister_) reinterpret_cast<CudaHostUnregister>(unregister_)(base_);
}

}  // namespace tailcut::detail
