// tests/io/reader_test_util.h: what the Reader suites (reader_test.cc,
// reader_options_test.cc, reader_bad_input_test.cc, reader_end_test.cc) share:
// queue names and their cleanup, temporary directories, generated data sets
// of every record format, small Reader options, a reading loop that collects
// what a Reader hands out, forked children that read or act on cue, and the
// skip for a backend or O_DIRECT this machine cannot run.
#ifndef TAILCUT_TESTS_IO_READER_TEST_UTIL_H_
#define TAILCUT_TESTS_IO_READER_TEST_UTIL_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {

namespace fs = std::filesystem;

inline std::string UniqueQueueName() {
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

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whether files in dir can be read with O_DIRECT (tmpfs on old kernels,
// ramfs and some FUSE mounts cannot).
inline bool SupportsDirectIo(const std::string& dir) {
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

inline bool IoUringAvailable() {
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

inline std::string Letters(std::mt19937_64& rng, size_t n) {
  std::string s(n, 'a');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

inline std::string Bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Record sizes: mostly small, some empty, some larger than a 4 KiB chunk.
inline size_t RecordSize(std::mt19937_64& rng, size_t i) {
  if (i % 53 == 7) return 0;
  if (i % 97 == 11) return 5000 + rng() % 9000;
  return rng() % 300;
}

inline DataSet MakeData(const std::string& dir, RecordFormatKind kind, int files = 3,
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
      case RecordFormatKind::kTar:
        ADD_FAILURE() << "MakeData writes no tar shards (tar_test.cc writes them with tar)";
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

inline WorkQueueOptions QueueOptions(const DataSet& data, const std::string& name,
                                     uint64_t num_slices, uint32_t num_clients = 1) {
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

inline ReaderOptions SmallReaderOptions(const RecordFormat& format, IoBackend backend,
                                        bool direct) {
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
inline Outcome ReadRecords(Reader& reader, size_t batch = 1, size_t max_records = SIZE_MAX) {
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

inline std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Runs fn in `children` forked processes; each returns the records it read,
// written through a file. Fails the test if a child fails.
inline std::vector<std::string> ReadInChildren(int children, const std::string& dir,
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
[[noreturn]] inline void RunChildBody(const std::function<int()>& fn) {
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

inline int WaitForChild(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline int RunInChild(const std::function<int()>& fn) {
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

inline const char* BackendName(IoBackend backend) {
  return backend == IoBackend::kUring ? "uring" : "pread";
}

inline const char* FormatName(RecordFormatKind kind) {
  switch (kind) {
    case RecordFormatKind::kFixed:
      return "fixed";
    case RecordFormatKind::kLines:
      return "lines";
    case RecordFormatKind::kTfrecord:
      return "tfrecord";
    case RecordFormatKind::kFile:
      return "file";
    case RecordFormatKind::kTar:
      return "tar";
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

}  // namespace tailcut

#endif  // TAILCUT_TESTS_IO_READER_TEST_UTIL_H_
