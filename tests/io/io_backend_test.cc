// Tests of the two I/O backends (io/io_backend.h), io_uring and pread
// threads, on their own: results carry the tag and what read(2) would
// return (bytes, a short count at the end of the file, 0 past it, -errno),
// reads into a registered arena, O_DIRECT with aligned buffers and offsets
// (and -EINVAL without), a bounded wait, and many reads at full depth. The
// Reader's handling of these results (resubmitting short reads, -EAGAIN and
// -EINTR) is tested in reader_test.
#include "io/io_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/buffer_arena.h"

namespace tailcut::detail {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/tailcut_io_XXXXXX";
    if (!mkdtemp(pattern.data())) ADD_FAILURE() << "mkdtemp(" << pattern << ")";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string WriteFile(const std::string& dir, const std::string& bytes) {
  std::string path = dir + "/data";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

enum class Kind { kUring, kPread };

class IoBackendTest : public ::testing::TestWithParam<Kind> {
 protected:
  // A backend of the kind under test; skips the test if io_uring is missing.
  std::unique_ptr<IoBackend> Make(uint32_t depth, BufferArena* arena = nullptr) {
    if (GetParam() == Kind::kPread) return MakePreadBackend(2, depth);
    UringSettings settings;
    settings.queue_depth = depth;
    if (arena) {
      settings.arena = arena->data();
      settings.arena_bytes = arena->size();
    }
    int err = 0;
    std::string problem;
    auto backend = MakeUringBackend(settings, &err, &problem);
    if (!backend) ADD_FAILURE() << "io_uring: " << problem;  // see SetUp
    return backend;
  }
  void SetUp() override {
    if (GetParam() != Kind::kUring) return;
    int err = 0;
    std::string problem;
    if (!MakeUringBackend(UringSettings{}, &err, &problem))
      GTEST_SKIP() << "io_uring is not available here: " << problem;
  }

  // Reaps until `want` results are in (waiting), or fails after 10 s.
  std::map<uint64_t, int32_t> ReapAll(IoBackend& backend, size_t want) {
    std::map<uint64_t, int32_t> results;
    ReadResult out[8];
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (results.size() < want && std::chrono::steady_clock::now() < give_up) {
      int n = backend.Reap(out, 8, true);
      EXPECT_GE(n, 0);
      for (int i = 0; i < n; ++i) EXPECT_TRUE(results.emplace(out[i].tag, out[i].res).second);
    }
    EXPECT_EQ(results.size(), want);
    return results;
  }
};

TEST_P(IoBackendTest, EachResultCarriesItsTagAndTheBytesAtItsOffset) {
  TempDir dir;
  std::string bytes = RandomBytes(1 << 20, 1);
  std::string path = WriteFile(dir.path(), bytes);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto backend = Make(8);
  ASSERT_TRUE(backend);
  std::vector<std::vector<std::byte>> bufs(8, std::vector<std::byte>(65536));
  const uint64_t offsets[8] = {0, 700000, 4096, 123457, 65536, 999999 - 65536, 300000, 1};
  for (uint64_t i = 0; i < 8; ++i)
    backend->Prepare(ReadRequest{fd, bufs[i].data(), 65536, offsets[i], 100 + i, false});
  EXPECT_EQ(backend->Submit(), 0);
  auto results = ReapAll(*backend, 8);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(results[100 + i], 65536) << "read " << i;
    EXPECT_EQ(memcmp(bufs[i].data(), bytes.data() + offsets[i], 65536), 0) << "read " << i;
  }
  close(fd);
}

TEST_P(IoBackendTest, AReadOverTheEndIsShortAndOnePastItReturnsZero) {
  TempDir dir;
  std::string bytes = RandomBytes(10000, 2);
  std::string path = WriteFile(dir.path(), bytes);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto backend = Make(4);
  ASSERT_TRUE(backend);
  std::vector<std::byte> a(8192), b(8192);
  backend->Prepare(ReadRequest{fd, a.data(), 8192, 8192, 1, false});
  backend->Prepare(ReadRequest{fd, b.data(), 8192, 10000, 2, false});
  auto results = ReapAll(*backend, 2);  // Reap starts what is prepared
  EXPECT_EQ(results[1], 10000 - 8192);
  EXPECT_EQ(memcmp(a.data(), bytes.data() + 8192, 10000 - 8192), 0);
  EXPECT_EQ(results[2], 0);
  close(fd);
}

TEST_P(IoBackendTest, FailedReadsComeBackAsNegativeErrno) {
  TempDir dir;
  auto backend = Make(4);  // first: its ring's fd must not reuse the closed one
  ASSERT_TRUE(backend);
  int dir_fd = open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  int closed_fd = open(dir.path().c_str(), O_RDONLY | O_CLOEXEC);
  close(closed_fd);
  std::vector<std::byte> buf(4096);
  backend->Prepare(ReadRequest{dir_fd, buf.data(), 4096, 0, 1, false});
  backend->Prepare(ReadRequest{closed_fd, buf.data(), 4096, 0, 2, false});
  backend->Submit();
  auto results = ReapAll(*backend, 2);
  EXPECT_EQ(results[1], -EISDIR);
  EXPECT_EQ(results[2], -EBADF);
  close(dir_fd);
}

TEST_P(IoBackendTest, ReadsGoIntoTheArenaRegisteredOrNot) {
  TempDir dir;
  std::string bytes = RandomBytes(3 * 16384, 3);
  std::string path = WriteFile(dir.path(), bytes);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  BufferArena arena(16384, 3, false, nullptr);
  auto backend = Make(3, &arena);
  ASSERT_TRUE(backend);
  if (GetParam() == Kind::kPread) EXPECT_FALSE(backend->registered());
  // io_uring registers the arena when RLIMIT_MEMLOCK allows; reads work either way.
  for (uint32_t c = 0; c < 3; ++c)
    backend->Prepare(ReadRequest{fd, arena.chunk(2 - c), 16384, c * 16384ull, c, false});
  backend->Submit();
  auto results = ReapAll(*backend, 3);
  for (uint32_t c = 0; c < 3; ++c) {
    ASSERT_EQ(results[c], 16384);
    EXPECT_EQ(memcmp(arena.chunk(2 - c), bytes.data() + c * 16384, 16384), 0);
  }
  close(fd);
}

TEST_P(IoBackendTest, DirectReadsNeedAlignedOffsetsLengthsAndBuffers) {
  TempDir dir;
  std::string bytes = RandomBytes(64 << 10, 4);
  std::string path = WriteFile(dir.path(), bytes);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) GTEST_SKIP() << dir.path() << " does not support O_DIRECT; set TMPDIR to a disk";
  BufferArena arena(16384, 3, false, nullptr);
  auto backend = Make(3, &arena);
  ASSERT_TRUE(backend);
  backend->Prepare(ReadRequest{fd, arena.chunk(0), 16384, 4096, 1, true});
  backend->Prepare(ReadRequest{fd, arena.chunk(1) + 1, 4096, 0, 2, true});  // buffer off by one
  backend->Prepare(ReadRequest{fd, arena.chunk(2), 4096, 100, 3, true});    // offset off
  backend->Submit();
  auto results = ReapAll(*backend, 3);
  if (results[1] == -EINVAL) GTEST_SKIP() << "the filesystem takes O_DIRECT but refuses reads";
  ASSERT_EQ(results[1], 16384);
  EXPECT_EQ(memcmp(arena.chunk(0), bytes.data() + 4096, 16384), 0);
  EXPECT_EQ(results[2], -EINVAL);
  EXPECT_EQ(results[3], -EINVAL);
  close(fd);
}

TEST_P(IoBackendTest, AWaitWithNothingToReapEndsAfterAboutASecond) {
  auto backend = Make(4);
  ASSERT_TRUE(backend);
  ReadResult out[4];
  EXPECT_EQ(backend->Reap(out, 4, false), 0);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(backend->Reap(out, 4, true), 0);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.9);
  EXPECT_LT(waited, 3.0);
}

TEST_P(IoBackendTest, ThousandsOfReadsAtFullDepthAllComeBackRight) {
  TempDir dir;
  std::string bytes = RandomBytes(4 << 20, 5);
  std::string path = WriteFile(dir.path(), bytes);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  constexpr uint32_t kDepth = 8;
  constexpr uint32_t kLen = 3000;  // unaligned lengths and offsets on purpose
  auto backend = Make(kDepth);
  ASSERT_TRUE(backend);
  std::vector<std::vector<std::byte>> bufs(kDepth, std::vector<std::byte>(kLen));
  std::vector<uint64_t> offset_of(kDepth);
  std::vector<uint32_t> free_slots;
  for (uint32_t i = 0; i < kDepth; ++i) free_slots.push_back(i);
  std::mt19937_64 rng(6);
  uint32_t issued = 0, done = 0, in_flight = 0;
  constexpr uint32_t kReads = 3000;
  ReadResult out[kDepth];
  while (done < kReads) {
    while (issued < kReads && !free_slots.empty()) {
      uint32_t slot = free_slots.back();
      free_slots.pop_back();
      offset_of[slot] = rng() % (bytes.size() - kLen);
      backend->Prepare(ReadRequest{fd, bufs[slot].data(), kLen, offset_of[slot], slot, false});
      ++issued;
      ++in_flight;
    }
    ASSERT_EQ(backend->Submit(), 0);
    int n = backend->Reap(out, kDepth, true);
    ASSERT_GE(n, 0);
    ASSERT_LE(static_cast<uint32_t>(n), in_flight);
    for (int i = 0; i < n; ++i) {
      uint32_t slot = static_cast<uint32_t>(out[i].tag);
      ASSERT_EQ(out[i].res, static_cast<int32_t>(kLen));
      ASSERT_EQ(memcmp(bufs[slot].data(), bytes.data() + offset_of[slot], kLen), 0);
      free_slots.push_back(slot);
      --in_flight;
      ++done;
    }
  }
  close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoBackendTest, ::testing::Values(Kind::kUring, Kind::kPread),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kUring ? "Uring" : "Pread";
                         });

}  // namespace
}  // namespace tailcut::detail
