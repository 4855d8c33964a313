// Loaders that read with a Reader, publish batches into a BatchRing and
// commit after each publish (the ring example of docs/cpp.md), killed with
// SIGKILL at random moments while two trainers pop: every record reaches a
// trainer (none lost), and a kill repeats at most the one batch that was
// published but not yet committed. The Reader claims every item it reads
// (tail splitting), so this holds only if Commit works for claimed items and
// a split never takes committed bytes; with split_tail on and off.
//
// TAILCUT_CRASH_TRIALS kill trials (default 6) each way, TAILCUT_TEST_SEED
// fixes the kill moments. With split_tail, loaders that run dry split the
// tails of the others' items (at least one split per run is required).
// ring_loader_process_stress_test (TAILCUT_CRASH_STRESS) runs trials until
// TAILCUT_STRESS_SECONDS (default 45) are spent, half of them each way, and
// prints one line of totals for each.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#ifdef TAILCUT_CRASH_STRESS
constexpr bool kStress = true;
#else
constexpr bool kStress = false;
#endif

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

constexpr int kFiles = 4;
constexpr uint32_t kLinesPerFile = 20000;
constexpr uint32_t kRecords = kFiles * kLinesPerFile;
constexpr size_t kLineBytes = 8;         // "%07u\n"
constexpr size_t kMaxBatchRecords = 64;  // what one kill may repeat at most

// Anonymous shared memory the parent reads after the children are gone.
struct SharedLog {
  std::atomic<uint32_t> popped[kRecords];  // by the trainers, per record id
  std::atomic<uint32_t> batches;           // published by any loader
  std::atomic<uint32_t> bad;               // records that are not ours, bad statuses
  std::atomic<uint64_t> splits;            // tails split off, as the last loader saw them
};

SharedLog* MapLog() {
  void* p =
      ::mmap(nullptr, sizeof(SharedLog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return new (p) SharedLog();
}

BatchRingOptions RingOptions(const std::string& name) {
  BatchRingOptions o;
  o.name = name;
  o.slot_bytes = 4096;
  o.num_slots = 8;
  o.cuda_register = false;
  o.on_notice = [](const std::string&) {};
  return o;
}

int Trainer(const std::string& ring_name, SharedLog* log) {
  auto ring = BatchRing::Open(RingOptions(ring_name), RingRole::kTrainer);
  ReadyBatch batch;
  RingStatus status;
  while ((status = ring->Pop(BatchRing::kAllEpochs, &batch,
                             Clock::now() + std::chrono::seconds(60))) == RingStatus::kOk) {
    for (size_t at = 0; at + kLineBytes <= batch.data.size(); at += kLineBytes) {
      char line[kLineBytes + 1] = {};
      std::memcpy(line, batch.data.data() + at, kLineBytes);
      uint32_t id = static_cast<uint32_t>(std::strtoul(line, nullptr, 10));
      if (id < kRecords)
        log->popped[id].fetch_add(1);
      else
        log->bad.fetch_add(1);
    }
    ring->Release(batch.token);
  }
  if (status != RingStatus::kEnd) log->bad.fetch_add(1);
  return status == RingStatus::kEnd ? 0 : 1;
}

// The loop of docs/cpp.md's ring_pipeline loader, with a little work per
// batch so that kills land mid-run.
int Loader(const WorkQueueOptions& queue_options, const std::string& ring_name, SharedLog* log) {
  auto queue = WorkQueue::Open(queue_options);
  ReaderOptions reader_options;
  reader_options.format = RecordFormat::Parse("lines");
  reader_options.buffer_budget_bytes = 1 << 20;
  reader_options.chunk_bytes = 16 << 10;  // several claims per item: tails to split
  reader_options.cuda_register = false;
  reader_options.on_notice = [](const std::string&) {};
  auto reader = Reader::Open(*queue, reader_options);
  auto ring = BatchRing::Open(RingOptions(ring_name), RingRole::kLoader);
  Record records[kMaxBatchRecords];
  size_t n = 0;
  ReadStatus status;
  while ((status = reader->NextBatch(records, kMaxBatchRecords, &n)) == ReadStatus::kOk) {
    WritableBatch slot;
    if (ring->AcquireSlot(&slot, Clock::now() + std::chrono::seconds(60)) != RingStatus::kOk)
      return 3;
    size_t used = 0;
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(slot.data.data() + used, records[i].data, records[i].size);
      slot.data[used + records[i].size] = std::byte{'\n'};
      used += kLineBytes;
    }
    if (ring->Publish(slot.token, /*epoch=*/0, n, used) != RingStatus::kOk) return 4;
    log->batches.fetch_add(1);
    // Every record of the batch came from the current item: should this
    // loader die from here on, the item resumes after its last record.
    const WorkItem item = reader->current_item();
    const Record& last = records[n - 1];
    const ItemStatus committed =
        queue->Commit(item, std::min(last.offset + last.size + 1, item.end));
    if (committed != ItemStatus::kOk && committed != ItemStatus::kStale) return 5;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  if (status != ReadStatus::kEnd) return 6;
  log->splits.store(std::max(log->splits.load(), queue->Stats().splits));
  ring->Close();
  reader.reset();
  queue->Close();
  return 0;
}

class RingLoaderProcessTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tailcut_ring_loader.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    uint32_t id = 0;
    for (int f = 0; f < kFiles; ++f) {
      std::string path = dir_ + "/part" + std::to_string(f);
      FILE* out = std::fopen(path.c_str(), "w");
      ASSERT_NE(out, nullptr);
      for (uint32_t i = 0; i < kLinesPerFile; ++i) std::fprintf(out, "%07u\n", id++);
      std::fclose(out);
      works_.push_back(path);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::vector<std::string> works_;
};

pid_t Spawn(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 7;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", ::getpid(), e.what());
    }
    ::_exit(rc);
  }
  return pid;
}

// Waits for pid until deadline; kills it then. Its wait status.
int WaitFor(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return status;
}

TEST_P(RingLoaderProcessTest, KilledLoadersLoseNoRecordAndRepeatAtMostOneBatchEach) {
  const bool split_tail = GetParam();
  const uint64_t max_trials = kStress ? ~0ull : EnvU64("TAILCUT_CRASH_TRIALS", 6);
  // Stress: half the budget each way (split_tail off, on); at least one trial.
  const auto budget = std::chrono::seconds(EnvU64("TAILCUT_STRESS_SECONDS", 45)) / 2;
  const auto start = Clock::now();
  const uint64_t seed = EnvU64("TAILCUT_TEST_SEED", std::random_device{}());
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  uint64_t trials = 0, kills_mid_run = 0, repeated_total = 0, lost_total = 0, splits = 0;
  for (uint64_t trial = 0;
       trial < max_trials && (!kStress || trial == 0 || Clock::now() - start < budget);
       ++trial, ++trials) {
    SharedLog* log = MapLog();
    ASSERT_NE(log, nullptr);
    const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(trial);
    WorkQueueOptions qo;
    qo.name = "tctest_ringld_q_" + tag;
    qo.works = works_;
    qo.num_slices = 12;
    // Three join: the two loaders and the one started after the kill. Until
    // then a finished queue stays, so that a replacement that comes after
    // the end finds it finished rather than making a new one.
    qo.num_clients = 3;
    qo.shuffle = false;
    qo.format = "lines";
    qo.split_tail = split_tail;
    qo.min_split_bytes = 4096;
    qo.on_notice = [](const std::string&) {};
    const std::string ring_name = "tctest_ringld_r_" + tag;
    // The trainers first: a ring is removed when its last process leaves it.
    std::vector<pid_t> trainers;
    for (int t = 0; t < 2; ++t) trainers.push_back(Spawn([&] { return Trainer(ring_name, log); }));
    std::this_thread::sleep_for(milliseconds(100));
    std::vector<pid_t> loaders;
    for (int l = 0; l < 2; ++l)
      loaders.push_back(Spawn([&] { return Loader(qo, ring_name, log); }));
    // Kill loader 0 at a random moment, once it has published something,
    // and start another in its place.
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    const auto delay = milliseconds(std::uniform_int_distribution<int>(0, 60)(rng));
    while (log->batches.load() == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(1));
    std::this_thread::sleep_for(delay);
    ::kill(loaders[0], SIGKILL);
    int status = WaitFor(loaders[0], deadline);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    kills_mid_run += killed;
    loaders.push_back(Spawn([&] { return Loader(qo, ring_name, log); }));
    for (size_t l = 1; l < loaders.size(); ++l) {
      status = WaitFor(loaders[l], deadline);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "trial " << trial << ": loader " << l << " wait status " << status;
    }
    for (pid_t t : trainers) {
      status = WaitFor(t, deadline);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "trial " << trial << ": trainer wait status " << status;
    }
    uint64_t lost = 0, repeated = 0;
    for (uint32_t id = 0; id < kRecords; ++id) {
      uint32_t c = log->popped[id].load();
      lost += c == 0;
      repeated += c > 1 ? c - 1 : 0;
    }
    repeated_total += repeated;
    lost_total += lost;
    splits += log->splits.load();
    EXPECT_EQ(lost, 0u) << "trial " << trial << " (TAILCUT_TEST_SEED=" << seed << ")";
    EXPECT_LE(repeated, killed ? kMaxBatchRecords : 0)
        << "trial " << trial << ": records popped twice (TAILCUT_TEST_SEED=" << seed << ")";
    EXPECT_EQ(log->bad.load(), 0u) << "trial " << trial;
    ::munmap(log, sizeof(SharedLog));
    try {
      RemoveQueue(qo.name, /*force=*/true);
    } catch (const Error&) {
    }
    try {
      RemoveBatchRing(ring_name);
    } catch (const Error&) {
    }
  }
  RecordProperty("kills_mid_run", std::to_string(kills_mid_run));
  RecordProperty("records_repeated", std::to_string(repeated_total));
  RecordProperty("records_lost", std::to_string(lost_total));
  RecordProperty("splits", std::to_string(splits));
  std::printf(
      "split_tail=%d: %llu trials, %llu loaders killed mid-run, %llu records repeated, %llu "
      "lost, %llu tails split (TAILCUT_TEST_SEED=%llu)\n",
      split_tail, static_cast<unsigned long long>(trials),
      static_cast<unsigned long long>(kills_mid_run),
      static_cast<unsigned long long>(repeated_total), static_cast<unsigned long long>(lost_total),
      static_cast<unsigned long long>(splits), static_cast<unsigned long long>(seed));
  if (split_tail) EXPECT_GT(splits, 0u) << "no tail was split: the test split nothing";
}

INSTANTIATE_TEST_SUITE_P(SplitTail, RingLoaderProcessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SplitTailOn" : "SplitTailOff";
                         });

}  // namespace
}  // namespace tailcut
