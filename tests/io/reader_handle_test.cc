// Reader handles: a forked child that uses or destroys its parent's Reader,
// and a queue closed or destroyed under a live Reader (reader.h: Fork,
// Ownership). The parent must read every record exactly once regardless.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/queue_test_util.h"
#include "fork_child.h"
#include "tailcut/batcher.h"
#include "tailcut/reader.h"
#include "tailcut/shuffler.h"
#include "tailcut/work_queue.h"

namespace tailcut::test {
namespace {

using tailcut::testing::InChild;

constexpr int kFiles = 4;
constexpr int kLinesPerFile = 1250;  // 5,000 records

class ReaderHandleTest : public QueueTest {
 protected:
  void SetUp() override {
    for (int f = 0; f < kFiles; ++f) {
      std::string path = dir_.path() + "/part" + std::to_string(f);
      std::ofstream out(path);
      for (int i = 0; i < kLinesPerFile; ++i) out << "f" << f << "-" << i << "\n";
      paths_.push_back(path);
    }
  }
  WorkQueueOptions Options(const std::string& tag) {
    WorkQueueOptions o = BaseOptions(NewName(tag), paths_);
    o.num_slices = 16;
    return o;
  }
  static ReaderOptions Small() {
    ReaderOptions r;
    r.format.kind = RecordFormatKind::kLines;
    r.buffer_budget_bytes = 64 << 10;
    r.chunk_bytes = 4096;
    r.on_notice = [](const std::string&) {};
    return r;
  }
  // Reads up to `limit` records (all when 0) into *seen; the final status.
  static ReadStatus Read(Reader& reader, std::map<std::string, int>* seen, size_t limit = 0) {
    tailcut::Record r;
    ReadStatus st = ReadStatus::kOk;
    for (size_t n = 0; limit == 0 || n < limit; ++n) {
      st = reader.NextRecord(&r);
      if (st != ReadStatus::kOk) break;
      ++(*seen)[std::string(reinterpret_cast<const char*>(r.data), r.size)];
    }
    return st;
  }
  static std::string ExactlyOnce(const std::map<std::string, int>& seen) {
    if (seen.size() != kFiles * kLinesPerFile)
      return std::to_string(seen.size()) + " distinct records of " +
             std::to_string(kFiles * kLinesPerFile);
    for (const auto& [record, n] : seen)
      if (n != 1) return "'" + record + "' read " + std::to_string(n) + " times";
    return "";
  }
  std::vector<std::string> paths_;
};

TEST_F(ReaderHandleTest, AForkedChildThatUsesOrDestroysItsParentsReaderChangesNothing) {
  auto queue = WorkQueue::Open(Options("reader_fork"));
  auto reader = Reader::Open(*queue, Small());
  std::map<std::string, int> seen;
  ASSERT_EQ(Read(*reader, &seen, 700), ReadStatus::kOk);
  EXPECT_EQ(InChild([&]() -> std::string {
              std::string bad;
              tailcut::Record r;
              tailcut::Record batch[8];
              size_t n = 99;
              ChunkView chunk;
              WorkItem item;
              if (!reader->forked()) bad += "forked() is false; ";
              if (reader->NextRecord(&r) != ReadStatus::kForked) bad += "NextRecord; ";
              if (reader->NextBatch(batch, 8, &n) != ReadStatus::kForked || n != 0)
                bad += "NextBatch; ";
              if (reader->NextChunk(&chunk) != ReadStatus::kForked) bad += "NextChunk; ";
              if (reader->TakeFinished(&item)) bad += "TakeFinished; ";
              reader->Close();
              reader.reset();
              queue.reset();
              return bad.empty() ? "" : "not refused as forked: " + bad;
            }),
            "");
  ASSERT_EQ(Read(*reader, &seen), ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(ExactlyOnce(seen), "");
  EXPECT_EQ(queue->Stats().done, queue->num_items());
}

// A Batcher and a Shuffler hold records that point into their Readers'
// buffers, which a child does not have mapped: they refuse before touching any.
TEST_F(ReaderHandleTest, AForkedChildsBatcherAndShufflerAreRefusedToo) {
  auto queue = WorkQueue::Open(Options("reader_fork_layers"));
  ReaderOptions deferring = Small();
  deferring.defer_acks = true;
  auto shuffled = Reader::Open(*queue, deferring);
  auto batched = Reader::Open(*queue, Small());
  ShufflerOptions shuffling;
  shuffling.buffer_records = 64;
  Shuffler shuffler({shuffled.get()}, shuffling);
  BatcherOptions batching;
  batching.max_records = 16;
  Batcher batcher(*batched, batching);
  tailcut::Record r;
  Batch b;
  ASSERT_EQ(shuffler.Next(&r), ReadStatus::kOk);
  ASSERT_EQ(batcher.Next(&b), ReadStatus::kOk);
  EXPECT_EQ(InChild([&]() -> std::string {
              std::string bad;
              tailcut::Record cr;
              Batch cb;
              if (shuffler.Next(&cr) != ReadStatus::kForked) bad += "Shuffler::Next; ";
              if (batcher.Next(&cb) != ReadStatus::kForked) bad += "Batcher::Next; ";
              return bad.empty() ? "" : "not refused as forked: " + bad;
            }),
            "");
  EXPECT_EQ(shuffler.Next(&r), ReadStatus::kOk) << "the parent's Shuffler goes on";
  EXPECT_EQ(batcher.Next(&b), ReadStatus::kOk) << "the parent's Batcher goes on";
}

TEST_F(ReaderHandleTest, AQueueClosedUnderALiveReaderFailsItNamingTheQueueNeverEnds) {
  WorkQueueOptions o = Options("reader_closed");
  auto queue = WorkQueue::Open(o);
  auto reader = Reader::Open(*queue, Small());
  std::map<std::string, int> seen;
  ASSERT_EQ(Read(*reader, &seen, 1864), ReadStatus::kOk);
  queue->Close();
  EXPECT_EQ(Read(*reader, &seen), ReadStatus::kError) << seen.size() << " records, then kEnd";
  EXPECT_NE(reader->error().find("queue '" + o.name + "' was closed while this Reader"),
            std::string::npos)
      << reader->error();
  EXPECT_EQ(reader->error_kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(reader->items_held(), 0u) << "what it held was given back";
  tailcut::Record r;
  EXPECT_EQ(reader->NextRecord(&r), ReadStatus::kError) << "sticky";
}

TEST_F(ReaderHandleTest, AReaderOpenedInAChildOnItsParentsQueueFailsSayingSo) {
  auto queue = WorkQueue::Open(Options("reader_child_queue"));
  EXPECT_EQ(InChild([&]() -> std::string {
              auto reader = Reader::Open(*queue, Small());
              tailcut::Record r;
              if (reader->NextRecord(&r) != ReadStatus::kError) return "no error";
              if (reader->error().find("forked child") == std::string::npos)
                return "error: " + reader->error();
              reader.reset();
              queue.reset();
              return "";
            }),
            "");
  auto reader = Reader::Open(*queue, Small());
  std::map<std::string, int> seen;
  ASSERT_EQ(Read(*reader, &seen), ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(ExactlyOnce(seen), "");
}

TEST_F(ReaderHandleTest, DestroyingTheQueueUnderALiveReaderAbortsNamingTheQueue) {
  WorkQueueOptions o = Options("reader_destroyed");
  EXPECT_DEATH(
      {
        auto queue = WorkQueue::Open(o);
        auto reader = Reader::Open(*queue, Small());
        tailcut::Record r;
        (void)reader->NextRecord(&r);
        queue.reset();
        (void)reader->NextRecord(&r);
      },
      "queue '.*reader_destroyed' destroyed while 1 Reader\\(s\\) still use it; destroy every "
      "Reader");
}

}  // namespace
}  // namespace tailcut::test
