// A stand-in for libcudart with one device, loaded through TAILCUT_CUDART by
// reader_test: it records what the Reader registers, so the CUDA path is
// tested on machines without a GPU. Signatures as in cuda_runtime_api.h.
#include <cstddef>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
void* registered_ptr = nullptr;
size_t registered_size = 0;
unsigned int registered_flags = 0;
int register_calls = 0;
int unregister_calls = 0;
}  // namespace

FAKE_EXPORT int cudaGetDeviceCount(int* count) {
  *count = 1;
  return 0;
}

FAKE_EXPORT int cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  registered_ptr = ptr;
  registered_size = size;
  registered_flags = flags;
  ++register_calls;
  return 0;
}

FAKE_EXPORT int cudaHostUnregister(void* ptr) {
  if (ptr == registered_ptr) ++unregister_calls;
  return ptr == registered_ptr ? 0 : 1;  // 1: cudaErrorInvalidValue
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
