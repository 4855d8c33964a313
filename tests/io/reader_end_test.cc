// Tests of tailcut::Reader at the end of the data: waiting for items other
// processes hold (given back or killed), short deadlines, items held ahead,
// and items reassigned after a lease timeout.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "item_holder.h"
#include "reader_test_util.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

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
      if (other->Ack(item) != ItemStatus::kOk) return 101;
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

}  // namespace
}  // namespace tailcut
