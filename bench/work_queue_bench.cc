// bench/work_queue_bench.cc: take+ack of the shared-memory work queue across
// processes, beside its floor and a conventional baseline.
//
// Every benchmark here is one process sweep (procs = 1, 2, 4, 8) with the
// same round structure:
//   * The benchmark process forks `procs` worker processes. Each prepares
//     (opens its own WorkQueue or message_queue; nothing is inherited but a
//     MAP_SHARED control block), reports ready, and spins until the start
//     signal. The parent waits until all are ready, lets them settle, takes
//     t0 and raises the start signal.
//   * Each worker does kOps/procs operations and stamps its finish time
//     (CLOCK_MONOTONIC) in the control block before it tears down.
//   * Round time = last finish - t0: the wall time for all kOps operations
//     of all processes. Setup, teardown and fork are outside it.
// One benchmark iteration is one round (manual time). The counter ns_per_op
// is round time / kOps, the host-wide cost of one operation: with one process
// it is the latency of one op, with more it is the inverse of the aggregate
// throughput. items_per_second is kOps / round time.
//
// The three families:
//   BM_Floor_FetchAdd        one std::atomic<uint64_t>::fetch_add (acq_rel) on
//                            one cache line of a MAP_SHARED anonymous mapping
//                            shared by all workers: the least any shared
//                            hand-out can cost.
//   BM_Tailcut_TakeAck       WorkQueue::Take + WorkQueue::Ack of one item, on a
//                            queue of 2^20 items (4 sparse 1 GiB files, 4 KiB
//                            slices, shuffled, 128 epochs) held open by one
//                            more idle process; recreated, outside the timing,
//                            before it could run dry. Each worker opens its
//                            own WorkQueue and does Take(deadline)+Ack in a
//                            loop; the round is checked afterwards (every op
//                            acked exactly one ticket, nothing in flight).
//   BM_Tailcut_TakeAck_1KItems  the same on 2^10 items (4 MiB slices, 2^16
//                            epochs): the item table stays in the L1 cache.
//                            A diagnostic: with 2^20 shuffled items each take
//                            reads its item's entry at a random place of a
//                            24 MiB table (a cache and TLB miss); here that
//                            miss is gone and the queue protocol remains.
//   BM_MessageQueue_Receive  boost::interprocess::message_queue: the parent
//                            fills it with kOps item ids (8 bytes each) before
//                            the round, then each op is one receive() of one
//                            id by a worker. The producer's sends are not
//                            timed and there is no ack: the cheapest hand-out
//                            a message queue offers, so the comparison
//                            favours the message queue.
//   BM_MessageQueue_ReceiveAck  the same plus, per op, one send() of the id
//                            into a second message_queue (sized for a whole
//                            round, so it never blocks): hand-out and a
//                            recorded completion, like take+ack. Still no
//                            recovery of a dead consumer's items.
//
// The machine may have fewer cores than processes; bench/engine_ratios.py
// runs the binary and prints medians and ratios (see docs/benchmarks.md).
//
// Fork rule: the parent never opens a WorkQueue (the library runs a holder
// thread and oneTBB, neither promised to survive fork); the queue holder and
// the workers are children that open their own and leave with _exit.

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/interprocess/ipc/message_queue.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"

namespace {

constexpr int kMaxProcs = 8;
constexpr size_t kCacheLine = 64;

// Operations per round, split evenly over the processes; sized so that one
// round takes tens of milliseconds or more at every process count.
constexpr uint64_t kFloorOps = uint64_t{1} << 23;
constexpr uint64_t kTailcutOps = uint64_t{1} << 21;
constexpr uint64_t kMessageQueueOps = uint64_t{1} << 20;

// The tailcut queues: 4 sparse files of 1 GiB, in 2^20 slices of 4 KiB (the
// headline) or in 2^10 slices of 4 MiB (the diagnostic); epochs enough for
// dozens of rounds before a queue is replaced.
constexpr int kNumFiles = 4;
constexpr uint64_t kFileBytes = uint64_t{1} << 30;

struct QueueShape {
  uint64_t num_slices;
  uint64_t num_epochs;
};
constexpr QueueShape kLargeQueue{uint64_t{1} << 20, 128};
constexpr QueueShape kSmallQueue{uint64_t{1} << 10, uint64_t{1} << 16};

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

void SleepMs(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

enum Go : uint32_t { kWait = 0, kRun = 1, kAbort = 2 };

// The control block all processes of a round share (MAP_SHARED, anonymous,
// created before any fork). Fields the workers write in the timed region sit
// on their own cache lines.
struct Control {
  alignas(kCacheLine) std::atomic<uint32_t> ready;  // workers done preparing
  alignas(kCacheLine) std::atomic<uint32_t> go;     // Go; release pairs with the workers' acquire
  alignas(kCacheLine) std::atomic<uint64_t> floor_counter;  // BM_Floor_FetchAdd's one line
  alignas(kCacheLine) std::atomic<uint64_t> finish_ns[kMaxProcs];
  alignas(kCacheLine) std::atomic<uint32_t> failed;  // first failure claims error
  char error[512];
  // The queue holder's handshake.
  alignas(kCacheLine) std::atomic<uint32_t> holder_state;  // 0 starting, 1 holding, 2 failed
  std::atomic<uint32_t> holder_release;
};

Control* control = nullptr;

void ReportFailure(const std::string& message) noexcept {
  uint32_t expected = 0;
  if (control->failed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::snprintf(control->error, sizeof control->error, "%s", message.c_str());
  }
}

// In a child right after fork: die with the parent (Ctrl-C of the bench).
void DieWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
}

// Worker side of the round protocol.
// Returns false when the round was aborted before it started.
bool ReadyAndWait() {
  // Release pairs with the parent's acquire load of ready.
  control->ready.fetch_add(1, std::memory_order_acq_rel);
  uint32_t go;
  // Acquire pairs with the parent's release store of kRun.
  while ((go = control->go.load(std::memory_order_acquire)) == kWait) sched_yield();
  return go == kRun;
}

// The worker's last timed act; the parent reads it after waitpid.
void MarkFinished(int index) {
  control->finish_ns[index].store(MonotonicNs(), std::memory_order_release);
}

// Runs one round: forks `procs` workers running body(index), which must call
// ReadyAndWait and MarkFinished. Returns the round's wall time in seconds, or
// throws std::runtime_error with the first worker's failure.
template <typename Body>
double RunRound(int procs, Body body) {
  control->ready.store(0);
  control->go.store(kWait);
  control->failed.store(0);
  control->error[0] = '\0';
  for (auto& f : control->finish_ns) f.store(0);

  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int i = 0; i < procs; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      control->go.store(kAbort);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      DieWithParent(parent);
      int status = 0;
      try {
        body(i);
      } catch (const std::exception& e) {
        ReportFailure("worker " + std::to_string(i) + ": " + e.what());
        status = 1;
      } catch (...) {
        ReportFailure("worker " + std::to_string(i) + ": unknown exception");
        status = 1;
      }
      _exit(status);  // never return into the benchmark framework
    }
    pids.push_back(pid);
  }

  // Wait, untimed, for every worker to be ready, or one to fail or die.
  std::vector<int> statuses(pids.size(), 0);
  std::vector<bool> reaped(pids.size(), false);
  bool died_early = false;
  const uint64_t give_up = MonotonicNs() + 120'000'000'000ull;
  // Acquire pairs with each worker's fetch_add of ready after its setup.
  while (control->ready.load(std::memory_order_acquire) < static_cast<uint32_t>(procs) &&
         control->failed.load(std::memory_order_acquire) == 0 && !died_early &&
         MonotonicNs() < give_up) {
    SleepMs(1);
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!reaped[i] && waitpid(pids[i], &statuses[i], WNOHANG) == pids[i]) {
        reaped[i] = true;
        died_early = true;
      }
    }
  }
  const bool started = control->failed.load() == 0 && !died_early &&
                       control->ready.load() == static_cast<uint32_t>(procs);
  uint64_t t0 = 0;
  if (started) {
    // Let helper threads of the setup (oneTBB workers after the parallel
    // stat in WorkQueue::Open) stop spinning before the clock starts.
    SleepMs(20);
    t0 = MonotonicNs();
    control->go.store(kRun, std::memory_order_release);
  } else {
    control->go.store(kAbort, std::memory_order_release);
  }

  bool clean = true;
  for (size_t i = 0; i < pids.size(); ++i) {
    while (!reaped[i] && waitpid(pids[i], &statuses[i], 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(statuses[i]) || WEXITSTATUS(statuses[i]) != 0) clean = false;
  }
  if (control->failed.load() != 0) throw std::runtime_error(control->error);
  if (!clean) throw std::runtime_error("a worker crashed (signal or unexpected exit)");
  if (!started) throw std::runtime_error("workers were not ready after 120 s");

  // waitpid ordered the workers' finish stamps before these loads.
  uint64_t t1 = 0;
  for (int i = 0; i < procs; ++i) t1 = std::max(t1, control->finish_ns[i].load());
  return static_cast<double>(t1 - t0) / 1e9;
}

// Shared reporting: one iteration per round of `ops` operations.
class RoundStats {
 public:
  RoundStats(benchmark::State& state, uint64_t ops) : state_(state), ops_(ops) {}
  void Add(double seconds) {
    state_.SetIterationTime(seconds);
    ns_per_op_sum_ += seconds * 1e9 / static_cast<double>(ops_);
  }
  void Finish() {
    const int procs = static_cast<int>(state_.range(0));
    state_.SetItemsProcessed(static_cast<int64_t>(state_.iterations() * ops_));
    state_.counters["ns_per_op"] =
        benchmark::Counter(ns_per_op_sum_, benchmark::Counter::kAvgIterations);
    state_.counters["procs"] = procs;
    state_.counters["ops_per_round"] = static_cast<double>(ops_);
  }

 private:
  benchmark::State& state_;
  uint64_t ops_;
  double ns_per_op_sum_ = 0;
};

uint64_t OpsPerProcess(uint64_t total, int procs) { return total / static_cast<uint64_t>(procs); }

// ---------------------------------------------------------------------------
// The floor: one shared fetch_add per op.

void BM_Floor_FetchAdd(benchmark::State& state) {
  const int procs = static_cast<int>(state.range(0));
  const uint64_t per_process = OpsPerProcess(kFloorOps, procs);
  RoundStats stats(state, per_process * procs);
  for (auto _ : state) {
    control->floor_counter.store(0);
    double seconds = 0;
    try {
      seconds = RunRound(procs, [&](int index) {
        if (!ReadyAndWait()) return;
        for (uint64_t n = 0; n < per_process; ++n) {
          // acq_rel: what a ticket counter needs; one lock xadd on x86 like relaxed.
          control->floor_counter.fetch_add(1, std::memory_order_acq_rel);
        }
        MarkFinished(index);
      });
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    if (control->floor_counter.load() != per_process * procs) {
      state.SkipWithError("floor counter lost increments");
      break;
    }
    stats.Add(seconds);
  }
  stats.Finish();
}

// ---------------------------------------------------------------------------
// tailcut: Take + Ack.

// Sparse work files, made once per run and removed at exit.
class WorkFiles {
 public:
  WorkFiles() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/tailcut_bench.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    dir_ = pattern;
    for (int i = 0; i < kNumFiles; ++i) {
      std::string path = dir_ + "/part-" + std::to_string(i);
      const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(kFileBytes)) != 0) {
        throw std::runtime_error("create sparse file " + path + ": " + std::strerror(errno));
      }
      close(fd);
      paths_.push_back(std::move(path));
    }
  }
  ~WorkFiles() {
    for (const std::string& path : paths_) unlink(path.c_str());
    rmdir(dir_.c_str());
  }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::string dir_;
  std::vector<std::string> paths_;
};

WorkFiles& Files() {
  static WorkFiles files;  // destroyed by the parent at exit, never by a child (_exit)
  return files;
}

tailcut::WorkQueueOptions BenchQueueOptions(const std::string& name, QueueShape shape) {
  tailcut::WorkQueueOptions options;
  options.name = name;
  options.works = Files().paths();
  options.num_slices = shape.num_slices;
  options.num_epochs = shape.num_epochs;
  options.shuffle = true;
  options.seed = 12345;
  options.num_clients = 1;
  options.on_notice = [](const std::string&) {};
  return options;
}

// A child process that creates the queue and holds it open (idle) until
// released, so the segment outlives the rounds' workers.
class QueueHolder {
 public:
  QueueHolder(std::string name, QueueShape shape) : name_(std::move(name)) {
    control->holder_state.store(0);
    control->holder_release.store(0);
    control->failed.store(0);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) {
      DieWithParent(parent);
      int status = 0;
      try {
        auto queue = tailcut::WorkQueue::Open(BenchQueueOptions(name_, shape));
        control->holder_state.store(1, std::memory_order_release);
        while (control->holder_release.load(std::memory_order_acquire) == 0) SleepMs(5);
        queue->Close();
      } catch (const std::exception& e) {
        ReportFailure("queue holder: " + std::string(e.what()));
        control->holder_state.store(2, std::memory_order_release);
        status = 1;
      }
      _exit(status);
    }
    while (control->holder_state.load(std::memory_order_acquire) == 0) SleepMs(1);
    if (control->holder_state.load() != 1) {
      const std::string message = control->error;
      Stop();
      throw std::runtime_error(message);
    }
  }
  ~QueueHolder() { Stop(); }
  const std::string& name() const { return name_; }

 private:
  void Stop() noexcept {
    if (pid_ <= 0) return;
    control->holder_release.store(1, std::memory_order_release);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    // The queue is not finished, so its last client left the segment in
    // place; a benchmark queue is never resumed.
    try {
      tailcut::RemoveQueue(name_, /*force=*/true);
    } catch (const std::exception&) {
    }
  }

  std::string name_;
  pid_t pid_ = -1;
};

void TailcutRounds(benchmark::State& state, QueueShape shape) {
  const int procs = static_cast<int>(state.range(0));
  const uint64_t per_process = OpsPerProcess(kTailcutOps, procs);
  const uint64_t round_ops = per_process * procs;
  RoundStats stats(state, round_ops);

  static int generation = 0;
  auto new_holder = [&] {
    return std::make_unique<QueueHolder>(
        "tailcut_bench_" + std::to_string(getpid()) + "_" + std::to_string(generation++), shape);
  };
  std::unique_ptr<QueueHolder> holder;
  try {
    Files();  // made here, in the parent, so that exit removes them
    holder = new_holder();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }

  for (auto _ : state) {
    double seconds = 0;
    try {
      // Untimed: a fresh queue when this one could run dry in this round.
      tailcut::QueueStats before = tailcut::InspectQueue(holder->name());
      if (before.total - before.handed_out < round_ops + shape.num_slices) {
        holder.reset();
        holder = new_holder();
        before = tailcut::InspectQueue(holder->name());
      }
      const std::string name = holder->name();
      seconds = RunRound(procs, [&](int index) {
        auto queue = tailcut::WorkQueue::Open(BenchQueueOptions(name, shape));
        if (!ReadyAndWait()) return;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        tailcut::WorkItem item;
        for (uint64_t n = 0; n < per_process; ++n) {
          if (queue->Take(&item, deadline) != tailcut::TakeStatus::kOk) {
            throw std::runtime_error("Take found no item after " + std::to_string(n));
          }
          if (queue->Ack(item) != tailcut::ItemStatus::kOk) {
            throw std::runtime_error("Ack refused after " + std::to_string(n));
          }
        }
        MarkFinished(index);
        queue->Close();
      });
      // Untimed check: every op acked exactly one ticket.
      const tailcut::QueueStats after = tailcut::InspectQueue(name);
      if (after.done - before.done != round_ops || after.in_flight != 0) {
        throw std::runtime_error(
            "queue counters after the round: " + std::to_string(after.done - before.done) +
            " acked, want " + std::to_string(round_ops) + "; in flight " +
            std::to_string(after.in_flight));
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    stats.Add(seconds);
  }
  stats.Finish();
}

void BM_Tailcut_TakeAck(benchmark::State& state) { TailcutRounds(state, kLargeQueue); }
void BM_Tailcut_TakeAck_1KItems(benchmark::State& state) { TailcutRounds(state, kSmallQueue); }

// ---------------------------------------------------------------------------
// boost::interprocess::message_queue: receive of pre-filled item ids, and
// optionally an ack message per item into a second queue.

namespace bip = boost::interprocess;

void MessageQueueRounds(benchmark::State& state, bool ack) {
  const int procs = static_cast<int>(state.range(0));
  const uint64_t per_process = OpsPerProcess(kMessageQueueOps, procs);
  const uint64_t round_ops = per_process * procs;
  RoundStats stats(state, round_ops);

  const std::string name = "tailcut_bench_mq_" + std::to_string(getpid());
  const std::string done_name = name + "_done";
  bip::message_queue::remove(name.c_str());
  bip::message_queue::remove(done_name.c_str());
  std::unique_ptr<bip::message_queue> queue;
  std::unique_ptr<bip::message_queue> done;
  try {
    queue = std::make_unique<bip::message_queue>(bip::create_only, name.c_str(), round_ops,
                                                 sizeof(uint64_t));
    if (ack) {
      // Room for every ack of a round: a send never blocks on a full queue.
      done = std::make_unique<bip::message_queue>(bip::create_only, done_name.c_str(), round_ops,
                                                  sizeof(uint64_t));
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    bip::message_queue::remove(name.c_str());
    return;
  }

  std::vector<uint8_t> seen(round_ops);
  for (auto _ : state) {
    // Untimed: the producer's side.
    for (uint64_t id = 0; id < round_ops; ++id) queue->send(&id, sizeof id, 0);
    double seconds = 0;
    try {
      seconds = RunRound(procs, [&](int index) {
        bip::message_queue mine(bip::open_only, name.c_str());
        std::unique_ptr<bip::message_queue> acks;
        if (ack) acks = std::make_unique<bip::message_queue>(bip::open_only, done_name.c_str());
        if (!ReadyAndWait()) return;
        uint64_t id = 0;
        bip::message_queue::size_type received = 0;
        unsigned int priority = 0;
        for (uint64_t n = 0; n < per_process; ++n) {
          mine.receive(&id, sizeof id, received, priority);
          if (received != sizeof id || id >= round_ops) throw std::runtime_error("bad message");
          if (ack) acks->send(&id, sizeof id, 0);
        }
        MarkFinished(index);
      });
      if (queue->get_num_msg() != 0) throw std::runtime_error("message queue not drained");
      if (ack) {
        // Untimed check: every id acked exactly once.
        std::fill(seen.begin(), seen.end(), 0);
        uint64_t id = 0;
        bip::message_queue::size_type received = 0;
        unsigned int priority = 0;
        for (uint64_t n = 0; n < round_ops; ++n) {
          if (!done->try_receive(&id, sizeof id, received, priority) || id >= round_ops ||
              seen[id]++ != 0) {
            throw std::runtime_error("acks: missing or repeated id");
          }
        }
        if (done->get_num_msg() != 0) throw std::runtime_error("more acks than items");
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    stats.Add(seconds);
  }
  stats.Finish();
  queue.reset();
  done.reset();
  bip::message_queue::remove(name.c_str());
  bip::message_queue::remove(done_name.c_str());
}

void BM_MessageQueue_Receive(benchmark::State& state) { MessageQueueRounds(state, false); }
void BM_MessageQueue_ReceiveAck(benchmark::State& state) { MessageQueueRounds(state, true); }

void ProcessSweep(benchmark::internal::Benchmark* b) {
  b->ArgName("procs");
  for (int procs = 1; procs <= kMaxProcs; procs *= 2) b->Arg(procs);
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Floor_FetchAdd)->Apply(ProcessSweep);
BENCHMARK(BM_Tailcut_TakeAck)->Apply(ProcessSweep);
BENCHMARK(BM_Tailcut_TakeAck_1KItems)->Apply(ProcessSweep);
BENCHMARK(BM_MessageQueue_Receive)->Apply(ProcessSweep);
BENCHMARK(BM_MessageQueue_ReceiveAck)->Apply(ProcessSweep);

}  // namespace

int main(int argc, char** argv) {
  void* block =
      mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED) {
    std::perror("work_queue_bench: mmap");
    return 1;
  }
  control = new (block) Control();
  benchmark::AddCustomContext("round",
                              "one iteration = one round of ops_per_round operations by all "
                              "procs; time = wall time of the round; ns_per_op = time / ops");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
