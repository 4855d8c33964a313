// Tests of tailcut::Shuffler over real Readers: every record once, in a
// seeded order that repeats, a checkpoint that continues the same order,
// the end of the data with another process holding an item, bad states and
// options; and a measurement of how well it mixes against a full shuffle and
// what it costs in records/s against reading in file order.
#include "tailcut/shuffler.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/queue_test_util.h"
#include "item_holder.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

namespace fs = std::filesystem;

using test::QueueGuard;
using test::TempDir;
using test::UniqueQueueName;

// Files of lines "<id>:<padding>", ids 0..files*per_file-1 in file order.
std::vector<std::string> MakeFiles(const std::string& dir, int files, int per_file) {
  std::vector<std::string> paths;
  int id = 0;
  for (int f = 0; f < files; ++f) {
    std::string content;
    for (int i = 0; i < per_file; ++i, ++id) {
      content += std::to_string(id) + ":" + std::string(20 + id % 40, 'x') + "\n";
    }
    paths.push_back(dir + "/data_" + std::to_string(f));
    std::ofstream(paths.back(), std::ios::binary) << content;
  }
  return paths;
}

WorkQueueOptions QueueOptions(const std::vector<std::string>& paths, const std::string& name,
                              uint64_t slices, uint32_t clients = 1) {
  WorkQueueOptions options;
  options.works = paths;
  options.num_slices = slices;
  options.num_clients = clients;
  options.seed = 11;
  options.name = name;
  options.format = "lines";
  options.on_notice = [](const std::string&) {};
  return options;
}

// A Shuffler's Readers (defer_acks), or one that acks its own items.
ReaderOptions SmallReaderOptions(bool defer_acks = true) {
  ReaderOptions options;
  options.format = RecordFormat::Parse("lines");
  options.buffer_budget_bytes = 256 << 10;
  options.chunk_bytes = 16 << 10;
  options.prefetch_items = 1;  // 4 Readers x 2 items, and finished items keep theirs
  options.backend = IoBackend::kDefault;
  options.cuda_register = false;
  options.defer_acks = defer_acks;
  options.on_notice = [](const std::string&) {};
  return options;
}

struct Readers {
  std::vector<std::unique_ptr<Reader>> owned;
  std::vector<Reader*> Pointers() const {
    std::vector<Reader*> out;
    for (const auto& r : owned) out.push_back(r.get());
    return out;
  }
};

Readers OpenReaders(WorkQueue& queue, int n, bool defer_acks = true) {
  Readers readers;
  for (int i = 0; i < n; ++i)
    readers.owned.push_back(Reader::Open(queue, SmallReaderOptions(defer_acks)));
  return readers;
}

int64_t IdOf(const Record& record) {
  return std::strtoll(std::string(reinterpret_cast<const char*>(record.data), record.size).c_str(),
                      nullptr, 10);
}

// Reads ids until the status is not kOk (returned in *last).
std::vector<int64_t> ReadIds(Shuffler& shuffler, size_t max = SIZE_MAX,
                             ReadStatus* last = nullptr) {
  std::vector<int64_t> ids;
  Record record;
  ReadStatus status = ReadStatus::kOk;
  while (ids.size() < max && (status = shuffler.Next(&record)) == ReadStatus::kOk) {
    ids.push_back(IdOf(record));
  }
  if (last) *last = status;
  return ids;
}

bool EachOnce(std::vector<int64_t> ids, int64_t n) {
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> expected(static_cast<size_t>(n));
  std::iota(expected.begin(), expected.end(), 0);
  return ids == expected;
}

// The ids read before and after a crash, restart or restore, each once
// (sorted): a record read twice counts once, a lost one is missing.
std::vector<int64_t> DistinctIds(std::vector<int64_t> before, const std::vector<int64_t>& after) {
  before.insert(before.end(), after.begin(), after.end());
  std::sort(before.begin(), before.end());
  before.erase(std::unique(before.begin(), before.end()), before.end());
  return before;
}

// How mixed an order of ids 0..n-1 is: the fraction of neighbours that are
// consecutive ids, and the mean distance of an id from its place.
struct Mixing {
  double consecutive = 0;
  double displacement = 0;
};

Mixing Measure(const std::vector<int64_t>& ids) {
  Mixing m;
  size_t consecutive = 0;
  double displaced = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0 && std::llabs(ids[i] - ids[i - 1]) == 1) ++consecutive;
    displaced += std::fabs(static_cast<double>(ids[i]) - static_cast<double>(i));
  }
  m.consecutive = static_cast<double>(consecutive) / static_cast<double>(ids.size() - 1);
  m.displacement = displaced / static_cast<double>(ids.size());
  return m;
}

constexpr int kFiles = 4;
constexpr int kPerFile = 5000;
constexpr int64_t kRecords = kFiles * kPerFile;

TEST(ShufflerTest, EveryRecordOnceInAnOrderThatDependsOnTheSeedOnly) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), kFiles, kPerFile);
  std::vector<std::vector<int64_t>> runs;
  for (uint64_t seed : {5, 5, 6}) {
    std::string name = UniqueQueueName("shuffler");
    QueueGuard cleanup{name};
    auto queue = WorkQueue::Open(QueueOptions(paths, name, 40));
    Readers readers = OpenReaders(*queue, 4);
    Shuffler shuffler(readers.Pointers(), {.buffer_records = 512, .seed = seed});
    ReadStatus last;
    runs.push_back(ReadIds(shuffler, SIZE_MAX, &last));
    EXPECT_EQ(last, ReadStatus::kEnd) << shuffler.error();
    EXPECT_TRUE(EachOnce(runs.back(), kRecords));
    EXPECT_EQ(shuffler.buffered(), 0u);
  }
  EXPECT_TRUE(runs[0] == runs[1]) << "same seeds, same order";
  EXPECT_FALSE(runs[0] == runs[2]) << "another Shuffler seed, another order";
}

// A checkpoint as a job takes one, mid-epoch: the queue's state alone,
// restored into a new queue, new Readers and a new Shuffler (as after a
// crash). Regression: the Readers reported their parse position as
// progress, up to an item's end once they finished it, so a restore skipped
// the records still in the buffer (700-1,800 of 200,000 lost in every run).
// Now every item resumes below its first record not handed out: nothing is
// lost; repeated are records handed out above the first one still buffered
// of an item not acked, so at most the records of leases_per_client items
// per process. Both ways of using records:
// handed out one by one (ack_on_next), and packed into batches, reported
// used per batch (ReportUsed). The Shuffler's state (its RNG) repeats the
// restored order.
TEST(ShufflerTest, ACheckpointOfTheQueueAloneLosesNoRecordAndTheStateRepeatsTheOrder) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 2, 3000);
  constexpr size_t kBuffer = 700;
  for (bool ack_on_next : {true, false}) {
    for (uint64_t seed : {9, 10, 11}) {
      SCOPED_TRACE((ack_on_next ? "records, seed " : "batches, seed ") + std::to_string(seed));
      std::string name = UniqueQueueName("shuffler");
      QueueGuard cleanup{name};
      std::vector<int64_t> before;
      std::string queue_state, shuffler_state;
      const size_t stop = 2500 + 300 * (seed % 3);
      size_t open_bound = 0;  // records in the 8 (leases_per_client) largest items
      {
        auto queue = WorkQueue::Open(QueueOptions(paths, name, 60));
        std::vector<uint64_t> sizes;
        for (const WorkQueue::Item& item : queue->items()) sizes.push_back(item.end - item.begin);
        std::sort(sizes.rbegin(), sizes.rend());
        for (size_t i = 0; i < 8; ++i) open_bound += sizes[i] / 22 + 1;  // lines of >= 22 bytes
        Readers readers = OpenReaders(*queue, 3);
        Shuffler shuffler(readers.Pointers(),
                          {.buffer_records = kBuffer, .seed = seed, .ack_on_next = ack_on_next});
        Record record;
        while (before.size() < stop && shuffler.Next(&record) == ReadStatus::kOk) {
          before.push_back(IdOf(record));
          // A batch of 32 goes to the caller: what it holds is used.
          if (!ack_on_next && before.size() % 32 == 0) shuffler.ReportUsed();
        }
        // The batch being packed (before.size() % 32 records) never reached
        // the caller: it does not count as used.
        before.resize(ack_on_next ? before.size() : before.size() / 32 * 32);
        shuffler_state = shuffler.SaveState();
        queue_state = queue->SaveState();
        EXPECT_GT(shuffler.buffered(), 0u) << "records buffered at the checkpoint";
      }
      std::vector<std::vector<int64_t>> afters;
      for (int run = 0; run < 2; ++run) {
        std::string again = UniqueQueueName("shuffler");
        QueueGuard cleanup_again{again};
        WorkQueueOptions qo = QueueOptions(paths, again, 60);
        qo.restore_state = queue_state;
        auto queue = WorkQueue::Open(qo);
        Readers readers = OpenReaders(*queue, 3);
        Shuffler shuffler(readers.Pointers(), {.buffer_records = kBuffer, .seed = 12345},
                          shuffler_state);
        ReadStatus last;
        afters.push_back(ReadIds(shuffler, SIZE_MAX, &last));
        EXPECT_EQ(last, ReadStatus::kEnd) << shuffler.error();
      }
      EXPECT_TRUE(afters[0] == afters[1]) << "the same states, the same order";
      std::vector<int64_t> distinct = DistinctIds(before, afters[0]);
      EXPECT_TRUE(EachOnce(distinct, 6000)) << "lost: " << 6000 - distinct.size() << " of 6000";
      const size_t repeated = before.size() + afters[0].size() - distinct.size();
      EXPECT_LE(repeated, open_bound) << "of " << before.size() << " read before";
      EXPECT_LT(open_bound, before.size()) << "the bound says something";
    }
  }
}

// A state saved by an earlier version (2) carries the records it buffered,
// its queue state counting them as read: they are handed out again.
TEST(ShufflerTest, AVersion2StateHandsOutTheRecordsItCarries) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 1, 10);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(paths, name, 1));
  Readers readers = OpenReaders(*queue, 1);
  std::string state("tcshuf2\0", 8);
  auto put = [&](uint64_t v) { state.append(reinterpret_cast<const char*>(&v), 8); };
  put(77);  // rng
  put(2);   // records
  for (const std::string record : {"100:a", "101:b"}) {
    put(0);  // offset
    put(0);  // epoch
    put(record.size());
    state += record;
  }
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 4}, state);
  EXPECT_EQ(shuffler.buffered(), 2u);
  std::vector<int64_t> ids = ReadIds(shuffler);
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> expected{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 101};
  EXPECT_EQ(ids, expected);
}

// file(): the file of the record handed out last (file f holds ids
// 100f..100f+99 here); unknown for a record of a version 2 state.
TEST(ShufflerTest, FileNamesTheWorkFileOfTheRecordHandedOutLast) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 3, 100);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(paths, name, 9));
  Readers readers = OpenReaders(*queue, 2);
  std::string state("tcshuf2\0", 8);
  auto put = [&](uint64_t v) { state.append(reinterpret_cast<const char*>(&v), 8); };
  const std::string restored = "1000:a";
  for (uint64_t v : {uint64_t{5}, uint64_t{1}, uint64_t{0}, uint64_t{0}, restored.size()}) put(v);
  state += restored;
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 16, .seed = 3}, state);
  Record record;
  size_t n = 0;
  while (shuffler.Next(&record) == ReadStatus::kOk) {
    const int64_t id = IdOf(record);
    if (id == 1000) {
      EXPECT_EQ(shuffler.file(), Shuffler::kUnknownFile);
    } else {
      EXPECT_EQ(shuffler.file(), static_cast<uint32_t>(id / 100)) << "record " << id;
    }
    ++n;
  }
  EXPECT_EQ(n, 301u) << shuffler.error();
}

// Exactly once across a kill -9: a child process reads through a Shuffler
// with a full buffer (records of finished items in it), writes each record's
// id to a pipe as it uses it and is killed mid-epoch. Its unacked items come
// back whole: the parent, reading the rest, gets every record the child did
// not use (the buffered ones included), and some again (at least once).
TEST(ShufflerTest, AProcessKilledWithAFullBufferLosesNoRecord) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 4, 2000);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(paths, name, 32, 2);
  int ids_pipe[2];
  ASSERT_EQ(pipe(ids_pipe), 0);
  fflush(nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ids_pipe[0]);
    auto queue = WorkQueue::Open(qo);
    Readers readers = OpenReaders(*queue, 2);
    Shuffler shuffler(readers.Pointers(), {.buffer_records = 1500, .seed = 2});
    Record record;
    for (int used = 0; used < 3000 && shuffler.Next(&record) == ReadStatus::kOk; ++used) {
      int64_t id = IdOf(record);
      if (write(ids_pipe[1], &id, sizeof id) != sizeof id) _exit(3);
    }
    kill(getpid(), SIGKILL);  // mid-epoch, 1500 records buffered
    _exit(4);
  }
  close(ids_pipe[1]);
  std::vector<int64_t> used_by_child;
  int64_t id;
  while (read(ids_pipe[0], &id, sizeof id) == sizeof id) used_by_child.push_back(id);
  close(ids_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  ASSERT_EQ(used_by_child.size(), 3000u);

  auto queue = WorkQueue::Open(qo);
  Readers readers = OpenReaders(*queue, 2);
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 1500, .seed = 2});
  ReadStatus last;
  std::vector<int64_t> rest = ReadIds(shuffler, SIZE_MAX, &last);
  ASSERT_EQ(last, ReadStatus::kEnd) << shuffler.error();
  EXPECT_GE(queue->Stats().recovered_items, 1u);
  std::vector<int64_t> all = DistinctIds(used_by_child, rest);
  EXPECT_TRUE(EachOnce(all, 8000)) << "lost " << 8000 - static_cast<int64_t>(all.size());
  EXPECT_LT(rest.size(), 8000u) << "the items the child acked were not read again";
}

// A Shuffler closed (or destroyed) before the end gives its finished items
// back: a new Shuffler over new Readers reads every record it did not hand out.
TEST(ShufflerTest, AShufflerClosedEarlyGivesBackWhatItBuffered) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 2, 2000);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(paths, name, 16));
  std::vector<int64_t> first;
  {
    Readers readers = OpenReaders(*queue, 2);
    Shuffler shuffler(readers.Pointers(), {.buffer_records = 1000, .seed = 8});
    first = ReadIds(shuffler, 1200);
    shuffler.Close();
    Record record;
    EXPECT_EQ(shuffler.Next(&record), ReadStatus::kEnd);
    EXPECT_EQ(shuffler.buffered(), 0u);
  }
  Readers readers = OpenReaders(*queue, 2);
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 1000, .seed = 8});
  ReadStatus last;
  std::vector<int64_t> rest = ReadIds(shuffler, SIZE_MAX, &last);
  ASSERT_EQ(last, ReadStatus::kEnd) << shuffler.error();
  std::vector<int64_t> all = DistinctIds(first, rest);
  EXPECT_TRUE(EachOnce(all, 4000)) << "lost " << 4000 - static_cast<int64_t>(all.size());
  EXPECT_EQ(queue->Stats().done, 16u);
}

TEST(ShufflerTest, AtTheEndTheBufferDrainsThenEmptyThenTheHeldItemsRecords) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 2, 1000);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(paths, name, 8, 2);
  auto queue = WorkQueue::Open(qo);
  ItemHolder holder(qo);
  ASSERT_TRUE(holder.ok());
  Readers readers = OpenReaders(*queue, 2);
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 300, .seed = 1});
  std::vector<int64_t> ids;
  Record record;
  ReadStatus status;
  auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::milliseconds(100); };
  while ((status = shuffler.Next(&record, deadline())) == ReadStatus::kOk)
    ids.push_back(IdOf(record));
  ASSERT_EQ(status, ReadStatus::kEmpty) << shuffler.error();
  EXPECT_EQ(shuffler.buffered(), 0u);
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_LT(ids.size(), 2000u) << "all but the held item's records";
  ASSERT_EQ(holder.GiveBack(), 0);
  while ((status = shuffler.Next(&record)) == ReadStatus::kOk) ids.push_back(IdOf(record));
  ASSERT_EQ(status, ReadStatus::kEnd) << shuffler.error();
  EXPECT_TRUE(EachOnce(ids, 2000));
}

TEST(ShufflerTest, MaxEpochStopsAtTheNextEpochAndGivesItsItemsBackWhole) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 2, 1500);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  WorkQueueOptions qo = QueueOptions(paths, name, 10);
  qo.num_epochs = 2;
  auto queue = WorkQueue::Open(qo);
  for (uint64_t epoch : {0, 1}) {
    Readers readers = OpenReaders(*queue, 3);
    Shuffler shuffler(readers.Pointers(),
                      {.buffer_records = 256, .seed = epoch, .max_epoch = epoch});
    std::vector<int64_t> ids;
    Record record;
    ReadStatus status;
    while ((status = shuffler.Next(&record)) == ReadStatus::kOk) {
      ids.push_back(IdOf(record));
      ASSERT_EQ(shuffler.epoch(), epoch);
    }
    ASSERT_EQ(status, ReadStatus::kEnd) << shuffler.error();
    EXPECT_TRUE(EachOnce(ids, 3000)) << "epoch " << epoch << ": " << ids.size() << " records";
  }
  EXPECT_EQ(queue->Stats().done, 20u);
}

// Regression: with a buffer of one record, every Next started with the
// buffer empty and let a Reader at the end of the data wait for the items its
// sibling Reader held -- which only this thread reads: a hang without a
// deadline. No other process holds anything here, so a Next that lasts until
// its deadline is that wait.
TEST(ShufflerTest, ABufferOfOneNeverWaitsForItsOwnReaders) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 2, 500);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(paths, name, 16));
  Readers readers = OpenReaders(*queue, 2);
  Shuffler shuffler(readers.Pointers(), {.buffer_records = 1, .seed = 4});
  std::vector<int64_t> ids;
  Record record;
  ReadStatus status;
  for (;;) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    status = shuffler.Next(&record, deadline);
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "Next waited for an item its sibling Reader held, after " << ids.size() << " records";
    if (status != ReadStatus::kOk) break;
    ids.push_back(IdOf(record));
  }
  ASSERT_EQ(status, ReadStatus::kEnd) << shuffler.error();
  EXPECT_TRUE(EachOnce(ids, 1000));
}

TEST(ShufflerTest, BadStatesAndOptionsAreErrorsThatSayWhat) {
  TempDir dir;
  auto paths = MakeFiles(dir.path(), 1, 10);
  std::string name = UniqueQueueName("shuffler");
  QueueGuard cleanup{name};
  auto queue = WorkQueue::Open(QueueOptions(paths, name, 1));
  Readers readers = OpenReaders(*queue, 1);
  auto expect_error = [&](ShufflerOptions options, std::string_view state, ErrorKind kind,
                          const std::string& text) {
    try {
      Shuffler shuffler(readers.Pointers(), options, state);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error({.buffer_records = 0}, {}, ErrorKind::kInvalidArgument,
               "buffer_records must be at least 1");
  expect_error({}, "not a state", ErrorKind::kCorrupt, "not a Shuffler state (bad magic)");
  {
    Readers acking = OpenReaders(*queue, 1, /*defer_acks=*/false);
    try {
      Shuffler shuffler(acking.Pointers(), {});
      ADD_FAILURE() << "no error for a Reader that acks its own items";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("open every Reader with ReaderOptions::defer_acks"),
                std::string::npos)
          << e.what();
    }
  }
  Shuffler good(readers.Pointers(), {.buffer_records = 4});
  Record record;
  ASSERT_EQ(good.Next(&record), ReadStatus::kOk);
  std::string state = good.SaveState();
  expect_error({}, std::string_view(state).substr(0, state.size() - 1), ErrorKind::kCorrupt,
               "truncated");
  expect_error({}, state + "x", ErrorKind::kCorrupt, "trailing bytes");
  try {
    Shuffler none({}, {});
    ADD_FAILURE() << "no error without Readers";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

// Prints how well the Shuffler mixes against a full shuffle and the file
// order, and its cost in records/s against reading in file order, all in
// this run; checks only that it mixes far better than file order.
TEST(ShufflerTest, MixingAndCostAgainstAFullShuffleAndFileOrder) {
  TempDir dir;
  constexpr int kFilesHere = 8, kPer = 25000;
  constexpr int64_t kAll = kFilesHere * kPer;
  auto paths = MakeFiles(dir.path(), kFilesHere, kPer);
  // Best of three runs: other work on the machine only ever slows a run down.
  auto timed_once = [&](int readers_n, size_t buffer, std::vector<int64_t>* ids) {
    std::string name = UniqueQueueName("shuffler");
    QueueGuard cleanup{name};
    WorkQueueOptions qo = QueueOptions(paths, name, 64);
    qo.shuffle = false;  // items in file order: what mixing there is comes from the Shuffler
    qo.leases_per_client = 32;
    auto queue = WorkQueue::Open(qo);
    Readers readers = OpenReaders(*queue, readers_n, /*defer_acks=*/buffer > 0);
    auto start = std::chrono::steady_clock::now();
    if (buffer == 0) {
      Record record;
      while (readers.owned[0]->NextRecord(&record) == ReadStatus::kOk) ids->push_back(IdOf(record));
    } else {
      Shuffler shuffler(readers.Pointers(), {.buffer_records = buffer, .seed = 3});
      *ids = ReadIds(shuffler);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return static_cast<double>(ids->size()) / s;
  };
  auto timed = [&](int readers_n, size_t buffer, std::vector<int64_t>* ids) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      ids->clear();
      best = std::max(best, timed_once(readers_n, buffer, ids));
    }
    return best;
  };
  std::vector<int64_t> plain, full(kAll);
  double plain_rate = timed(1, 0, &plain);
  ASSERT_TRUE(EachOnce(plain, kAll));
  std::iota(full.begin(), full.end(), 0);
  std::shuffle(full.begin(), full.end(), std::mt19937_64(1));
  Mixing m_plain = Measure(plain), m_full = Measure(full);
  printf("%-32s %12s %14s %12s\n", "order", "consecutive", "displacement", "records/s");
  printf("%-32s %12.5f %14.0f %12.0f\n", "file order (1 Reader)", m_plain.consecutive,
         m_plain.displacement, plain_rate);
  printf("%-32s %12.5f %14.0f %12s\n", "full shuffle", m_full.consecutive, m_full.displacement,
         "-");
  struct Case {
    int readers;
    size_t buffer;
  };
  for (Case c : {Case{1, 1024}, Case{1, 8192}, Case{4, 1024}, Case{4, 8192}, Case{8, 8192}}) {
    std::vector<int64_t> ids;
    double rate = timed(c.readers, c.buffer, &ids);
    ASSERT_TRUE(EachOnce(ids, kAll));
    Mixing m = Measure(ids);
    char label[64];
    snprintf(label, sizeof label, "%d Readers, buffer %zu", c.readers, c.buffer);
    printf("%-32s %12.5f %14.0f %12.0f (%.2fx file order)\n", label, m.consecutive, m.displacement,
           rate, rate / plain_rate);
    EXPECT_LT(m.consecutive, 0.01) << label;
    EXPECT_GT(m.displacement, static_cast<double>(c.buffer) / 4) << label;
  }
}

}  // namespace
}  // namespace tailcut
