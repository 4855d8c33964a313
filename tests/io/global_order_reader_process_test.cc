// Tests of tailcut/global_order_reader.h across processes: several forked
// processes reading one queue at once read every record exactly once per
// epoch; one killed with kill -9 mid-epoch loses nothing (the records of
// items it acked are read by nobody else, those of the item it held are read
// again by the others); idle processes split the tail of a slow process's
// item and every record is still read once; a reader that stalls past the
// lease timeout loses its item and counts it as stale.
//
// The test process itself never builds a RecordFiles nor opens a queue
// before it forks (both start threads, and a child forked from a process with
// threads may inherit a lock held forever): each child builds and opens its
// own, and the parent checks what they wrote against the data it generated.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "reader_test_util.h"
#include "tailcut/global_order_reader.h"
#include "tailcut/record_index.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

// One record as a child hands it on: which epoch and number, which item of
// the child's (a counter that moves when current_item() changes), its bytes.
struct Got {
  uint64_t epoch = 0;
  uint64_t number = 0;
  uint64_t item = 0;
  std::string bytes;
};

// Writes records to a file with write(2), unbuffered, so that what a child
// wrote before it was killed is all there.
class GotWriter {
 public:
  explicit GotWriter(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600)) {}
  ~GotWriter() { ::close(fd_); }
  bool Write(const Got& g) {
    const uint64_t head[4] = {g.epoch, g.number, g.item, g.bytes.size()};
    std::string out(reinterpret_cast<const char*>(head), sizeof head);
    out += g.bytes;
    return ::write(fd_, out.data(), out.size()) == static_cast<ssize_t>(out.size());
  }

 private:
  int fd_;
};

std::vector<Got> ReadGot(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<Got> out;
  for (size_t at = 0; at + 32 <= bytes.size();) {
    uint64_t head[4];
    std::memcpy(head, bytes.data() + at, sizeof head);
    out.push_back({head[0], head[1], head[2], bytes.substr(at + 32, head[3])});
    at += 32 + head[3];
  }
  return out;
}

// Reads with batches of `batch` until a status other than kOk (or `limit`
// records), writing each record as it is handed out. `each` runs after every
// call that handed records out (a slow consumer, a kill).
ReadStatus ReadAndWrite(GlobalOrderReader& reader, size_t batch, GotWriter& out,
                        size_t limit = SIZE_MAX, const std::function<void()>& each = {}) {
  std::vector<Record> records(batch);
  WorkItem last;
  uint64_t item = 0;
  size_t count = 0;
  while (count < limit) {
    size_t n = 0;
    ReadStatus status = reader.NextBatch(records.data(), std::min(batch, limit - count), &n);
    if (status != ReadStatus::kOk) return status;
    for (size_t i = 0; i < n; ++i) {
      // current_item() is the last record's item: a batch that spans items
      // counts as the last one's here, which only makes the kill test's
      // "acked" set smaller.
      WorkItem now = reader.current_item();
      if (now.ticket != last.ticket || now.lease != last.lease ||
          now.generation != last.generation || now.begin != last.begin)
        ++item;
      last = now;
      if (!out.Write(
              {reader.epoch(), reader.numbers()[i], item,
               std::string(reinterpret_cast<const char*>(records[i].data), records[i].size)}))
        _exit(9);
    }
    count += n;
    if (each) each();
  }
  return ReadStatus::kOk;
}

// A child's body: builds the files, opens the queue and a reader, runs `fn`;
// exits 0 when fn returns kEnd, else prints why.
[[noreturn]] void ChildMain(const DataSet& data, const std::string& dir, WorkQueueOptions qo,
                            GlobalOrderReaderOptions ro,
                            const std::function<ReadStatus(GlobalOrderReader&, WorkQueue&)>& fn) {
  alarm(120);
  int code = 0;
  try {
    RecordIndexOptions index;
    index.cache_dir = dir + "/index";
    auto files = RecordFiles::Build(data.paths, data.format, index);
    auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, qo));
    auto reader = GlobalOrderReader::Open(*queue, files, ro);
    ReadStatus status = fn(*reader, *queue);
    if (status != ReadStatus::kEnd) {
      std::fprintf(stderr, "child %d: %s: %s\n", getpid(), ReadStatusName(status),
                   reader->error().c_str());
      code = 1;
    }
    reader.reset();
    queue->Close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
    code = 2;
  }
  std::fflush(nullptr);
  _exit(code);
}

pid_t Fork(const std::function<void()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(3);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

WorkQueueOptions Options(const std::string& name, uint64_t epochs, uint32_t clients) {
  WorkQueueOptions o;
  o.name = name;
  o.seed = 23;
  o.num_epochs = epochs;
  o.num_clients = clients;
  o.on_notice = [](const std::string&) {};
  return o;
}

GlobalOrderReaderOptions Quiet() {
  GlobalOrderReaderOptions o;
  o.on_notice = [](const std::string&) {};
  return o;
}

// Every (epoch, number) in `counts` exactly once for epochs [0, epochs), and
// each number's bytes the same record of the data set in every epoch.
void ExpectEachOnce(const std::map<std::pair<uint64_t, uint64_t>, int>& counts,
                    const std::vector<Got>& all, const DataSet& data, uint64_t epochs) {
  const uint64_t n = data.records.size();
  EXPECT_EQ(counts.size(), epochs * n);
  for (const auto& [key, count] : counts)
    ASSERT_EQ(count, 1) << "epoch " << key.first << " record " << key.second;
  std::map<uint64_t, std::string> bytes_of;
  for (const Got& g : all) {
    auto [at, fresh] = bytes_of.emplace(g.number, g.bytes);
    ASSERT_EQ(at->second, g.bytes) << "record " << g.number << " changed bytes";
  }
  std::vector<std::string> distinct;
  for (const auto& [number, bytes] : bytes_of) distinct.push_back(bytes);
  EXPECT_EQ(Sorted(distinct), data.records) << "each number holds one record of the files";
}

TEST(GlobalOrderReaderProcessTest, FourProcessesReadEveryRecordOncePerEpochOverTwoEpochs) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 3, 700);  // 2,100 records
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = Options(name, 2, 4);
  qo.num_slices = 30;
  const size_t batches[] = {1, 5, 64, 300};
  std::vector<pid_t> pids;
  for (int c = 0; c < 4; ++c) {
    pids.push_back(Fork([&, c] {
      GotWriter out(dir.path() + "/got" + std::to_string(c));
      ChildMain(data, dir.path(), qo, Quiet(),
                [&](GlobalOrderReader& r, WorkQueue&) { return ReadAndWrite(r, batches[c], out); });
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(Wait(pid), 0);
  std::vector<Got> all;
  std::map<std::pair<uint64_t, uint64_t>, int> counts;
  for (int c = 0; c < 4; ++c) {
    for (Got& g : ReadGot(dir.path() + "/got" + std::to_string(c))) {
      ++counts[{g.epoch, g.number}];
      all.push_back(std::move(g));
    }
  }
  ExpectEachOnce(counts, all, data, 2);
}

// kill -9 mid-epoch: the victim reads 500 records one by one and kills
// itself while a second process holds items of its own; the survivors read
// the rest. The victim's acked items (every item before the one its last
// record came from) are read by nobody else; the item it held comes back
// whole and its records are read again.
TEST(GlobalOrderReaderProcessTest, AProcessKilledMidEpochLosesNoRecordAndItsAckedOnesAreNotReread) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kTfrecord, 3, 700, 5);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = Options(name, 2, 3);
  qo.num_slices = 30;  // items of 70 records
  int cue[2];
  ASSERT_EQ(pipe(cue), 0);
  // A survivor that holds items while the victim dies: 50 records, a wait
  // for the cue, then the rest.
  pid_t holder = Fork([&] {
    close(cue[1]);
    GotWriter out(dir.path() + "/got_holder");
    ChildMain(data, dir.path(), qo, Quiet(), [&](GlobalOrderReader& r, WorkQueue&) {
      ReadStatus s = ReadAndWrite(r, 10, out, 50);
      if (s != ReadStatus::kOk) return s;
      char go;
      if (read(cue[0], &go, 1) != 1) return ReadStatus::kError;
      return ReadAndWrite(r, 10, out);
    });
  });
  close(cue[0]);
  pid_t victim = Fork([&] {
    GotWriter out(dir.path() + "/got_victim");
    ChildMain(data, dir.path(), qo, Quiet(), [&](GlobalOrderReader& r, WorkQueue&) {
      ReadAndWrite(r, 1, out, 500);
      kill(getpid(), SIGKILL);
      return ReadStatus::kError;
    });
  });
  ASSERT_EQ(Wait(victim), 128 + SIGKILL);
  pid_t late = Fork([&] {
    GotWriter out(dir.path() + "/got_late");
    ChildMain(data, dir.path(), qo, Quiet(),
              [&](GlobalOrderReader& r, WorkQueue&) { return ReadAndWrite(r, 32, out); });
  });
  char go = 1;
  ASSERT_EQ(write(cue[1], &go, 1), 1);
  close(cue[1]);
  EXPECT_EQ(Wait(holder), 0);
  EXPECT_EQ(Wait(late), 0);

  std::vector<Got> victim_got = ReadGot(dir.path() + "/got_victim");
  ASSERT_EQ(victim_got.size(), 500u);
  const uint64_t held_item = victim_got.back().item;
  std::map<std::pair<uint64_t, uint64_t>, int> counts;
  std::vector<Got> all;
  size_t acked = 0;
  for (const Got& g : victim_got) {
    if (g.item == held_item) continue;  // its item came back: read again by the others
    ++counts[{g.epoch, g.number}];
    ++acked;
    all.push_back(g);
  }
  EXPECT_GE(acked, 400u);
  for (const char* who : {"holder", "late"}) {
    for (Got& g : ReadGot(dir.path() + "/got_" + who)) {
      ++counts[{g.epoch, g.number}];
      all.push_back(std::move(g));
    }
  }
  ExpectEachOnce(counts, all, data, 2);
  for (const Got& g : victim_got)
    if (g.item == held_item)
      EXPECT_EQ((counts[{g.epoch, g.number}]), 1) << "record " << g.number << " of the held item";
}

// Tail splitting: a slow process claims a few positions at a time; the
// others, with nothing left to take, split the unclaimed tail of its item.
TEST(GlobalOrderReaderProcessTest, IdleProcessesSplitASlowProcessesItemAndEveryRecordIsReadOnce) {
  TempDir dir;
  // The queue splits in units of 4096 positions (segment_layout.h,
  // SplitUnit): items of 21,000 records, 63,000 fixed records of 100 bytes.
  DataSet data = MakeData(dir.path(), RecordFormatKind::kFixed, 3, 7000, 9);
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = Options(name, 1, 3);
  qo.num_slices = 3;
  qo.split_tail = true;
  qo.min_split_bytes = 16;  // positions, in an index work
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  GlobalOrderReaderOptions slow_options = Quiet();
  slow_options.records_per_read = 4;
  pid_t slow = Fork([&] {
    close(ready[0]);
    GotWriter out(dir.path() + "/got_slow");
    ChildMain(data, dir.path(), qo, slow_options, [&](GlobalOrderReader& r, WorkQueue& q) {
      bool told = false;
      ReadStatus s = ReadAndWrite(r, 1, out, SIZE_MAX, [&] {
        if (!told && write(ready[1], "r", 1) == 1) told = true;  // it holds an item now
        usleep(50);
      });
      std::ofstream(dir.path() + "/splits") << q.Stats().splits;
      return s;
    });
  });
  close(ready[1]);
  char r;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  close(ready[0]);
  std::vector<pid_t> fast;
  for (int c = 0; c < 2; ++c) {
    fast.push_back(Fork([&, c] {
      GotWriter out(dir.path() + "/got_fast" + std::to_string(c));
      ChildMain(data, dir.path(), qo, Quiet(),
                [&](GlobalOrderReader& r, WorkQueue&) { return ReadAndWrite(r, 16, out); });
    }));
  }
  EXPECT_EQ(Wait(slow), 0);
  for (pid_t pid : fast) EXPECT_EQ(Wait(pid), 0);
  const std::string splits = ReadFile(dir.path() + "/splits");
  ASSERT_FALSE(splits.empty());
  EXPECT_GT(std::stoull(splits), 0u) << "nobody split the slow process's item";
  std::map<std::pair<uint64_t, uint64_t>, int> counts;
  std::vector<Got> all;
  size_t slow_count = 0;
  for (const char* who : {"slow", "fast0", "fast1"}) {
    for (Got& g : ReadGot(dir.path() + "/got_" + who)) {
      ++counts[{g.epoch, g.number}];
      if (std::string(who) == "slow") ++slow_count;
      all.push_back(std::move(g));
    }
  }
  EXPECT_LT(slow_count, 21000u) << "the slow process read its whole item: nothing was split off";
  ExpectEachOnce(counts, all, data, 1);
}

// A reader that stalls past the lease timeout loses its item to another
// process; when it goes on, it stops reading it at the next claim, counts it
// in stale_items, says so, and ends without hanging. The records it handed
// out before the stall are read again by the new owner (at least once).
TEST(GlobalOrderReaderProcessTest, AnItemReassignedAfterALeaseTimeoutIsCountedAsStale) {
  TempDir dir;
  DataSet data = MakeData(dir.path(), RecordFormatKind::kLines, 2, 600, 27);  // 1,200 records
  std::string name = UniqueQueueName();
  QueueCleanup cleanup{name};
  WorkQueueOptions qo = Options(name, 1, 2);
  qo.num_samples = data.records.size();
  qo.num_slices = 8;
  qo.lease_timeout = std::chrono::milliseconds(200);
  // Ours is lost whole to the lease timeout, not in pieces split off its tail.
  qo.split_tail = false;
  // Forked now, while this process has no thread: it takes (and acks) every
  // item once cued, ours too once its lease has expired.
  ChildOnCue other_process([&] {
    auto other = WorkQueue::Open(GlobalOrderReader::QueueOptions(
        *RecordFiles::Build(data.paths, data.format, RecordIndexOptions{}), qo));
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
  RecordIndexOptions index;
  index.cache_dir = dir.path() + "/index";
  auto files = RecordFiles::Build(data.paths, data.format, index);
  auto queue = WorkQueue::Open(GlobalOrderReader::QueueOptions(*files, qo));
  std::vector<std::string> notices;
  GlobalOrderReaderOptions options;
  options.on_notice = [&](const std::string& line) { notices.push_back(line); };
  auto reader = GlobalOrderReader::Open(*queue, files, options);
  Record batch[10];
  size_t n = 0;
  ASSERT_EQ(reader->NextBatch(batch, 10, &n), ReadStatus::kOk) << reader->error();
  ASSERT_EQ(n, 10u);
  ASSERT_EQ(reader->items_held(), 1u);

  ASSERT_EQ(other_process.RunAndWait(), 8) << "the other process took every item, ours included";

  size_t after = 0;
  ReadStatus status;
  while ((status = reader->NextBatch(batch, 10, &n)) == ReadStatus::kOk) after += n;
  EXPECT_EQ(status, ReadStatus::kEnd) << reader->error();
  EXPECT_EQ(after, 0u) << "every item was the other process's by then";
  EXPECT_EQ(reader->stats().stale_items, 1u);
  EXPECT_EQ(reader->stats().items_acked, 0u);
  EXPECT_EQ(reader->items_held(), 0u);
  bool said = false;
  for (const std::string& line : notices)
    said |= line.find("was reassigned (lease timeout)") != std::string::npos &&
            line.find("its new owner reads it again") != std::string::npos;
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace tailcut
