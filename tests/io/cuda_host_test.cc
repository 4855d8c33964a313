// Tests of host memory registration with a CUDA runtime loaded at run time
// (io/cuda_host.h), against the stand-in runtime (fake_cudart.cc): the range
// given is registered and unregistered, failures are kept with CUDA's words,
// and "no GPU here" is told apart from "a GPU that refused".
#include "io/cuda_host.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "tests/io/fake_cuda.h"

namespace tailcut::detail {
namespace {

using testing::FakeCuda;

bool NvidiaDriverPresent() { return access("/dev/nvidiactl", F_OK) == 0; }

class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    base_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~Mapping() { munmap(base_, bytes_); }
  void* base() const { return base_; }

 private:
  void* base_;
  size_t bytes_;
};

TEST(CudaHostRegistrationTest, RegistersTheRangeGivenAndUnregistersItWhenDestroyed) {
  FakeCuda cuda("0", "1", "0");
  Mapping memory(3 * 4096);
  int ranges = 0;
  {
    CudaHostRegistration registration(memory.base(), 3 * 4096);
    EXPECT_TRUE(registration.pinned());
    EXPECT_EQ(registration.problem(), "");
    EXPECT_FALSE(registration.no_gpu());
    EXPECT_EQ(FakeCuda::Live(memory.base(), &ranges), 3u * 4096);
    EXPECT_EQ(ranges, 1);
  }
  EXPECT_EQ(FakeCuda::Live(memory.base(), &ranges), 0u) << "unregistered";
  EXPECT_EQ(ranges, 0);
}

TEST(CudaHostRegistrationTest, AFailedRegistrationKeepsCudasWordsAndIsNotANoGpuHost) {
  FakeCuda cuda("0", "1", "2");  // 2: cudaErrorMemoryAllocation
  Mapping memory(4096);
  CudaHostRegistration registration(memory.base(), 4096);
  EXPECT_FALSE(registration.pinned());
  EXPECT_EQ(registration.problem(), "cudaHostRegister failed: CUDA error 2 (fake error)");
  EXPECT_FALSE(registration.no_gpu()) << "a GPU is there: worth a notice";
  int ranges = 0;
  EXPECT_EQ(FakeCuda::Live(memory.base(), &ranges), 0u);
}

TEST(CudaHostRegistrationTest, ARuntimeThatFindsNoDeviceIsANoGpuHost) {
  Mapping memory(4096);
  {
    FakeCuda cuda("100", "0", "0");  // cudaErrorNoDevice
    CudaHostRegistration registration(memory.base(), 4096);
    EXPECT_FALSE(registration.pinned());
    EXPECT_TRUE(registration.no_gpu());
    EXPECT_EQ(registration.problem(),
              "no CUDA device (cudaGetDeviceCount: CUDA error 100 (fake error))");
  }
  {
    FakeCuda cuda("0", "0", "0");
    CudaHostRegistration registration(memory.base(), 4096);
    EXPECT_TRUE(registration.no_gpu());
    EXPECT_EQ(registration.problem(), "no CUDA device");
  }
  {
    FakeCuda cuda("35", "0", "0");  // insufficient driver: no GPU only without a driver
    CudaHostRegistration registration(memory.base(), 4096);
    EXPECT_EQ(registration.no_gpu(), !NvidiaDriverPresent());
  }
}

TEST(CudaHostRegistrationTest, ARuntimeAskedForThatCannotBeLoadedIsNamed) {
  FakeCuda cuda("0", "1", "0", "/nonexistent/libcudart.so");
  Mapping memory(4096);
  CudaHostRegistration registration(memory.base(), 4096);
  EXPECT_FALSE(registration.pinned());
  EXPECT_FALSE(registration.no_gpu()) << "asked for by name: worth a notice";
  EXPECT_EQ(registration.problem().find("cannot load TAILCUT_CUDART='/nonexistent/libcudart.so'"),
            0u)
      << registration.problem();
}

TEST(CudaHostRegistrationTest, ALibraryWithoutTheRuntimesCallsIsRefused) {
  FakeCuda cuda("0", "1", "0", "libc.so.6");
  Mapping memory(4096);
  CudaHostRegistration registration(memory.base(), 4096);
  EXPECT_FALSE(registration.pinned());
  EXPECT_EQ(registration.problem(),
            "the CUDA runtime lacks cudaGetDeviceCount/cudaHostRegister/cudaHostUnregister");
}

}  // namespace
}  // namespace tailcut::detail
