// Tests of tailcut::Reader on real files in a temporary directory: every
// format over many slices and several processes, both I/O backends, O_DIRECT
// on and off, huge records, raw chunks, files truncated or removed after the
// queue was created, early close, progress, and tail splitting.
//
// The other Reader suites: options, limits and fallbacks in
// reader_options_test.cc, bad input in reader_bad_input_test.cc, the end of
// the data in reader_end_test.cc (helpers: reader_test_util.h).
#include "tailcut/reader.h"

#include <map>
#include <string>
#include <vector>

#include "reader_test_util.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

// ---- Every format, many slices, several processes, both backends -----------

struct FormatParam {
  RecordFormatKind kind;
  IoBackend backend;
  bool direct;
};

class ReaderFormatTest : public ::testing::TestWithParam<FormatParam> {};

TEST_P(ReaderFormatTest, FourProcessesReadEveryRecordExactlyOnce) {
  const FormatParam p = GetParam();
  TempDir dir;
  SKIP_UNLESS_SUPPORTED(p.backend, p.direct, dir.path());
  int files = p.kind == RecordFormatKind::kFile ? 8 : 3;
  DataSet data = MakeData(dir.path(), p.kind, files);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  constexpr int kChildren = 4;
  WorkQueueOptions qo = QueueOptions(data, name, 101, kChildren);
  ReaderOptions ro = SmallReaderOptions(data.format, p.backend, p.direct);
  std::vector<std::string> got = ReadInChildren(kChildren, dir.path(), [&](int) {
    auto queue = WorkQueue::Open(qo);
    auto reader = Reader::Open(*queue, ro);
    if (reader->backend_name() != (p.backend == IoBackend::kUring ? "io_uring" : "pread")) {
      throw std::runtime_error("wrong backend " + std::string(reader->backend_name()));
    }
    Outcome outcome = ReadRecords(*reader);
    reader.reset();
    queue->Close();
    return outcome;
  });
  ASSERT_EQ(got.size(), data.records.size());
  EXPECT_TRUE(got == data.records) << "the records read differ from the records written";
}

INSTANTIATE_TEST_SUITE_P(AllFormats, ReaderFormatTest, ::testing::ValuesIn([] {
                           std::vector<FormatParam> params;
                           for (RecordFormatKind kind :
                                {RecordFormatKind::kFixed, RecordFormatKind::kLines,
                                 RecordFormatKind::kTfrecord, RecordFormatKind::kFile}) {
                             for (IoBackend backend : {IoBackend::kUring, IoBackend::kPread}) {
                               for (bool direct : {false, true})
                                 params.push_back({kind, backend, direct});
                             }
                           }
                           return params;
                         }()),
                         [](const ::testing::TestParamInfo<FormatParam>& info) {
                           return std::string(FormatName(info.param.kind)) + "_" +
                                  BackendName(info.param.backend) +
                                  (info.param.direct ? "_direct" : "_buffered");
                         });

// ---- Single-process behaviour, both backends, O_DIRECT on and off ----------

struct IoParam {
  IoBackend backend;
  bool direct;
};

class ReaderIoTest : public ::testing::TestWithParam<IoParam> {
 protected:
  void SetUp() override {
    SKIP_UNLESS_SUPPORTED(GetParam().backend, GetParam().direct, dir_.path());
  }
  ReaderOptions Options(const RecordFormat& format) {
    return SmallReaderOptions(format, GetParam().backend, GetParam().direct);
  }
  TempDir dir_;
};

TEST_P(ReaderIoTest, BatchesHandOutEveryRecordAndStayValidUntilTheNextCall) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kTfrecord, 3, 900, 7);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 97));
  auto reader = Reader::Open(*queue, Options(data.format));
  Outcome outcome = ReadRecords(*reader, /*batch=*/64);
  EXPECT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
  EXPECT_TRUE(Sorted(outcome.records) == data.records);
  EXPECT_EQ(outcome.stats.items_acked, queue->num_items());
  EXPECT_EQ(outcome.stats.records, data.records.size());
  EXPECT_GT(outcome.stats.carried_bytes, 0u) << "records crossed chunks, so some were carried";
}

TEST_P(ReaderIoTest, RecordsOfManyMegabytesCrossHundredsOfSmallChunks) {
  std::mt19937_64 rng(3);
  DataSet tf;
  tf.format.kind = RecordFormatKind::kTfrecord;
  std::string content;
  for (size_t n : {size_t{1} << 20, size_t{10}, size_t{3} << 20, size_t{0}, size_t{777777}}) {
    std::string record = Bytes(rng, n);
    tf.records.push_back(record);
    AppendTfrecord(&content, record);
  }
  tf.paths.push_back(dir_.path() + "/huge.tfrecord");
  WriteFile(tf.paths[0], content);
  std::sort(tf.records.begin(), tf.records.end());

  // A text file whose last, huge line has no newline.
  DataSet text;
  text.format.kind = RecordFormatKind::kLines;
  text.records = {"short", Letters(rng, 300000), "", Letters(rng, 500000)};
  text.paths.push_back(dir_.path() + "/huge.txt");
  WriteFile(text.paths[0], text.records[0] + "\n" + text.records[1] + "\n\n" + text.records[3]);
  std::sort(text.records.begin(), text.records.end());

  for (const DataSet* data : {&tf, &text}) {
    for (uint64_t slices : {1, 7}) {
      std::string name = UniqueQueueName();
      QueueCleanup cleanup{name};
      auto queue = WorkQueue::Open(QueueOptions(*data, name, slices));
      auto reader = Reader::Open(*queue, Options(data->format));
      Outcome outcome = ReadRecords(*reader);
      ASSERT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
      EXPECT_TRUE(Sorted(outcome.records) == data->records)
          << data->paths[0] << ", " << slices << " slices";
      EXPECT_GE(outcome.stats.carried_bytes, 500000u);
    }
  }
}

// Regression: the carry buffer returned its pages while a huge record in it
// was still handed out. The bindings also keep views across Close().
TEST_P(ReaderIoTest, AHugeRecordStaysIntactUntilTheNextCallAndAfterClose) {
  std::mt19937_64 rng(41);
  DataSet data;
  data.format.kind = RecordFormatKind::kTfrecord;
  std::string huge = Bytes(rng, 3 << 20);
  std::string content;
  AppendTfrecord(&content, "small");
  AppendTfrecord(&content, huge);
  data.paths.push_back(dir_.path() + "/last_is_huge.tfrecord");
  WriteFile(data.paths[0], content);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  auto reader = Reader::Open(*queue, Options(data.format));
  Record record;
  ASSERT_EQ(reader->NextRecord(&record), ReadStatus::kOk);
  ASSERT_EQ(reader->NextRecord(&record), ReadStatus::kOk);
  ASSERT_EQ(record.size, huge.size());
  EXPECT_EQ(memcmp(record.data, huge.data(), huge.size()), 0) << "after the call";
  reader->Close();
  EXPECT_EQ(memcmp(record.data, huge.data(), huge.size()), 0) << "after Close()";
}

TEST_P(ReaderIoTest, RawChunksReassembleEveryFileExactly) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kLines, 4, 500, 5);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 37));
  ReaderOptions options = Options(data.format);
  options.mode = ReadMode::kChunks;
  auto reader = Reader::Open(*queue, options);
  std::map<std::string, std::map<uint64_t, std::string>> pieces;
  ChunkView chunk;
  ReadStatus status;
  while ((status = reader->NextChunk(&chunk)) == ReadStatus::kOk) {
    std::string path(reader->current_item().path);
    ASSERT_TRUE(pieces[path]
                    .emplace(chunk.offset,
                             std::string(reinterpret_cast<const char*>(chunk.data), chunk.size))
                    .second)
        << "offset " << chunk.offset << " of " << path << " handed out twice";
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << reader->error();
  for (size_t f = 0; f < data.paths.size(); ++f) {
    std::string joined;
    for (const auto& [offset, bytes] : pieces[data.paths[f]]) {
      ASSERT_EQ(offset, joined.size()) << "a gap or overlap in " << data.paths[f];
      joined += bytes;
    }
    EXPECT_TRUE(joined == data.contents[f]) << data.paths[f];
  }
  Record record;
  EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kEnd);
}

TEST_P(ReaderIoTest, FileTruncatedAfterTheQueueWasCreatedIsAnErrorAndItsItemGoesBack) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kLines, 3, 700, 11);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 13));
  const std::string& victim = data.paths[1];
  ASSERT_EQ(truncate(victim.c_str(), static_cast<off_t>(data.contents[1].size() / 2)), 0);

  auto first = Reader::Open(*queue, Options(data.format));
  Outcome before = ReadRecords(*first);
  ASSERT_EQ(before.last, ReadStatus::kError);
  EXPECT_NE(before.error.find(victim), std::string::npos) << before.error;
  const std::string half = std::to_string(data.contents[1].size() / 2);
  EXPECT_EQ(before.error, "file '" + victim + "' at offset " + half + ": the file is " + half +
                              " bytes, " + std::to_string(data.contents[1].size()) +
                              " when the queue was created (truncated? restore it or recreate "
                              "the queue)");
  EXPECT_EQ(first->error_kind(), ErrorKind::kIo);
  Record record;
  EXPECT_EQ(first->NextRecord(&record), ReadStatus::kError) << "errors are sticky";
  EXPECT_GE(before.stats.items_given_back, 1u) << "the failing item is given back, not acked";
  first.reset();

  // Once the file is whole again, another reader gets the item back.
  WriteFile(victim, data.contents[1]);
  auto second = Reader::Open(*queue, Options(data.format));
  Outcome after = ReadRecords(*second);
  ASSERT_EQ(after.last, ReadStatus::kEnd) << after.error;
  std::vector<std::string> all = before.records;
  all.insert(all.end(), after.records.begin(), after.records.end());
  EXPECT_TRUE(Sorted(all) == data.records) << "every record exactly once across both readers";
}

TEST_P(ReaderIoTest, FileTruncatedWhileBeingReadIsAnErrorNamingTheOffset) {
  std::mt19937_64 rng(13);
  DataSet data;
  data.format.kind = RecordFormatKind::kLines;
  std::string content;
  while (content.size() < (4u << 20)) content += Letters(rng, 1 + rng() % 120) + "\n";
  data.paths.push_back(dir_.path() + "/shrinks.txt");
  WriteFile(data.paths[0], content);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 1);
  qo.num_slices.reset();  // one item: the whole file
  auto queue = WorkQueue::Open(qo);
  auto reader = Reader::Open(*queue, Options(data.format));
  Outcome start = ReadRecords(*reader, 1, 10);
  ASSERT_EQ(start.records.size(), 10u);
  ASSERT_EQ(truncate(data.paths[0].c_str(), 1 << 20), 0);
  Outcome rest = ReadRecords(*reader);
  ASSERT_EQ(rest.last, ReadStatus::kError);
  EXPECT_EQ(rest.error, "file '" + data.paths[0] +
                            "' at offset 1048576: read returned end of file, " +
                            std::to_string(content.size() - (1 << 20)) +
                            " bytes expected (file truncated while reading?)");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kIo);
  EXPECT_EQ(rest.stats.items_acked, 0u);
  EXPECT_EQ(rest.stats.items_given_back, 1u);
  // The item is open again for anyone: this process takes it back.
  WorkItem item;
  ASSERT_EQ(queue->TryTake(&item), TakeStatus::kOk);
  EXPECT_EQ(item.path, data.paths[0]);
  queue->GiveBack(item);
}

TEST_P(ReaderIoTest, FileRemovedAfterTheQueueWasCreatedIsAnErrorNamingIt) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kLines, 2, 100, 17);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 4));
  ASSERT_EQ(unlink(data.paths[0].c_str()), 0);
  auto reader = Reader::Open(*queue, Options(data.format));
  Outcome outcome = ReadRecords(*reader);
  ASSERT_EQ(outcome.last, ReadStatus::kError);
  EXPECT_EQ(outcome.error, "file '" + data.paths[0] +
                               "': cannot open: No such file or directory (removed after the "
                               "queue was created? restore it or recreate the queue)");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kNotFound);
  EXPECT_EQ(outcome.stats.items_acked + outcome.stats.items_given_back, outcome.stats.items_taken);
}

TEST_P(ReaderIoTest, ClosingEarlyGivesBackPrefetchedItemsAndASecondReaderFinishesThem) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kLines, 3, 900, 19);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 31));
  ReaderOptions options = Options(data.format);
  options.prefetch_items = 2;
  auto first = Reader::Open(*queue, options);
  // Read until the second item has started: the first is then acked, the
  // second is current, and up to two more are prefetched.
  Outcome before;
  Record record;
  uint64_t first_index = UINT64_MAX;
  while (first->NextRecord(&record) == ReadStatus::kOk) {
    uint64_t index = first->current_item().index;
    if (first_index == UINT64_MAX) first_index = index;
    before.records.emplace_back(reinterpret_cast<const char*>(record.data), record.size);
    before.record_items.push_back(index);
    if (index != first_index) break;
  }
  uint64_t open_index = first->current_item().index;
  first->Close();
  ReaderStats stats = first->stats();
  EXPECT_EQ(stats.items_acked, 1u);
  EXPECT_GE(stats.items_given_back, 2u) << "the current item and at least one prefetched one";
  EXPECT_LE(stats.items_taken, 1u + 1u + options.prefetch_items) << "no hoarding";
  EXPECT_EQ(first->NextRecord(&record), ReadStatus::kEnd);

  auto second = Reader::Open(*queue, options);
  Outcome after = ReadRecords(*second);
  ASSERT_EQ(after.last, ReadStatus::kEnd) << after.error;
  // The item open at close is read again from its start (GiveBack restarts
  // an item), so its records from the first reader do not count.
  std::vector<std::string> all;
  for (size_t i = 0; i < before.records.size(); ++i) {
    if (before.record_items[i] != open_index) all.push_back(before.records[i]);
  }
  all.insert(all.end(), after.records.begin(), after.records.end());
  EXPECT_TRUE(Sorted(all) == data.records);
}

TEST_P(ReaderIoTest, ProgressAndRecordCountsReachTheQueue) {
  DataSet data = MakeData(dir_.path(), RecordFormatKind::kFixed, 2, 400, 23);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 9));
  auto reader = Reader::Open(*queue, Options(data.format));
  Outcome outcome = ReadRecords(*reader);
  ASSERT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
  EXPECT_TRUE(Sorted(outcome.records) == data.records);
  QueueStats stats = queue->Stats();
  bool found = false;
  for (const ClientStats& client : stats.clients) {
    if (client.pid != getpid()) continue;
    found = true;
    EXPECT_EQ(client.records, data.records.size());
    EXPECT_EQ(client.items_acked, queue->num_items());
  }
  EXPECT_TRUE(found);
}

INSTANTIATE_TEST_SUITE_P(BothBackends, ReaderIoTest,
                         ::testing::Values(IoParam{IoBackend::kUring, false},
                                           IoParam{IoBackend::kUring, true},
                                           IoParam{IoBackend::kPread, false},
                                           IoParam{IoBackend::kPread, true}),
                         [](const ::testing::TestParamInfo<IoParam>& info) {
                           return std::string(BackendName(info.param.backend)) +
                                  (info.param.direct ? "_direct" : "_buffered");
                         });

// Tail splitting: processes with nothing left to take split the unread tail
// of the item a slow process is reading; the slow one stops where its item
// now ends. Every record is still read exactly once.
TEST(ReaderSplitTest, IdleProcessesSplitASlowProcessesItemAndEveryRecordIsReadOnce) {
  for (IoBackend backend : {IoBackend::kUring, IoBackend::kPread}) {
    TempDir dir;
    if (backend == IoBackend::kUring && !IoUringAvailable()) continue;
    DataSet data;
    data.format.kind = RecordFormatKind::kLines;
    std::mt19937_64 rng(37);
    for (int f = 0; f < 3; ++f) {
      std::string content;
      for (int i = 0; content.size() < (1u << 20); ++i) {
        std::string record =
            "f" + std::to_string(f) + "r" + std::to_string(i) + ":" + Letters(rng, rng() % 100);
        data.records.push_back(record);
        content += record + "\n";
      }
      data.paths.push_back(dir.path() + "/split_" + std::to_string(f));
      WriteFile(data.paths.back(), content);
    }
    std::sort(data.records.begin(), data.records.end());
    std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    constexpr int kChildren = 3;
    WorkQueueOptions qo = QueueOptions(data, name, 3, kChildren);
    qo.split_tail = true;
    qo.min_split_bytes = 16 << 10;
    std::vector<std::string> got = ReadInChildren(kChildren, dir.path(), [&](int child) {
      auto queue = WorkQueue::Open(qo);
      ReaderOptions ro = SmallReaderOptions(data.format, backend, false);
      ro.prefetch_items = child == 0 ? 0 : 2;  // the slow one hoards nothing
      auto reader = Reader::Open(*queue, ro);
      Outcome outcome;
      Record record;
      while ((outcome.last = reader->NextRecord(&record)) == ReadStatus::kOk) {
        outcome.records.emplace_back(reinterpret_cast<const char*>(record.data), record.size);
        if (child == 0) usleep(100);  // a straggler
      }
      outcome.error = reader->error();
      std::ofstream(dir.path() + "/splits_" + std::to_string(child)) << queue->Stats().splits;
      reader.reset();
      queue->Close();
      return outcome;
    });
    uint64_t splits = 0;
    for (int i = 0; i < kChildren; ++i) {
      std::string text = ReadFile(dir.path() + "/splits_" + std::to_string(i));
      if (!text.empty()) splits = std::max<uint64_t>(splits, std::stoull(text));
    }
    EXPECT_GT(splits, 0u) << BackendName(backend) << ": nobody split the straggler's item";
    ASSERT_EQ(got.size(), data.records.size()) << BackendName(backend);
    EXPECT_TRUE(got == data.records) << BackendName(backend);
  }
}

}  // namespace
}  // namespace tailcut
