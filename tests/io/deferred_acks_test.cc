// Readers with ReaderOptions::defer_acks in several processes, read to the
// end of the data with Deadline::max(): nobody waits forever for items that
// another process's caller has finished but not acked yet.
//
// Regression: at the end of the data a Reader finished its item (leaving it
// for TakeFinished, unacked) and then waited in WorkQueue::Take for the
// items of the other processes, whose Readers did the same: every process
// waited for the others' finished items (ReadersWhoseCallersAckLate... hung
// with all records read). Now a Reader whose caller holds finished items
// says kHoldsFinished instead of waiting. A Shuffler acks what it holds
// before it waits, so it did not hang; its test guards that.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/queue_test_util.h"
#include "tailcut/reader.h"
#include "tailcut/shuffler.h"
#include "tailcut/work_queue.h"

namespace tailcut {
namespace {

using test::QueueGuard;
using test::TempDir;
using test::UniqueQueueName;

constexpr int kProcesses = 3;
constexpr int kFiles = 6;
constexpr int kPerFile = 3000;
constexpr int64_t kRecords = int64_t{kFiles} * kPerFile;

// Files of lines "<id>:<padding>", ids 0..kRecords-1.
std::vector<std::string> MakeFiles(const std::string& dir) {
  std::vector<std::string> paths;
  int64_t id = 0;
  for (int f = 0; f < kFiles; ++f) {
    std::string content;
    for (int i = 0; i < kPerFile; ++i, ++id) content += std::to_string(id) + ":padding\n";
    paths.push_back(dir + "/data_" + std::to_string(f));
    std::ofstream(paths.back(), std::ios::binary) << content;
  }
  return paths;
}

WorkQueueOptions QueueOptions(const std::vector<std::string>& paths, const std::string& name) {
  WorkQueueOptions options;
  options.works = paths;
  options.num_slices = 48;
  options.num_clients = kProcesses;
  options.seed = 5;
  options.name = name;
  options.format = "lines";
  options.on_notice = [](const std::string&) {};
  return options;
}

ReaderOptions DeferringReader() {
  ReaderOptions options;
  options.format = RecordFormat::Parse("lines");
  options.buffer_budget_bytes = 64 << 10;
  options.chunk_bytes = 4 << 10;
  options.prefetch_items = 0;
  options.cuda_register = false;
  options.defer_acks = true;
  options.on_notice = [](const std::string&) {};
  return options;
}

int64_t IdOf(const Record& record) {
  return std::strtoll(std::string(reinterpret_cast<const char*>(record.data), record.size).c_str(),
                      nullptr, 10);
}

// Runs body(queue, emit) in kProcesses forked processes, each on its own
// WorkQueue handle; emit(id) sends a record's id to the parent. Returns every
// id sent, or fails the test (killing the children) when they have not all
// finished within `limit`: a deadlock.
std::vector<int64_t> ReadInProcesses(const WorkQueueOptions& qo,
                                     const std::function<ReadStatus(WorkQueue&, int fd)>& body,
                                     std::chrono::seconds limit) {
  int ids[2];
  EXPECT_EQ(pipe(ids), 0);
  fflush(nullptr);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      close(ids[0]);
      int code = 0;
      try {
        auto queue = WorkQueue::Open(qo);
        code = body(*queue, ids[1]) == ReadStatus::kEnd ? 0 : 1;
        queue->Close();
      } catch (const std::exception& e) {
        fprintf(stderr, "process %d: %s\n", p, e.what());
        code = 2;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  close(ids[1]);
  std::vector<int64_t> got;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool hung = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd pfd{ids[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
      hung = true;
      break;
    }
    int64_t id;
    ssize_t n = read(ids[0], &id, sizeof id);
    if (n <= 0) break;  // every process closed its end: all exited
    if (n == sizeof id) got.push_back(id);
  }
  close(ids[0]);
  for (pid_t pid : pids) {
    if (hung) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!hung) EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_FALSE(hung) << "the processes did not reach the end within " << limit.count()
                     << " s (deadlock); " << got.size() << " of " << kRecords << " records read";
  return got;
}

void Emit(int fd, const Record& record) {
  int64_t id = IdOf(record);
  if (write(fd, &id, sizeof id) != sizeof id) _exit(3);
}

bool EachOnce(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<int64_t> expected(static_cast<size_t>(kRecords));
  std::iota(expected.begin(), expected.end(), 0);
  return ids == expected;
}

// The Python default: a Shuffler over two Readers per process.
TEST(DeferredAcksTest, ShufflersInSeveralProcessesReachTheEndWithEveryRecordOnce) {
  TempDir dir;
  auto paths = MakeFiles(dir.path());
  for (int trial = 0; trial < 3; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::string name = UniqueQueueName("deferred");
    QueueGuard cleanup{name};
    auto ids = ReadInProcesses(
        QueueOptions(paths, name),
        [](WorkQueue& queue, int fd) {
          auto a = Reader::Open(queue, DeferringReader());
          auto b = Reader::Open(queue, DeferringReader());
          Shuffler shuffler({a.get(), b.get()}, {.buffer_records = 256, .seed = 1});
          Record record;
          ReadStatus status;
          while ((status = shuffler.Next(&record)) == ReadStatus::kOk) Emit(fd, record);
          return status;
        },
        std::chrono::seconds(60));
    EXPECT_TRUE(EachOnce(ids)) << ids.size() << " records of " << kRecords;
  }
}

// A caller of its own: it acks finished items only once it has used a batch
// of 100 records, and on kHoldsFinished acks what it holds and goes on.
TEST(DeferredAcksTest, ReadersWhoseCallersAckLateReachTheEndWithEveryRecordOnce) {
  TempDir dir;
  auto paths = MakeFiles(dir.path());
  std::string name = UniqueQueueName("deferred");
  QueueGuard cleanup{name};
  auto ids = ReadInProcesses(
      QueueOptions(paths, name),
      [](WorkQueue& queue, int fd) {
        auto reader = Reader::Open(queue, DeferringReader());
        std::vector<WorkItem> finished;
        auto ack_all = [&] {
          WorkItem item;
          while (reader->TakeFinished(&item)) finished.push_back(item);
          for (const WorkItem& f : finished) reader->AckFinished(f);
          finished.clear();
        };
        Record record;
        int used = 0;
        for (;;) {
          ReadStatus status = reader->NextRecord(&record);
          if (status == ReadStatus::kHoldsFinished) {
            ack_all();
            continue;
          }
          if (status != ReadStatus::kOk) {
            ack_all();
            return status;
          }
          Emit(fd, record);
          WorkItem item;
          while (reader->TakeFinished(&item)) finished.push_back(item);
          if (++used % 100 == 0) ack_all();
        }
      },
      std::chrono::seconds(60));
  EXPECT_TRUE(EachOnce(ids)) << ids.size() << " records of " << kRecords;
}

}  // namespace
}  // namespace tailcut
