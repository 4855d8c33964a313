// tools/trainer_sim/pool_sim.cc: see pool_sim.h.
//
// The parent and its children share one anonymous MAP_SHARED mapping made
// before the fork (nothing in /dev/shm): a start barrier, live counters and
// each child's results, written before it exits and read by the parent
// after waitpid.
#include "tools/trainer_sim/pool_sim.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tailcut/error.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace tailcut::trainer_sim {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTrainers = 64;
constexpr int kMaxLoaders = 256;

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

void SleepUntilNs(double ns) {
  std::this_thread::sleep_until(
      Clock::time_point(std::chrono::nanoseconds(static_cast<uint64_t>(ns))));
}

struct alignas(64) LoaderCell {
  std::atomic<uint64_t> batches{0}, records{0};  // published so far (live view)
  char error[192] = {};
};

struct alignas(64) TrainerCell {
  std::atomic<uint64_t> steps{0}, records{0};  // trained on so far (live view)
  uint64_t end_ns = 0;                         // when equal steps ended the epoch here
  uint64_t released = 0, leftover_batches = 0, leftover_records = 0;
  Digest trained, leftover;
  char error[192] = {};
};

struct StepSample {
  float wait_s;  // from the end of the previous step to the agreement on this one
  float end_s;   // when this step ended, since the start
};

struct Shared {
  std::atomic<uint32_t> ready{0};     // children that opened everything
  std::atomic<uint64_t> start_ns{0};  // set by the parent once all are ready
  std::atomic<uint32_t> abort{0};     // set by the parent when a child failed first
  std::atomic<uint32_t> loaders_left[kMaxTrainers] = {};  // per ring: the last one closes it
  LoaderCell loaders[kMaxLoaders];
  TrainerCell trainers[kMaxTrainers];
  // StepSample[trainers][cap] follow.
};

WorkQueueOptions QueueOptionsFor(const PoolConfig& c) {
  WorkQueueOptions o;
  o.works = c.paths;
  o.num_epochs = 1;
  o.num_slices = c.slices;
  // Trainers join too: AgreeStep is the queue's.
  o.num_clients = static_cast<uint32_t>(c.loaders + c.trainers);
  o.format = RecordFormat::Parse(c.format).Tag();
  o.split_tail = true;
  o.min_split_bytes = c.min_split_bytes;
  o.seed = c.seed;
  o.name = c.name;
  o.on_notice = [](const std::string&) {};
  return o;
}

BatchRingOptions RingOptionsFor(const PoolConfig& c, int ring) {
  BatchRingOptions o;
  o.name = c.pooled ? c.name + ".pool" : c.name + ".rank" + std::to_string(ring);
  o.slot_bytes = c.slot_bytes;
  // The same memory in all: a per-trainer ring gets its share of the slots.
  o.num_slots = c.pooled ? c.slots : std::max<uint32_t>(2, c.slots / c.trainers);
  o.max_clients = static_cast<uint32_t>(c.loaders + c.trainers);
  o.cuda_register = false;  // nothing here copies to a GPU
  o.on_notice = [](const std::string&) {};
  return o;
}

// Registers a ready child and sleeps until the common start; returns it.
uint64_t AwaitStart(Shared* sh) {
  sh->ready.fetch_add(1, std::memory_order_release);  // pairs with the parent's acquire load
  for (;;) {
    uint64_t start = sh->start_ns.load(std::memory_order_acquire);
    if (start != 0) {
      SleepUntilNs(static_cast<double>(start));
      return start;
    }
    if (sh->abort.load(std::memory_order_relaxed)) std::_Exit(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

[[noreturn]] void Fail(char (&error)[192], const char* who, int index, const std::string& what) {
  std::snprintf(error, sizeof(error), "%s", what.c_str());
  std::fprintf(stderr, "%s %d (pid %d): %s\n", who, index, static_cast<int>(::getpid()),
               what.c_str());
  std::_Exit(1);
}

// Adds the ids of a batch's records, read in the slot itself, to *d; returns
// how many. Throws on a batch that is not what a loader packs.
uint64_t AddIds(const ReadyBatch& b, Digest* d) {
  const std::byte* p = b.data.data();
  const size_t size = b.data.size();
  uint64_t n = 0;
  for (size_t at = 0; at < size; ++n) {
    uint32_t len;
    if (size - at < 4) throw std::runtime_error("batch ends inside a record length");
    std::memcpy(&len, p + at, 4);
    at += 4;
    if (len > size - at) throw std::runtime_error("record runs past the end of its batch");
    uint64_t id = RecordId(p + at, len);
    if (id == UINT64_MAX) throw std::runtime_error("record without id");
    d->Add(id);
    at += len;
  }
  if (n != b.records)
    throw std::runtime_error("batch says " + std::to_string(b.records) + " records, holds " +
                             std::to_string(n));
  return n;
}

[[noreturn]] void LoaderMain(const PoolConfig& c, Shared* sh, int l) {
  LoaderCell& me = sh->loaders[l];
  try {
    auto queue = WorkQueue::Open(QueueOptionsFor(c));
    ReaderOptions ro;
    ro.format = RecordFormat::Parse(c.format);
    ro.chunk_bytes = c.chunk_bytes;
    ro.buffer_budget_bytes = c.buffer_bytes;
    ro.prefetch_items = 0;  // an item held ahead is one another loader cannot take
    ro.cuda_register = false;
    ro.on_notice = [](const std::string&) {};
    auto reader = Reader::Open(*queue, ro);
    const int ring_index = RingOfLoader(c, l);
    auto ring = BatchRing::Open(RingOptionsFor(c, ring_index), RingRole::kLoader);
    const auto patience =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.patience_s));
    const double cost_ns = c.loader_cost_us * 1000.0 * (IsSlowLoader(c, l) ? c.slowdown : 1.0);
    const uint64_t start = AwaitStart(sh);

    std::vector<Record> records(c.batch);
    size_t n = 0;
    ReadStatus st;
    // `target` is when the work so far is done: the records' cost plus the
    // time spent waiting for records or a slot, so that a late wake-up from
    // one sleep shortens the next instead of adding up.
    double target = static_cast<double>(start);
    uint64_t t = NowNs();
    // A pooled loader waits for items other loaders hold (they come back if
    // those die); a per-trainer loader stops when nothing is left to take now.
    while ((st = reader->NextBatch(records.data(), records.size(), &n,
                                   c.pooled ? Deadline::max() : Clock::now())) == ReadStatus::kOk) {
      target += static_cast<double>(NowNs() - t) + cost_ns * static_cast<double>(n);
      SleepUntilNs(target);  // decoding, augmenting: the loader's work on the batch
      t = NowNs();
      WritableBatch slot;
      RingStatus rs = ring->AcquireSlot(&slot, Clock::now() + patience);
      if (rs != RingStatus::kOk)
        throw std::runtime_error(std::string("no free slot (") + RingStatusName(rs) +
                                 "): are the trainers running?");
      size_t used = 0;
      for (size_t i = 0; i < n; ++i) {
        uint32_t size = static_cast<uint32_t>(records[i].size);
        if (slot.data.size() - used < 4 + static_cast<size_t>(size)) {
          ring->Abandon(slot.token);
          throw std::runtime_error("a batch does not fit a slot of " +
                                   std::to_string(slot.data.size()) + " bytes");
        }
        std::memcpy(slot.data.data() + used, &size, 4);
        std::memcpy(slot.data.data() + used + 4, records[i].data, size);
        used += 4 + size;
      }
      rs = ring->Publish(slot.token, reader->current_item().epoch, n, used);
      if (rs != RingStatus::kOk) {
        ring->Abandon(slot.token);
        throw std::runtime_error(std::string("publish: ") + RingStatusName(rs));
      }
      me.batches.fetch_add(1, std::memory_order_relaxed);
      me.records.fetch_add(n, std::memory_order_relaxed);
      uint64_t now = NowNs();
      target += static_cast<double>(now - t);
      t = now;
    }
    if (st == ReadStatus::kError) throw std::runtime_error(reader->error());
    // kEnd, or kEmpty with no item held: every record this loader read is in
    // a published batch.
    reader.reset();
    // acq_rel: the last one's Close comes after every other loader's publishes.
    if (sh->loaders_left[ring_index].fetch_sub(1, std::memory_order_acq_rel) == 1) ring->Close();
    ring.reset();
    queue->Close();
    std::_Exit(0);
  } catch (const std::exception& e) {
    Fail(me.error, "loader", l, e.what());
  }
}

[[noreturn]] void TrainerMain(const PoolConfig& c, Shared* sh, int rank, StepSample* samples,
                              uint64_t cap) {
  TrainerCell& me = sh->trainers[rank];
  try {
    auto queue = WorkQueue::Open(QueueOptionsFor(c));
    auto ring = BatchRing::Open(RingOptionsFor(c, c.pooled ? 0 : rank), RingRole::kTrainer);
    const auto patience =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.patience_s));
    const double step_ns = c.step_ms * 1e6;
    const uint64_t start = AwaitStart(sh);

    auto left_over = [&](const ReadyBatch& b) {
      me.leftover_records += AddIds(b, &me.leftover);
      ++me.leftover_batches;
      if (ring->Release(b.token) != RingStatus::kOk) throw std::runtime_error("release refused");
      ++me.released;
    };
    ReadyBatch batch;
    uint64_t step = 0, ready = start;
    for (;;) {
      RingStatus rs = ring->Pop(BatchRing::kAllEpochs, &batch, Clock::now() + patience);
      if (rs != RingStatus::kOk && rs != RingStatus::kEnd)
        throw std::runtime_error(std::string("pop: ") + RingStatusName(rs) +
                                 " (no batch from the loaders)");
      const bool has_batch = rs == RingStatus::kOk;
      StepStatus agreed =
          queue->AgreeStep(static_cast<uint32_t>(rank), static_cast<uint32_t>(c.trainers), step,
                           has_batch, Clock::now() + patience);
      const uint64_t now = NowNs();
      if (agreed == StepStatus::kEndEpoch) {
        me.end_ns = now;
        if (has_batch) left_over(batch);
        break;
      }
      if (agreed != StepStatus::kAllHaveBatch)
        throw std::runtime_error("the other trainers did not arrive at step " +
                                 std::to_string(step));
      // The step uses the batch in place: its records' ids, then the compute.
      uint64_t n = AddIds(batch, &me.trained);
      SleepUntilNs(static_cast<double>(now) + step_ns);
      if (ring->Release(batch.token) != RingStatus::kOk)
        throw std::runtime_error("release refused");
      ++me.released;
      const uint64_t done = NowNs();
      if (step < cap)
        samples[step] = {static_cast<float>(static_cast<double>(now - ready) / 1e9),
                         static_cast<float>(static_cast<double>(done - start) / 1e9)};
      ready = done;
      ++step;
      me.records.fetch_add(n, std::memory_order_relaxed);
      me.steps.store(step, std::memory_order_relaxed);
    }
    // What the ring still gets is left over too: the loaders publish every
    // record they read before they end it.
    RingStatus rs;
    while ((rs = ring->Pop(BatchRing::kAllEpochs, &batch, Clock::now() + patience)) ==
           RingStatus::kOk)
      left_over(batch);
    if (rs != RingStatus::kEnd)
      throw std::runtime_error(std::string("pop after the epoch: ") + RingStatusName(rs));
    ring.reset();
    queue->Close();
    std::_Exit(0);
  } catch (const std::exception& e) {
    Fail(me.error, "trainer", rank, e.what());
  }
}

}  // namespace

bool IsSlowLoader(const PoolConfig& c, int loader) { return loader >= c.loaders - c.slow; }

int RingOfLoader(const PoolConfig& c, int loader) { return c.pooled ? 0 : loader % c.trainers; }

double LoaderBoundSeconds(const PoolConfig& c) {
  double speed = (c.loaders - c.slow) + c.slow / c.slowdown;  // fast loaders' worth
  return static_cast<double>(c.records) * c.loader_cost_us / 1e6 / speed;
}

double PoolResult::WaitPercentile(double p) const {
  if (waits.empty()) return 0;
  std::vector<double> w = waits;
  std::sort(w.begin(), w.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(w.size())));
  return w[std::clamp<size_t>(rank, 1, w.size()) - 1];
}

PoolResult RunPool(const PoolConfig& config, const PoolTickFn& tick, double tick_s) {
  const PoolConfig& c = config;
  if (c.trainers < 1 || c.trainers > kMaxTrainers || c.loaders < 1 || c.loaders > kMaxLoaders ||
      (!c.pooled && c.loaders % c.trainers != 0) || c.slow < 0 || c.slow > c.loaders ||
      c.slowdown < 1 || c.batch < 1 || c.slots < 2 || c.records == 0 || c.paths.empty() ||
      c.slot_bytes < 4 + 16)
    throw std::runtime_error(
        "pool run: bad configuration (1-64 trainers, 1-256 loaders, a multiple of the trainers "
        "when per trainer)");
  PoolResult r;
  r.config = c;
  r.expected = ExpectedDigest(c.records);
  // A step takes a record from every trainer, so none makes more than this.
  const uint64_t cap = c.records / static_cast<uint64_t>(c.trainers) + 1;
  const size_t bytes = sizeof(Shared) + c.trainers * cap * sizeof(StepSample);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("pool run: cannot map its shared results");
  Shared* sh = new (mem) Shared();
  auto* samples = reinterpret_cast<StepSample*>(static_cast<char*>(mem) + sizeof(Shared));
  const int rings = c.pooled ? 1 : c.trainers;
  for (int i = 0; i < rings; ++i) sh->loaders_left[i] = c.loaders / rings;

  // Children: loaders 0..L-1, then trainers.
  const int total = c.loaders + c.trainers;
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int i = 0; i < total; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      ::munmap(mem, bytes);
      throw std::runtime_error("pool run: fork failed");
    }
    if (pid == 0) {
      if (i < c.loaders) LoaderMain(c, sh, i);
      int rank = i - c.loaders;
      TrainerMain(c, sh, rank, samples + rank * cap, cap);
    }
    pids.push_back(pid);
  }

  std::vector<bool> exited(total, false);
  int running = total;
  bool killed = false;
  uint64_t start = 0, next_tick = 0;
  auto progress = [&]() {
    PoolProgress p;
    p.steps = UINT64_MAX;
    for (int l = 0; l < c.loaders; ++l)
      p.loader_batches.push_back(sh->loaders[l].batches.load(std::memory_order_relaxed));
    for (int t = 0; t < c.trainers; ++t) {
      p.records_trained += sh->trainers[t].records.load(std::memory_order_relaxed);
      p.steps = std::min(p.steps, sh->trainers[t].steps.load(std::memory_order_relaxed));
    }
    return p;
  };
  while (running > 0) {
    for (int i = 0; i < total; ++i) {
      int status;
      if (exited[i] || ::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      exited[i] = true;
      --running;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !killed) {
        // One failed: the others would wait for it until their patience ran
        // out. Stop them now; the error is the first one's.
        std::string who = i < c.loaders ? "loader " + std::to_string(i)
                                        : "trainer " + std::to_string(i - c.loaders);
        const char* text = i < c.loaders ? sh->loaders[i].error : sh->trainers[i - c.loaders].error;
        r.error = who + ": " +
                  (text[0] ? std::string(text) : "exited with status " + std::to_string(status));
        sh->abort.store(1, std::memory_order_relaxed);
        for (int j = 0; j < total; ++j)
          if (!exited[j]) ::kill(pids[j], SIGKILL);
        killed = true;
      }
    }
    uint64_t now = NowNs();
    if (start == 0 && !killed &&
        sh->ready.load(std::memory_order_acquire) == static_cast<uint32_t>(total)) {
      start = now + 20'000'000;  // time for every child to see it
      sh->start_ns.store(start, std::memory_order_release);
      next_tick = start;
    }
    if (tick && start != 0 && now >= next_tick && running > 0) {
      tick(progress(), (static_cast<double>(now) - static_cast<double>(start)) / 1e9);
      next_tick = now + static_cast<uint64_t>(tick_s * 1e9);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // Every child is gone: their segments went with the last of them, unless
  // one failed. Remove what is left.
  for (int i = 0; i < rings; ++i) try {
      RemoveBatchRing(RingOptionsFor(c, i).name);
    } catch (const Error&) {
    }
  try {
    RemoveQueue(c.name, true);
  } catch (const Error&) {  // kNotFound: removed by its last process, as it should be
  }

  for (int l = 0; l < c.loaders; ++l) {
    r.loader_batches.push_back(sh->loaders[l].batches.load());
    r.loader_records.push_back(sh->loaders[l].records.load());
    r.published += r.loader_batches.back();
  }
  uint64_t end = start;
  r.steps = sh->trainers[0].steps.load();
  for (int t = 0; t < c.trainers; ++t) {
    const TrainerCell& tc = sh->trainers[t];
    r.trained.Merge(tc.trained);
    r.leftover.Merge(tc.leftover);
    r.leftover_batches += tc.leftover_batches;
    r.leftover_records += tc.leftover_records;
    r.released += tc.released;
    end = std::max(end, tc.end_ns);
    if (tc.steps.load() != r.steps && r.error.empty())
      r.error = "trainers ran different numbers of steps (" + std::to_string(r.steps) + ", " +
                std::to_string(tc.steps.load()) + ")";
    const uint64_t n = std::min(tc.steps.load(), cap);
    for (uint64_t s = 0; s < n; ++s) {
      r.waits.push_back(samples[t * cap + s].wait_s);
      if (t == 0) r.step_ends.push_back(samples[s].end_s);
    }
  }
  if (start != 0) r.epoch_s = static_cast<double>(end - start) / 1e9;
  Digest all = r.trained;
  all.Merge(r.leftover);
  r.exactly_once = r.error.empty() && all == r.expected && r.published == r.released;
  sh->~Shared();
  ::munmap(mem, bytes);
  return r;
}

}  // namespace tailcut::trainer_sim
