// tools/trainer_sim/trainer_sim.h: trainer processes with stragglers, for
// tailcut-demo (tools/demo_main.cc) and the straggler benchmark
// (bench/straggler/straggler.cc).
//
// A run forks P trainer processes. Each reads records through tailcut's
// Reader and "trains" by spending a fixed time per record (cost_us, times
// slowdown for the slow ranks): it sleeps once per batch until an absolute
// deadline that advances by n * cost, so timer slack does not accumulate and
// 8 sleeping processes fit on 2 cores. Three strategies:
//   kStatic:  rank r opens its OWN queue (name suffix .r) over its 1/P of the
//             files, shuffle off: it reads exactly its shard, like
//             DistributedSampler.
//   kElastic: one shared queue, split_tail = false.
//   kSplit:   one shared queue, split_tail = true.
//
// Every record carries its id (12 decimal digits at the start of the
// record). A trainer folds the ids of each finished (acked) item into a
// digest (count, sum and xor of a 64-bit mix) and sends it to the parent
// with the item's timing; the parent checks, per epoch, that the digests of
// all items add up to the digest of ids 0..N-1: every record exactly once,
// without storing any. Records of an item whose process was killed before it
// finished are not counted: the queue hands that item out again from its
// begin (docs/design.md, "what this promises").
//
// Not thread-safe; one Run at a time per parent process.
#ifndef TAILCUT_TOOLS_TRAINER_SIM_TRAINER_SIM_H_
#define TAILCUT_TOOLS_TRAINER_SIM_TRAINER_SIM_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tailcut::trainer_sim {

// The ids of a set of records, folded so that sets compare equal without
// storing them.
struct Digest {
  uint64_t count = 0, sum = 0, xr = 0;
  void Add(uint64_t id);
  void Merge(const Digest& o);
  bool operator==(const Digest&) const = default;
};

// The digest of ids 0..records-1: what the records of one epoch add up to.
Digest ExpectedDigest(uint64_t records);
// The id a record of EnsureData starts with (12 decimal digits);
// UINT64_MAX if it has none.
uint64_t RecordId(const void* data, size_t size);

// ---------------------------------------------------------------- data

struct DataSpec {
  std::string dir = "/tmp/tailcut-straggler";
  std::string format = "lines";  // "lines" or "tfrecord"
  uint64_t records = 200000;     // records in all files together
  uint32_t files = 16;
  uint32_t record_bytes = 64;  // lines: with '\n'; tfrecord: payload
};

// The files of spec in dir, generated unless a MANIFEST from an identical
// spec is there. Record i of the data set has id i; file f holds ids
// [f * N / F, (f + 1) * N / F). Throws std::runtime_error.
std::vector<std::string> EnsureData(const DataSpec& spec, bool* generated = nullptr);

// ---------------------------------------------------------------- runs

enum class Strategy { kStatic, kElastic, kSplit };

const char* StrategyName(Strategy s);
// False when name is none of "static", "elastic", "split".
bool ParseStrategy(const std::string& name, Strategy* s);

struct RunConfig {
  Strategy strategy = Strategy::kSplit;
  int processes = 8;
  int slow = 1;         // the last `slow` ranks are slow
  double slowdown = 4;  // k
  double cost_us = 25;  // per record, fast ranks
  uint32_t batch = 64;  // records per NextBatch (and per sleep)
  uint64_t slices = 0;  // 0: 10 x processes (all ranks together)
  uint64_t epochs = 1;
  uint64_t chunk_bytes = 4 << 10;
  uint64_t min_split_bytes = 4 << 10;
  uint64_t buffer_bytes = 1 << 20;
  uint32_t prefetch_items = 0;  // items a Reader takes ahead (hoarding hurts the tail)
  uint64_t seed = 42;
  std::string format = "lines";
  std::vector<std::string> paths;
  uint64_t records = 0;        // records per epoch, for the check and the ideal
  std::string name;            // queue name; unique per run
  double start_delay_s = 0.4;  // setup time before the common start
  bool quiet_notices = true;   // drop Reader notices (memory locking) in children
};

// Whether rank is one of the slow ones.
bool IsSlow(const RunConfig& c, int rank);
// The makespan with perfect balance: every record of every epoch spread over
// the processes in proportion to their speed.
double IdealSeconds(const RunConfig& c);

struct Segment {
  int rank;
  uint64_t epoch, item, begin, end_orig, records;
  bool piece;
  double t0, t1;  // seconds since the common start
};

struct ProcResult {
  int rank = 0;
  pid_t pid = 0;
  bool slow = false, killed = false, done = false, failed = false;
  double start = 0, end = 0;  // seconds since the common start (end: last work done)
  uint64_t records = 0;       // records of finished items
  uint64_t progress = 0;      // records trained on, as last reported
  uint64_t items = 0, splits = 0, recovered = 0;
};

struct RunResult {
  RunConfig config;
  std::vector<ProcResult> procs;
  std::vector<Segment> segments;
  std::vector<Digest> epoch_digests;
  Digest expected;
  double makespan = 0, ideal = 0;
  double idle_fast_mean = 0, idle_fast_max = 0;
  uint64_t splits = 0, recovered = 0, pieces = 0;
  bool exactly_once = false;
  std::string error;
};

// Live view for a caller: called about every tick_s with the partial result
// (procs[].progress, elapsed seconds). Returning a rank >= 0 kills it with
// SIGKILL (once per call).
using TickFn = std::function<int(const RunResult&, double elapsed)>;

// Forks the trainers, collects their messages, waits for all of them and
// computes the summary. Throws std::runtime_error on setup failures.
RunResult Run(const RunConfig& config, const TickFn& tick = nullptr, double tick_s = 1.0);

}  // namespace tailcut::trainer_sim

#endif  // TAILCUT_TOOLS_TRAINER_SIM_TRAINER_SIM_H_
