// A stand-in for libcudart with one device, loaded through TAILCUT_CUDART by
// the io and pool tests: it records what the Reader and the batch ring
// register, so the CUDA path is tested on machines without a GPU. Signatures
// as in cuda_runtime_api.h. Not thread-safe (nor are the tests that use it).
// Environment, read at each call:
//   FAKE_CUDART_DEVICE_STATUS  what cudaGetDeviceCount returns (default 0;
//                              35: insufficient driver, 100: no device)
//   FAKE_CUDART_DEVICES        the device count it reports (default 1)
//   FAKE_CUDART_REGISTER_STATUS  what cudaHostRegister returns (default 0)
#include <cstddef>
#include <cstdlib>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

void* registered_ptr = nullptr;  // the latest registration
size_t registered_size = 0;
unsigned int registered_flags = 0;
int register_calls = 0;
int unregister_calls = 0;

// Ranges registered and not yet unregistered (a real runtime refuses to
// unregister what it does not know).
struct Range {
  void* ptr;
  size_t size;
};
constexpr int kMaxLive = 64;
Range live[kMaxLive];
int num_live = 0;
}  // namespace

FAKE_EXPORT int cudaGetDeviceCount(int* count) {
  int status = EnvInt("FAKE_CUDART_DEVICE_STATUS", 0);
  *count = status == 0 ? EnvInt("FAKE_CUDART_DEVICES", 1) : 0;
  return status;
}

FAKE_EXPORT int cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  int status = EnvInt("FAKE_CUDART_REGISTER_STATUS", 0);
  if (status != 0) return status;
  if (num_live == kMaxLive) return 2;  // cudaErrorMemoryAllocation
  live[num_live++] = {ptr, size};
  registered_ptr = ptr;
  registered_size = size;
  registered_flags = flags;
  ++register_calls;
  return 0;
}

FAKE_EXPORT int cudaHostUnregister(void* ptr) {
  for (int i = 0; i < num_live; ++i) {
    if (live[i].ptr != ptr) continue;
    live[i] = live[--num_live];
    ++unregister_calls;
    return 0;
  }
  return 1;  // cudaErrorInvalidValue
}

FAKE_EXPORT const char* cudaGetErrorString(int error) {
  return error == 0 ? "no error" : "fake error";
}

// For the test: what was registered, and how often.
FAKE_EXPORT void FakeCudartState(void** ptr, size_t* size, unsigned int* flags, int* registers,
                                 int* unregisters) {
  *ptr = registered_ptr;
  *size = registered_size;
  *flags = registered_flags;
  *registers = register_calls;
  *unregisters = unregister_calls;
}

// For the test: the size registered at `ptr` and not unregistered since, 0
// if none; *live_ranges: how many ranges are registered now.
FAKE_EXPORT size_t FakeCudartLive(void* ptr, int* live_ranges) {
  *live_ranges = num_live;
  for (int i = 0; i < num_live; ++i)
    if (live[i].ptr == ptr) return live[i].size;
  return 0;
}
