// straggler_bench: one epoch of P trainer processes, some of them k times
// slower, reading real files through tailcut's Reader with one strategy
// (static sharding, elastic queue, elastic queue with tail splitting).
// Prints a summary line; writes per-process and per-segment timings as CSV
// and everything as JSON. bench/straggler/run.py runs the sweep; results are
// in docs/straggler.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tools/trainer_sim/trainer_sim.h"

namespace {

namespace ts = tailcut::trainer_sim;

void Usage(FILE* out) {
  std::fprintf(
      out,
      "usage: straggler_bench [options]\n"
      "\n"
      "P trainer processes read one epoch of generated records through tailcut's\n"
      "Reader, spending --cost-us per record (times --slowdown on the last --slow\n"
      "ranks). Reports the makespan against the ideal (total work / sum of speeds),\n"
      "the idle time of the fast processes at the end, and checks that every\n"
      "record was trained on exactly once.\n"
      "\n"
      "  --strategy S        static | elastic | split (default split)\n"
      "                      static: rank r opens its own queue over files r, r+P, ...\n"
      "                      elastic: one shared queue, split_tail=false\n"
      "                      split: one shared queue, split_tail=true\n"
      "  --processes P       trainer processes (default 8)\n"
      "  --slow N            how many are slow, the last N ranks (default 1)\n"
      "  --slowdown K        how much slower (default 4)\n"
      "  --cost-us X         time per record of a fast process, microseconds (default 25)\n"
      "  --batch N           records per NextBatch and per sleep (default 64)\n"
      "  --slices N          work items per epoch, all ranks together (default 10 x P)\n"
      "  --epochs N          epochs (default 1)\n"
      "  --records N         records in the data set (default 200000)\n"
      "  --files N           data files (default 16)\n"
      "  --record-bytes N    bytes per record (default 64)\n"
      "  --format F          lines | tfrecord (default lines)\n"
      "  --data-dir PATH     data set, generated unless there (default /tmp/tailcut-straggler)\n"
      "  --chunk-kib N       Reader chunk (claim granularity) in KiB (default 4)\n"
      "  --min-split-kib N   WorkQueue min_split_bytes in KiB (default 4)\n"
      "  --prefetch N        Reader prefetch_items (default 0)\n"
      "  --seed N            shuffle seed of the shared queue (default 42)\n"
      "  --csv PATH          per-process rows: rank,slow,killed,start_s,end_s,records,...\n"
      "  --segments PATH     per-item rows: rank,epoch,item,begin,end,piece,records,t0_s,t1_s\n"
      "  --json PATH         summary, processes and segments as JSON\n"
      "  --help              this text\n");
}

[[noreturn]] void Bad(const std::string& what) {
  std::fprintf(stderr, "straggler_bench: %s (see --help)\n", what.c_str());
  std::exit(2);
}

void WriteCsv(const ts::RunResult& r, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) Bad("cannot write " + path);
  std::fprintf(
      f,
      "strategy,processes,slowdown,slices,rank,slow,killed,start_s,end_s,records,items,splits\n");
  for (const auto& p : r.procs)
    std::fprintf(
        f, "%s,%d,%g,%llu,%d,%d,%d,%.6f,%.6f,%llu,%llu,%llu\n", ts::StrategyName(r.config.strategy),
        r.config.processes, r.config.slowdown, static_cast<unsigned long long>(r.config.slices),
        p.rank, p.slow, p.killed, p.start, p.end, static_cast<unsigned long long>(p.records),
        static_cast<unsigned long long>(p.items), static_cast<unsigned long long>(p.splits));
  std::fclose(f);
}

void WriteSegments(const ts::RunResult& r, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) Bad("cannot write " + path);
  std::fprintf(f, "rank,epoch,item,begin,end,piece,records,t0_s,t1_s\n");
  for (const auto& s : r.segments)
    std::fprintf(f, "%d,%llu,%llu,%llu,%llu,%d,%llu,%.6f,%.6f\n", s.rank,
                 static_cast<unsigned long long>(s.epoch), static_cast<unsigned long long>(s.item),
                 static_cast<unsigned long long>(s.begin),
                 static_cast<unsigned long long>(s.end_orig), s.piece ? 1 : 0,
                 static_cast<unsigned long long>(s.records), s.t0, s.t1);
  std::fclose(f);
}

void WriteJson(const ts::RunResult& r, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) Bad("cannot write " + path);
  const auto& c = r.config;
  std::fprintf(
      f,
      "{\"strategy\":\"%s\",\"processes\":%d,\"slow\":%d,\"slowdown\":%g,\"cost_us\":%g,"
      "\"slices\":%llu,\"records\":%llu,\"epochs\":%llu,\"makespan_s\":%.6f,\"ideal_s\":%.6f,"
      "\"ratio\":%.6f,\"idle_fast_mean_s\":%.6f,\"idle_fast_max_s\":%.6f,\"splits\":%llu,"
      "\"pieces\":%llu,\"exactly_once\":%s,\"error\":\"%s\",\n\"procs\":[",
      ts::StrategyName(c.strategy), c.processes, c.slow, c.slowdown, c.cost_us,
      static_cast<unsigned long long>(c.slices), static_cast<unsigned long long>(c.records),
      static_cast<unsigned long long>(c.epochs), r.makespan, r.ideal, r.makespan / r.ideal,
      r.idle_fast_mean, r.idle_fast_max, static_cast<unsigned long long>(r.splits),
      static_cast<unsigned long long>(r.pieces), r.exactly_once ? "true" : "false",
      r.error.empty() ? "" : "trainer failed");
  for (size_t i = 0; i < r.procs.size(); ++i) {
    const auto& p = r.procs[i];
    std::fprintf(f,
                 "%s\n{\"rank\":%d,\"slow\":%s,\"killed\":%s,\"start_s\":%.6f,\"end_s\":%.6f,"
                 "\"records\":%llu,"
                 "\"items\":%llu,\"splits\":%llu}",
                 i ? "," : "", p.rank, p.slow ? "true" : "false", p.killed ? "true" : "false",
                 p.start, p.end, static_cast<unsigned long long>(p.records),
                 static_cast<unsigned long long>(p.items),
                 static_cast<unsigned long long>(p.splits));
  }
  std::fprintf(f, "],\n\"segments\":[");
  for (size_t i = 0; i < r.segments.size(); ++i) {
    const auto& s = r.segments[i];
    std::fprintf(f,
                 "%s\n{\"rank\":%d,\"epoch\":%llu,\"item\":%llu,\"begin\":%llu,\"piece\":%s,"
                 "\"records\":%llu,"
                 "\"t0_s\":%.6f,\"t1_s\":%.6f}",
                 i ? "," : "", s.rank, static_cast<unsigned long long>(s.epoch),
                 static_cast<unsigned long long>(s.item), static_cast<unsigned long long>(s.begin),
                 s.piece ? "true" : "false", static_cast<unsigned long long>(s.records), s.t0,
                 s.t1);
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  ts::RunConfig c;
  ts::DataSpec data;
  std::string strategy = "split", csv, segments, json;
  uint64_t chunk_kib = 4, split_kib = 4;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Bad(k + " needs a value");
      return argv[++i];
    };
    auto num = [&]() -> double {
      std::string v = value();
      char* e = nullptr;
      double d = std::strtod(v.c_str(), &e);
      if (e == v.c_str() || *e != '\0' || d < 0) Bad("bad value for " + k + ": " + v);
      return d;
    };
    if (k == "--help" || k == "-h") {
      Usage(stdout);
      return 0;
    } else if (k == "--strategy")
      strategy = value();
    else if (k == "--processes")
      c.processes = static_cast<int>(num());
    else if (k == "--slow")
      c.slow = static_cast<int>(num());
    else if (k == "--slowdown")
      c.slowdown = num();
    else if (k == "--cost-us")
      c.cost_us = num();
    else if (k == "--batch")
      c.batch = static_cast<uint32_t>(num());
    else if (k == "--slices")
      c.slices = static_cast<uint64_t>(num());
    else if (k == "--epochs")
      c.epochs = static_cast<uint64_t>(num());
    else if (k == "--records")
      data.records = static_cast<uint64_t>(num());
    else if (k == "--files")
      data.files = static_cast<uint32_t>(num());
    else if (k == "--record-bytes")
      data.record_bytes = static_cast<uint32_t>(num());
    else if (k == "--format")
      data.format = value();
    else if (k == "--data-dir")
      data.dir = value();
    else if (k == "--chunk-kib")
      chunk_kib = static_cast<uint64_t>(num());
    else if (k == "--min-split-kib")
      split_kib = static_cast<uint64_t>(num());
    else if (k == "--prefetch")
      c.prefetch_items = static_cast<uint32_t>(num());
    else if (k == "--seed")
      c.seed = static_cast<uint64_t>(num());
    else if (k == "--csv")
      csv = value();
    else if (k == "--segments")
      segments = value();
    else if (k == "--json")
      json = value();
    else
      Bad("unknown option " + k);
  }
  if (!ts::ParseStrategy(strategy, &c.strategy)) Bad("strategy must be static, elastic or split");
  if (c.processes < 1 || c.processes > 200 || c.slow < 0 || c.slow > c.processes ||
      c.slowdown < 1 || c.batch < 1 || c.epochs < 1 || chunk_kib < 4 || c.cost_us <= 0)
    Bad("bad option value");
  if (c.slices == 0) c.slices = 10ull * c.processes;
  c.chunk_bytes = chunk_kib << 10;
  c.min_split_bytes = split_kib << 10;
  c.buffer_bytes = std::max<uint64_t>(1 << 20, 8 * c.chunk_bytes);
  c.format = data.format;
  c.records = data.records;
  c.name = "straggler." + std::to_string(::getpid());
  try {
    c.paths = ts::EnsureData(data);
    ts::RunResult r = ts::Run(c);
    std::printf(
        "strategy=%s P=%d slow=%d k=%g slices=%llu makespan=%.3fs ideal=%.3fs ratio=%.3f "
        "idle_fast_mean=%.3fs idle_fast_max=%.3fs splits=%llu exactly_once=%s\n",
        ts::StrategyName(c.strategy), c.processes, c.slow, c.slowdown,
        static_cast<unsigned long long>(c.slices), r.makespan, r.ideal, r.makespan / r.ideal,
        r.idle_fast_mean, r.idle_fast_max, static_cast<unsigned long long>(r.splits),
        r.exactly_once ? "yes" : "NO");
    if (!r.error.empty()) std::fprintf(stderr, "straggler_bench: %s\n", r.error.c_str());
    if (!csv.empty()) WriteCsv(r, csv);
    if (!segments.empty()) WriteSegments(r, segments);
    if (!json.empty()) WriteJson(r, json);
    return r.exactly_once ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "straggler_bench: %s\n", e.what());
    return 1;
  }
}
