// Tests of tailcut::Reader's options, limits and fallbacks: bad options,
// TAILCUT_IO, seccomp without io_uring, RLIMIT_MEMLOCK, locked and registered
// buffers, CUDA (absent, or a fake runtime with a device), ramfs without
// O_DIRECT, the peak resident size, and the buffer budget's rounding.
#include <dlfcn.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <string>
#include <vector>

#include "reader_test_util.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

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
