// Tests of RunDeviceReads (io/record_device_reads.h) through a backend that
// scripts what each read returns: short reads are continued, -EAGAIN and
// -EINTR retried, a read that ends early or fails fails the batch with its
// offset once nothing is in flight, -EINVAL on an O_DIRECT read switches the
// file to buffered reads; and through io_uring and pread for real.
#include "io/record_device_reads.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/io/reader_test_util.h"

namespace tailcut::detail {
namespace {

// Serves reads from `content`, the n-th result of a read (by tag) taken from
// script[tag][n] when there is one: a negative errno, or a number of bytes to
// deliver at most (0: end of file). Results come back newest first, so that
// completion order differs from submission order.
class ScriptedBackend final : public IoBackend {
 public:
  ScriptedBackend(std::string content, std::map<uint64_t, std::vector<int>> script)
      : content_(std::move(content)), script_(std::move(script)) {}

  void Prepare(const ReadRequest& request) noexcept override {
    queued_.push_back(request);
    max_in_flight_ = std::max(max_in_flight_, queued_.size());
  }
  int Submit() noexcept override { return 0; }
  int Reap(ReadResult* out, int max, bool) noexcept override {
    int n = 0;
    while (n < max && !queued_.empty()) {
      ReadRequest r = queued_.back();
      queued_.pop_back();
      requests_.push_back(r);
      int res = static_cast<int>(std::min<uint64_t>(
          r.len, content_.size() - std::min<uint64_t>(r.offset, content_.size())));
      std::vector<int>& steps = script_[r.tag];
      if (!steps.empty()) {
        const int step = steps.front();
        steps.erase(steps.begin());
        res = step < 0 ? step : std::min(res, step);
      }
      if (res > 0) std::memcpy(r.buf, content_.data() + r.offset, static_cast<size_t>(res));
      out[n++] = ReadResult{r.tag, res};
    }
    return n;
  }
  const char* name() const noexcept override { return "scripted"; }

  std::vector<ReadRequest> requests_;  // every request reaped, in order
  size_t max_in_flight_ = 0;

 private:
  std::string content_;
  std::map<uint64_t, std::vector<int>> script_;
  std::vector<ReadRequest> queued_;
};

std::string Content() {
  std::mt19937_64 rng(1);
  return Bytes(rng, 64 * 1024);
}

// Reads [offset, offset + len) of file 0 each into its own buffer.
std::vector<DeviceRead> Reads(const std::vector<std::pair<uint64_t, uint32_t>>& ranges,
                              std::vector<std::string>* buffers) {
  std::vector<DeviceRead> reads;
  buffers->clear();
  for (auto [offset, len] : ranges) buffers->push_back(std::string(len, '\0'));
  for (size_t i = 0; i < ranges.size(); ++i) {
    DeviceRead r;
    r.buf = (*buffers)[i].data();
    r.offset = ranges[i].first;
    r.len = r.need = ranges[i].second;
    reads.push_back(r);
  }
  return reads;
}

TEST(RecordDeviceReads, ShortReadsAreContinuedAndEagainEintrRetried) {
  const std::string content = Content();
  ScriptedBackend backend(content, {{0, {100, -EAGAIN, 1, -EINTR}}, {2, {-EINTR, 4000}}});
  std::vector<DeviceFile> files(1);
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads = Reads({{10, 5000}, {7000, 300}, {20000, 9000}}, &buffers);
  DeviceReadFailure failure;
  ASSERT_TRUE(RunDeviceReads(
      backend, 2, &files, &reads, [](size_t) {}, &failure));
  EXPECT_EQ(buffers[0], content.substr(10, 5000));
  EXPECT_EQ(buffers[1], content.substr(7000, 300));
  EXPECT_EQ(buffers[2], content.substr(20000, 9000));
  EXPECT_LE(backend.max_in_flight_, 2u);
  // Read 0 went on from where each short read stopped.
  std::vector<uint64_t> offsets_of_0;
  for (const ReadRequest& r : backend.requests_)
    if (r.tag == 0) offsets_of_0.push_back(r.offset);
  EXPECT_EQ(offsets_of_0, (std::vector<uint64_t>{10, 110, 110, 111, 111}));
}

TEST(RecordDeviceReads, AReadThatEndsEarlyFailsWithTheOffsetWhereTheFileEnds) {
  ScriptedBackend backend(Content(), {{1, {200, 0}}});
  std::vector<DeviceFile> files(1);
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads =
      Reads({{0, 100}, {4096, 1000}, {9000, 100}, {12000, 10}}, &buffers);
  DeviceReadFailure failure;
  ASSERT_FALSE(RunDeviceReads(
      backend, 1, &files, &reads, [](size_t) {}, &failure));
  EXPECT_EQ(failure.read, 1u);
  EXPECT_EQ(failure.offset, 4096u + 200u);
  EXPECT_EQ(failure.error, 0);
  EXPECT_FALSE(failure.backend_failed);
  // Nothing was started after the failure (one read in flight at a time).
  for (const ReadRequest& r : backend.requests_) EXPECT_LT(r.tag, 2u);
}

TEST(RecordDeviceReads, AFailedReadFailsWithItsErrnoAndOffset) {
  ScriptedBackend backend(Content(), {{0, {-EIO}}});
  std::vector<DeviceFile> files(1);
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads = Reads({{300, 100}}, &buffers);
  DeviceReadFailure failure;
  ASSERT_FALSE(RunDeviceReads(
      backend, 8, &files, &reads, [](size_t) {}, &failure));
  EXPECT_EQ(failure.offset, 300u);
  EXPECT_EQ(failure.error, EIO);
}

TEST(RecordDeviceReads, EndlessEagainFailsAfterTheRetries) {
  ScriptedBackend backend(Content(), {{0, std::vector<int>(kDeviceReadMaxRetries + 1, -EAGAIN)}});
  std::vector<DeviceFile> files(1);
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads = Reads({{0, 100}}, &buffers);
  DeviceReadFailure failure;
  ASSERT_FALSE(RunDeviceReads(
      backend, 8, &files, &reads, [](size_t) {}, &failure));
  EXPECT_EQ(failure.error, EAGAIN);
}

// O_DIRECT: a read rounded up past the end of the file may stop short of its
// len at the end, but not before `need`; off a block boundary it is the end.
TEST(RecordDeviceReads, ADirectReadStopsAtTheEndOfTheFileAfterWhatItNeeds) {
  const std::string content = Content();  // 64 KiB
  {
    ScriptedBackend backend(content.substr(0, 60000), {});
    std::vector<DeviceFile> files(1);
    files[0].direct = true;
    files[0].align = 4096;
    std::vector<std::string> buffers;
    std::vector<DeviceRead> reads = Reads({{57344, 4096}}, &buffers);
    reads[0].need = 60000 - 57344;
    DeviceReadFailure failure;
    ASSERT_TRUE(RunDeviceReads(
        backend, 8, &files, &reads, [](size_t) {}, &failure));
    EXPECT_EQ(buffers[0].substr(0, reads[0].need), content.substr(57344, reads[0].need));
  }
  {
    ScriptedBackend backend(content.substr(0, 59000), {});
    std::vector<DeviceFile> files(1);
    files[0].direct = true;
    files[0].align = 4096;
    std::vector<std::string> buffers;
    std::vector<DeviceRead> reads = Reads({{57344, 4096}}, &buffers);
    reads[0].need = 60000 - 57344;
    DeviceReadFailure failure;
    ASSERT_FALSE(RunDeviceReads(
        backend, 8, &files, &reads, [](size_t) {}, &failure));
    EXPECT_EQ(failure.offset, 59000u);
    EXPECT_EQ(failure.error, 0);
  }
}

TEST(RecordDeviceReads, EinvalOnADirectReadSwitchesItsFileToBuffered) {
  const std::string content = Content();
  ScriptedBackend backend(content, {{0, {-EINVAL}}});
  std::vector<DeviceFile> files(1);
  files[0].fd = 3;
  files[0].direct = true;
  files[0].align = 4096;
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads = Reads({{0, 4096}, {8192, 4096}}, &buffers);
  int refused = 0;
  DeviceReadFailure failure;
  ASSERT_TRUE(RunDeviceReads(
      backend, 1, &files, &reads,
      [&](size_t f) {
        ++refused;
        files[f].fd = 4;
        files[f].direct = false;
      },
      &failure));
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(buffers[0], content.substr(0, 4096));
  EXPECT_EQ(buffers[1], content.substr(8192, 4096));
  ASSERT_EQ(backend.requests_.size(), 3u);
  EXPECT_TRUE(backend.requests_[0].direct);
  EXPECT_FALSE(backend.requests_[1].direct);
  EXPECT_EQ(backend.requests_[1].fd, 4);
  EXPECT_EQ(backend.requests_[2].fd, 4);
}

// EINVAL that persists after the switch (refuse_direct could not reopen) fails.
TEST(RecordDeviceReads, EinvalWhenTheFileCannotBeReopenedFails) {
  ScriptedBackend backend(Content(), {{0, {-EINVAL}}});
  std::vector<DeviceFile> files(1);
  files[0].direct = true;
  files[0].align = 4096;
  std::vector<std::string> buffers;
  std::vector<DeviceRead> reads = Reads({{0, 4096}}, &buffers);
  DeviceReadFailure failure;
  ASSERT_FALSE(RunDeviceReads(
      backend, 1, &files, &reads, [](size_t) {}, &failure));
  EXPECT_EQ(failure.error, EINVAL);
}

// The real backends, on a real file, many reads deeper than the queue.
TEST(RecordDeviceReads, IoUringAndPreadReadEveryRangeOfARealFile) {
  TempDir dir;
  const std::string content = Content();
  const std::string path = dir.path() + "/data";
  WriteFile(path, content);
  std::vector<std::pair<uint64_t, uint32_t>> ranges;
  std::mt19937_64 rng(2);
  for (int k = 0; k < 500; ++k) {
    const uint64_t offset = rng() % content.size();
    ranges.push_back({offset, static_cast<uint32_t>(1 + rng() % (content.size() - offset))});
  }
  for (int use_uring : {1, 0}) {
    std::unique_ptr<IoBackend> backend;
    if (use_uring) {
      UringSettings settings;
      settings.queue_depth = 16;
      settings.async_buffered = false;
      settings.max_async_workers = 0;
      int err = 0;
      std::string problem;
      backend = MakeUringBackend(settings, &err, &problem);
      if (!backend) {
        fprintf(stderr, "io_uring unavailable here: %s\n", problem.c_str());
        continue;
      }
    } else {
      backend = MakePreadBackend(3, 16);
    }
    std::vector<DeviceFile> files(1);
    files[0].fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(files[0].fd, 0);
    std::vector<std::string> buffers;
    std::vector<DeviceRead> reads = Reads(ranges, &buffers);
    DeviceReadFailure failure;
    EXPECT_TRUE(RunDeviceReads(
        *backend, 16, &files, &reads, [](size_t) {}, &failure))
        << backend->name();
    for (size_t k = 0; k < ranges.size(); ++k)
      ASSERT_EQ(buffers[k], content.substr(ranges[k].first, ranges[k].second))
          << backend->name() << " read " << k;
    ::close(files[0].fd);
  }
}

}  // namespace
}  // namespace tailcut::detail
