// Tests of tailcut::Reader on bad input, with the messages
// docs/reliability.md quotes: damaged TFRecords, records over
// max_record_bytes, fixed-record files of another size, empty files, bytes
// appended, failed reads (EIO injected with seccomp), files removed or made
// unreadable, bad buffer geometry, misuse, and a process that holds every
// lease.
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

#include <string>
#include <vector>

#include "reader_test_util.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

// ---- Bad input: the messages docs/reliability.md quotes --------------------

// A data set of one file with these bytes.
DataSet OneFile(const std::string& path, const std::string& bytes, RecordFormat format) {
  WriteFile(path, bytes);
  DataSet data;
  data.format = format;
  data.paths = {path};
  data.contents = {bytes};
  return data;
}

// Reads a fresh queue of `slices` items over data with one Reader; the queue
// is removed afterwards.
Outcome ReadQueue(const DataSet& data, const ReaderOptions& options, uint64_t slices = 1) {
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, slices));
  auto reader = Reader::Open(*queue, options);
  return ReadRecords(*reader);
}

// Each damage in a file of its own: the error names the file, the offset of
// the damaged record and the check it failed; the records before it are
// handed out and the item goes back.
TEST(ReaderTest, DamagedTfrecordFilesAreCorruptErrorsNamingFileOffsetAndCheck) {
  TempDir dir;
  std::string good;
  AppendTfrecord(&good, "a");      // [0, 17)
  AppendTfrecord(&good, "hello");  // [17, 38)
  AppendTfrecord(&good, "z");
  std::string bad_length_crc = good, bad_data_crc = good;
  bad_length_crc[17 + 8] ^= 1;  // in the masked CRC of the length
  bad_data_crc[17 + 12] ^= 1;   // 'h'
  const struct {
    const char* file;
    std::string bytes;
    std::vector<std::string> records;  // handed out before the error
    std::string at;                    // the message after "at offset "
  } cases[] = {
      {"length_crc",
       bad_length_crc,
       {"a"},
       "17: length CRC mismatch (record corrupt or not a TFRecord file)"},
      {"data_crc",
       bad_data_crc,
       {"a"},
       "17: data CRC mismatch (record corrupt or not a TFRecord file)"},
      {"cut_in_data",
       good.substr(0, 17 + 14),
       {"a"},
       "17: truncated record: header says 5 data bytes, the file ends at 31 (file cut short?)"},
      {"cut_in_header",
       good.substr(0, 17 + 5),
       {"a"},
       "17: truncated record: 5 header bytes, the file ends at 22 (file cut short?)"},
      {"text",
       "just a line of text\n",
       {},
       "0: length CRC mismatch (record corrupt or not a TFRecord file)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    DataSet data =
        OneFile(dir.path() + "/" + c.file + ".tfrecord", c.bytes, RecordFormat::Parse("tfrecord"));
    Outcome outcome = ReadQueue(data, SmallReaderOptions(data.format, IoBackend::kDefault, false));
    ASSERT_EQ(outcome.last, ReadStatus::kError);
    EXPECT_EQ(outcome.records, c.records);
    EXPECT_EQ(outcome.error, "tfrecord file '" + data.paths[0] + "' at offset " + c.at);
    EXPECT_EQ(outcome.kind, ErrorKind::kCorrupt);
    EXPECT_EQ(outcome.stats.items_given_back, 1u);
    EXPECT_EQ(outcome.stats.items_acked, 0u);
  }
}

TEST(ReaderTest, RecordsOverMaxRecordBytesAreCorruptErrorsInEveryFormat) {
  TempDir dir;
  std::mt19937_64 rng(43);
  const std::string big = Bytes(rng, 40000);
  std::string tfrecord;
  AppendTfrecord(&tfrecord, "a");
  AppendTfrecord(&tfrecord, big);
  RecordFormat tf = RecordFormat::Parse("tfrecord"), file = RecordFormat::Parse("file");
  tf.max_record_bytes = file.max_record_bytes = 32 << 10;

  DataSet data = OneFile(dir.path() + "/big.tfrecord", tfrecord, tf);
  Outcome outcome = ReadQueue(data, SmallReaderOptions(tf, IoBackend::kDefault, false));
  ASSERT_EQ(outcome.last, ReadStatus::kError);
  EXPECT_EQ(outcome.records, std::vector<std::string>{"a"});
  EXPECT_EQ(outcome.error, "tfrecord file '" + data.paths[0] +
                               "' at offset 17: record of 40000 bytes is longer than "
                               "max_record_bytes (32768); raise max_record_bytes if the file is "
                               "right");
  EXPECT_EQ(outcome.kind, ErrorKind::kCorrupt);

  data = OneFile(dir.path() + "/big.bin", big, file);
  outcome = ReadQueue(data, SmallReaderOptions(file, IoBackend::kDefault, false));
  ASSERT_EQ(outcome.last, ReadStatus::kError);
  EXPECT_EQ(outcome.error, "file '" + data.paths[0] +
                               "' at offset 0: the file is 40000 bytes, more than "
                               "max_record_bytes (32768); raise max_record_bytes or use a format "
                               "that splits it");
  EXPECT_EQ(outcome.kind, ErrorKind::kCorrupt);

  // Fixed-size records longer than the limit are refused when the Reader opens.
  RecordFormat fixed = RecordFormat::Parse("fixed", 40000);
  fixed.max_record_bytes = 32 << 10;
  data = OneFile(dir.path() + "/big.fixed", big, fixed);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  try {
    Reader::Open(*queue, SmallReaderOptions(fixed, IoBackend::kDefault, false));
    ADD_FAILURE() << "a fixed record size over max_record_bytes was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "record format 'fixed': record_bytes (40000) must be in [1, 32768] "
                 "(max_record_bytes)");
  }
}

TEST(ReaderTest, AFixedRecordFileOfAnotherSizeThanWholeRecordsIsCorruptAndGoesBack) {
  TempDir dir;
  DataSet data =
      OneFile(dir.path() + "/odd.bin", std::string(250, 'x'), RecordFormat::Parse("fixed", 100));
  Outcome outcome = ReadQueue(data, SmallReaderOptions(data.format, IoBackend::kDefault, false));
  ASSERT_EQ(outcome.last, ReadStatus::kError);
  EXPECT_TRUE(outcome.records.empty());
  EXPECT_EQ(outcome.error, "fixed-record file '" + data.paths[0] +
                               "' is 250 bytes, not a multiple of record_bytes 100 (truncated "
                               "file, or wrong record_bytes?)");
  EXPECT_EQ(outcome.kind, ErrorKind::kCorrupt);
  EXPECT_EQ(outcome.stats.items_given_back, 1u);
}

TEST(ReaderTest, EmptyFilesHaveNoRecordsExceptOneEmptyRecordInTheFileFormat) {
  TempDir dir;
  for (RecordFormat format : {RecordFormat::Parse("lines"), RecordFormat::Parse("tfrecord"),
                              RecordFormat::Parse("fixed", 8), RecordFormat::Parse("file")}) {
    SCOPED_TRACE(format.Tag());
    DataSet data = OneFile(dir.path() + "/empty", "", format);
    Outcome outcome = ReadQueue(data, SmallReaderOptions(format, IoBackend::kDefault, false));
    EXPECT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
    EXPECT_EQ(outcome.records, format.kind == RecordFormatKind::kFile ? std::vector<std::string>{""}
                                                                      : std::vector<std::string>{});
    EXPECT_EQ(outcome.stats.items_acked, 1u);
  }
}

// The queue sliced the file at its size then; every process reads the same
// bytes, whatever was appended since.
TEST(ReaderTest, BytesAppendedAfterTheQueueWasCreatedAreNotRead) {
  TempDir dir;
  DataSet data = OneFile(dir.path() + "/grows.txt", "a\nb\n", RecordFormat::Parse("lines"));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  std::ofstream(data.paths[0], std::ios::app) << "c\n";
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kDefault, false));
  Outcome outcome = ReadRecords(*reader);
  EXPECT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
  EXPECT_EQ(outcome.records, (std::vector<std::string>{"a", "b"}));
}

// EIO from a failing disk, injected with a seccomp filter on pread64 (the
// pread backend; io_uring completions take the same path in the Reader).
TEST(ReaderTest, AFailedReadIsAnIoErrorNamingFileOffsetAndErrno) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 300);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  int code = RunInChild([&] {
    auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pread64, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EIO),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      return 77;
    }
    auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kPread, false));
    Outcome outcome = ReadRecords(*reader);
    fprintf(stderr, "error: %s\n", outcome.error.c_str());
    if (outcome.last != ReadStatus::kError || !outcome.records.empty()) return 10;
    if (outcome.error !=
        "file '" + data.paths[0] + "' at offset 0: read of 4096 bytes failed: Input/output error") {
      return 11;
    }
    if (outcome.kind != ErrorKind::kIo) return 12;
    if (outcome.stats.items_given_back != 1) return 13;
    return 0;
  });
  if (code == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(code, 0);
}

// The open descriptor keeps a removed file's data: the item being read goes
// on to its end; the next item of that file cannot open it.
TEST(ReaderTest, AFileRemovedWhileBeingReadFinishesTheOpenItemAndLaterOnesAreNotFound) {
  TempDir dir;
  std::vector<std::pair<uint64_t, std::string>> lines;  // (offset, line)
  std::string content;
  for (int i = 0; i < 3000; ++i) {
    lines.emplace_back(content.size(), "line " + std::to_string(i));
    content += lines.back().second + "\n";
  }
  DataSet data = OneFile(dir.path() + "/removed.txt", content, RecordFormat::Parse("lines"));
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 2);
  qo.shuffle = false;
  auto queue = WorkQueue::Open(qo);
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
  options.prefetch_items = 0;  // the second item is opened only after the removal
  auto reader = Reader::Open(*queue, options);
  Outcome first = ReadRecords(*reader, 1, 1);
  ASSERT_EQ(first.records.size(), 1u);
  ASSERT_EQ(unlink(data.paths[0].c_str()), 0);
  Outcome rest = ReadRecords(*reader);
  ASSERT_EQ(rest.last, ReadStatus::kError);
  std::vector<std::string> expected;  // the lines that start in the first item
  for (const auto& [offset, line] : lines) {
    if (offset < queue->items()[0].end) expected.push_back(line);
  }
  std::vector<std::string> got = first.records;
  got.insert(got.end(), rest.records.begin(), rest.records.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(rest.error, "file '" + data.paths[0] +
                            "': cannot open: No such file or directory (removed after the queue "
                            "was created? restore it or recreate the queue)");
  EXPECT_EQ(rest.kind, ErrorKind::kNotFound);
  EXPECT_EQ(rest.stats.items_acked, 1u);
  EXPECT_EQ(rest.stats.items_given_back, 1u);
}

// Root reads any file: the child gives up the capabilities that allow it.
TEST(ReaderTest, AFileMadeUnreadableAfterTheQueueWasCreatedIsAPermissionError) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 50);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  int code = RunInChild([&] {
    auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
    if (chmod(data.paths[0].c_str(), 0) != 0) return 20;
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &header, caps) != 0) return 21;
    caps[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
    if (syscall(SYS_capset, &header, caps) != 0) return 22;
    auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kDefault, false));
    Outcome outcome = ReadRecords(*reader);
    fprintf(stderr, "error: %s\n", outcome.error.c_str());
    if (outcome.last != ReadStatus::kError) return 10;
    if (outcome.error != "file '" + data.paths[0] +
                             "': cannot open: Permission denied (made unreadable after the queue "
                             "was created? fix its permissions)") {
      return 11;
    }
    if (outcome.kind != ErrorKind::kPermission) return 12;
    if (outcome.stats.items_given_back != 1) return 13;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

TEST(ReaderTest, BadBufferGeometryIsAnInvalidArgumentNamingTheOptionAndTheFix) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  const struct {
    uint64_t budget, chunk;
    const char* message;
  } cases[] = {
      {0, 4096, "reader: buffer_budget_bytes and chunk_bytes must be > 0"},
      {8ull << 30, 2ull << 30, "reader: chunk_bytes (2147483648) must be at most 1 GiB"},
      {8192, 4096,
       "reader: buffer_budget_bytes (8192) must hold at least 3 chunks of chunk_bytes (4096); "
       "raise the budget or lower chunk_bytes"},
      {8ull << 30, 4096,
       "reader: buffer_budget_bytes / chunk_bytes is 2097152 chunks; use larger chunks (at most "
       "1048576 chunks)"},
  };
  for (const auto& c : cases) {
    ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
    options.buffer_budget_bytes = c.budget;
    options.chunk_bytes = c.chunk;
    try {
      Reader::Open(*queue, options);
      ADD_FAILURE() << "accepted: " << c.message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_STREQ(e.what(), c.message);
    }
  }
}

// 1 PiB is more address space than a process has (47 or 48 bits), so the
// mapping fails whatever the overcommit settings.
TEST(ReaderTest, BuffersThatCannotBeMappedAreNoSpaceNamingTheOptionToLower) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  constexpr uint64_t kPiB = 1ull << 50;
  ReaderOptions arena = SmallReaderOptions(data.format, IoBackend::kPread, false);
  arena.buffer_budget_bytes = kPiB;
  arena.chunk_bytes = 1 << 30;  // 1048576 chunks: the most allowed
  ReaderOptions carry = SmallReaderOptions(data.format, IoBackend::kPread, false);
  carry.format.max_record_bytes = kPiB - (128 << 10);  // + two 64 KiB carry steps = 1 PiB
  const std::pair<ReaderOptions*, const char*> cases[] = {
      {&arena,
       "reader: cannot map 1024 TiB of chunk buffers: Cannot allocate memory; lower "
       "buffer_budget_bytes"},
      {&carry,
       "reader: cannot reserve 1024 TiB for records that cross chunks: Cannot allocate memory; "
       "lower format.max_record_bytes"},
  };
  for (const auto& [options, message] : cases) {
    try {
      Reader::Open(*queue, *options);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kNoSpace);
      EXPECT_STREQ(e.what(), message);
    }
  }
}

TEST(ReaderTest, NextRecordOnAChunkReaderIsAnInvalidArgumentAndSticks) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.mode = ReadMode::kChunks;
  auto reader = Reader::Open(*queue, options);
  Record record;
  EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kError);
  EXPECT_EQ(reader->error(), "reader: NextRecord/NextBatch need ReaderOptions::mode = kRecords");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  ChunkView chunk;
  EXPECT_EQ(reader->NextChunk(&chunk), ReadStatus::kError) << "errors are sticky";
}

// The Reader's Take would wait for a lease that only this process can free.
TEST(ReaderTest, AProcessHoldingEveryLeaseGetsAnErrorFromItsReaderNotAHang) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 4);
  qo.leases_per_client = 1;
  auto queue = WorkQueue::Open(qo);
  WorkItem held;
  ASSERT_EQ(queue->TryTake(&held), TakeStatus::kOk);
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kPread, false));
  Record record;
  EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kError);
  EXPECT_EQ(reader->error(),
            "reader: the queue hands this process no more items: it already holds "
            "leases_per_client open items (other Readers on the same WorkQueue?); raise "
            "WorkQueueOptions::leases_per_client or lower prefetch_items");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(queue->GiveBack(held), ItemStatus::kOk);
}

}  // namespace
}  // namespace tailcut
