// Tests of ReadRecords' paths (tailcut/record_index.h): io_uring and pread
// reads, buffered and O_DIRECT, return the bytes the mapping returns for any
// set of positions in every format; a truncated file and a corrupt TFRecord
// are errors naming file and offset; without io_uring the reads fall back to
// pread threads with one notice; TAILCUT_IO=uring picks io_uring.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tailcut/record_index.h"
#include "tests/io/reader_test_util.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ReadWith(const RecordFiles& files, const std::vector<uint64_t>& positions,
                                  const ReadRecordsOptions& options) {
  std::string data;
  std::vector<uint64_t> ends;
  ReadRecords(files, positions, &data, &ends, options);
  std::vector<std::string> out;
  uint64_t begin = 0;
  for (uint64_t end : ends) {
    out.push_back(data.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

ReadRecordsOptions Path(RecordReadPath path, bool direct = false, uint64_t max_gap = 4096,
                        uint32_t queue_depth = 64, std::vector<std::string>* notices = nullptr) {
  ReadRecordsOptions options;
  options.path = path;
  options.direct = direct;
  options.max_gap = max_gap;
  options.queue_depth = queue_depth;
  options.on_notice = [notices](const std::string& line) {
    if (notices) notices->push_back(line);
  };
  return options;
}

// Random position sets: a few records, a batch with repeats, every record shuffled.
std::vector<std::vector<uint64_t>> PositionSets(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> sets;
  sets.push_back({0});
  sets.push_back({n - 1, 0, n - 1});
  std::vector<uint64_t> batch;
  for (int k = 0; k < 256; ++k) batch.push_back(rng() % n);
  batch.push_back(batch[3]);  // a repeat
  sets.push_back(batch);
  std::vector<uint64_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  sets.push_back(all);
  return sets;
}

// Every path gives the mapping's bytes, position for position. `direct` runs
// O_DIRECT reads as well (the temp dir's filesystem may refuse them: then
// they read buffered with a notice, and the bytes are still compared).
void ExpectEveryPathReadsTheMappingsBytes(const RecordFiles& files) {
  for (const std::vector<uint64_t>& positions : PositionSets(files.size(), files.size())) {
    const std::vector<std::string> want = ReadWith(files, positions, Path(RecordReadPath::kMap));
    ASSERT_EQ(want.size(), positions.size());
    for (RecordReadPath path : {RecordReadPath::kUring, RecordReadPath::kPread}) {
      for (bool direct : {false, true}) {
        // No coalescing and a depth of 1; coalescing at the default gap and depth; everything
        // in a few large reads.
        for (auto [max_gap, depth] :
             {std::pair<uint64_t, uint32_t>{0, 1}, {4096, 64}, {uint64_t{1} << 22, 3}}) {
          SCOPED_TRACE(std::string(path == RecordReadPath::kUring ? "uring" : "pread") +
                       (direct ? " direct" : " buffered") + " max_gap " + std::to_string(max_gap) +
                       " depth " + std::to_string(depth) + ", " + std::to_string(positions.size()) +
                       " positions");
          std::vector<std::string> notices;
          std::vector<std::string> got =
              ReadWith(files, positions, Path(path, direct, max_gap, depth, &notices));
          // Where the temp dir's filesystem refuses O_DIRECT the log says so.
          for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
          ASSERT_EQ(got.size(), want.size());
          for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], want[k]) << "position " << k;
        }
      }
    }
  }
}

class EveryFormat : public ::testing::TestWithParam<RecordFormatKind> {};

TEST_P(EveryFormat, IoUringAndPreadReadTheMappingsBytesBufferedAndDirect) {
  TempDir dir;
  // Records of 0 to 14,000 bytes (fixed: 100), so many cross a 4 KiB boundary.
  DataSet data = MakeData(dir.path(), GetParam(), 3, 300);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  ExpectEveryPathReadsTheMappingsBytes(*files);
}

INSTANTIATE_TEST_SUITE_P(RecordRead, EveryFormat,
                         ::testing::Values(RecordFormatKind::kLines, RecordFormatKind::kTfrecord,
                                           RecordFormatKind::kFixed, RecordFormatKind::kFile),
                         [](const auto& info) { return std::string(FormatName(info.param)); });

TEST(RecordRead, TarSamplesReadTheMappingsBytes) {
  TempDir dir;
  const std::string members = dir.path() + "/members";
  fs::create_directory(members);
  std::mt19937_64 rng(9);
  std::string names;
  for (int i = 0; i < 40; ++i) {
    const std::string key = "s" + std::to_string(1000 + i);
    WriteFile(members + "/" + key + ".txt", Letters(rng, 10 + rng() % 5000));
    WriteFile(members + "/" + key + ".bin", Bytes(rng, 1 + rng() % 3000));
    names += " " + key + ".txt " + key + ".bin";
  }
  const std::string shard = dir.path() + "/shard.tar";
  const std::string command = "tar -cf " + shard + " -C " + members + names;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto files = RecordFiles::Build({shard}, RecordFormat::Parse("tar"), RecordIndexOptions{});
  ASSERT_EQ(files->size(), 40u);
  ExpectEveryPathReadsTheMappingsBytes(*files);
}

// 1,000 records of 4 KiB - 1 at offsets that walk across every page boundary,
// read one record per read and O_DIRECT (each read rounded out to whole blocks).
TEST(RecordRead, RecordsSpanning4KiBBoundariesReadWholeDirectAndBuffered) {
  TempDir dir;
  const std::string path = dir.path() + "/odd.bin";
  std::mt19937_64 rng(4);
  WriteFile(path, Bytes(rng, 4095 * 1000));
  auto files = RecordFiles::Build({path}, RecordFormat::Parse("fixed", 4095), RecordIndexOptions{});
  ExpectEveryPathReadsTheMappingsBytes(*files);
}

TEST(RecordRead, ACorruptTfrecordIsAnErrorNamingFileAndOffsetOnEveryPath) {
  TempDir dir;
  std::string content;
  AppendTfrecord(&content, "first");
  const size_t second = content.size();
  AppendTfrecord(&content, std::string(5000, 'x'));
  content[second + 12 + 4500] ^= 1;  // a byte of the second record's data, in its second page
  const std::string path = dir.path() + "/bad.tfrecord";
  WriteFile(path, content);
  auto files = RecordFiles::Build({path}, RecordFormat::Parse("tfrecord"), RecordIndexOptions{});
  for (RecordReadPath p : {RecordReadPath::kUring, RecordReadPath::kPread}) {
    for (bool direct : {false, true}) {
      EXPECT_EQ(ReadWith(*files, {0}, Path(p, direct))[0], "first");
      try {
        ReadWith(*files, {0, 1}, Path(p, direct));
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
        EXPECT_EQ(std::string(e.what()), "tfrecord file '" + path + "' at offset " +
                                             std::to_string(second) +
                                             ": data CRC mismatch (the file changed or decayed "
                                             "since it was indexed)");
      }
    }
  }
}

TEST(RecordRead, AFileTruncatedSinceItWasIndexedIsAnErrorNamingFileAndWhereItEnds) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 2, 100);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  ASSERT_EQ(::truncate(data.paths[1].c_str(), 1000), 0);
  for (RecordReadPath p : {RecordReadPath::kUring, RecordReadPath::kPread}) {
    for (bool direct : {false, true}) {
      try {
        ReadWith(*files, {0, files->size() - 1}, Path(p, direct));
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kIo);
        const std::string what = e.what();
        EXPECT_NE(what.find("'" + data.paths[1] + "' at offset 1000: "), std::string::npos) << what;
        EXPECT_NE(what.find("truncated"), std::string::npos) << what;
      }
    }
  }
}

TEST(RecordRead, BadOptionsAreErrors) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 1, 10);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  EXPECT_THROW(ReadWith(*files, {0}, Path(RecordReadPath::kUring, false, 4096, 0)), Error);
  EXPECT_THROW(ReadWith(*files, {0}, Path(RecordReadPath::kUring, false, 4096, 5000)), Error);
}

// Runs fn with TAILCUT_IO set to value (unset for nullptr), restoring it after.
template <typename Fn>
void WithTailcutIo(const char* value, Fn fn) {
  const char* saved = std::getenv("TAILCUT_IO");
  const std::string saved_value = saved ? saved : "";
  if (value) {
    setenv("TAILCUT_IO", value, 1);
  } else {
    unsetenv("TAILCUT_IO");
  }
  fn();
  if (saved) {
    setenv("TAILCUT_IO", saved_value.c_str(), 1);
  } else {
    unsetenv("TAILCUT_IO");
  }
}

TEST(RecordRead, TailcutIoUringPicksIoUringAndPreadKeepsTheMapping) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 1, 10);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  // A file truncated since it was mapped: the mapping still serves the
  // records it has, reads check the file at open. So the error tells the paths apart.
  const std::string record0 = ReadWith(*files, {0}, Path(RecordReadPath::kMap))[0];
  ASSERT_EQ(::truncate(data.paths[0].c_str(), 1000), 0);
  WithTailcutIo(nullptr, [&] {
    EXPECT_EQ(ReadWith(*files, {0}, Path(RecordReadPath::kDefault))[0], record0);
  });
  WithTailcutIo("uring", [&] {
    EXPECT_THROW(ReadWith(*files, {0}, Path(RecordReadPath::kDefault)), Error);
    // An explicit path wins over the variable.
    EXPECT_EQ(ReadWith(*files, {0}, Path(RecordReadPath::kMap))[0], record0);
  });
  // pread is the Reader's choice for hot data: records keep the mapping.
  WithTailcutIo("pread", [&] {
    EXPECT_EQ(ReadWith(*files, {0}, Path(RecordReadPath::kDefault))[0], record0);
    EXPECT_THROW(ReadWith(*files, {0}, Path(RecordReadPath::kPread)), Error);
  });
  WithTailcutIo("mmap", [&] {
    try {
      ReadWith(*files, {0}, Path(RecordReadPath::kDefault));
      ADD_FAILURE() << "TAILCUT_IO=mmap was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_STREQ(e.what(), "TAILCUT_IO='mmap' is not 'uring' or 'pread'");
    }
  });
}

// Docker's default seccomp profile blocks io_uring with ENOSYS: the reads
// fall back to pread threads, with one notice per process.
TEST(RecordRead, WithoutIoUringTheReadsFallBackToPreadWithOneNotice) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 2, 200);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  std::vector<uint64_t> positions = PositionSets(files->size(), 1)[2];
  const std::vector<std::string> want = ReadWith(*files, positions, Path(RecordReadPath::kMap));
  int code = RunInChild([&] {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(ENOSYS)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      return 77;
    }
    std::vector<std::string> notices;
    for (int k = 0; k < 3; ++k) {
      if (ReadWith(*files, positions, Path(RecordReadPath::kUring, false, 4096, 64, &notices)) !=
          want) {
        return 10;
      }
    }
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    if (notices != std::vector<std::string>{"tailcut: io_uring unavailable for record reads: "
                                            "io_uring_setup: Function not implemented (kernel "
                                            "too old, or seccomp blocks io_uring); reading with "
                                            "2 pread threads (path kPread silences this)"}) {
      return 11;
    }
    return 0;
  });
  if (code == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(code, 0);
}

// A filesystem that refuses O_DIRECT at open (EINVAL, as tmpfs did before
// Linux 6.6), made with a seccomp filter on openat's flags: the files are read
// buffered, with one notice for the filesystem.
TEST(RecordRead, AFilesystemRefusingODirectIsReadBufferedWithOneNotice) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 200);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  std::vector<uint64_t> positions = PositionSets(files->size(), 2)[2];
  const std::vector<std::string> want = ReadWith(*files, positions, Path(RecordReadPath::kMap));
  int code = RunInChild([&] {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(EINVAL)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      return 77;
    }
    std::vector<std::string> notices;
    for (RecordReadPath p : {RecordReadPath::kUring, RecordReadPath::kPread}) {
      if (ReadWith(*files, positions, Path(p, true, 4096, 64, &notices)) != want) return 10;
    }
    for (const std::string& line : notices) fprintf(stderr, "notice: %s\n", line.c_str());
    if (notices !=
        std::vector<std::string>{"tailcut: O_DIRECT is not supported for '" + data.paths[0] +
                                 "' (open: Invalid argument); reading record files "
                                 "on its filesystem buffered"}) {
      return 11;
    }
    return 0;
  });
  if (code == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(code, 0);
}

// A thread's ring and pread threads are kept between calls; a forked child
// sets up its own, and one that exits without reading does not wait for the
// parent's pread threads (which do not exist in it).
TEST(RecordRead, AForkedChildReadsWithBackendsOfItsOwnAndExitsCleanly) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 2, 200);
  auto files = RecordFiles::Build(data.paths, data.format, RecordIndexOptions{});
  std::vector<uint64_t> positions = PositionSets(files->size(), 3)[2];
  const std::vector<std::string> want = ReadWith(*files, positions, Path(RecordReadPath::kMap));
  for (RecordReadPath path : {RecordReadPath::kUring, RecordReadPath::kPread}) {
    ASSERT_EQ(ReadWith(*files, positions, Path(path)), want);  // the parent's backend
    for (bool read_in_child : {true, false}) {
      SCOPED_TRACE(std::string(path == RecordReadPath::kUring ? "uring" : "pread") +
                   (read_in_child ? ", the child reads" : ", the child only exits"));
      fflush(nullptr);
      const pid_t pid = fork();
      if (pid == 0) {
        alarm(60);  // a child that waits for threads it does not have dies, and the test fails
        int code = 0;
        if (read_in_child) {
          for (int k = 0; k < 3; ++k)
            if (ReadWith(*files, positions, Path(path)) != want) code = 10;
        }
        std::exit(code);  // thread_local destructors run
      }
      EXPECT_EQ(WaitForChild(pid), 0);
    }
    EXPECT_EQ(ReadWith(*files, positions, Path(path)), want);
  }
}

}  // namespace
}  // namespace tailcut
