// Tests of tailcut/record_index.h: record indexes of every format find each
// record once with the bytes the Reader hands out; they are kept in a cache
// directory, loaded on the next build, rebuilt with a notice when their file
// changed or the cache file is damaged; ReadRecords reads any set of records
// in any order; damaged and changed files are errors naming file and offset.
#include "tailcut/record_index.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/sample_order.h"
#include "tailcut/work_queue.h"
#include "tests/io/reader_test_util.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ReadAll(const RecordFiles& files, const std::vector<uint64_t>& positions,
                                 size_t threads = 1, uint64_t max_gap = 4096) {
  std::string data;
  std::vector<uint64_t> ends;
  ReadRecords(files, positions, &data, &ends, threads, max_gap);
  std::vector<std::string> out;
  uint64_t begin = 0;
  for (uint64_t end : ends) {
    out.push_back(data.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

RecordIndexOptions CacheIn(const std::string& dir, std::vector<std::string>* notices = nullptr) {
  RecordIndexOptions options;
  options.cache_dir = dir + "/index";
  if (notices) options.notice = [notices](const std::string& line) { notices->push_back(line); };
  return options;
}

class EveryFormat : public ::testing::TestWithParam<RecordFormatKind> {};

TEST_P(EveryFormat, IndexFindsEveryRecordOnceWithTheReadersBytes) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), GetParam(), 4, 500);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  ASSERT_EQ(files->size(), data.records.size());
  std::vector<uint64_t> all(files->size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::string> got = ReadAll(*files, all);
  std::vector<std::string> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, data.records);
  // Any order, repeats, several threads, no coalescing: the same bytes per number.
  std::vector<uint64_t> shuffled = all;
  std::mt19937_64 rng(3);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  shuffled.push_back(shuffled.front());
  for (uint64_t max_gap : {uint64_t{0}, uint64_t{1} << 20}) {
    std::vector<std::string> again = ReadAll(*files, shuffled, 3, max_gap);
    ASSERT_EQ(again.size(), shuffled.size());
    for (size_t k = 0; k < shuffled.size(); ++k) ASSERT_EQ(again[k], got[shuffled[k]]) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(RecordIndex, EveryFormat,
                         ::testing::Values(RecordFormatKind::kLines, RecordFormatKind::kTfrecord,
                                           RecordFormatKind::kFixed, RecordFormatKind::kFile),
                         [](const auto& info) { return std::string(FormatName(info.param)); });

// A C++ trainer's global shuffle: an index work over the records' numbers, each
// item's positions mapped through the epoch's SampleOrder and read at once.
TEST(RecordIndex, AnIndexWorkOverRecordNumbersReadsEveryRecordOnceInAShuffledOrder) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 3, 400);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  WorkQueueOptions options;
  options.name = "record_index_" + std::to_string(::getpid());
  options.num_samples = files->size();
  options.num_slices = 16;
  options.shuffle = true;
  options.seed = 5;
  options.on_notice = [](const std::string&) {};
  auto queue = WorkQueue::Open(options);
  std::vector<std::string> got;
  std::vector<uint64_t> numbers_read;
  WorkItem item;
  while (queue->Take(&item, std::chrono::steady_clock::now() + std::chrono::seconds(10)) ==
         TakeStatus::kOk) {
    SampleOrder order(*queue, item.epoch);
    std::vector<uint64_t> numbers;
    for (uint64_t p = item.begin; p < item.end; ++p) numbers.push_back(order[p]);
    for (std::string& r : ReadAll(*files, numbers)) got.push_back(std::move(r));
    numbers_read.insert(numbers_read.end(), numbers.begin(), numbers.end());
    ASSERT_EQ(queue->Ack(item), AckStatus::kOk);
  }
  queue->Close();  // the last process of a finished queue: it is removed
  std::vector<std::string> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, data.records);
  // Not file order: the first 100 records come from all three files.
  std::set<size_t> first_files;
  for (size_t k = 0; k < 100; ++k) {
    size_t f;
    uint64_t i;
    files->Locate(numbers_read[k], &f, &i);
    first_files.insert(f);
  }
  EXPECT_EQ(first_files.size(), 3u);
}

TEST(RecordIndex, SecondBuildLoadsTheCacheAndScansNothing) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 3, 300);
  std::vector<std::string> notices;
  auto first = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path(), &notices));
  EXPECT_EQ(first->files_scanned(), 3u);
  auto second = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path(), &notices));
  EXPECT_EQ(second->files_scanned(), 0u);
  EXPECT_EQ(second->size(), first->size());
  EXPECT_TRUE(notices.empty());
  for (size_t f = 0; f < 3; ++f) {
    EXPECT_EQ(second->file(f).offsets, first->file(f).offsets);
    EXPECT_EQ(second->file(f).sizes, first->file(f).sizes);
  }
}

// Progress: one call per file, files done counting up to all of them and
// the bytes of the files scanned; a second build loads every index and
// reports no bytes scanned.
TEST(RecordIndex, ABuildReportsItsProgressFileByFile) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 5, 200);
  uint64_t total = 0;
  for (const std::string& path : data.paths) total += fs::file_size(path);
  for (uint64_t want_bytes : {total, uint64_t{0}}) {
    std::vector<std::pair<size_t, uint64_t>> calls;
    RecordIndexOptions options = CacheIn(dir.path());
    options.progress = [&](size_t done, size_t of, uint64_t bytes) {
      EXPECT_EQ(of, 5u);
      calls.emplace_back(done, bytes);
    };
    RecordFiles::Build(data.paths, data.format, options);
    ASSERT_EQ(calls.size(), 5u);
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].first, i + 1);
      if (i > 0) EXPECT_GE(calls[i].second, calls[i - 1].second);
    }
    EXPECT_EQ(calls.back().second, want_bytes);
  }
}

TEST(RecordIndex, AFileThatChangedIsIndexedAgainWithANotice) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 200);
  std::vector<std::string> notices;
  RecordFiles::Build(data.paths, data.format, CacheIn(dir.path(), &notices));
  // One more line, same mtime second or not: size and mtime both move.
  WriteFile(data.paths[1], data.contents[1] + "\nadded line\n");
  struct timeval later[2] = {{2000000000, 0}, {2000000000, 0}};
  ASSERT_EQ(::utimes(data.paths[1].c_str(), later), 0);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path(), &notices));
  EXPECT_EQ(files->files_scanned(), 1u);
  EXPECT_EQ(files->size(), data.records.size() + 1);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find(data.paths[1]), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("changed since it was indexed"), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("mtime"), std::string::npos) << notices[0];
  EXPECT_EQ(ReadAll(*files, {files->size() - 1})[0], "added line");
}

TEST(RecordIndex, ADamagedCacheFileIsRebuiltWithANotice) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 200);
  RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  std::string cache;
  for (const auto& e : fs::directory_iterator(dir.path() + "/index")) cache = e.path();
  ASSERT_FALSE(cache.empty());
  std::string bytes = ReadFile(cache);
  bytes[bytes.size() / 2] ^= 0x40;
  WriteFile(cache, bytes);
  std::vector<std::string> notices;
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path(), &notices));
  EXPECT_EQ(files->files_scanned(), 1u);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("damaged"), std::string::npos) << notices[0];
  EXPECT_EQ(files->size(), data.records.size());
}

TEST(RecordIndex, ACorruptTfrecordHeaderIsAnErrorOfTheBuildNamingFileAndOffset) {
  TempDir dir;
  std::string content;
  AppendTfrecord(&content, "first");
  const size_t second = content.size();
  AppendTfrecord(&content, "second record");
  content[second + 2] ^= 1;  // a byte of the second record's length
  const std::string path = dir.path() + "/bad.tfrecord";
  WriteFile(path, content);
  try {
    RecordFiles::Build({path}, RecordFormat::Parse("tfrecord"), CacheIn(dir.path()));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(second)), std::string::npos)
        << e.what();
  }
}

TEST(RecordIndex, ACorruptTfrecordDataIsAnErrorOfTheReadNamingFileAndOffset) {
  TempDir dir;
  std::string content;
  AppendTfrecord(&content, "first");
  const size_t second = content.size();
  AppendTfrecord(&content, "second record");
  content[second + 12 + 3] ^= 1;  // a byte of the second record's data
  const std::string path = dir.path() + "/bad.tfrecord";
  WriteFile(path, content);
  auto files = RecordFiles::Build({path}, RecordFormat::Parse("tfrecord"), CacheIn(dir.path()));
  EXPECT_EQ(ReadAll(*files, {0})[0], "first");
  try {
    ReadAll(*files, {1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(second)), std::string::npos)
        << e.what();
  }
}

TEST(RecordIndex, ATfrecordCutShortIsAnErrorOfTheBuild) {
  TempDir dir;
  std::string content;
  AppendTfrecord(&content, "first");
  AppendTfrecord(&content, "second record");
  content.resize(content.size() - 3);
  const std::string path = dir.path() + "/short.tfrecord";
  WriteFile(path, content);
  try {
    RecordFiles::Build({path}, RecordFormat::Parse("tfrecord"), CacheIn(dir.path()));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut short"), std::string::npos) << e.what();
  }
}

TEST(RecordIndex, AFixedFileOfAPartialRecordIsAnError) {
  TempDir dir;
  const std::string path = dir.path() + "/odd.bin";
  WriteFile(path, std::string(250, 'x'));
  EXPECT_THROW(RecordFiles::Build({path}, RecordFormat::Parse("fixed", 100), CacheIn(dir.path())),
               Error);
}

TEST(RecordIndex, AMissingFileIsAnErrorNamingIt) {
  TempDir dir;
  try {
    RecordFiles::Build({dir.path() + "/none.txt"}, RecordFormat::Parse("lines"),
                       CacheIn(dir.path()));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("none.txt"), std::string::npos) << e.what();
  }
}

TEST(RecordIndex, ReadingAFileTruncatedSinceItWasIndexedIsAnError) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 200);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  ASSERT_EQ(::truncate(data.paths[0].c_str(), 10), 0);
  try {
    ReadAll(*files, {files->size() - 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(data.paths[0]), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(RecordIndex, AFileTruncatedUnderItsMappingIsAnErrorNotACrash) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 1, 4000);  // 1.2 MB
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  // The mapping, whatever TAILCUT_IO says.
  auto read_mapped = [](const RecordFiles& f, const std::vector<uint64_t>& positions) {
    ReadRecordsOptions options;
    options.path = RecordReadPath::kMap;
    std::string data;
    std::vector<uint64_t> ends;
    ReadRecords(f, positions, &data, &ends, options);
    return std::vector<std::string>{data.substr(0, ends.empty() ? 0 : ends[0])};
  };
  read_mapped(*files, {0});  // the file is mapped now
  ASSERT_EQ(::truncate(data.paths[0].c_str(), 4096), 0);
  try {
    read_mapped(*files, {files->size() - 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(data.paths[0]), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_mapped(*files, {1})[0], std::string(data.contents[0], 100, 100));  // still usable
}

TEST(RecordIndex, APositionOutOfRangeIsAnError) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 1, 10);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  EXPECT_THROW(ReadAll(*files, {files->size()}), Error);
}

TEST(RecordIndex, EmptyFilesAmongOthersAreSkippedByTheNumbering) {
  TempDir dir;
  std::vector<std::string> paths;
  for (const char* text : {"", "a\nb\n", "", "", "c\n", ""}) {
    paths.push_back(dir.path() + "/f" + std::to_string(paths.size()));
    WriteFile(paths.back(), text);
  }
  auto files = RecordFiles::Build(paths, RecordFormat::Parse("lines"), CacheIn(dir.path()));
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ(ReadAll(*files, {2, 0, 1}), (std::vector<std::string>{"c", "a", "b"}));
}

// The TFRecord scan reads 256 KiB windows and sizes its vectors from the
// file's first 256 records: here those are empty (an estimate of a record
// per 16 bytes, far too high), then records longer than a window (skipped,
// not read), then short ones again.
TEST(RecordIndex, ATfrecordOfEmptyHugeAndShortRecordsIsIndexedWhole) {
  TempDir dir;
  std::string content;
  std::vector<std::string> records;
  for (int i = 0; i < 300; ++i) records.push_back("");
  for (int i = 0; i < 12; ++i) records.push_back(std::string((300 << 10) + i, char('a' + i)));
  for (int i = 0; i < 300; ++i) records.push_back("r" + std::to_string(i));
  for (const std::string& r : records) AppendTfrecord(&content, r);
  const std::string path = dir.path() + "/mixed.tfrecord";
  WriteFile(path, content);
  auto files = RecordFiles::Build({path}, RecordFormat::Parse("tfrecord"), CacheIn(dir.path()));
  ASSERT_EQ(files->size(), records.size());
  std::vector<uint64_t> all(records.size());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(ReadAll(*files, all), records);
  // The estimate's room was given back: at most twice the records, and some.
  EXPECT_LE(files->file(0).offsets.capacity(), 2 * records.size() + 1024);
}

}  // namespace
}  // namespace tailcut
