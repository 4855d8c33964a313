// A work file that changes under a running queue: the Reader checks each
// file at every open: a regular file, the same inode and device as when the
// queue was created (FileIdentity), and not shorter.
// A FIFO renamed over a file once blocked the Reader forever inside open();
// a file replaced by another of the same size was read silently.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class ReaderFileChangeTest : public ::testing::Test {
 protected:
  ReaderFileChangeTest() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/tailcut_change_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    dir_ = pattern;
    name_ = "rfc_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  ~ReaderFileChangeTest() override {
    try {
      RemoveQueue(name_, true);
    } catch (...) {
    }
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string Write(const std::string& file, const std::string& text) {
    std::string p = dir_ + "/" + file;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }

  std::unique_ptr<WorkQueue> OpenQueue(const std::vector<std::string>& works) {
    WorkQueueOptions o;
    o.name = name_;
    o.works = works;
    o.shuffle = false;
    o.format = "lines";
    o.on_notice = [](const std::string&) {};
    return WorkQueue::Open(o);
  }

  ReaderOptions Options() {
    ReaderOptions r;
    r.format = RecordFormat::Parse("lines");
    r.buffer_budget_bytes = 3 << 20;
    r.chunk_bytes = 1 << 20;
    r.on_notice = [](const std::string&) {};
    return r;
  }

  // Reads to the end or the first error, in a thread, bounded: a hang fails.
  ReadStatus ReadAll(Reader& reader, std::vector<std::string>* records) {
    auto result = std::async(std::launch::async, [&] {
      Record r;
      ReadStatus s;
      while ((s = reader.NextRecord(&r)) == ReadStatus::kOk)
        records->emplace_back(reinterpret_cast<const char*>(r.data), r.size);
      return s;
    });
    if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "the Reader did not return within 20 s (blocked on the changed file)";
      std::_Exit(1);  // the thread is stuck in a system call: nothing to join
    }
    return result.get();
  }

  // Replaces `path` by renaming `replacement` over it (as a deploy would).
  static void RenameOver(const std::string& replacement, const std::string& path) {
    ASSERT_EQ(rename(replacement.c_str(), path.c_str()), 0) << strerror(errno);
  }

  std::string dir_, name_;
};

TEST_F(ReaderFileChangeTest, AFifoRenamedOverAWorkFileIsAnErrorNotAHang) {
  const std::string a = Write("a.txt", "one\ntwo\n");
  auto queue = OpenQueue({a});
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << strerror(errno);
  RenameOver(fifo, a);
  auto reader = Reader::Open(*queue, Options());
  std::vector<std::string> records;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ReadAll(*reader, &records), ReadStatus::kError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(reader->error(), "file '" + a +
                                 "' changed since the queue was created: it is no longer a regular "
                                 "file; recreate the queue or restore the file");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(records.empty());
  // The item went back: nothing is lost.
  reader.reset();
  EXPECT_EQ(queue->Stats().done, 0u);
  WorkItem item;
  EXPECT_EQ(queue->TryTake(&item), TakeStatus::kOk);
  queue->GiveBack(item);
}

TEST_F(ReaderFileChangeTest, AFileReplacedByAnotherOfTheSameSizeIsAnErrorNamingTheChange) {
  const std::string a = Write("a.txt", "one\ntwo\n");
  const std::string b = Write("b.txt", "six\nten\n");
  auto queue = OpenQueue({a, b});
  const FileIdentity before = queue->files()[0];
  struct stat st {};
  ASSERT_EQ(stat(a.c_str(), &st), 0);
  ASSERT_EQ(before, IdentityOf(st)) << "files() is the identity taken at creation";
  const std::string other = Write("other.txt", "ONE\nTWO\n");  // same size, another inode
  struct stat ost {};
  ASSERT_EQ(stat(other.c_str(), &ost), 0);
  RenameOver(other, a);
  auto reader = Reader::Open(*queue, Options());
  std::vector<std::string> records;
  ASSERT_EQ(ReadAll(*reader, &records), ReadStatus::kError);
  const std::string expected_start =
      "file '" + a + "' changed since the queue was created: inode " +
      std::to_string(before.inode) + " -> " + std::to_string(ost.st_ino);
  EXPECT_EQ(reader->error().rfind(expected_start, 0), 0u) << reader->error();
  EXPECT_NE(reader->error().find("; recreate the queue or restore the file"), std::string::npos)
      << reader->error();
  EXPECT_EQ(reader->error_kind(), ErrorKind::kConfigMismatch);
  for (const std::string& r : records) EXPECT_TRUE(r == "six" || r == "ten") << r;
}

// Restored in place (same inode, a new mtime) after an error, a file is read
// again: the Reader compares inode and device, the attachers every field.
TEST_F(ReaderFileChangeTest, AFileRestoredInPlaceIsReadAgain) {
  const std::string a = Write("a.txt", "one\ntwo\n");
  auto queue = OpenQueue({a});
  const FileIdentity before = queue->files()[0];
  struct timespec times[2] = {{0, UTIME_OMIT},
                              {static_cast<time_t>(before.mtime_ns / 1000000000) + 5, 0}};
  Write("a.txt", "one\ntwo\n");
  ASSERT_EQ(utimensat(AT_FDCWD, a.c_str(), times, 0), 0) << strerror(errno);
  auto reader = Reader::Open(*queue, Options());
  std::vector<std::string> records;
  ASSERT_EQ(ReadAll(*reader, &records), ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(records, (std::vector<std::string>{"one", "two"}));
}

TEST_F(ReaderFileChangeTest, AnUnchangedFileIsReadAsBefore) {
  const std::string a = Write("a.txt", "one\ntwo\n");
  auto queue = OpenQueue({a});
  auto reader = Reader::Open(*queue, Options());
  std::vector<std::string> records;
  ASSERT_EQ(ReadAll(*reader, &records), ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(records, (std::vector<std::string>{"one", "two"}));
}

}  // namespace
}  // namespace tailcut
