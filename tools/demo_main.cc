// tailcut-demo: the long tail, and tailcut removing it.
//
// Generates a data set (reused when already there), then runs one epoch
// set twice with P local trainer processes, one of them k times slower:
// first with static sharding (each process reads its fixed 1/P, like
// DistributedSampler), then with one tailcut queue (elastic + tail
// splitting), killing one process with SIGKILL part-way. Shows live
// progress, then the makespan of each against the ideal, the exactly-once
// check of every record of every epoch, the recovery of the killed
// process's items, and a timeline plot. The trainer processes, data set and
// checks are tools/trainer_sim, shared with the straggler benchmark.
//
// Then pooled loaders: T synchronous trainers (every step waits until all
// have a batch, as under DDP) fed by L loader processes, one of them slower,
// first per trainer (each trainer's own loaders, like a DataLoader per rank),
// then as one pool feeding every trainer through one tailcut::BatchRing.
// Shows the epoch time and the step waits of each, the exactly-once check of
// the records (trained on, or left over when equal steps end the epoch) and
// a second plot (tools/trainer_sim/pool_sim.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "tools/trainer_sim/pool_sim.h"
#include "tools/trainer_sim/trainer_sim.h"

namespace {

namespace ts = tailcut::trainer_sim;

struct Args {
  ts::DataSpec data;
  ts::RunConfig run;
  bool kill_one = true;
  std::string plot;  // default: <dir>/tailcut-demo.png
  // Pooled loaders (pooled, name and paths are set per run).
  ts::PoolConfig pool;
  int loaders_per_trainer = 1;
  bool run_pool = true;
  std::string pool_plot;  // the timeline's path with -pool before .png
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: tailcut-demo [options]\n"
               "\n"
               "Starts trainer processes, one of them slower, that read a generated data set\n"
               "with static sharding and then with one tailcut queue (elastic + tail\n"
               "splitting, one process killed with SIGKILL part-way); prints the makespans\n"
               "against the ideal and checks that every record of every epoch was trained\n"
               "on exactly once.\n"
               "\n"
               "  --processes N     trainer processes (default 8)\n"
               "  --slow N          how many of them are slow (default 1)\n"
               "  --slowdown K      how much slower (default 4)\n"
               "  --epochs N        epochs (default 2)\n"
               "  --records N       records in the data set (default 262144)\n"
               "  --record-bytes N  bytes per record (default 1024: 256 MiB in all)\n"
               "  --files N         data files (default 16)\n"
               "  --format F        tfrecord | lines (default tfrecord)\n"
               "  --cost-us X       training time per record of a fast process (default 40)\n"
               "  --slices N        work items per epoch (default 10 x processes)\n"
               "  --no-kill         do not kill a process part-way\n"
               "  --dir PATH        data set directory (default /tmp/tailcut-demo)\n"
               "  --plot PATH       timeline PNG (default <dir>/tailcut-demo.png)\n"
               "\n"
               "Then synchronous trainers (all must have a batch before each step, as under\n"
               "DDP) fed by loader processes, one of them slower: per trainer, then as one\n"
               "pool through one tailcut::BatchRing. Same data set, one epoch.\n"
               "\n"
               "  --sync-trainers N        synchronous trainers (default 4)\n"
               "  --loaders-per-trainer N  loader processes per trainer (default 1)\n"
               "  --loader-slowdown K      how much slower the last loader is (default 3)\n"
               "  --loader-cost-us X       a fast loader's time per record (default 20)\n"
               "  --step-ms X              a training step's time (default 2)\n"
               "  --pool-batch N           records per batch at most (default 128)\n"
               "  --no-pool                skip the pooled loaders\n"
               "  --help                   this text\n");
}

bool ParseArgs(int argc, char** argv, Args* a) {
  a->data.dir = "/tmp/tailcut-demo";
  a->data.format = "tfrecord";
  a->data.records = 262144;
  a->data.record_bytes = 1024;
  a->data.files = 16;
  a->run.epochs = 2;
  a->run.cost_us = 40;
  a->run.batch = 64;
  a->run.chunk_bytes = 64 << 10;
  a->run.min_split_bytes = 64 << 10;
  a->run.buffer_bytes = 2 << 20;
  a->pool.trainers = 4;
  a->pool.slowdown = 3;
  a->pool.loader_cost_us = 20;
  a->pool.step_ms = 2;
  a->pool.batch = 128;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tailcut-demo: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto num = [&]() -> double {
      std::string v = value();
      char* e = nullptr;
      double d = std::strtod(v.c_str(), &e);
      if (e == v.c_str() || *e != '\0' || d < 0) {
        std::fprintf(stderr, "tailcut-demo: bad value for %s: %s\n", k.c_str(), v.c_str());
        std::exit(2);
      }
      return d;
    };
    if (k == "--help" || k == "-h") {
      Usage(stdout);
      std::exit(0);
    } else if (k == "--processes")
      a->run.processes = static_cast<int>(num());
    else if (k == "--slow")
      a->run.slow = static_cast<int>(num());
    else if (k == "--slowdown")
      a->run.slowdown = num();
    else if (k == "--epochs")
      a->run.epochs = static_cast<uint64_t>(num());
    else if (k == "--records")
      a->data.records = static_cast<uint64_t>(num());
    else if (k == "--record-bytes")
      a->data.record_bytes = static_cast<uint32_t>(num());
    else if (k == "--files")
      a->data.files = static_cast<uint32_t>(num());
    else if (k == "--format")
      a->data.format = value();
    else if (k == "--cost-us")
      a->run.cost_us = num();
    else if (k == "--slices")
      a->run.slices = static_cast<uint64_t>(num());
    else if (k == "--no-kill")
      a->kill_one = false;
    else if (k == "--dir")
      a->data.dir = value();
    else if (k == "--plot")
      a->plot = value();
    else if (k == "--sync-trainers")
      a->pool.trainers = static_cast<int>(num());
    else if (k == "--loaders-per-trainer")
      a->loaders_per_trainer = static_cast<int>(num());
    else if (k == "--loader-slowdown")
      a->pool.slowdown = num();
    else if (k == "--loader-cost-us")
      a->pool.loader_cost_us = num();
    else if (k == "--step-ms")
      a->pool.step_ms = num();
    else if (k == "--pool-batch")
      a->pool.batch = static_cast<uint32_t>(num());
    else if (k == "--no-pool")
      a->run_pool = false;
    else {
      std::fprintf(stderr, "tailcut-demo: unknown option %s (see --help)\n", k.c_str());
      return false;
    }
  }
  if (a->run.processes < 1 || a->run.processes > 200 || a->run.slow < 0 ||
      a->run.slow > a->run.processes || a->run.slowdown < 1 || a->run.epochs < 1 ||
      a->run.cost_us <= 0 || (a->data.format != "lines" && a->data.format != "tfrecord") ||
      a->pool.trainers < 1 || a->pool.trainers > 64 || a->loaders_per_trainer < 1 ||
      a->pool.trainers * a->loaders_per_trainer > 256 || a->pool.slowdown < 1 ||
      a->pool.loader_cost_us <= 0 || a->pool.batch < 1 || a->pool.batch > 4096) {
    std::fprintf(stderr, "tailcut-demo: bad option value (see --help)\n");
    return false;
  }
  if (a->run.slices == 0) a->run.slices = 10ull * a->run.processes;
  a->run.format = a->data.format;
  a->run.records = a->data.records;
  if (a->plot.empty()) a->plot = a->data.dir + "/tailcut-demo.png";
  std::string stem = a->plot;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0)
    stem.resize(stem.size() - 4);
  a->pool_plot = stem + "-pool.png";
  a->pool.loaders = a->pool.trainers * a->loaders_per_trainer;
  a->pool.slow = 1;
  a->pool.format = a->data.format;
  a->pool.records = a->data.records;
  // A batch: each record with a 4-byte length, in whole pages.
  uint64_t record = a->data.record_bytes + 4;
  a->pool.slot_bytes = (a->pool.batch * record + 4095) / 4096 * 4096;
  // 64 items (4 MiB each in the default data set), at least 4 per loader.
  a->pool.slices = std::max<uint64_t>(4ull * a->pool.loaders, 64);
  return true;
}

// Live progress: \r updates on a terminal, a line per second otherwise.
ts::TickFn Progress(const char* label, const Args& a, bool tty, bool kill) {
  auto killed = std::make_shared<bool>(false);
  auto printed = std::make_shared<double>(-1e9);
  return [=](const ts::RunResult& r, double elapsed) -> int {
    uint64_t total = a.run.records * a.run.epochs, done = 0;
    for (const auto& p : r.procs) done += p.progress;
    done = std::min(done, total);
    int victim = -1;
    if (kill && !*killed && done * 10 >= total * 4 && a.run.processes > 1) {
      victim = 0;  // a fast one, 40% into the run
      *killed = true;
    }
    // Called every 0.1 s; draws every 0.2 s on a terminal, every second otherwise.
    if (victim < 0 && elapsed - *printed < (tty ? 0.2 : 1.0) - 1e-3) return -1;
    *printed = elapsed;
    const int width = 30;
    int filled = static_cast<int>(width * done / std::max<uint64_t>(total, 1));
    std::string per;
    for (const auto& p : r.procs) {
      char cell[24];
      std::snprintf(cell, sizeof(cell), " %s%llu", p.killed ? "x" : "",
                    static_cast<unsigned long long>(p.progress / 1000));
      per += cell;
    }
    std::printf("%s  %-8s %5.1f s [%s%s] %3.0f%%  k records per process:%s", tty ? "\r" : "", label,
                elapsed, std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                100.0 * done / std::max<uint64_t>(total, 1), per.c_str());
    std::printf(tty ? "\033[K" : "\n");  // a terminal: clear what a longer line left
    if (victim >= 0) {
      std::printf("%s  -> killing process 0 (pid %d) with SIGKILL at %.1f s\n", tty ? "\n" : "",
                  static_cast<int>(r.procs[0].pid), elapsed);
    }
    std::fflush(stdout);
    return victim;
  };
}

// Live progress of a pooled-loaders run, as Progress draws it.
ts::PoolTickFn PoolProgressLine(const char* label, const Args& a, bool tty) {
  auto printed = std::make_shared<double>(-1e9);
  return [=](const ts::PoolProgress& p, double elapsed) {
    if (elapsed - *printed < (tty ? 0.2 : 1.0) - 1e-3) return;
    *printed = elapsed;
    const int width = 30;
    uint64_t total = std::max<uint64_t>(a.pool.records, 1);
    uint64_t done = std::min(p.records_trained, total);
    int filled = static_cast<int>(width * done / total);
    std::string per;
    for (uint64_t b : p.loader_batches) per += ' ' + std::to_string(b);
    std::printf("%s  %-8s %5.1f s [%s%s] %3.0f%%  step %llu, batches per loader:%s",
                tty ? "\r" : "", label, elapsed, std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), 100.0 * done / total,
                static_cast<unsigned long long>(p.steps), per.c_str());
    std::printf(tty ? "\033[K" : "\n");
    std::fflush(stdout);
  };
}

bool CheckEpochs(const char* label, const ts::RunResult& r) {
  bool ok = r.error.empty();
  for (size_t e = 0; e < r.epoch_digests.size(); ++e) {
    const ts::Digest& d = r.epoch_digests[e];
    bool same = d == r.expected;
    ok = ok && same;
    std::printf("  %-8s epoch %zu: %llu of %llu records trained on, id checksum %s -> %s\n", label,
                e, static_cast<unsigned long long>(d.count),
                static_cast<unsigned long long>(r.expected.count), same ? "matches" : "DIFFERS",
                same ? "every record exactly once" : "NOT exactly once");
  }
  if (!r.error.empty()) std::printf("  %-8s error: %s\n", label, r.error.c_str());
  return ok;
}

// Every record of a pooled-loaders run in exactly one released batch:
// trained on, or left over when equal steps ended the epoch.
bool CheckPool(const char* label, const ts::PoolResult& r) {
  ts::Digest all = r.trained;
  all.Merge(r.leftover);
  bool same = all == r.expected;
  std::printf(
      "  %-8s epoch 0: %llu trained on + %llu left over by equal steps = %llu of %llu records,\n"
      "  %-8s          id checksum %s -> %s\n",
      label, static_cast<unsigned long long>(r.trained.count),
      static_cast<unsigned long long>(r.leftover.count), static_cast<unsigned long long>(all.count),
      static_cast<unsigned long long>(r.expected.count), "", same ? "matches" : "DIFFERS",
      same ? "every record in exactly one released batch" : "NOT exactly once");
  std::printf("  %-8s %llu batches published, %llu released (%llu of them unused: left over)\n",
              label, static_cast<unsigned long long>(r.published),
              static_cast<unsigned long long>(r.released),
              static_cast<unsigned long long>(r.leftover_batches));
  if (!r.error.empty()) std::printf("  %-8s error: %s\n", label, r.error.c_str());
  return r.exactly_once;
}

// Why no plot can be drawn, or "" when /usr/bin/python3 has matplotlib.
std::string PlotUnavailable() {
  if (::access("/usr/bin/python3", X_OK) != 0) return "no plot: /usr/bin/python3 not found";
  if (std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
    return "no plot: matplotlib is not installed for /usr/bin/python3 (apt-get install "
           "python3-matplotlib)";
  return "";
}

std::string WritePlot(const Args& a, const ts::RunResult& st, const ts::RunResult& tc) {
  if (std::string why = PlotUnavailable(); !why.empty()) return why;
  std::string csv = a.data.dir + "/tailcut-demo-segments.csv";
  FILE* f = std::fopen(csv.c_str(), "w");
  if (!f) return "no plot: cannot write " + csv;
  std::fprintf(f, "run,rank,slow,item,piece,t0,t1\n");
  for (const auto* r : {&st, &tc})
    for (const auto& s : r->segments)
      std::fprintf(f, "%s,%d,%d,%llu,%d,%.6f,%.6f\n",
                   r == &st ? "static sharding" : "tailcut (elastic + split)", s.rank,
                   ts::IsSlow(r->config, s.rank) ? 1 : 0, static_cast<unsigned long long>(s.item),
                   s.piece ? 1 : 0, s.t0, s.t1);
  std::fclose(f);
  char kill_at[32] = "";
  for (const auto& p : tc.procs)
    if (p.killed) std::snprintf(kill_at, sizeof(kill_at), "%d:%.3f", p.rank, p.end);
  std::string script =
      "import csv,sys\n"
      "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
      "rows=list(csv.DictReader(open(sys.argv[1])))\n"
      "runs=['static sharding','tailcut (elastic + split)']\n"
      "fig,axes=plt.subplots(2,1,figsize=(9,5),sharex=True)\n"
      "cm=plt.get_cmap('tab20')\n"
      "for ax,run in zip(axes,runs):\n"
      "  for r in rows:\n"
      "    if r['run']!=run: continue\n"
      "    t0=float(r['t0']); ax.barh(int(r['rank']),float(r['t1'])-t0,left=t0,height=0.8,"
      "color=cm(int(r['item'])%20),edgecolor='k',lw=0.2,hatch='////' if r['piece']=='1' else "
      "None)\n"
      "  ax.axvline(float(sys.argv[3]),color='red',ls='--',lw=1)\n"
      "  ax.set_title(run+' (red: ideal; hatched: split-off pieces)',fontsize=9); "
      "ax.set_ylabel('process')\n"
      "if sys.argv[4]:\n"
      "  k,t=sys.argv[4].split(':'); axes[1].plot([float(t)],[int(k)],'kx',ms=10)\n"
      "axes[1].set_xlabel('seconds')\n"
      "fig.tight_layout(); fig.savefig(sys.argv[2],dpi=100)\n";
  std::string script_path = a.data.dir + "/tailcut-demo-plot.py";
  f = std::fopen(script_path.c_str(), "w");
  if (!f) return "no plot: cannot write " + script_path;
  std::fputs(script.c_str(), f);
  std::fclose(f);
  char ideal[32];
  std::snprintf(ideal, sizeof(ideal), "%.4f", tc.ideal);
  std::string cmd = "/usr/bin/python3 '" + script_path + "' '" + csv + "' '" + a.plot + "' " +
                    ideal + " '" + kill_at + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) return "no plot: drawing it failed (" + cmd + ")";
  return "timeline plot written to " + a.plot;
}

// Steps over time and the distribution of step waits, per trainer and
// pooled: what the table's p50 and p99 summarise.
std::string WritePoolPlot(const Args& a, const ts::PoolResult& per, const ts::PoolResult& pool) {
  if (std::string why = PlotUnavailable(); !why.empty()) return why;
  std::string csv = a.data.dir + "/tailcut-demo-pool.csv";
  FILE* f = std::fopen(csv.c_str(), "w");
  if (!f) return "no plot: cannot write " + csv;
  std::fprintf(f, "run,series,value\n");
  for (const auto* r : {&per, &pool}) {
    const char* run = r == &per ? "per-trainer loaders" : "one pool (BatchRing)";
    for (double t : r->step_ends) std::fprintf(f, "%s,end,%.6f\n", run, t);
    for (double w : r->waits) std::fprintf(f, "%s,wait,%.6f\n", run, w);
  }
  std::fclose(f);
  std::string script =
      "import csv,math,sys\n"
      "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
      "rows=list(csv.DictReader(open(sys.argv[1])))\n"
      "fig,(a0,a1)=plt.subplots(1,2,figsize=(9,3.2))\n"
      "for run,color in (('per-trainer loaders','tab:red'),('one pool (BatchRing)','tab:blue')):\n"
      "  ends=[float(r['value']) for r in rows if r['run']==run and r['series']=='end']\n"
      "  waits=sorted(max(1e3*float(r['value']),0.01) for r in rows "
      "if r['run']==run and r['series']=='wait')\n"
      "  if not waits: continue\n"
      "  a0.plot(ends,range(1,len(ends)+1),color=color,label=run)\n"
      "  n=len(waits); a1.plot(waits,[(i+1)/n for i in range(n)],color=color,label=run)\n"
      "  a1.axvline(waits[max(0,math.ceil(0.99*n)-1)],color=color,ls='--',lw=1)\n"
      "a0.set_xlabel('seconds'); a0.set_ylabel('steps done (trainer 0)')\n"
      "a0.set_title('synchronous steps over time ('+sys.argv[3]+')',fontsize=9)\n"
      "a0.legend(fontsize=8)\n"
      "a1.set_xscale('log'); a1.set_xlabel('wait before a step, ms')\n"
      "a1.set_ylabel('fraction of steps')\n"
      "a1.set_title('step waits of every trainer (dashed: p99)',fontsize=9)\n"
      "fig.tight_layout(); fig.savefig(sys.argv[2],dpi=100)\n";
  std::string script_path = a.data.dir + "/tailcut-demo-pool-plot.py";
  f = std::fopen(script_path.c_str(), "w");
  if (!f) return "no plot: cannot write " + script_path;
  std::fputs(script.c_str(), f);
  std::fclose(f);
  char slow[64];
  std::snprintf(slow, sizeof(slow), "loader %d is %gx slower", per.config.loaders - 1,
                per.config.slowdown);
  std::string cmd = "/usr/bin/python3 '" + script_path + "' '" + csv + "' '" + a.pool_plot + "' '" +
                    slow + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) return "no plot: drawing it failed (" + cmd + ")";
  return "steps and step waits plot written to " + a.pool_plot;
}

// The pooled-loaders act: the same loaders and trainers per trainer, then
// pooled. Returns whether both runs used every record exactly once.
bool RunPooledAct(const Args& a, bool tty) {
  ts::PoolConfig pc = a.pool;
  pc.paths = a.run.paths;
  const int slow_loader = pc.loaders - 1;
  std::printf(
      "\nPooled loaders: %d synchronous trainers, every step waits until all of them have a "
      "batch (as\nunder DDP); %d loader processes, loader %d %gx slower; %g us per record, "
      "%u records per batch,\n%g ms per step, one epoch\n",
      pc.trainers, pc.loaders, slow_loader, pc.slowdown, pc.loader_cost_us, pc.batch, pc.step_ms);

  ts::PoolConfig per = pc;
  per.pooled = false;
  per.name = "tailcut-demo." + std::to_string(::getpid()) + ".per-trainer";
  std::printf(
      "\n3) per-trainer loaders: each trainer has its own %d loader%s and ring of %u slots, like "
      "a\n"
      "   DataLoader per rank (all loaders take items from one tailcut queue)\n",
      a.loaders_per_trainer, a.loaders_per_trainer == 1 ? "" : "s",
      std::max<uint32_t>(2, pc.slots / pc.trainers));
  ts::PoolResult rp = ts::RunPool(per, PoolProgressLine("per-rank", a, tty), 0.1);
  if (tty) std::printf("\n");

  ts::PoolConfig pool = pc;
  pool.pooled = true;
  pool.name = "tailcut-demo." + std::to_string(::getpid()) + ".pooled";
  std::printf(
      "\n4) one pool: the same %d loaders feed every trainer through one tailcut::BatchRing of "
      "%u slots\n",
      pc.loaders, pc.slots);
  ts::PoolResult rq = ts::RunPool(pool, PoolProgressLine("pooled", a, tty), 0.1);
  if (tty) std::printf("\n");

  std::printf("\n  %-28s %9s %7s %16s %9s %12s\n", "run", "epoch", "steps", "step wait: p50", "p99",
              "vs bound");
  const double bound = ts::LoaderBoundSeconds(pc);
  for (const auto* r : {&rp, &rq})
    std::printf("  %-28s %7.2f s %7llu %13.1f ms %6.1f ms %11.2fx\n",
                r == &rp ? "per-trainer loaders" : "one pool (BatchRing)", r->epoch_s,
                static_cast<unsigned long long>(r->steps), 1e3 * r->WaitPercentile(50),
                1e3 * r->WaitPercentile(99), r->epoch_s / bound);
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  std::printf("  %-28s %8.2fx %7s %15.1fx %8.1fx\n", "per-trainer / pool",
              ratio(rp.epoch_s, rq.epoch_s), "",
              ratio(rp.WaitPercentile(50), rq.WaitPercentile(50)),
              ratio(rp.WaitPercentile(99), rq.WaitPercentile(99)));
  std::printf(
      "  (bound: every record's loader cost spread over the loaders' speeds, %.2f s. A step's "
      "wait:\n   from the end of a trainer's step to all trainers agreeing on the next one.)\n",
      bound);
  auto per_loader = [](const ts::PoolResult& r) {
    std::string s;
    for (uint64_t b : r.loader_batches) s += ' ' + std::to_string(b);
    return s;
  };
  std::printf("  batches per loader (loader %d slow): per trainer%s; pooled%s\n\n", slow_loader,
              per_loader(rp).c_str(), per_loader(rq).c_str());
  bool ok = CheckPool("per-rank", rp);
  ok = CheckPool("pooled", rq) && ok;
  std::printf("\n  %s\n", WritePoolPlot(a, rp, rq).c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  const bool tty = ::isatty(STDOUT_FILENO);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto& c = a.run;
  std::printf(
      "tailcut-demo: %d trainer processes, %d of them %gx slower, %llu epochs, %g us per record\n",
      c.processes, c.slow, c.slowdown, static_cast<unsigned long long>(c.epochs), c.cost_us);
  try {
    auto t = std::chrono::steady_clock::now();
    bool generated = false;
    a.run.paths = ts::EnsureData(a.data, &generated);
    double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    std::printf(
        "data: %llu %s records of %u bytes in %u files (%.0f MiB) in %s, %s\n",
        static_cast<unsigned long long>(a.data.records), a.data.format.c_str(), a.data.record_bytes,
        a.data.files,
        a.data.records * (a.data.record_bytes + (a.data.format == "tfrecord" ? 16 : 0)) / 1048576.0,
        a.data.dir.c_str(),
        generated ? ("generated in " + std::to_string(gen_s).substr(0, 4) + " s").c_str()
                  : "reused");

    ts::RunConfig st = a.run;
    st.strategy = ts::Strategy::kStatic;
    st.name = "tailcut-demo." + std::to_string(::getpid()) + ".static";
    std::printf("\n1) static sharding: each process reads its own 1/%d of the files\n",
                c.processes);
    ts::RunResult rs = ts::Run(st, Progress("static", a, tty, false), 0.1);
    if (tty) std::printf("\n");

    ts::RunConfig tc = a.run;
    tc.strategy = ts::Strategy::kSplit;
    tc.name = "tailcut-demo." + std::to_string(::getpid()) + ".tailcut";
    std::printf("\n2) tailcut: one shared queue, %llu slices per epoch, tail splitting on%s\n",
                static_cast<unsigned long long>(tc.slices),
                a.kill_one ? ", one process killed part-way" : "");
    ts::RunResult rt = ts::Run(tc, Progress("tailcut", a, tty, a.kill_one), 0.1);
    if (tty) std::printf("\n");

    std::printf("\n  %-28s %9s %9s %9s %22s\n", "run", "makespan", "ideal", "vs ideal",
                "fast procs idle at end");
    for (const auto* r : {&rs, &rt})
      std::printf("  %-28s %7.2f s %7.2f s %8.2fx %20.2f s\n",
                  r == &rs ? "static sharding" : "tailcut (elastic + split)", r->makespan, r->ideal,
                  r->makespan / r->ideal, r->idle_fast_mean);
    for (const auto& p : rt.procs) {
      if (!p.killed) continue;
      // The ideal once a fast process is gone at p.end: the work left then,
      // spread over the speeds that remain.
      double fast = 1e6 / c.cost_us,
             speed = (c.processes - c.slow) * fast + c.slow * fast / c.slowdown;
      double work = static_cast<double>(c.records * c.epochs);
      double left = std::max(0.0, work - p.end * speed);
      double ideal_kill = std::min(p.end, work / speed) + left / (speed - fast);
      std::printf("  %-28s %7s   %7.2f s %8.2fx   (process %d lost at %.2f s)\n",
                  "  ideal with the kill", "", ideal_kill, rt.makespan / ideal_kill, p.rank, p.end);
    }
    std::printf(
        "  (ideal: total work / sum of the processes' speeds. The tailcut run also re-reads the\n"
        "   killed process's open item from its start.)\n\n");
    bool ok = CheckEpochs("static", rs);
    ok = CheckEpochs("tailcut", rt) && ok;
    for (const auto& p : rt.procs)
      if (p.killed)
        std::printf(
            "\n  killed process %d (pid %d) at %.2f s after it finished %llu items; the survivors\n"
            "  recovered %llu open item(s) of it and read them again from their start.\n",
            p.rank, static_cast<int>(p.pid), p.end,
            static_cast<unsigned long long>(
                std::count_if(rt.segments.begin(), rt.segments.end(),
                              [&](const ts::Segment& s) { return s.rank == p.rank; })),
            static_cast<unsigned long long>(rt.recovered));
    std::printf("  tail splits: %llu (pieces split off slow items by idle processes)\n",
                static_cast<unsigned long long>(rt.splits));
    std::printf("\n  %s\n", WritePlot(a, rs, rt).c_str());
    if (a.run_pool) ok = RunPooledAct(a, tty) && ok;
    std::printf("\n  exactly once per epoch, every run: %s\n", ok ? "yes" : "NO");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tailcut-demo: %s\n", e.what());
    return 1;
  }
}
