// Tests of tailcut::Reader on real files in a temporary directory: every
// format over many slices and several processes, both I/O backends, O_DIRECT
// on and off, truncated and vanished files, early close, memory limits and
// the fallbacks (seccomp without io_uring, RLIMIT_MEMLOCK, ramfs without
// O_DIRECT, no CUDA runtime).
#include "tailcut/reader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "item_holder.h"
#include "tailcut/crc32c.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

// ---- Fixtures and helpers --------------------------------------------------

std::string UniqueQueueName() {
  static int counter = 0;
  return "rt_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
}

// Removes the queue's segment when the test ends, whatever happened.
struct QueueCleanup {
  std::string name;
  ~QueueCleanup() {
    try {
      RemoveQueue(name, true);
    } catch (...) {
    }
  }
};

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/tailcut_reader_XXXXXX";
    char* made = mkdtemp(pattern.data());
    if (!made) ADD_FAILURE() << "mkdtemp(" << pattern << "): " << strerror(errno);
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

// In a "threadsafe" death test the child re-executes the test binary and runs
// the test body again up to the EXPECT_EXIT. The parent hands its scratch
// directory down through the environment, so the child reuses the parent's
// files instead of making (and, since it leaves with _exit, leaking) its own.
class SharedScratch {
 public:
  explicit SharedScratch(const char* key) : key_(key) {
    const char* inherited = std::getenv(key);
    if (inherited && *inherited) {
      path_ = inherited;
      child_ = true;
    } else {
      owned_ = std::make_unique<TempDir>();
      path_ = owned_->path();
      setenv(key, path_.c_str(), 1);
    }
  }
  ~SharedScratch() {
    if (!child_) unsetenv(key_);
  }
  bool child() const { return child_; }
  const std::string& path() const { return path_; }

 private:
  const char* key_;
  bool child_ = false;
  std::string path_;
  std::unique_ptr<TempDir> owned_;
};

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whether files in dir can be read with O_DIRECT (tmpfs on old kernels,
// ramfs and some FUSE mounts cannot).
bool SupportsDirectIo(const std::string& dir) {
  std::string probe = dir + "/.direct_probe";
  WriteFile(probe, std::string(8192, 'x'));
  int fd = open(probe.c_str(), O_RDONLY | O_DIRECT);
  bool ok = false;
  if (fd >= 0) {
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, 4096) == 0) {
      ok = pread(fd, buf, 4096, 0) == 4096;
      free(buf);
    }
    close(fd);
  }
  unlink(probe.c_str());
  return ok;
}

bool IoUringAvailable() {
  io_uring_params params{};
  long fd = syscall(__NR_io_uring_setup, 1, &params);
  if (fd < 0) return false;
  close(static_cast<int>(fd));
  return true;
}

// A data set: files on disk and every record they hold, in a multiset.
struct DataSet {
  RecordFormat format;
  std::vector<std::string> paths;
  std::vector<std::string> records;   // sorted
  std::vector<std::string> contents;  // per file
};

std::string Letters(std::mt19937_64& rng, size_t n) {
  std::string s(n, 'a');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

std::string Bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Record sizes: mostly small, some empty, some larger than a 4 KiB chunk.
size_t RecordSize(std::mt19937_64& rng, size_t i) {
  if (i % 53 == 7) return 0;
  if (i % 97 == 11) return 5000 + rng() % 9000;
  return rng() % 300;
}

DataSet MakeData(const std::string& dir, RecordFormatKind kind, int files = 3,
                 size_t records_per_file = 700, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  DataSet data;
  data.format.kind = kind;
  if (kind == RecordFormatKind::kFixed) data.format.record_bytes = 100;
  for (int f = 0; f < files; ++f) {
    std::string path = dir + "/data_" + std::to_string(f);
    std::string content;
    switch (kind) {
      case RecordFormatKind::kLines:
        for (size_t i = 0; i < records_per_file; ++i) {
          size_t n = RecordSize(rng, i);
          std::string record =
              n == 0 ? ""
                     : "f" + std::to_string(f) + "r" + std::to_string(i) + ":" + Letters(rng, n);
          data.records.push_back(record);
          content += record;
          // The last file ends without a newline.
          if (!(f == files - 1 && i + 1 == records_per_file)) content += '\n';
        }
        break;
      case RecordFormatKind::kTfrecord:
        for (size_t i = 0; i < records_per_file; ++i) {
          size_t n = RecordSize(rng, i);
          std::string record =
              n == 0 ? "" : "f" + std::to_string(f) + "r" + std::to_string(i) + ":" + Bytes(rng, n);
          data.records.push_back(record);
          AppendTfrecord(&content, record);
        }
        break;
      case RecordFormatKind::kFixed:
        for (size_t i = 0; i < records_per_file * 3; ++i) {
          std::string record = "f" + std::to_string(f) + "r" + std::to_string(i) + ":";
          record += Bytes(rng, 100 - record.size());
          data.records.push_back(record);
          content += record;
        }
        break;
      case RecordFormatKind::kFile: {
        static const size_t kSizes[] = {1, 3000, 50000, 130000, 7, 4096, 0, 9000};
        size_t n = kSizes[f % 8];
        content = n == 0 ? "" : Bytes(rng, n);
        data.records.push_back(content);
        break;
      }
    }
    WriteFile(path, content);
    data.paths.push_back(path);
    data.contents.push_back(content);
  }
  std::sort(data.records.begin(), data.records.end());
  return data;
}

WorkQueueOptions QueueOptions(const DataSet& data, const std::string& name, uint64_t num_slices,
                              uint32_t num_clients = 1) {
  WorkQueueOptions options;
  options.works = data.paths;
  options.num_slices = num_slices;
  options.num_clients = num_clients;
  options.seed = 42;
  options.name = name;
  options.format = data.format.Tag();
  options.on_notice = [](const std::string&) {};
  return options;
}

ReaderOptions SmallReaderOptions(const RecordFormat& format, IoBackend backend, bool direct) {
  ReaderOptions options;
  options.format = format;
  options.buffer_budget_bytes = 64 << 10;
  options.chunk_bytes = 4 << 10;
  options.backend = backend;
  options.direct = direct;
  options.cuda_register = false;
  options.on_notice = [](const std::string&) {};
  return options;
}

struct Outcome {
  std::vector<std::string> records;
  std::vector<uint64_t> record_items;  // current_item().index of each record
  ReadStatus last = ReadStatus::kOk;
  std::string error;
  ErrorKind kind = ErrorKind::kIo;  // error_kind() after kError
  ReaderStats stats;
};

// Reads until kEnd or kError, or max_records.
Outcome ReadRecords(Reader& reader, size_t batch = 1, size_t max_records = SIZE_MAX) {
  Outcome out;
  std::vector<Record> records(batch);
  while (out.records.size() < max_records) {
    size_t n = 0;
    out.last = batch == 1 ? reader.NextRecord(records.data())
                          : reader.NextBatch(records.data(), batch, &n);
    if (batch == 1 && out.last == ReadStatus::kOk) n = 1;
    if (out.last != ReadStatus::kOk) break;
    EXPECT_GE(n, 1u);
    // All records of a batch must still be valid here, after the call.
    for (size_t i = 0; i < n; ++i) {
      out.records.emplace_back(reinterpret_cast<const char*>(records[i].data), records[i].size);
      out.record_items.push_back(reader.current_item().index);
    }
  }
  out.error = reader.error();
  out.kind = reader.error_kind();
  out.stats = reader.stats();
  return out;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Runs fn in `children` forked processes; each returns the records it read,
// written through a file. Fails the test if a child fails.
std::vector<std::string> ReadInChildren(int children, const std::string& dir,
                                        const std::function<Outcome(int child)>& fn) {
  std::vector<pid_t> pids;
  for (int i = 0; i < children; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string out_path = dir + "/child_" + std::to_string(i);
      FILE* out = fopen(out_path.c_str(), "wb");
      int code = 0;
      try {
        Outcome outcome = fn(i);
        for (const std::string& r : outcome.records) {
          uint64_t n = r.size();
          fwrite(&n, sizeof n, 1, out);
          fwrite(r.data(), 1, r.size(), out);
        }
        if (outcome.last != ReadStatus::kEnd) {
          fprintf(stderr, "child %d: %s\n", i, outcome.error.c_str());
          code = 1;
        }
      } catch (const std::exception& e) {
        fprintf(stderr, "child %d: %s\n", i, e.what());
        code = 2;
      }
      fclose(out);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> records;
  for (int i = 0; i < children; ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << i << " status " << status;
    std::string bytes = ReadFile(dir + "/child_" + std::to_string(i));
    for (size_t at = 0; at + 8 <= bytes.size();) {
      uint64_t n;
      memcpy(&n, bytes.data() + at, 8);
      records.push_back(bytes.substr(at + 8, n));
      at += 8 + n;
    }
  }
  return Sorted(records);
}

// Runs fn in one forked child; returns its exit code (77: skipped).
// The child of a fork gets one thread and every lock as it was. Fork only
// while this process has no other threads (no queue, no reader open): a lock
// held by another thread at the fork, the sanitizer allocator's among them,
// stays held in the child forever. The alarm turns such a hang into a failure.
[[noreturn]] void RunChildBody(const std::function<int()>& fn) {
  alarm(120);
  int code = 3;
  try {
    code = fn();
  } catch (const std::exception& e) {
    fprintf(stderr, "child: %s\n", e.what());
  }
  fflush(nullptr);
  _exit(code);
}

int WaitForChild(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int RunInChild(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) RunChildBody(fn);
  return WaitForChild(pid);
}

// A child forked now, while this process has one thread, that runs `fn` when
// Start() is called, so a test can have another process act later, once this
// one has threads of its own.
class ChildOnCue {
 public:
  explicit ChildOnCue(std::function<int()> fn) {
    if (pipe(cue_) != 0) ADD_FAILURE() << "pipe: " << strerror(errno);
    fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      close(cue_[1]);
      char go = 0;
      if (read(cue_[0], &go, 1) != 1) _exit(0);  // the test ended without a cue
      RunChildBody(fn);
    }
    close(cue_[0]);
  }
  ~ChildOnCue() {
    if (cue_[1] >= 0) close(cue_[1]);
    if (pid_ > 0 && !waited_) WaitForChild(pid_);
  }
  // Cues the child and returns its exit code (128 + signal if it was killed).
  int RunAndWait() {
    char go = 1;
    if (write(cue_[1], &go, 1) != 1) return -1;
    close(cue_[1]);
    cue_[1] = -1;
    waited_ = true;
    return WaitForChild(pid_);
  }

 private:
  int cue_[2] = {-1, -1};
  pid_t pid_ = -1;
  bool waited_ = false;
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // mlock is a no-op and RSS includes shadow memory
#else
constexpr bool kSanitized = false;
#endif

const char* BackendName(IoBackend backend) {
  return backend == IoBackend::kUring ? "uring" : "pread";
}

const char* FormatName(RecordFormatKind kind) {
  switch (kind) {
    case RecordFormatKind::kFixed:
      return "fixed";
    case RecordFormatKind::kLines:
      return "lines";
    case RecordFormatKind::kTfrecord:
      return "tfrecord";
    case RecordFormatKind::kFile:
      return "file";
  }
  return "?";
}

// Skips the test when the backend or O_DIRECT cannot run here.
#define SKIP_UNLESS_SUPPORTED(backend, direct, dir)                                  \
  do {                                                                               \
    if ((backend) == IoBackend::kUring && !IoUringAvailable())                       \
      GTEST_SKIP() << "io_uring is not available on this kernel (or blocked)";       \
    if ((direct) && !SupportsDirectIo(dir))                                          \
      GTEST_SKIP() << "the temporary directory " << (dir)                            \
                   << " does not support O_DIRECT; set TMPDIR to a disk filesystem"; \
  } while (0)

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

// ---- Limits, options, fallbacks ---------------------------------------------

TEST(ReaderTest, RecordLargerThanMaxRecordBytesIsAnErrorNamingFileAndOffset) {
  TempDir dir;
  std::mt19937_64 rng(29);
  DataSet data;
  data.format.kind = RecordFormatKind::kLines;
  data.format.max_record_bytes = 32 << 10;
  data.paths.push_back(dir.path() + "/long_line.txt");
  WriteFile(data.paths[0], "ok\n" + Letters(rng, 100 << 10) + "\nok\n");
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  auto reader = Reader::Open(*queue, SmallReaderOptions(data.format, IoBackend::kDefault, false));
  Outcome outcome = ReadRecords(*reader);
  ASSERT_EQ(outcome.last, ReadStatus::kError);
  EXPECT_EQ(outcome.records, std::vector<std::string>{"ok"});
  EXPECT_EQ(outcome.error, "text file '" + data.paths[0] +
                               "' at offset 3: line longer than max_record_bytes (32768); raise "
                               "max_record_bytes, or check that this is a text file");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kCorrupt);
  EXPECT_EQ(outcome.stats.items_given_back, 1u);
}

TEST(ReaderTest, BadOptionsAreErrorsThatNameTheField) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.buffer_budget_bytes = 8 << 10;  // two chunks
  try {
    Reader::Open(*queue, options);
    ADD_FAILURE() << "a budget of two chunks was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("buffer_budget_bytes"), std::string::npos) << e.what();
  }
  options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.chunk_bytes = 5000;  // rounded up to 8 KiB
  auto reader = Reader::Open(*queue, options);
  EXPECT_EQ(reader->chunk_bytes(), 8192u);
  EXPECT_EQ(reader->num_chunks(), 8u);
  EXPECT_LE(reader->queue_depth(), reader->num_chunks() - 2);
  ChunkView chunk;
  EXPECT_EQ(reader->NextChunk(&chunk), ReadStatus::kError);
  EXPECT_EQ(reader->error(), "reader: NextChunk needs ReaderOptions::mode = kChunks");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
}

TEST(ReaderTest, TailcutIoEnvironmentVariableChoosesTheBackend) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 50);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
  const char* saved = std::getenv("TAILCUT_IO");
  std::string saved_value = saved ? saved : "";
  setenv("TAILCUT_IO", "pread", 1);
  EXPECT_EQ(Reader::Open(*queue, options)->backend_name(), "pread");
  if (IoUringAvailable()) {
    setenv("TAILCUT_IO", "uring", 1);
    EXPECT_EQ(Reader::Open(*queue, options)->backend_name(), "io_uring");
  }
  setenv("TAILCUT_IO", "mmap", 1);
  try {
    Reader::Open(*queue, options);
    ADD_FAILURE() << "TAILCUT_IO=mmap was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(), "TAILCUT_IO='mmap' is not 'uring' or 'pread'");
  }
  if (saved) {
    setenv("TAILCUT_IO", saved_value.c_str(), 1);
  } else {
    unsetenv("TAILCUT_IO");
  }
}

// Docker's default seccomp profile blocks io_uring with ENOSYS; the sysctl
// kernel.io_uring_disabled (and some profiles) with EPERM.
TEST(ReaderTest, SeccompBlockingIoUringFallsBackToPreadWithANotice) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 2, 200);
  const struct {
    int error;
    std::string why;  // what the notice says, after "io_uring_setup: "
  } cases[] = {
      {ENOSYS, "Function not implemented (kernel too old, or seccomp blocks io_uring)"},
      {EPERM, "Operation not permitted (kernel.io_uring_disabled, or seccomp)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(strerror(c.error));
    std::string name = UniqueQueueName();
    QueueCleanup cleanup{name};
    int code = RunInChild([&] {
      unsetenv("TAILCUT_IO");
      struct sock_filter filter[] = {
          BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
          BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
          BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(c.error)),
          BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      };
      struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
      if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
          prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        return 77;
      }
      auto queue = WorkQueue::Open(QueueOptions(data, name, 7));
      std::vector<std::string> notices;
      ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
      options.on_notice = [&](const std::string& line) { notices.push_back(line); };
      auto reader = Reader::Open(*queue, options);
      for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
      if (reader->backend_name() != "pread") return 10;
      if (notices != std::vector<std::string>{"tailcut reader: io_uring unavailable: "
                                              "io_uring_setup: " +
                                              c.why +
                                              "; reading with 2 pread threads "
                                              "(TAILCUT_IO=pread silences this)"}) {
        return 11;
      }
      Outcome outcome = ReadRecords(*reader);
      if (outcome.last != ReadStatus::kEnd || Sorted(outcome.records) != data.records) return 12;
      // Forced io_uring must not fall back silently, and the error names
      // what forced it: the option or the environment. 0 when Open threw
      // kIo with exactly "reader: io_uring was asked for (<by>) but is
      // unavailable: ...; <fix>".
      auto forced = [&](const std::string& by, const std::string& fix) {
        try {
          Reader::Open(*queue, options);
          return 1;
        } catch (const Error& e) {
          fprintf(stderr, "forced (%s): %s\n", by.c_str(), e.what());
          if (e.kind() != ErrorKind::kIo) return 2;
          return e.what() == "reader: io_uring was asked for (" + by +
                                 ") but is unavailable: io_uring_setup: " + c.why + "; " + fix
                     ? 0
                     : 3;
        }
      };
      options.backend = IoBackend::kUring;
      if (int bad = forced("backend 'uring'",
                           "use backend 'pread', or leave the backend unset to fall back to "
                           "pread threads")) {
        return 12 + bad;
      }
      options.backend = IoBackend::kDefault;
      setenv("TAILCUT_IO", "uring", 1);
      if (int bad = forced("TAILCUT_IO=uring",
                           "unset TAILCUT_IO to fall back to pread threads, or set "
                           "TAILCUT_IO=pread")) {
        return 15 + bad;
      }
      return 0;
    });
    if (code == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
    EXPECT_EQ(code, 0);
  }
}

// Drops CAP_IPC_LOCK and lowers RLIMIT_MEMLOCK in a child, as for an ordinary
// user: 64 KiB was the kernel's default before Linux 5.16 and is still common
// in distributions and containers; 1 MiB is a limit raised a little. Both are
// far below the 4 MiB arena, so locking fails and reading goes on.
//
// io_uring: since Linux 5.12 a ring's own memory is charged to the memory
// cgroup, not to RLIMIT_MEMLOCK, so the ring is set up; registering the arena
// as a fixed buffer pins it and is still charged to RLIMIT_MEMLOCK, so that
// is refused and reads go to plain buffers. Older kernels charge the ring
// too and may refuse it: then the Reader falls back to pread with a notice.
struct MemlockParam {
  uint64_t limit;
  const char* printed;  // how memory_state() prints the limit
};

class ReaderMemlockTest : public ::testing::TestWithParam<MemlockParam> {};

bool KernelAtLeast(int major, int minor) {
  struct utsname name {};
  int have_major = 0, have_minor = 0;
  if (uname(&name) != 0 || sscanf(name.release, "%d.%d", &have_major, &have_minor) != 2) {
    return false;
  }
  return have_major > major || (have_major == major && have_minor >= minor);
}

TEST_P(ReaderMemlockTest, LockingFailureNamesRlimitMemlockAndReadingGoesOn) {
  if (kSanitized) GTEST_SKIP() << "the sanitizer runtime turns mlock into a no-op";
  const MemlockParam p = GetParam();
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 300);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  const bool uring_here = IoUringAvailable();
  int code = RunInChild([&] {
    unsetenv("TAILCUT_IO");  // the default path: io_uring, or its fallback
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &header, caps) != 0) return 20;
    caps[0].effective &= ~(1u << CAP_IPC_LOCK);
    caps[0].permitted &= ~(1u << CAP_IPC_LOCK);
    if (syscall(SYS_capset, &header, caps) != 0) return 21;
    struct rlimit limit {
      p.limit, p.limit
    };
    if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 22;
    auto queue = WorkQueue::Open(QueueOptions(data, name, 5));
    std::vector<std::string> notices;
    ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
    options.buffer_budget_bytes = 4 << 20;
    options.chunk_bytes = 256 << 10;
    options.on_notice = [&](const std::string& line) { notices.push_back(line); };
    auto resident = [] {
      long size = 0, pages = 0;
      FILE* f = fopen("/proc/self/statm", "r");
      if (f == nullptr || fscanf(f, "%ld %ld", &size, &pages) != 2) pages = 0;
      if (f != nullptr) fclose(f);
      return static_cast<uint64_t>(pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    };
    auto reader = Reader::Open(*queue, options);
    const std::string& state = reader->memory_state();
    fprintf(stderr, "backend %s, memory state: %s\n", std::string(reader->backend_name()).c_str(),
            state.c_str());
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());

    const std::string not_locked = std::string("buffers: 4 MiB not locked: RLIMIT_MEMLOCK is ") +
                                   p.printed +
                                   "; raise it with `ulimit -l unlimited` or "
                                   "LimitMEMLOCK=infinity (systemd)";
    if (notices.size() != 2 || notices[0] != "tailcut reader: " + not_locked) return 23;
    if (reader->backend_name() == "io_uring") {
      if (state != not_locked + "; not io_uring-registered") return 24;
      if (notices[1] !=
          "tailcut reader: io_uring_register_buffers: Cannot allocate memory (RLIMIT_MEMLOCK "
          "too low?); reading into unregistered buffers") {
        return 25;
      }
    } else {
      // Only a kernel that charges rings to RLIMIT_MEMLOCK may refuse one.
      if (uring_here && KernelAtLeast(5, 12)) return 26;
      if (state != not_locked) return 27;
      if (uring_here && notices[1] !=
                            "tailcut reader: io_uring unavailable: io_uring_setup: Cannot "
                            "allocate memory (RLIMIT_MEMLOCK too low for the ring); reading "
                            "with 2 pread threads (TAILCUT_IO=pread silences this)") {
        return 28;
      }
    }
    Outcome outcome = ReadRecords(*reader);
    if (outcome.last != ReadStatus::kEnd || Sorted(outcome.records) != data.records) return 29;
    // Not locked, but faulted in, so the first reads do not pay for it (a
    // refused io_uring buffer registration faults them in on its way; the
    // pread path has only the arena to do it).
    reader.reset();
    options.backend = IoBackend::kPread;
    const uint64_t resident_before = resident();
    auto pread_reader = Reader::Open(*queue, options);
    const uint64_t faulted = resident() - resident_before;
    fprintf(stderr, "pread reader: resident +%llu KiB\n",
            static_cast<unsigned long long>(faulted >> 10));
    if (faulted < (4u << 20)) return 30;
    return 0;
  });
  EXPECT_EQ(code, 0) << "see the child's memory state and notices above";
}

INSTANTIATE_TEST_SUITE_P(Limits, ReaderMemlockTest,
                         ::testing::Values(MemlockParam{64 << 10, "64 KiB"},
                                           MemlockParam{1 << 20, "1 MiB"}),
                         [](const ::testing::TestParamInfo<MemlockParam>& info) {
                           std::string printed = info.param.printed;  // "64 KiB" -> "64KiB"
                           printed.erase(printed.find(' '), 1);
                           return printed;
                         });

TEST(ReaderTest, BuffersAreLockedAndRegisteredWhenTheLimitAllows) {
  struct rlimit limit {};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  bool can_lock =
      syscall(SYS_capget, &header, caps) == 0 && (caps[0].effective & (1u << CAP_IPC_LOCK));
  if (!can_lock && limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < (2u << 20)) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK is below 2 MiB here";
  }
  if (!IoUringAvailable()) GTEST_SKIP() << "io_uring is not available";
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 10);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kUring, false);
  options.buffer_budget_bytes = 1 << 20;
  auto reader = Reader::Open(*queue, options);
  EXPECT_EQ(reader->memory_state(), "buffers: 1 MiB locked + io_uring-registered");
}

// Without a usable GPU (no runtime, or one that finds no driver or device) a
// Reader says nothing about CUDA: a CPU-only host is normal. memory_state()
// still says why the buffers are not CUDA-pinned. Only where an NVIDIA driver
// is loaded and the buffers still are not pinned is there one notice.
TEST(ReaderTest, NoUsableCudaIsSilentAndMemoryStateSaysWhy) {
  GTEST_FLAG_SET(death_test_style,
                 "threadsafe");  // a fresh process: the notice is once per process
  SharedScratch dir("TAILCUT_TEST_CUDA_DIR");
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 40);  // same bytes in the child
  EXPECT_EXIT(
      {
        unsetenv("TAILCUT_CUDART");
        std::string name = UniqueQueueName();
        auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
        std::vector<std::string> notices;
        ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
        options.cuda_register = true;
        options.on_notice = [&](const std::string& line) { notices.push_back(line); };
        auto reader = Reader::Open(*queue, options);
        auto again = Reader::Open(*queue, options);
        int cuda_notices = 0;
        for (const std::string& line : notices) {
          if (line.find("not CUDA-pinned") != std::string::npos) {
            ++cuda_notices;
            fprintf(stderr, "%s\n", line.c_str());
          }
        }
        const std::string& state = reader->memory_state();
        fprintf(stderr, "memory state: %s\n", state.c_str());
        bool pinned = state.find("+ CUDA-pinned") != std::string::npos;
        bool says_why = pinned || state.find("; not CUDA-pinned: no CUDA") != std::string::npos;
        bool driver = access("/dev/nvidiactl", F_OK) == 0;
        int expected_notices = !pinned && driver ? 1 : 0;
        Outcome outcome = ReadRecords(*reader);
        bool ok = outcome.last == ReadStatus::kEnd && Sorted(outcome.records) == data.records;
        reader.reset();
        again.reset();
        queue->Close();
        try {
          RemoveQueue(name, true);
        } catch (...) {
        }
        _exit(cuda_notices == expected_notices && says_why && ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "memory state: buffers: .*CUDA");
}

#ifdef TAILCUT_FAKE_CUDART
TEST(ReaderTest, ACudaRuntimeWithADeviceRegistersTheArenaAsPortablePinnedMemory) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 40);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  using StateFn = void (*)(void**, size_t*, unsigned int*, int*, int*);
  struct State {
    void* ptr = nullptr;
    size_t size = 0;
    unsigned int flags = 0;
    int registers = 0, unregisters = 0;
  };
  // The Reader never unloads a CUDA runtime, so counters carry over from
  // earlier runs of this test in the same process: compare differences.
  auto read_state = [] {
    State s;
    if (void* handle = dlopen(TAILCUT_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD)) {
      auto fn = reinterpret_cast<StateFn>(dlsym(handle, "FakeCudartState"));
      if (fn) fn(&s.ptr, &s.size, &s.flags, &s.registers, &s.unregisters);
      dlclose(handle);
    }
    return s;
  };
  State before = read_state();
  setenv("TAILCUT_CUDART", TAILCUT_FAKE_CUDART, 1);
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.cuda_register = true;
  auto reader = Reader::Open(*queue, options);
  unsetenv("TAILCUT_CUDART");
  EXPECT_NE(reader->memory_state().find("+ CUDA-pinned"), std::string::npos)
      << reader->memory_state();
  State during = read_state();
  EXPECT_EQ(during.registers, before.registers + 1);
  EXPECT_EQ(during.size, reader->chunk_bytes() * reader->num_chunks());
  EXPECT_EQ(during.flags, 1u) << "cudaHostRegisterPortable";
  Outcome outcome = ReadRecords(*reader);
  EXPECT_EQ(outcome.last, ReadStatus::kEnd) << outcome.error;
  reader.reset();
  State after = read_state();
  EXPECT_EQ(after.unregisters, before.unregisters + 1)
      << "the arena is unregistered before it is unmapped";
}
#endif

// ramfs refuses O_DIRECT at open; a private mount namespace keeps the mount
// to this test.
TEST(ReaderTest, DirectReadsFallBackToBufferedPerFilesystemWithANotice) {
  TempDir dir;
  std::string mount_point = dir.path() + "/ramfs";
  fs::create_directory(mount_point);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  int code = RunInChild([&] {
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (mount("none", mount_point.c_str(), "ramfs", 0, nullptr) != 0) return 77;
    DataSet data = MakeData(mount_point, RecordFormatKind::kTfrecord, 3, 300);
    auto queue = WorkQueue::Open(QueueOptions(data, name, 11));
    std::vector<std::string> notices;
    ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, true);
    options.on_notice = [&](const std::string& line) { notices.push_back(line); };
    auto reader = Reader::Open(*queue, options);
    Outcome outcome = ReadRecords(*reader);
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    if (outcome.last != ReadStatus::kEnd) {
      fprintf(stderr, "%s\n", outcome.error.c_str());
      return 30;
    }
    if (Sorted(outcome.records) != data.records) return 31;
    int direct_notices = 0;
    const std::string said = "tailcut reader: O_DIRECT is not supported for '" + mount_point;
    const std::string how = "; reading files on its filesystem buffered";
    for (const std::string& line : notices) {
      direct_notices += line.rfind(said, 0) == 0 && line.size() > how.size() &&
                        line.compare(line.size() - how.size(), how.size(), how) == 0;
    }
    if (direct_notices != 1) return 32;  // once per filesystem, not per file
    umount(mount_point.c_str());
    return 0;
  });
  if (code == 77) GTEST_SKIP() << "cannot mount ramfs in a private mount namespace (not root?)";
  EXPECT_EQ(code, 0);
}

// Measured in a fresh process (re-executed), after reading data eight times
// the budget.
TEST(ReaderTest, PeakRssStaysWithinTheBufferBudgetPlus16MiB) {
  if (kSanitized) GTEST_SKIP() << "sanitizer shadow memory counts in RSS";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SharedScratch dir("TAILCUT_TEST_RSS_DIR");
  constexpr uint64_t kBudget = 8 << 20;
  constexpr int kFiles = 4;
  constexpr uint64_t kBlocks = 64;  // per file, of 4096 lines of 64 bytes: 16 MiB
  constexpr uint64_t kLines = kFiles * kBlocks * 4096;
  DataSet data;
  data.format.kind = RecordFormatKind::kLines;
  std::mt19937_64 rng(31);
  for (int f = 0; f < kFiles; ++f) {
    std::string path = dir.path() + "/big_" + std::to_string(f);
    data.paths.push_back(path);
    if (dir.child()) continue;  // the parent wrote them
    FILE* out = fopen(path.c_str(), "wb");
    std::string buffer;
    for (uint64_t block = 0; block < kBlocks; ++block) {
      buffer.clear();
      for (int i = 0; i < 4096; ++i) buffer += Letters(rng, 63) + "\n";
      fwrite(buffer.data(), 1, buffer.size(), out);
    }
    fclose(out);
  }
  std::string name = "rt_rss_" + std::to_string(dir.child() ? getppid() : getpid());
  QueueCleanup cleanup{name};
  EXPECT_EXIT(
      {
        auto queue = WorkQueue::Open(QueueOptions(data, name, 16));
        ReaderOptions options;
        options.format = data.format;
        options.buffer_budget_bytes = kBudget;
        options.chunk_bytes = 1 << 20;
        options.cuda_register = false;
        options.on_notice = [](const std::string&) {};
        auto reader = Reader::Open(*queue, options);
        Record record;
        uint64_t n = 0;
        while (reader->NextRecord(&record) == ReadStatus::kOk) ++n;
        uint64_t hwm_kib = 0;
        std::ifstream status("/proc/self/status");
        for (std::string line; std::getline(status, line);) {
          if (line.rfind("VmHWM:", 0) == 0) hwm_kib = std::stoull(line.substr(6));
        }
        fprintf(stderr, "records %llu of %llu, VmHWM %llu KiB, budget %llu KiB + 16 MiB\n",
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(kLines),
                static_cast<unsigned long long>(hwm_kib),
                static_cast<unsigned long long>(kBudget >> 10));
        std::ofstream(dir.path() + "/hwm") << hwm_kib;
        reader.reset();
        queue->Close();
        _exit(n == kLines && hwm_kib > 0 && hwm_kib * 1024 <= kBudget + (16 << 20) ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "VmHWM");
  std::string hwm = ReadFile(dir.path() + "/hwm");
  RecordProperty("VmHWM_KiB", hwm);
  printf("peak RSS (VmHWM) of the reading process: %s KiB; budget %llu KiB + 16 MiB\n", hwm.c_str(),
         static_cast<unsigned long long>(kBudget >> 10));
}

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
  EXPECT_EQ(queue->GiveBack(held), AckStatus::kOk);
}

// ---- The end of the data: waiting for items other processes hold ----------

enum class EndCall { kNextRecord, kNextBatch, kNextChunk };
enum class HolderExit { kGivesBack, kKilled };
struct EndParam {
  EndCall call;
  HolderExit exit;
};

class ReaderEndTest : public ::testing::TestWithParam<EndParam> {};

// One call of the kind under test; appends what it hands out to `pieces`
// (records, or chunks as "path@offset:bytes").
ReadStatus ReadOnce(Reader& reader, EndCall call, Deadline deadline,
                    std::vector<std::string>* pieces) {
  Record records[7];
  size_t n = 0;
  ReadStatus status;
  switch (call) {
    case EndCall::kNextRecord:
      status = reader.NextRecord(records, deadline);
      n = status == ReadStatus::kOk ? 1 : 0;
      break;
    case EndCall::kNextBatch:
      n = 99;
      status = reader.NextBatch(records, 7, &n, deadline);
      EXPECT_TRUE(status == ReadStatus::kOk ? n >= 1 : n == 0) << n;
      break;
    case EndCall::kNextChunk: {
      ChunkView chunk;
      status = reader.NextChunk(&chunk, deadline);
      if (status == ReadStatus::kOk) {
        pieces->push_back(std::string(reader.current_item().path) + "@" +
                          std::to_string(chunk.offset) + ":" +
                          std::string(reinterpret_cast<const char*>(chunk.data), chunk.size));
      }
      return status;
    }
  }
  for (size_t i = 0; i < n; ++i)
    pieces->emplace_back(reinterpret_cast<const char*>(records[i].data), records[i].size);
  return status;
}

// What a complete, exactly-once read hands out: the records, or for chunks
// each file reassembled from its pieces (no gap, no overlap).
std::vector<std::string> Reassembled(const DataSet& data, EndCall call,
                                     const std::vector<std::string>& pieces) {
  if (call != EndCall::kNextChunk) return Sorted(pieces);
  std::map<std::string, std::map<uint64_t, std::string>> by_file;
  for (const std::string& p : pieces) {
    size_t at = p.find('@'), colon = p.find(':', at);
    uint64_t offset = std::stoull(p.substr(at + 1, colon - at - 1));
    EXPECT_TRUE(by_file[p.substr(0, at)].emplace(offset, p.substr(colon + 1)).second)
        << "offset " << offset << " handed out twice";
  }
  std::vector<std::string> files;
  for (const std::string& path : data.paths) {
    std::string joined;
    for (const auto& [offset, bytes] : by_file[path]) {
      EXPECT_EQ(offset, joined.size()) << "a gap or overlap in " << path;
      joined += bytes;
    }
    files.push_back(joined);
  }
  return files;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_P(ReaderEndTest, EmptyAtTheDeadlineWhileAnotherProcessHoldsAnItemThenItsRecordsOnce) {
  const EndParam param = GetParam();
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 300, 21);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 6, 2);
  auto queue = WorkQueue::Open(qo);
  ItemHolder holder(qo);
  ASSERT_TRUE(holder.ok());

  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  if (param.call == EndCall::kNextChunk) options.mode = ReadMode::kChunks;
  auto reader = Reader::Open(*queue, options);
  std::vector<std::string> pieces;
  ReadStatus status;
  // Everything but the held item, then kEmpty once the short deadline passes.
  auto start = std::chrono::steady_clock::now();
  while ((status = ReadOnce(*reader, param.call, start + std::chrono::milliseconds(300),
                            &pieces)) == ReadStatus::kOk) {
  }
  double waited = SecondsSince(start);
  ASSERT_EQ(status, ReadStatus::kEmpty) << reader->error();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 3.0) << "the wait ends at the deadline";
  EXPECT_EQ(reader->items_held(), 0u) << "kEmpty strands no item in the Reader";
  EXPECT_EQ(reader->current_item().path, "");
  size_t before = pieces.size();
  EXPECT_GT(before, 0u);

  // Deadline "now": no wait at all, again and again, and nothing changes.
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ReadOnce(*reader, param.call, t0, &pieces), ReadStatus::kEmpty);
    EXPECT_LT(SecondsSince(t0), 0.1);
  }
  EXPECT_EQ(pieces.size(), before);

  // The held item comes back: the next call (no deadline) wakes and reads it.
  auto released = std::chrono::steady_clock::now();
  if (param.exit == HolderExit::kGivesBack) {
    ASSERT_EQ(holder.GiveBack(), 0);
  } else {
    holder.Kill();
  }
  status = ReadOnce(*reader, param.call, Deadline::max(), &pieces);
  ASSERT_EQ(status, ReadStatus::kOk) << reader->error();
  double woke = SecondsSince(released);
  // Given back: the futex wakes the waiter. Killed: the next wait slice's
  // housekeeping finds the dead client.
  EXPECT_LT(woke, param.exit == HolderExit::kGivesBack ? 1.0 : 3.0);
  while ((status = ReadOnce(*reader, param.call, Deadline::max(), &pieces)) == ReadStatus::kOk) {
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << reader->error();
  std::vector<std::string> expected =
      param.call == EndCall::kNextChunk ? data.contents : data.records;
  EXPECT_TRUE(Reassembled(data, param.call, pieces) == expected)
      << "every record exactly once across kEmpty";
  ReaderStats stats = reader->stats();
  EXPECT_EQ(stats.items_taken, stats.items_acked);
  EXPECT_EQ(stats.stale_items, 0u);
}

TEST_P(ReaderEndTest, ShortDeadlinesRepeatedlyNeverLoseOrRepeatARecord) {
  const EndParam param = GetParam();
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 200, 23);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 5, 2);
  auto queue = WorkQueue::Open(qo);
  ItemHolder holder(qo);
  ASSERT_TRUE(holder.ok());
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kDefault, false);
  if (param.call == EndCall::kNextChunk) options.mode = ReadMode::kChunks;
  auto reader = Reader::Open(*queue, options);
  std::vector<std::string> pieces;
  int empties = 0;
  bool released = false;
  for (;;) {
    // Every call waits 5 ms at most; the item comes back after 10 kEmpty.
    ReadStatus status =
        ReadOnce(*reader, param.call,
                 std::chrono::steady_clock::now() + std::chrono::milliseconds(5), &pieces);
    if (status == ReadStatus::kOk) continue;
    if (status == ReadStatus::kEnd) break;
    ASSERT_EQ(status, ReadStatus::kEmpty) << reader->error();
    EXPECT_EQ(reader->items_held(), 0u);
    ++empties;
    if (empties == 10 && !released) {
      released = true;
      if (param.exit == HolderExit::kGivesBack) {
        ASSERT_EQ(holder.GiveBack(), 0);
      } else {
        holder.Kill();
      }
    }
    ASSERT_LT(empties, 2000) << "the item never came back";
  }
  EXPECT_TRUE(released);
  std::vector<std::string> expected =
      param.call == EndCall::kNextChunk ? data.contents : data.records;
  EXPECT_TRUE(Reassembled(data, param.call, pieces) == expected);
}

INSTANTIATE_TEST_SUITE_P(Calls, ReaderEndTest,
                         ::testing::Values(EndParam{EndCall::kNextRecord, HolderExit::kGivesBack},
                                           EndParam{EndCall::kNextBatch, HolderExit::kGivesBack},
                                           EndParam{EndCall::kNextChunk, HolderExit::kGivesBack},
                                           EndParam{EndCall::kNextRecord, HolderExit::kKilled},
                                           EndParam{EndCall::kNextBatch, HolderExit::kKilled},
                                           EndParam{EndCall::kNextChunk, HolderExit::kKilled}),
                         [](const ::testing::TestParamInfo<EndParam>& info) {
                           const char* call = info.param.call == EndCall::kNextRecord ? "NextRecord"
                                              : info.param.call == EndCall::kNextBatch
                                                  ? "NextBatch"
                                                  : "NextChunk";
                           return std::string(call) + (info.param.exit == HolderExit::kGivesBack
                                                           ? "HolderGivesBack"
                                                           : "HolderKilled");
                         });

TEST(ReaderTest, ItemsHeldCountsTheCurrentItemAndThoseTakenAhead) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 3, 300, 25);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 9));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.prefetch_items = 2;
  auto reader = Reader::Open(*queue, options);
  EXPECT_EQ(reader->items_held(), 0u);
  Record record;
  size_t most = 0;
  ReadStatus status;
  while ((status = reader->NextRecord(&record)) == ReadStatus::kOk) {
    size_t held = reader->items_held();
    EXPECT_GE(held, 1u);
    EXPECT_LE(held, 3u);
    ReaderStats st = reader->stats();
    EXPECT_EQ(held, st.items_taken - st.items_acked - st.items_given_back);
    most = std::max(most, held);
  }
  EXPECT_EQ(status, ReadStatus::kEnd);
  EXPECT_EQ(most, 3u) << "the current item and prefetch_items more";
  EXPECT_EQ(reader->items_held(), 0u);
}

// A Reader that stalls past the lease timeout loses its items to another
// process; when it goes on, it stops reading each of them, counts it in
// stale_items and says so, and ends without hanging. Records of them it
// handed out before the stall are read again by the new owner (at least once).
TEST(ReaderTest, ItemsReassignedAfterALeaseTimeoutAreCountedAsStale) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 600, 27);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = QueueOptions(data, name, 8, 2);
  qo.lease_timeout = std::chrono::milliseconds(200);
  // Stalled: another process finds our leases expired and takes everything.
  ChildOnCue other_process([&] {
    auto other = WorkQueue::Open(qo);
    int n = 0;
    WorkItem item;
    TakeStatus status;
    while ((status = other->Take(&item, std::chrono::steady_clock::now() +
                                            std::chrono::seconds(20))) == TakeStatus::kOk) {
      if (other->Ack(item) != AckStatus::kOk) return 101;
      ++n;
    }
    other->Close();
    return status == TakeStatus::kEnd ? n : 100;
  });
  auto queue = WorkQueue::Open(qo);
  std::vector<std::string> notices;
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.on_notice = [&](const std::string& line) { notices.push_back(line); };
  auto reader = Reader::Open(*queue, options);
  Outcome before = ReadRecords(*reader, 1, 10);
  ASSERT_EQ(before.records.size(), 10u);
  size_t held = reader->items_held();
  ASSERT_GE(held, 1u);

  int taken = other_process.RunAndWait();
  ASSERT_EQ(taken, 8) << "the other process took every item, ours included";

  Outcome after = ReadRecords(*reader);
  EXPECT_EQ(after.last, ReadStatus::kEnd) << after.error;
  EXPECT_EQ(after.stats.stale_items, held);
  EXPECT_EQ(after.stats.items_acked, 0u);
  bool said = false;
  for (const std::string& line : notices)
    said |= line.find("was reassigned (lease timeout)") != std::string::npos &&
            line.find("read again by its new owner") != std::string::npos;
  EXPECT_TRUE(said);
  EXPECT_LT(after.records.size(), data.records.size());
}

TEST(ReaderTest, TheBudgetIsRoundedDownToWholeChunksOfWholePages) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 1, 50);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(data, name, 1));
  ReaderOptions options = SmallReaderOptions(data.format, IoBackend::kPread, false);
  options.chunk_bytes = 5000;           // up to 8192
  options.buffer_budget_bytes = 60000;  // 7 whole chunks of 8192
  auto reader = Reader::Open(*queue, options);
  EXPECT_EQ(reader->chunk_bytes(), 8192u);
  EXPECT_EQ(reader->num_chunks(), 7u);
  EXPECT_EQ(reader->queue_depth(), 3u) << "min(16, chunks / 2)";
  options.queue_depth = 100;
  auto capped = Reader::Open(*queue, options);
  EXPECT_EQ(capped->queue_depth(), 5u) << "at most chunks - 2";
  Outcome outcome = ReadRecords(*reader);
  EXPECT_EQ(outcome.last, ReadStatus::kEnd);
  EXPECT_TRUE(Sorted(outcome.records) == data.records);
}

}  // namespace
}  // namespace tailcut
