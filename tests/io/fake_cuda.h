// Test helpers for code that registers memory with CUDA, run against the
// stand-in runtime tests/io/fake_cudart.cc (its path in TAILCUT_FAKE_CUDART,
// a compile definition of each test that uses it).
#ifndef TAILCUT_TESTS_IO_FAKE_CUDA_H_
#define TAILCUT_TESTS_IO_FAKE_CUDA_H_

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>

namespace tailcut::testing {

// Sets the stand-in's environment for the life of the object: what its
// cudaGetDeviceCount answers (status, devices) and what cudaHostRegister
// returns; `library` is the runtime TAILCUT_CUDART names.
class FakeCuda {
 public:
  FakeCuda(const char* device_status, const char* devices, const char* register_status,
           const char* library = TAILCUT_FAKE_CUDART) {
    setenv("TAILCUT_CUDART", library, 1);
    setenv("FAKE_CUDART_DEVICE_STATUS", device_status, 1);
    setenv("FAKE_CUDART_DEVICES", devices, 1);
    setenv("FAKE_CUDART_REGISTER_STATUS", register_status, 1);
  }
  ~FakeCuda() {
    for (const char* name : {"TAILCUT_CUDART", "FAKE_CUDART_DEVICE_STATUS", "FAKE_CUDART_DEVICES",
                             "FAKE_CUDART_REGISTER_STATUS"}) {
      unsetenv(name);
    }
  }
  // What the stand-in holds registered at ptr (0: nothing), and how many
  // ranges it holds (-1: the stand-in is not loaded).
  static size_t Live(void* ptr, int* ranges) {
    using LiveFn = size_t (*)(void*, int*);
    *ranges = -1;
    void* handle = dlopen(TAILCUT_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) return 0;
    auto fn = reinterpret_cast<LiveFn>(dlsym(handle, "FakeCudartLive"));
    size_t size = fn ? fn(ptr, ranges) : 0;
    dlclose(handle);
    return size;
  }

  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;
};

// Runs fn in a forked child (a fresh once-per-process notice state); returns
// its exit code, or 128 + the signal that killed it.
inline int RunInChild(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int code = 3;
    try {
      code = fn();
    } catch (const std::exception& e) {
      fprintf(stderr, "child: %s\n", e.what());
    }
    fflush(nullptr);
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace tailcut::testing

#endif  // TAILCUT_TESTS_IO_FAKE_CUDA_H_
