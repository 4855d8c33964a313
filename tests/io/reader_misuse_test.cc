// A Reader used against its contract: in another format than its queue's,
// or from two threads at once. Regression: the queue's format tag was never
// compared with the Reader's format (a queue made for "fixed:8" read as
// lines gave other records), and two threads on one Reader got wrong
// records silently.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/queue_test_util.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using test::QueueGuard;
using test::TempDir;
using test::UniqueQueueName;

class ReaderMisuseTest : public ::testing::Test {
 protected:
  // One file of `lines` lines "<i>:xxxx...", 48 bytes each.
  std::unique_ptr<WorkQueue> Queue(const std::string& format, int lines = 100) {
    path_ = dir_.path() + "/data";
    std::ofstream out(path_, std::ios::binary);
    for (int i = 0; i < lines; ++i) {
      std::string line = std::to_string(i) + ":";
      out << line << std::string(47 - line.size(), 'x') << "\n";
    }
    out.close();
    WorkQueueOptions o;
    o.works = {path_};
    o.num_slices = 16;
    o.format = format;
    o.name = name_;
    o.on_notice = [](const std::string&) {};
    return WorkQueue::Open(o);
  }
  static ReaderOptions Options(const RecordFormat& format) {
    ReaderOptions r;
    r.format = format;
    r.buffer_budget_bytes = 3 * 4096;
    r.chunk_bytes = 4096;
    r.cuda_register = false;
    r.on_notice = [](const std::string&) {};
    return r;
  }

  TempDir dir_;
  std::string path_;
  std::string name_ = UniqueQueueName("misuse");
  QueueGuard cleanup_{name_};
};

TEST_F(ReaderMisuseTest, AFormatTheQueuesTagDoesNotAllowIsRefusedNamingBoth) {
  struct Case {
    std::string tag;
    RecordFormat format;
    bool allowed;
  };
  const std::vector<Case> cases = {
      {"", RecordFormat::Parse("tfrecord"), true},
      {"my-data-v2", RecordFormat::Parse("lines"), true},  // a tag of the user's own
      {"lines", RecordFormat::Parse("lines"), true},
      {"fixed", RecordFormat::Parse("fixed", 16), true},
      {"fixed:16", RecordFormat::Parse("fixed", 16), true},
      {"lines", RecordFormat::Parse("tfrecord"), false},
      {"fixed:8", RecordFormat::Parse("fixed", 16), false},
      {"fixed:8", RecordFormat::Parse("lines"), false},
      {"fixed", RecordFormat::Parse("lines"), false},
      {"tfrecord:max=4096", RecordFormat::Parse("tfrecord"), true},  // the reader's limit
      {"tfrecord", RecordFormat::Parse("file"), false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("tag '" + c.tag + "', format " + c.format.Tag());
    EXPECT_EQ(c.format.FitsTag(c.tag), c.allowed);
    auto queue = Queue(c.tag);
    try {
      auto reader = Reader::Open(*queue, Options(c.format));
      EXPECT_TRUE(c.allowed) << "opened";
    } catch (const Error& e) {
      EXPECT_FALSE(c.allowed) << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()),
                "reader: queue '" + name_ + "' was made with format '" + c.tag + "', not '" +
                    c.format.Tag() +
                    "': every process must read a queue's items the same way; open the "
                    "Reader with the queue's format");
    }
    queue.reset();  // removed: closed unfinished by its only process
  }
  // Raw chunks parse nothing: any format tag will do.
  auto queue = Queue("fixed:8");
  ReaderOptions chunks = Options(RecordFormat::Parse("lines"));
  chunks.mode = ReadMode::kChunks;
  EXPECT_NO_THROW(Reader::Open(*queue, chunks));
}

// Two threads call NextRecord on one Reader in a loop: an overlap is found
// (the second call returns kError at once), and the Reader fails with a
// message that says what; every record handed out before is one of the
// file's, whole.
TEST_F(ReaderMisuseTest, TwoThreadsOnOneReaderAreDetectedNotWrongRecords) {
  auto queue = Queue("lines", 200000);
  auto reader = Reader::Open(*queue, Options(RecordFormat::Parse("lines")));
  std::atomic<int> ready{0};
  std::atomic<int> errors{0};
  std::atomic<int> bad_records{0};
  auto read = [&] {
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    Record record;
    ReadStatus status;
    while ((status = reader->NextRecord(&record)) == ReadStatus::kOk) {
      std::string line(reinterpret_cast<const char*>(record.data), record.size);
      if (line.size() != 47 || line.back() != 'x') bad_records.fetch_add(1);
    }
    if (status == ReadStatus::kError) errors.fetch_add(1);
  };
  std::thread a(read), b(read);
  a.join();
  b.join();
  EXPECT_GE(errors.load(), 1) << "200,000 records read by two threads without an overlap";
  EXPECT_EQ(reader->error(),
            "reader: NextRecord/NextBatch/NextChunk called from two threads at once; a Reader "
            "is used by one thread at a time: open one per thread");
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  Record record;
  EXPECT_EQ(reader->NextRecord(&record), ReadStatus::kError) << "sticky";
  reader->Close();
  const ReaderStats stats = reader->stats();
  EXPECT_EQ(stats.items_acked + stats.items_given_back, stats.items_taken)
      << "every item the Reader held went back";
  EXPECT_GT(stats.items_given_back, 0u);
}

}  // namespace
}  // namespace tailcut
