// A trainer's registration of the batch ring's arena with CUDA
// (tailcut/batch_ring.h, Contract: CUDA), against the stand-in runtime
// (tests/io/fake_cudart.cc): once per trainer, the arena and nothing else,
// undone when the trainer leaves; loaders never register; a refusal is in
// memory_state() and one notice per process; a host without a GPU is silent.
// These check what tailcut asks of the runtime, not a real GPU's DMA.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tests/io/fake_cuda.h"

namespace tailcut {
namespace {

using testing::FakeCuda;
using testing::RunInChild;

using Clock = std::chrono::steady_clock;

std::string UniqueName(const char* what) {
  return std::string("ringcuda.") + what + "." + std::to_string(::getpid());
}

struct RingGuard {
  explicit RingGuard(std::string n) : name(std::move(n)) { RemoveBatchRing(name); }
  ~RingGuard() { RemoveBatchRing(name); }
  std::string name;
};

// What the stand-in was asked. The runtime is never unloaded, so counters
// carry over from earlier tests of this process: compare differences.
struct FakeState {
  void* last_ptr = nullptr;
  size_t last_size = 0;
  unsigned int last_flags = 0;
  int registers = 0, unregisters = 0, live_ranges = 0;
};

FakeState ReadFake() {
  FakeState s;
  void* handle = dlopen(TAILCUT_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return s;  // not loaded yet: nothing asked
  using StateFn = void (*)(void**, size_t*, unsigned int*, int*, int*);
  using LiveFn = size_t (*)(void*, int*);
  auto state = reinterpret_cast<StateFn>(dlsym(handle, "FakeCudartState"));
  auto live = reinterpret_cast<LiveFn>(dlsym(handle, "FakeCudartLive"));
  if (state) state(&s.last_ptr, &s.last_size, &s.last_flags, &s.registers, &s.unregisters);
  if (live) live(nullptr, &s.live_ranges);
  dlclose(handle);
  return s;
}

// The size the stand-in holds registered at ptr (0: none).
size_t RegisteredAt(const void* ptr) {
  void* handle = dlopen(TAILCUT_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return 0;
  using LiveFn = size_t (*)(void*, int*);
  auto live = reinterpret_cast<LiveFn>(dlsym(handle, "FakeCudartLive"));
  int ranges = 0;
  size_t size = live ? live(const_cast<void*>(ptr), &ranges) : 0;
  dlclose(handle);
  return size;
}

BatchRingOptions Small(const std::string& name, std::vector<std::string>* notices) {
  BatchRingOptions o;
  o.name = name;
  o.slot_bytes = 4000;  // a stride of 4 KiB
  o.num_slots = 3;
  o.max_clients = 8;
  o.attach_timeout = std::chrono::milliseconds(500);
  o.on_notice = [notices](const std::string& line) { notices->push_back(line); };
  return o;
}

TEST(BatchRingCudaTest, EachTrainerRegistersItsArenaOnceAndUnregistersItWhenItLeaves) {
  RingGuard g(UniqueName("once"));
  FakeCuda cuda("0", "1", "0");
  std::vector<std::string> notices;
  const FakeState before = ReadFake();
  auto loader = BatchRing::Open(Small(g.name, &notices), RingRole::kLoader);
  EXPECT_EQ(ReadFake().registers, before.registers) << "a loader only writes the slots";
  EXPECT_FALSE(loader->cuda_pinned());
  EXPECT_EQ(loader->memory_state(), "arena: 12 KiB (3 slots of 4 KiB)");

  auto trainer = BatchRing::Open(Small(g.name, &notices), RingRole::kTrainer);
  const FakeState registered = ReadFake();
  EXPECT_EQ(registered.registers, before.registers + 1);
  EXPECT_EQ(registered.live_ranges, before.live_ranges + 1);
  EXPECT_EQ(registered.last_size, 3u * 4096) << "the arena, not the control part";
  EXPECT_EQ(registered.last_flags, 1u) << "cudaHostRegisterPortable";
  EXPECT_TRUE(trainer->cuda_pinned());
  EXPECT_EQ(trainer->memory_state(), "arena: 12 KiB (3 slots of 4 KiB) + CUDA-pinned");

  // Every batch popped lies in the registered range, and popping registers nothing more.
  const auto* arena = static_cast<const std::byte*>(registered.last_ptr);
  for (int i = 0; i < 5; ++i) {
    WritableBatch w;
    ASSERT_EQ(loader->AcquireSlot(&w, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
    ASSERT_EQ(loader->Publish(w.token, 0, 1, 100), RingStatus::kOk);
    ReadyBatch r;
    ASSERT_EQ(trainer->Pop(0, &r, Clock::now() + std::chrono::seconds(1)), RingStatus::kOk);
    EXPECT_GE(r.data.data(), arena);
    EXPECT_LE(r.data.data() + 4000, arena + 3 * 4096);
    ASSERT_EQ(trainer->Release(r.token), RingStatus::kOk);
  }
  // A second trainer in the same process maps the ring again and registers its own mapping.
  auto second = BatchRing::Open(Small(g.name, &notices), RingRole::kTrainer);
  const FakeState two = ReadFake();
  EXPECT_EQ(two.registers, before.registers + 2);
  EXPECT_EQ(two.live_ranges, before.live_ranges + 2);
  EXPECT_NE(two.last_ptr, registered.last_ptr);
  EXPECT_TRUE(second->cuda_pinned());

  trainer.reset();
  EXPECT_EQ(RegisteredAt(arena), 0u) << "unregistered when the trainer left";
  EXPECT_EQ(ReadFake().unregisters, before.unregisters + 1);
  EXPECT_EQ(RegisteredAt(two.last_ptr), 3u * 4096) << "the other trainer's stays";
  second.reset();
  loader.reset();
  const FakeState after = ReadFake();
  EXPECT_EQ(after.unregisters, before.unregisters + 2);
  EXPECT_EQ(after.live_ranges, before.live_ranges);
  EXPECT_TRUE(notices.empty());
}

TEST(BatchRingCudaTest, RegistrationOffLeavesCudaAlone) {
  RingGuard g(UniqueName("off"));
  FakeCuda cuda("0", "1", "0");
  std::vector<std::string> notices;
  const FakeState before = ReadFake();
  BatchRingOptions o = Small(g.name, &notices);
  o.cuda_register = false;
  auto trainer = BatchRing::Open(o, RingRole::kTrainer);
  EXPECT_FALSE(trainer->cuda_pinned());
  EXPECT_EQ(trainer->memory_state(), "arena: 12 KiB (3 slots of 4 KiB)");
  EXPECT_EQ(ReadFake().registers, before.registers);
  EXPECT_TRUE(notices.empty());
}

struct NoGpuParam {
  const char* device_status;
  const char* devices;
  const char* said;  // what memory_state() says after "not CUDA-pinned: "
};
class BatchRingNoGpuTest : public ::testing::TestWithParam<NoGpuParam> {};

TEST_P(BatchRingNoGpuTest, ATrainerOnAHostWithoutAGpuIsSilentAndSaysWhy) {
  const NoGpuParam p = GetParam();
  RingGuard g(UniqueName("nogpu"));
  int code = RunInChild([&] {
    FakeCuda cuda(p.device_status, p.devices, "0");
    std::vector<std::string> notices;
    std::vector<std::unique_ptr<BatchRing>> trainers;
    for (int i = 0; i < 3; ++i)
      trainers.push_back(BatchRing::Open(Small(g.name, &notices), RingRole::kTrainer));
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    fprintf(stderr, "state: %s\n", trainers[0]->memory_state().c_str());
    if (trainers[0]->cuda_pinned()) return 10;
    if (!notices.empty()) return 11;
    if (trainers[0]->memory_state() !=
        std::string("arena: 12 KiB (3 slots of 4 KiB); not CUDA-pinned: ") + p.said)
      return 12;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Answers, BatchRingNoGpuTest,
    ::testing::Values(
        NoGpuParam{"100", "0", "no CUDA device (cudaGetDeviceCount: CUDA error 100 (fake error))"},
        NoGpuParam{"0", "0", "no CUDA device"}),
    [](const ::testing::TestParamInfo<NoGpuParam>& info) {
      return std::string("Status") + info.param.device_status + "Devices" + info.param.devices;
    });

TEST(BatchRingCudaTest, ARefusedRegistrationIsInTheStateAndOneNoticePerProcess) {
  RingGuard g(UniqueName("refused"));
  int code = RunInChild([&] {
    FakeCuda cuda("0", "1", "2");  // 2: cudaErrorMemoryAllocation
    std::vector<std::string> notices;
    std::vector<std::unique_ptr<BatchRing>> trainers;
    for (int i = 0; i < 3; ++i)
      trainers.push_back(BatchRing::Open(Small(g.name, &notices), RingRole::kTrainer));
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    for (const auto& t : trainers) {
      if (t->cuda_pinned()) return 10;
      if (t->memory_state() !=
          "arena: 12 KiB (3 slots of 4 KiB); not CUDA-pinned: cudaHostRegister failed: CUDA "
          "error 2 (fake error)")
        return 11;
    }
    if (notices.size() != 1) return 12;
    if (notices[0] != "tailcut batch ring '" + g.name +
                          "': arena not CUDA-pinned: cudaHostRegister failed: CUDA error 2 (fake "
                          "error); host-to-device copies of batches will be staged by the driver")
      return 13;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace tailcut
