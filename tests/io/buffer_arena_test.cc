// Tests of the Reader's chunk arena and carry buffer (io/buffer_arena.h):
// geometry, exclusion from fork, mapping failures, returning carry pages,
// and CUDA registration against the stand-in runtime (fake_cudart.cc): pinned
// with a device, silent without a driver or device, a notice once per
// process when a GPU is there and registration fails.
#include "io/buffer_arena.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tailcut/error.h"
#include "tests/io/fake_cuda.h"

namespace tailcut::detail {
namespace {

using testing::RunInChild;

bool NvidiaDriverPresent() { return access("/dev/nvidiactl", F_OK) == 0; }

TEST(FormatBytesTest, SaysBytesInTheLargestWholeOrTenthUnit) {
  EXPECT_EQ(FormatBytes(0), "0 bytes");
  EXPECT_EQ(FormatBytes(100), "100 bytes");
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(64ull << 20), "64 MiB");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(1ull << 50), "1024 TiB");
}

TEST(BufferArenaTest, ChunksLieBackToBackAndEveryByteIsWritable) {
  BufferArena arena(8192, 5, false, nullptr);
  EXPECT_EQ(arena.size(), 5u * 8192);
  EXPECT_EQ(arena.chunk_bytes(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.data()) % 4096, 0u) << "page-aligned for O_DIRECT";
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(arena.chunk(i), arena.data() + i * 8192);
  memset(arena.data(), 0xab, arena.size());
  EXPECT_EQ(arena.data()[arena.size() - 1], std::byte{0xab});
  EXPECT_FALSE(arena.cuda_pinned());
}

TEST(BufferArenaTest, DescribeSaysLockedOrNamesRlimitMemlockAndTheFix) {
  BufferArena arena(4096, 4, false, [](const std::string&) {});
  if (arena.locked()) {
    EXPECT_EQ(arena.Describe(true, true), "buffers: 16 KiB locked + io_uring-registered");
    EXPECT_EQ(arena.Describe(false, true), "buffers: 16 KiB locked; not io_uring-registered");
    EXPECT_EQ(arena.Describe(false, false), "buffers: 16 KiB locked");
  } else {
    EXPECT_NE(arena.Describe(false, false).find("not locked: RLIMIT_MEMLOCK is "),
              std::string::npos);
    EXPECT_NE(arena.Describe(false, false).find("ulimit -l unlimited"), std::string::npos);
  }
}

TEST(BufferArenaTest, AForkedChildDoesNotGetTheArena) {
  BufferArena arena(4096, 3, false, nullptr);
  memset(arena.data(), 1, arena.size());
  std::byte* p = arena.data();
  int code = RunInChild([p] {
    signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would exit instead
    static_cast<volatile std::byte*>(p)[0] = std::byte{2};  // MADV_DONTFORK: not mapped here
    return 0;
  });
  EXPECT_EQ(code, 128 + SIGSEGV);
  EXPECT_EQ(arena.data()[0], std::byte{1});
}

TEST(BufferArenaTest, AnArenaThatCannotBeMappedIsNoSpaceNamingTheOptionToLower) {
  try {
    BufferArena arena(1ull << 30, 1u << 20, false, nullptr);  // 1 PiB
    FAIL() << "mapped 1 PiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNoSpace);
    EXPECT_EQ(std::string(e.what()),
              "reader: cannot map 1024 TiB of chunk buffers: Cannot allocate memory; lower "
              "buffer_budget_bytes");
  }
}

// Pages of [p, p + bytes) resident in memory.
size_t Resident(const std::byte* p, size_t bytes) {
  std::vector<unsigned char> v(bytes / 4096);
  if (mincore(const_cast<std::byte*>(p), bytes, v.data()) != 0) return SIZE_MAX;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(CarryBufferTest, OnlyTouchedPagesAreUsedAndTrimReturnsThoseBeyondOneMiB) {
  CarryBuffer carry(256ull << 20);
  EXPECT_EQ(carry.capacity(), 256ull << 20);
  EXPECT_EQ(Resident(carry.data(), 16 << 20), 0u) << "reserved, not committed";
  memset(carry.data(), 7, 8 << 20);
  carry.Touch(8 << 20);
  EXPECT_EQ(Resident(carry.data(), 8 << 20), 2048u);
  carry.Trim();
  EXPECT_EQ(Resident(carry.data(), 1 << 20), 256u) << "the first MiB stays";
  EXPECT_EQ(Resident(carry.data() + (1 << 20), 7 << 20), 0u);
  EXPECT_EQ(carry.data()[0], std::byte{7});
  carry.Trim();  // nothing more to return
  EXPECT_EQ(Resident(carry.data(), 1 << 20), 256u);
}

TEST(CarryBufferTest, ASmallCarryIsNotTrimmed) {
  CarryBuffer carry(4 << 20);
  memset(carry.data(), 1, 512 << 10);
  carry.Touch(512 << 10);
  carry.Trim();
  EXPECT_EQ(Resident(carry.data(), 512 << 10), 128u);
}

#ifdef TAILCUT_FAKE_CUDART
// Opens an arena with CUDA registration through the stand-in runtime under
// the given environment; collects the notices.
struct CudaOutcome {
  bool pinned = false;
  std::string described;
  std::vector<std::string> notices;
};

CudaOutcome OpenWithFakeCuda(const char* device_status, const char* devices,
                             const char* register_status, int arenas = 1) {
  testing::FakeCuda cuda(device_status, devices, register_status);
  CudaOutcome out;
  for (int i = 0; i < arenas; ++i) {
    BufferArena arena(4096, 3, true, [&](const std::string& line) {
      if (line.find("CUDA") != std::string::npos) out.notices.push_back(line);
    });
    out.pinned = arena.cuda_pinned();
    out.described = arena.Describe(false, false);
  }
  return out;
}

TEST(BufferArenaCudaTest, ARuntimeWithADeviceRegistersTheArenaSilently) {
  CudaOutcome out = OpenWithFakeCuda("0", "1", "0");
  EXPECT_TRUE(out.pinned);
  EXPECT_TRUE(out.notices.empty());
  EXPECT_NE(out.described.find("+ CUDA-pinned"), std::string::npos) << out.described;
}

struct NoGpuParam {
  const char* device_status;
  const char* devices;
  const char* said;  // what Describe() says
};
class BufferArenaNoGpuTest : public ::testing::TestWithParam<NoGpuParam> {};

TEST_P(BufferArenaNoGpuTest, ARuntimeThatFindsNoDriverOrDeviceIsSilentAndDescribeSaysWhy) {
  const NoGpuParam p = GetParam();
  // On a host with an NVIDIA driver, "insufficient driver" is a real problem.
  if (std::string(p.device_status) == "35" && NvidiaDriverPresent())
    GTEST_SKIP() << "an NVIDIA driver is loaded here";
  int code = RunInChild([&] {
    CudaOutcome out = OpenWithFakeCuda(p.device_status, p.devices, "0", 3);
    for (const std::string& line : out.notices) fprintf(stderr, "notice: %s\n", line.c_str());
    fprintf(stderr, "described: %s\n", out.described.c_str());
    if (out.pinned) return 10;
    if (!out.notices.empty()) return 11;
    if (out.described.find(std::string("; not CUDA-pinned: ") + p.said) == std::string::npos)
      return 12;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Answers, BufferArenaNoGpuTest,
    ::testing::Values(
        NoGpuParam{"35", "0", "no CUDA device (cudaGetDeviceCount: CUDA error 35 (fake error))"},
        NoGpuParam{"100", "0", "no CUDA device (cudaGetDeviceCount: CUDA error 100 (fake error))"},
        NoGpuParam{"0", "0", "no CUDA device"}),
    [](const ::testing::TestParamInfo<NoGpuParam>& info) {
      return std::string("Status") + info.param.device_status + "Devices" + info.param.devices;
    });

TEST(BufferArenaCudaTest, AFailedRegistrationWithAGpuIsANoticeOncePerProcess) {
  int code = RunInChild([] {
    CudaOutcome out = OpenWithFakeCuda("0", "1", "2", 3);  // 2: cudaErrorMemoryAllocation
    for (const std::string& line : out.notices) fprintf(stderr, "notice: %s\n", line.c_str());
    if (out.pinned) return 10;
    if (out.notices.size() != 1) return 11;
    if (out.notices[0] !=
        "tailcut reader: buffers not CUDA-pinned: cudaHostRegister failed: CUDA error 2 (fake "
        "error); host-to-device copies will be staged by the driver")
      return 12;
    if (out.described.find("; not CUDA-pinned: cudaHostRegister failed: CUDA error 2") ==
        std::string::npos)
      return 13;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

TEST(BufferArenaCudaTest, ADeviceCountErrorOtherThanNoDriverOrDeviceIsANotice) {
  int code = RunInChild([] {
    CudaOutcome out = OpenWithFakeCuda("3", "0", "0");  // 3: cudaErrorInitializationError
    for (const std::string& line : out.notices) fprintf(stderr, "notice: %s\n", line.c_str());
    return out.notices.size() == 1 && !out.pinned ? 0 : 10;
  });
  EXPECT_EQ(code, 0);
}
#endif

TEST(BufferArenaCudaTest, ARuntimeAskedForThatCannotBeLoadedIsANotice) {
  int code = RunInChild([] {
    setenv("TAILCUT_CUDART", "/nonexistent/libcudart.so", 1);
    std::vector<std::string> notices;
    BufferArena arena(4096, 3, true, [&](const std::string& line) { notices.push_back(line); });
    std::string described = arena.Describe(false, false);
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    bool noticed = false;
    for (const std::string& line : notices)
      noticed |=
          line.find("cannot load TAILCUT_CUDART='/nonexistent/libcudart.so'") != std::string::npos;
    return noticed && described.find("not CUDA-pinned: cannot load") != std::string::npos ? 0 : 10;
  });
  EXPECT_EQ(code, 0);
}

TEST(BufferArenaCudaTest, RegistrationOffSaysNothingAboutCuda) {
  std::vector<std::string> notices;
  BufferArena arena(4096, 3, false, [&](const std::string& line) { notices.push_back(line); });
  for (const std::string& line : notices) EXPECT_EQ(line.find("CUDA"), std::string::npos);
  EXPECT_EQ(arena.Describe(false, false).find("CUDA"), std::string::npos);
}

}  // namespace
}  // namespace tailcut::detail
