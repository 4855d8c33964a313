// Tests of tailcut/global_order_reader.h in one process: the order is the
// queue's permutation (what QueueDataset(shuffle="global") reads), batches
// span items of one epoch, a checkpoint resumes mid-item exactly, a corrupt
// TFRecord is an error naming file and offset, tar samples come whole, the
// end of the data waits for another process's item, two threads at once and
// a forked child are refused, and bad arguments are errors naming what is wrong.
// tests/io/global_order_reader_process_test.cc has the multi-process ones.
#include "tailcut/global_order_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fork_child.h"
#include "item_holder.h"
#include "reader_test_util.h"
#include "tailcut/record_index.h"
#include "tailcut/sample_order.h"
#include "tailcut/tar_sample.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using tailcut::testing::InChild;

RecordIndexOptions CacheIn(const std::string& dir) {
  RecordIndexOptions options;
  options.cache_dir = dir + "/index";
  return options;
}

WorkQueueOptions BaseOptions(const std::string& name, uint64_t epochs = 1) {
  WorkQueueOptions options;
  options.name = name;
  options.seed = 11;
  options.num_epochs = epochs;
  options.on_notice = [](const std::string&) {};
  return options;
}

struct Got {
  uint64_t epoch;
  uint64_t number;
  std::string bytes;
};

// Reads with NextBatch(batch) (NextRecord when batch is 1) until a status
// other than kOk or `limit` records; checks what every batch says of itself.
ReadStatus ReadSome(GlobalOrderReader& reader, size_t batch, std::vector<Got>* got,
                    size_t limit = SIZE_MAX) {
  std::vector<Record> records(batch);
  ReadStatus status = ReadStatus::kOk;
  while (got->size() < limit) {
    size_t n = 0;
    if (batch == 1) {
      status = reader.NextRecord(records.data());
      n = status == ReadStatus::kOk ? 1 : 0;
    } else {
      status = reader.NextBatch(records.data(), std::min(batch, limit - got->size()), &n);
    }
    if (status != ReadStatus::kOk) {
      EXPECT_EQ(n, 0u);
      EXPECT_TRUE(reader.numbers().empty());
      break;
    }
    EXPECT_GE(n, 1u);
    EXPECT_EQ(reader.numbers().size(), n);
    for (size_t i = 0; i < n; ++i) {
      got->push_back(
          {reader.epoch(), reader.numbers()[i],
           std::string(reinterpret_cast<const char*>(records[i].data), records[i].size)});
    }
  }
  return status;
}

// What ReadRecords gives for each number: the bytes every reader must hand out.
std::vector<std::string> AllRecords(const RecordFiles& files) {
  std::vector<uint64_t> all(files.size());
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  std::string data;
  std::vector<uint64_t> ends;
  ReadRecords(files, all, &data, &ends);
  std::vector<std::string> out;
  uint64_t begin = 0;
  for (uint64_t end : ends) {
    out.push_back(data.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

// The order one process reads an index work in: tickets in order, each
// item's positions through its epoch's permutation.
std::vector<std::pair<uint64_t, uint64_t>> ExpectedOrder(const WorkQueue& queue) {
  std::vector<std::pair<uint64_t, uint64_t>> order;
  for (uint64_t e = 0; e < queue.num_epochs(); ++e) {
    SampleOrder samples(queue, e);
    for (uint64_t t = 0; t < queue.num_items(); ++t) {
      const WorkQueue::Item& item = queue.items()[queue.ItemAt(e, t)];
      for (uint64_t p = item.begin; p < item.end; ++p) order.push_back({e, samples[p]});
    }
  }
  return order;
}

// QueueDataset(shuffle="global") sizes items as min(max(1, n // 256),
// max(ceil(n / 4096), 64)) (tailcut/torch/_queue_dataset.py) and holds 32
// leases; QueueOptions must make the same queue, or the orders differ.
TEST(GlobalOrderReaderTest, QueueOptionsAreThoseOfQueueDatasetsGlobalShuffle) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 2, 700);  // 4,200 records
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  WorkQueueOptions base = BaseOptions("unused");
  base.works = {"x"};
  base.format = "lines";
  base.shuffle = false;
  WorkQueueOptions o = GlobalOrderReader::QueueOptions(*files, base);
  EXPECT_EQ(o.num_samples, 4200u);
  EXPECT_EQ(*o.num_slices, 16u);  // min(max(1, 16), max(2, 64))
  EXPECT_TRUE(o.shuffle);
  EXPECT_TRUE(o.works.empty());
  EXPECT_TRUE(o.format.empty());
  EXPECT_EQ(o.leases_per_client, 32u);
  EXPECT_EQ(o.min_split_bytes, 8u);  // Python's WorkQueue sets it so for an index work
  EXPECT_EQ(o.seed, base.seed);
  base.num_slices = 5;
  base.leases_per_client = 12;
  base.min_split_bytes = 100;
  o = GlobalOrderReader::QueueOptions(*files, base);
  EXPECT_EQ(*o.num_slices, 5u);
  EXPECT_EQ(o.leases_per_client, 12u);
  EXPECT_EQ(o.min_split_bytes, 100u);
}

// Same seed, same order: one process reads the records in ticket order, each
// item's positions through its epoch's permutation, whatever the batch
// sizes, and each record's bytes are those of its number.
TEST(GlobalOrderReaderTest, TheOrderIsTheQueuesPermutationOfRecordNumbers) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 3, 600);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  const std::vector<std::string> bytes = AllRecords(*files);
  for (size_t batch : {size_t{1}, size_t{7}, size_t{300}, size_t{2000}}) {
    std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, BaseOptions(name, 2)));
    auto reader = GlobalOrderReader::Open(*queue, files);
    std::vector<Got> got;
    ASSERT_EQ(ReadSome(*reader, batch, &got), ReadStatus::kEnd) << reader->error();
    auto expected = ExpectedOrder(*queue);
    ASSERT_EQ(got.size(), expected.size()) << "batch " << batch;
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].epoch, expected[k].first) << "batch " << batch << " record " << k;
      ASSERT_EQ(got[k].number, expected[k].second) << "batch " << batch << " record " << k;
      ASSERT_EQ(got[k].bytes, bytes[got[k].number]) << "batch " << batch << " record " << k;
    }
    // Shuffled across files: the first 60 records come from all three.
    std::set<size_t> first_files;
    for (size_t k = 0; k < 60; ++k) {
      size_t f;
      uint64_t i;
      files->Locate(got[k].number, &f, &i);
      first_files.insert(f);
    }
    EXPECT_EQ(first_files.size(), 3u);
    ReaderStats stats = reader->stats();
    EXPECT_EQ(stats.records, got.size());
    EXPECT_EQ(stats.items_taken, 2 * queue->num_items());
    EXPECT_EQ(stats.items_acked, 2 * queue->num_items());
    EXPECT_EQ(reader->items_held(), 0u);
  }
}

// A batch takes positions from as many items as it needs, but never from two
// epochs: full batches but at each epoch's end, and Record's offsets are
// where each record lies in its file.
TEST(GlobalOrderReaderTest, BatchesSpanItemsOfOneEpochAndNameWhereEachRecordLies) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 2, 500);  // 1,000 records
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = BaseOptions(name, 2);
  qo.num_slices = 40;  // items of 25 positions
  auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, qo));
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Record> records(64);
  std::vector<size_t> sizes;
  std::vector<uint64_t> epochs;
  size_t n;
  while (reader->NextBatch(records.data(), 64, &n) == ReadStatus::kOk) {
    sizes.push_back(n);
    epochs.push_back(reader->epoch());
    for (size_t i = 0; i < n; ++i) {
      size_t f;
      uint64_t r;
      files->Locate(reader->numbers()[i], &f, &r);
      const uint64_t payload = files->file(f).Offset(r);
      ASSERT_EQ(records[i].offset, payload - 12);  // the TFRecord's header
      ASSERT_EQ(records[i].end, payload + records[i].size + 4);
      ASSERT_EQ(std::string(reinterpret_cast<const char*>(records[i].data), records[i].size),
                data.contents[f].substr(payload, records[i].size));
    }
  }
  ASSERT_TRUE(reader->error().empty()) << reader->error();
  // 1,000 records per epoch: 15 batches of 64 and one of 40, twice.
  std::vector<size_t> expected;
  for (int e = 0; e < 2; ++e) {
    for (int b = 0; b < 15; ++b) expected.push_back(64);
    expected.push_back(40);
  }
  EXPECT_EQ(sizes, expected);
  EXPECT_EQ(epochs[15], 0u);
  EXPECT_EQ(epochs[16], 1u);
}

// Checkpoint mid-item: SaveState after some batches and records one by one;
// a queue restored from it reads exactly the records not handed out yet.
TEST(GlobalOrderReaderTest, ACheckpointResumesMidItemExactlyAfterTheLastRecordHandedOut) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 3, 400);  // 1,200 records
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  for (size_t cut : {size_t{1}, size_t{37}, size_t{150}, size_t{1203}}) {
    std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    WorkQueueOptions qo = GlobalOrderReader::QueueOptions(*files, BaseOptions(name, 2));
    qo.num_slices = 12;  // items of 100 positions: the cuts fall mid-item
    std::vector<Got> first;
    std::string state;
    {
      auto queue = WorkQueue::Open(qo);
      auto reader = GlobalOrderReader::Open(*queue, files);
      ASSERT_EQ(ReadSome(*reader, 33, &first, cut - cut % 33), ReadStatus::kOk);
      if (cut % 33 != 0) ASSERT_EQ(ReadSome(*reader, 1, &first, cut), ReadStatus::kOk);
      ASSERT_EQ(first.size(), cut);
      state = queue->SaveState();
      // The job stops here (the reader gives its items back, the unfinished
      // queue is removed with its last process).
    }
    qo.restore_state = state;
    auto queue = WorkQueue::Open(qo);
    auto reader = GlobalOrderReader::Open(*queue, files);
    std::vector<Got> rest;
    ASSERT_EQ(ReadSome(*reader, 50, &rest), ReadStatus::kEnd) << reader->error();
    std::map<std::pair<uint64_t, uint64_t>, int> seen;
    for (const Got& g : first) ++seen[{g.epoch, g.number}];
    for (const Got& g : rest) ++seen[{g.epoch, g.number}];
    EXPECT_EQ(seen.size(), 2 * files->size()) << "cut " << cut;
    for (const auto& [key, count] : seen)
      ASSERT_EQ(count, 1) << "cut " << cut << ": epoch " << key.first << " record " << key.second;
    EXPECT_EQ(first.size() + rest.size(), 2 * files->size()) << "cut " << cut;
  }
}

TEST(GlobalOrderReaderTest, ACorruptTfrecordIsAnErrorNamingFileAndOffsetAndItsItemsGoBack) {
  TempDir dir;
  std::vector<std::string> paths;
  uint64_t bad_offset = 0;
  for (int f = 0; f < 2; ++f) {
    std::string content;
    for (int i = 0; i < 300; ++i) {
      if (f == 1 && i == 123) bad_offset = content.size();
      AppendTfrecord(&content, "file " + std::to_string(f) + " record " + std::to_string(i));
    }
    // A byte of record 123's data in file 1 flipped: the index checks only
    // headers, so the build passes; the data CRC is checked as it is read.
    if (f == 1) content[bad_offset + 12 + 2] ^= 0x20;
    paths.push_back(dir.path() + "/part" + std::to_string(f) + ".tfrecord");
    WriteFile(paths.back(), content);
  }
  auto files = RecordFiles::Build(paths, RecordFormat::Parse("tfrecord"), CacheIn(dir.path()));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, BaseOptions(name)));
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Got> got;
  ASSERT_EQ(ReadSome(*reader, 16, &got), ReadStatus::kError);
  EXPECT_LT(got.size(), 600u);
  EXPECT_EQ(reader->error_kind(), ErrorKind::kCorrupt);
  EXPECT_NE(reader->error().find(paths[1]), std::string::npos) << reader->error();
  EXPECT_NE(reader->error().find("offset " + std::to_string(bad_offset)), std::string::npos)
      << reader->error();
  EXPECT_NE(reader->error().find("data CRC"), std::string::npos) << reader->error();
  EXPECT_EQ(reader->items_held(), 0u);
  EXPECT_GE(reader->stats().items_given_back, 1u);
  Record record;
  EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kError) << "the error is sticky";
  // Given back, not lost: this process holds no lease, the items wait for a taker.
  for (const ClientStats& c : queue->Stats().clients)
    if (c.pid == ::getpid()) EXPECT_EQ(c.open_items, 0u);
}

// Tar shards written by Python's tarfile: each record is one whole sample,
// its members readable with TarSample, every sample once.
TEST(GlobalOrderReaderTest, TarSamplesComeWholeAndEachOnce) {
  TempDir dir;
  const std::string script =
      "python3 -c 'import io, sys, tarfile\n"
      "for s in range(3):\n"
      "    with tarfile.open(sys.argv[1] + \"/shard%d.tar\" % s, \"w\", "
      "format=tarfile.USTAR_FORMAT) as t:\n"
      "        for i in range(40):\n"
      "            key = \"s%d/%04d\" % (s, i)\n"
      "            for suffix in (\"jpg\", \"cls\"):\n"
      "                data = (\"%s.%s:\" % (key, suffix)).encode() * (1 + i % 7)\n"
      "                info = tarfile.TarInfo(key + \".\" + suffix)\n"
      "                info.size = len(data)\n"
      "                t.addfile(info, io.BytesIO(data))\n' " +
      dir.path();
  if (std::system(script.c_str()) != 0) GTEST_SKIP() << "python3 could not write tar shards";
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) paths.push_back(dir.path() + "/shard" + std::to_string(s) + ".tar");
  auto files = RecordFiles::Build(paths, RecordFormat::Parse("tar"), CacheIn(dir.path()));
  ASSERT_EQ(files->size(), 120u);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, BaseOptions(name)));
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::set<std::string> keys;
  std::set<char> first_shards;
  Record batch[9];
  size_t n;
  while (reader->NextBatch(batch, 9, &n) == ReadStatus::kOk) {
    for (size_t i = 0; i < n; ++i) {
      TarSample sample(batch[i]);
      ASSERT_EQ(sample.members().size(), 2u) << sample.key();
      const int repeat = 1 + std::stoi(sample.key().substr(3)) % 7;
      for (const char* suffix : {"jpg", "cls"}) {
        const TarMember* member = sample.Find(suffix);
        ASSERT_NE(member, nullptr) << sample.key() << "." << suffix;
        std::string want;
        for (int r = 0; r < repeat; ++r) want += sample.key() + "." + suffix + ":";
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(member->data), member->size), want);
      }
      EXPECT_TRUE(keys.insert(sample.key()).second) << sample.key() << " twice";
      if (keys.size() <= 12) first_shards.insert(sample.key()[1]);
    }
  }
  ASSERT_TRUE(reader->error().empty()) << reader->error();
  EXPECT_EQ(keys.size(), 120u);
  EXPECT_EQ(first_shards.size(), 3u) << "the first 12 samples come from every shard";
}

// The end of the data while another process holds an item: kEmpty at the
// deadline holding nothing, then, once it comes back, its records once.
TEST(GlobalOrderReaderTest, EmptyAtTheDeadlineWhileAnotherProcessHoldsAnItemThenItsRecords) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 2, 100);  // 600 records
  const uint64_t n = data.records.size();
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = BaseOptions(name);
  qo.num_samples = n;
  qo.num_slices = 6;
  qo.num_clients = 2;
  ItemHolder holder(qo);  // forked before this process has threads
  ASSERT_TRUE(holder.ok());
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  auto queue = WorkQueue::Open(qo);
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Got> got;
  std::vector<Record> records(32);
  size_t count;
  ReadStatus status;
  auto start = std::chrono::steady_clock::now();
  while ((status = reader->NextBatch(records.data(), 32, &count,
                                     start + std::chrono::milliseconds(300))) == ReadStatus::kOk)
    got.resize(got.size() + count);
  ASSERT_EQ(status, ReadStatus::kEmpty) << reader->error();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ(reader->items_held(), 0u);
  EXPECT_EQ(got.size(), n - 100);
  EXPECT_EQ(reader->NextRecord(records.data(), std::chrono::steady_clock::now()),
            ReadStatus::kEmpty);
  holder.Kill();  // its item comes back when this process finds it dead
  got.clear();
  ASSERT_EQ(ReadSome(*reader, 32, &got), ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(got.size(), 100u);
}

// Two threads in Next* at once: the second is refused at once, the first
// ends with the sticky error, its items given back.
TEST(GlobalOrderReaderTest, TwoThreadsCallingAtOnceFailTheReaderSayingSo) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 2, 100);  // 600 records
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = BaseOptions(name);
  qo.num_samples = data.records.size();
  qo.num_slices = 6;
  qo.num_clients = 2;
  ItemHolder holder(qo);  // so that the first call waits at the end of the data
  ASSERT_TRUE(holder.ok());
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  auto queue = WorkQueue::Open(qo);
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Got> got;
  ASSERT_EQ(ReadSome(*reader, 100, &got, 500), ReadStatus::kOk);
  // Each call waits at most 1.5 s; whichever enters second is refused at
  // once, and the one waiting in Take then ends with the sticky error.
  auto call = [&] {
    Record record;
    return reader->NextRecord(&record,
                              std::chrono::steady_clock::now() + std::chrono::milliseconds(1500));
  };
  ReadStatus first = ReadStatus::kOk;
  std::thread waiter([&] { first = call(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the waiter is in Take
  EXPECT_EQ(call(), ReadStatus::kError);
  waiter.join();
  EXPECT_EQ(first, ReadStatus::kError);
  EXPECT_NE(reader->error().find("two threads at once"), std::string::npos) << reader->error();
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(reader->items_held(), 0u);
  holder.GiveBack();
}

TEST(GlobalOrderReaderTest, AForkedChildIsRefusedAndItsCopyGivesNothingBack) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 300);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, BaseOptions(name)));
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Got> got;
  ASSERT_EQ(ReadSome(*reader, 10, &got, 50), ReadStatus::kOk);
  const size_t held = reader->items_held();
  EXPECT_EQ(InChild([&]() -> std::string {
              std::string bad;
              Record r[4];
              size_t n = 9;
              if (!reader->forked()) bad += "forked() is false; ";
              if (reader->NextRecord(r) != ReadStatus::kForked) bad += "NextRecord; ";
              if (reader->NextBatch(r, 4, &n) != ReadStatus::kForked || n != 0)
                bad += "NextBatch; ";
              reader->Close();
              reader.reset();  // gives nothing back: the items are the parent's
              return bad.empty() ? "" : "not refused as forked: " + bad;
            }),
            "");
  EXPECT_EQ(reader->items_held(), held);
  ASSERT_EQ(ReadSome(*reader, 10, &got), ReadStatus::kEnd) << reader->error();
  std::set<uint64_t> numbers;
  for (const Got& g : got) EXPECT_TRUE(numbers.insert(g.number).second) << g.number;
  EXPECT_EQ(numbers.size(), files->size());
}

TEST(GlobalOrderReaderTest, ClosingGivesBackWhatItHoldsAndASecondReaderFinishes) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 300);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = GlobalOrderReader::QueueOptions(*files, BaseOptions(name));
  qo.num_slices = 6;
  auto queue = WorkQueue::Open(qo);
  std::vector<Got> got;
  {
    auto reader = GlobalOrderReader::Open(*queue, files);
    ASSERT_EQ(ReadSome(*reader, 40, &got, 120), ReadStatus::kOk);  // mid-item 2
    EXPECT_EQ(reader->items_held(), 2u);
    reader->Close();
    EXPECT_EQ(reader->items_held(), 0u);
    Record record;
    EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kEnd);
    EXPECT_EQ(reader->stats().items_given_back, 2u);
    EXPECT_EQ(reader->stats().items_acked, 0u);
  }
  auto reader = GlobalOrderReader::Open(*queue, files);
  std::vector<Got> rest;
  ASSERT_EQ(ReadSome(*reader, 40, &rest), ReadStatus::kEnd) << reader->error();
  // Items 1 and 2 were given back whole: their records are read again.
  EXPECT_EQ(rest.size(), files->size());
}

TEST(GlobalOrderReaderTest, BadArgumentsAreErrorsNamingWhatIsWrong) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 100);
  auto files = RecordFiles::Build(data.paths, data.format, CacheIn(dir.path()));
  auto expect_error = [](auto&& open, const std::string& words) {
    try {
      open();
      ADD_FAILURE() << "no error; expected one saying '" << words << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  {
    std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    WorkQueueOptions qo = QueueOptions(data, name, 4);
    auto queue = WorkQueue::Open(qo);
    expect_error([&] { GlobalOrderReader::Open(*queue, files); }, "is a queue of files");
  }
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = BaseOptions(name);
  qo.num_samples = files->size() + 1;
  auto queue = WorkQueue::Open(qo);
  expect_error([&] { GlobalOrderReader::Open(*queue, files); },
               "index work of " + std::to_string(files->size() + 1) + " samples");
  expect_error([&] { GlobalOrderReader::Open(*queue, nullptr); }, "files is null");
  qo.num_samples = files->size();
  qo.name = UniqueQueueName();
  QueueCleanup cleanup2{qo.name};
  auto good = WorkQueue::Open(qo);
  GlobalOrderReaderOptions options;
  options.records_per_read = 0;
  expect_error([&] { GlobalOrderReader::Open(*good, files, options); }, "records_per_read");
  auto reader = GlobalOrderReader::Open(*good, files);
  size_t n = 5;
  Record record;
  EXPECT_EQ(reader->NextBatch(&record, 0, &n), ReadStatus::kError);
  EXPECT_EQ(n, 0u);
  EXPECT_NE(reader->error().find("max >= 1"), std::string::npos) << reader->error();
}

}  // namespace
}  // namespace tailcut
