// Tests of tailcut::Batcher over a real Reader and queue: full batches across
// items, epochs never mixed, the byte budget, in-place batches, max_epoch,
// deadlines and short batches at the end of the data, errors after a batch.
#include "tailcut/batcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/queue_test_util.h"
#include "item_holder.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

using test::QueueGuard;
using test::TempDir;
using test::UniqueQueueName;

struct Data {
  RecordFormat format;
  std::vector<std::string> paths;
  std::vector<std::string> records;  // sorted
};

// Lines of 0..120 bytes (or fixed 100-byte records), each unique.
Data MakeData(const std::string& dir, int files, size_t per_file, bool fixed = false) {
  std::mt19937_64 rng(7);
  Data data;
  data.format.kind = fixed ? RecordFormatKind::kFixed : RecordFormatKind::kLines;
  if (fixed) data.format.record_bytes = 100;
  for (int f = 0; f < files; ++f) {
    std::string content;
    for (size_t i = 0; i < per_file; ++i) {
      std::string record = "f" + std::to_string(f) + "r" + std::to_string(i) + ":";
      size_t size = fixed ? 100 : record.size() + rng() % 120;
      while (record.size() < size) record += static_cast<char>('a' + rng() % 26);
      data.records.push_back(record);
      content += record;
      if (!fixed) content += '\n';
    }
    std::string path = dir + "/data_" + std::to_string(f);
    std::ofstream(path, std::ios::binary) << content;
    data.paths.push_back(path);
  }
  std::sort(data.records.begin(), data.records.end());
  return data;
}

WorkQueueOptions QueueOptions(const Data& data, const std::string& name, uint64_t slices,
                              uint64_t epochs = 1, uint32_t clients = 1) {
  WorkQueueOptions options;
  options.works = data.paths;
  options.num_slices = slices;
  options.num_epochs = epochs;
  options.num_clients = clients;
  options.seed = 3;
  options.name = name;
  options.format = data.format.Tag();
  options.on_notice = [](const std::string&) {};
  return options;
}

ReaderOptions SmallReaderOptions(const RecordFormat& format) {
  ReaderOptions options;
  options.format = format;
  options.buffer_budget_bytes = 64 << 10;
  options.chunk_bytes = 4 << 10;
  options.backend = IoBackend::kPread;
  options.cuda_register = false;
  options.on_notice = [](const std::string&) {};
  return options;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Checks the batch's layout and appends its records.
void Collect(const Batch& batch, std::vector<std::string>* out) {
  ASSERT_EQ(batch.offsets.size(), batch.count + 1);
  ASSERT_EQ(batch.offsets[0], 0);
  if (!batch.in_place) {
    ASSERT_EQ(batch.data, batch.storage.data());
    ASSERT_EQ(batch.bytes(), batch.storage.size());
  }
  for (size_t i = 0; i < batch.count; ++i) out->emplace_back(batch.record(i));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(BatcherTest, BatchesAreFullAcrossItemsAndHandOutEveryRecordOnce) {
  TempDir dir;
  Data data = MakeData(dir.path(), 3, 500);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 17));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 64});
  Batch batch;
  std::vector<std::string> records;
  std::vector<size_t> counts;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    Collect(batch, &records);
    counts.push_back(batch.count);
    EXPECT_FALSE(batch.in_place);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_EQ(batch.count, 0u);
  EXPECT_TRUE(Sorted(records) == data.records);
  // Items and chunks end inside batches; only the last batch is short.
  ASSERT_EQ(counts.size(), (data.records.size() + 63) / 64);
  for (size_t i = 0; i + 1 < counts.size(); ++i) EXPECT_EQ(counts[i], 64u) << "batch " << i;
  EXPECT_EQ(counts.back(), data.records.size() % 64);
  EXPECT_EQ(batcher.Next(&batch), ReadStatus::kEnd);
}

// Each record starts "f<file>r", so its text names the file it came from.
TEST(BatcherTest, RecordFilesSayWhichFileEachRecordOfABatchMixingItemsCameFrom) {
  TempDir dir;
  Data data = MakeData(dir.path(), 3, 200);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 7));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 64, .record_files = true});
  Batch batch;
  size_t records = 0;
  size_t mixed = 0;  // batches holding records of two files or more
  while (batcher.Next(&batch, 1 + records % 64) == ReadStatus::kOk) {
    ASSERT_EQ(batch.files.size(), batch.count);
    for (size_t i = 0; i < batch.count; ++i) {
      std::string_view record = batch.record(i);
      EXPECT_EQ(record.substr(0, record.find('r')), "f" + std::to_string(batch.files[i]));
    }
    mixed += std::adjacent_find(batch.files.begin(), batch.files.end(), std::not_equal_to<>()) !=
             batch.files.end();
    records += batch.count;
  }
  EXPECT_EQ(records, data.records.size()) << batcher.error();
  EXPECT_GT(mixed, 0u);
}

TEST(BatcherTest, ALimitPerCallCapsTheBatchAndHeldBackRecordsComeFirst) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 4, 2));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 50});
  Batch batch;
  std::vector<std::string> records;
  ReadStatus status;
  for (size_t call = 0;; ++call) {
    size_t limit = 1 + call % 7;
    status = batcher.Next(&batch, limit);
    if (status != ReadStatus::kOk) break;
    EXPECT_LE(batch.count, limit);
    Collect(batch, &records);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  std::vector<std::string> twice = data.records;
  twice.insert(twice.end(), data.records.begin(), data.records.end());
  EXPECT_TRUE(Sorted(records) == Sorted(twice));
}

TEST(BatcherTest, ABatchNeverMixesEpochs) {
  TempDir dir;
  Data data = MakeData(dir.path(), 3, 211);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 7, 3));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 100});
  Batch batch;
  std::map<uint64_t, std::vector<std::string>> by_epoch;
  std::map<uint64_t, size_t> short_batches;
  uint64_t last_epoch = 0;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    EXPECT_GE(batch.epoch, last_epoch);
    last_epoch = batch.epoch;
    Collect(batch, &by_epoch[batch.epoch]);
    if (batch.count < 100) ++short_batches[batch.epoch];
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  ASSERT_EQ(by_epoch.size(), 3u);
  // A batch labelled with one epoch that held records of the next would leave
  // one epoch with a record twice and the other without it.
  for (auto& [epoch, records] : by_epoch) {
    EXPECT_TRUE(Sorted(records) == data.records) << "epoch " << epoch;
    EXPECT_EQ(short_batches[epoch], 1u) << "one short batch per epoch, at its end";
  }
}

TEST(BatcherTest, ABatchEndsBeforeARecordThatWouldExceedTheByteBudget) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 400);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 5));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 1000, .max_bytes = 1500});
  Batch batch;
  std::vector<std::string> records;
  std::vector<size_t> bytes;
  std::vector<size_t> first_sizes;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    EXPECT_LE(batch.bytes(), 1500u);
    bytes.push_back(batch.bytes());
    first_sizes.push_back(batch.record(0).size());
    Collect(batch, &records);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(records) == data.records);
  // Each batch but the last ended because the next record did not fit.
  for (size_t i = 0; i + 1 < bytes.size(); ++i)
    EXPECT_GT(bytes[i] + first_sizes[i + 1], 1500u) << "batch " << i;
}

TEST(BatcherTest, ARecordLargerThanTheByteBudgetIsABatchOfItsOwn) {
  TempDir dir;
  Data data = MakeData(dir.path(), 1, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 8, .max_bytes = 10});
  Batch batch;
  std::vector<std::string> records;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    if (batch.bytes() > 10) EXPECT_EQ(batch.count, 1u);
    Collect(batch, &records);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(records) == data.records);
}

TEST(BatcherTest, ZeroCopyHandsOutWholeBackToBackBatchesInPlace) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 1000, /*fixed=*/true);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 3));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 8, .zero_copy = true});
  Batch batch;
  std::vector<std::string> records;
  size_t in_place = 0, copied = 0;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    if (batch.in_place) {
      ++in_place;
      EXPECT_EQ(batch.count, 8u);
      EXPECT_TRUE(batch.storage.empty());
      EXPECT_EQ(batch.bytes(), 800u);
    } else {
      ++copied;
    }
    for (size_t i = 0; i <= batch.count; ++i) EXPECT_EQ(batch.offsets[i], int64_t(100 * i));
    Collect(batch, &records);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(records) == data.records);
  // 4 KiB chunks hold 40 records: a batch crosses a chunk end now and then.
  EXPECT_GT(in_place, copied);
  EXPECT_GT(copied, 0u);
}

TEST(BatcherTest, MaxEpochStopsAtTheNextEpochAndItsItemGoesBackWhole) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 6, 2));
  std::vector<std::string> first, second;
  {
    auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
    Batcher batcher(*reader, {.max_records = 40, .max_epoch = 0});
    Batch batch;
    ReadStatus status;
    while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
      EXPECT_EQ(batch.epoch, 0u);
      Collect(batch, &first);
    }
    ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
    EXPECT_EQ(reader->items_held(), 0u) << "the Reader was closed";
    EXPECT_GE(reader->stats().items_given_back, 1u);
  }
  EXPECT_TRUE(Sorted(first) == data.records);
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 40});
  Batch batch;
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) {
    EXPECT_EQ(batch.epoch, 1u);
    Collect(batch, &second);
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(second) == data.records) << "epoch 1 exactly once";
}

TEST(BatcherTest, DropLastDropsOnlyTheShortLastBatch) {
  TempDir dir;
  Data data = MakeData(dir.path(), 1, 250);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 2));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 100, .drop_last = true});
  Batch batch;
  size_t batches = 0;
  while (batcher.Next(&batch) == ReadStatus::kOk) {
    EXPECT_EQ(batch.count, 100u);
    ++batches;
  }
  EXPECT_EQ(batches, 2u);
  EXPECT_EQ(batcher.Next(&batch), ReadStatus::kEnd);
}

// Another process holds the last item: the Batcher hands out what it has,
// then kEmpty at the deadline with nothing held back, then the rest once the
// item comes back; every record once.
TEST(BatcherTest, AtTheEndTheDeadlineGivesAShortBatchThenEmptyThenTheRest) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 6, 1, 2);
  auto queue = WorkQueue::Open(qo);
  ItemHolder holder(qo);
  ASSERT_TRUE(holder.ok());
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 1000});
  Batch batch;
  std::vector<std::string> records;
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(batcher.Next(&batch, start + std::chrono::milliseconds(200)), ReadStatus::kOk);
  EXPECT_GE(SecondsSince(start), 0.2) << "it waited to fill the batch until the deadline";
  EXPECT_GT(batch.count, 0u);
  EXPECT_LT(batch.count, data.records.size());
  Collect(batch, &records);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(batcher.Next(&batch, t0 + std::chrono::milliseconds(50)), ReadStatus::kEmpty);
  EXPECT_EQ(batch.count, 0u);
  EXPECT_EQ(batcher.held_back(), 0u);
  EXPECT_EQ(reader->items_held(), 0u);
  EXPECT_EQ(batcher.Next(&batch, std::chrono::steady_clock::now()), ReadStatus::kEmpty);
  ASSERT_EQ(holder.GiveBack(), 0);
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) Collect(batch, &records);
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(records) == data.records);
}

TEST(BatcherTest, ShortAtEndHandsOutWhatItHasInsteadOfWaitingForOthers) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 6, 1, 2);
  auto queue = WorkQueue::Open(qo);
  ItemHolder holder(qo);
  ASSERT_TRUE(holder.ok());
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 1000, .short_at_end = true});
  Batch batch;
  std::vector<std::string> records;
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(batcher.Next(&batch), ReadStatus::kOk);  // no deadline, and yet no wait
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_GT(batch.count, 0u);
  Collect(batch, &records);
  holder.Kill();
  ReadStatus status;
  while ((status = batcher.Next(&batch)) == ReadStatus::kOk) Collect(batch, &records);
  ASSERT_EQ(status, ReadStatus::kEnd) << batcher.error();
  EXPECT_TRUE(Sorted(records) == data.records);
}

TEST(BatcherTest, AReaderErrorComesAfterTheRecordsReadBeforeIt) {
  TempDir dir;
  Data data = MakeData(dir.path(), 2, 300);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 2);
  qo.shuffle = false;
  auto queue = WorkQueue::Open(qo);
  fs::resize_file(data.paths[1], 100);  // the second item's file shrinks
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  Batcher batcher(*reader, {.max_records = 1000});
  Batch batch;
  ASSERT_EQ(batcher.Next(&batch), ReadStatus::kOk);
  EXPECT_EQ(batch.count, 300u) << "the first file's records";
  EXPECT_EQ(batcher.Next(&batch), ReadStatus::kError);
  EXPECT_EQ(batch.count, 0u);
  EXPECT_NE(batcher.error().find("when the queue was created"), std::string::npos)
      << batcher.error();
  EXPECT_EQ(batcher.error_kind(), ErrorKind::kIo);
  EXPECT_EQ(batcher.Next(&batch), ReadStatus::kError) << "sticky";
}

TEST(BatcherTest, ZeroMaxRecordsIsAnInvalidArgument) {
  TempDir dir;
  Data data = MakeData(dir.path(), 1, 10);
  std::string name = UniqueQueueName("batcher");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format));
  try {
    Batcher batcher(*reader, {.max_records = 0});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(), "batcher: max_records must be at least 1");
  }
}

}  // namespace
}  // namespace tailcut
