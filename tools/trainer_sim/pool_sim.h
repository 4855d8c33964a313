// tools/trainer_sim/pool_sim.h: synchronous trainers fed by loader
// processes, per trainer or pooled, for tailcut-demo (tools/demo_main.cc).
//
// A run forks L loader processes and T trainer processes over one WorkQueue
// of a data set from EnsureData (one epoch):
//   * A loader reads records with tailcut's Reader, one NextBatch at a time
//     (at most `batch` records of one item), spends cost_us per record
//     (times slowdown for the slow ones: decoding, augmenting), then copies
//     the records into a slot of a tailcut::BatchRing, each as a 4-byte
//     length and its bytes, and publishes it. The Reader acks an item only
//     on the call after its last records were published (docs/cpp.md,
//     ring_pipeline).
//   * A trainer pops a batch, and before every step all T trainers agree
//     that each has one (WorkQueue::AgreeStep, as DDP's allreduce makes
//     every rank wait for the slowest). The step reads each record's id in
//     the slot, in place, spends step_ms, and releases the slot. When one
//     trainer has no batch the epoch ends on all at the same step; the
//     batches they still hold or can still pop are released unused and
//     counted as left over.
// Two topologies, the same processes and costs:
//   per trainer (pooled = false): trainer t has its own ring, fed only by
//     its own loaders (loader l feeds trainer l % T), like a DataLoader per
//     rank. A loader stops when nothing is left to take now (it does not
//     wait for items others hold: under equal steps that wait can deadlock,
//     see tailcut.torch's _Source), and the last loader of a ring closes it.
//   pooled: one ring; every loader feeds every trainer. A loader stops when
//     every item is acked (Take's end), so every record is published.
// The check: the ids of the records trained on plus those left over must be
// the ids 0..N-1 of the data set, each once (Digest).
//
// Not thread-safe; one RunPool at a time per parent process.
#ifndef TAILCUT_TOOLS_TRAINER_SIM_POOL_SIM_H_
#define TAILCUT_TOOLS_TRAINER_SIM_POOL_SIM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/trainer_sim/trainer_sim.h"

namespace tailcut::trainer_sim {

struct PoolConfig {
  bool pooled = true;          // one ring for all trainers; false: one per trainer
  int trainers = 4;            // synchronous ranks, 1..64
  int loaders = 4;             // in all, a multiple of trainers when not pooled
  int slow = 1;                // the last `slow` loaders are slow
  double slowdown = 3;         // k
  double loader_cost_us = 20;  // per record, fast loaders
  double step_ms = 2;          // per training step
  uint32_t batch = 128;        // records per batch at most
  uint64_t slot_bytes = 0;     // must hold `batch` records plus 4 bytes each
  uint32_t slots = 16;         // ring slots in all (split over the rings when not pooled)
  uint64_t slices = 64;        // work items of the epoch
  uint64_t chunk_bytes = 1 << 20;
  uint64_t buffer_bytes = 4 << 20;
  uint64_t min_split_bytes = 64 << 10;
  uint64_t seed = 42;
  std::string format = "tfrecord";
  std::vector<std::string> paths;
  uint64_t records = 0;    // records in the data set, for the check
  std::string name;        // queue name, and the rings' prefix; unique per run
  double patience_s = 60;  // longest wait for a slot, a batch or the other ranks
};

// Whether loader l is one of the slow ones.
bool IsSlowLoader(const PoolConfig& c, int loader);
// The ring loader l publishes into.
int RingOfLoader(const PoolConfig& c, int loader);
// Seconds for the loaders to make every record with perfect balance: the
// records' cost spread over the loaders in proportion to their speed.
double LoaderBoundSeconds(const PoolConfig& c);

// What the run's processes have done so far, for a live view.
struct PoolProgress {
  std::vector<uint64_t> loader_batches;  // published, per loader
  uint64_t records_trained = 0;          // all trainers together
  uint64_t steps = 0;                    // steps every trainer has finished
};
using PoolTickFn = std::function<void(const PoolProgress&, double elapsed)>;

struct PoolResult {
  PoolConfig config;
  // The common start to the step at which the epoch ended on every trainer
  // (the last trainer's agreement that one has no batch).
  double epoch_s = 0;
  uint64_t steps = 0;             // per trainer (equal on all, or `error` says so)
  std::vector<double> waits;      // every trainer's wait before every step, seconds
  std::vector<double> step_ends;  // trainer 0: when each step ended, since the start
  std::vector<uint64_t> loader_batches, loader_records;
  uint64_t published = 0, released = 0;  // batches, all rings
  uint64_t leftover_batches = 0, leftover_records = 0;
  Digest trained, leftover, expected;
  bool exactly_once = false;  // trained + leftover == expected, and nothing failed
  std::string error;

  // The p-th percentile (0..100) of `waits`, seconds.
  double WaitPercentile(double p) const;
};

// Forks the loaders and trainers, starts them together once all have
// opened the queue and the rings, waits for them, and removes the queue and
// the rings. Throws std::runtime_error on setup failures.
PoolResult RunPool(const PoolConfig& config, const PoolTickFn& tick = nullptr, double tick_s = 0.1);

}  // namespace tailcut::trainer_sim

#endif  // TAILCUT_TOOLS_TRAINER_SIM_POOL_SIM_H_
