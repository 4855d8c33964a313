// hosts_bench: the long tail between hosts, and what the coordinator costs.
//
// Simulated hosts (a host id each) of forked processes, on this machine,
// against a redis-server this program starts (appendonly yes, appendfsync
// everysec). Each process takes items through WorkQueue and "trains" on each
// for a fixed time per item (a sleep, so that the processes of all hosts run
// at the speeds they are given on any number of cores); one host is
// --slow-factor times slower. In the same run:
//
//   static   per-host sharding: every host runs a queue of its own over a
//            third of the files (what one would do without a global tier)
//   global   one job over all the files, WorkQueue(coordinator=...)
//
// Makespan = start to the last process's end; ideal = the work spread over
// every process in proportion to its speed. Then the same job on one host,
// with and without a coordinator (the coordinator's own cost), and Redis
// commands per item from INFO stats.
//
//   build/bin/hosts_bench [--hosts 3] [--procs 3] [--items 720] [--epochs 2]
//                         [--ms-per-item 10] [--slow-factor 2] [--reps 3]
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "global/redis_server.h"
#include "tailcut/work_queue.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int hosts = 3;
  int procs = 3;
  uint64_t items = 720;
  uint64_t epochs = 2;
  double ms_per_item = 10;
  double slow_factor = 2;
  int reps = 3;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One process: take, sleep `ms` per item, ack, until the end.
int Work(tailcut::WorkQueueOptions options, double ms) {
  try {
    auto q = tailcut::WorkQueue::Open(options);
    tailcut::WorkItem item;
    while (q->Take(&item) == tailcut::TakeStatus::kOk) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
      q->Ack(item);
    }
    q->Close();
  } catch (const tailcut::Error& e) {
    std::fprintf(stderr, "hosts_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Runs one process per (options, ms) at once; returns the makespan in s.
double RunAll(const std::vector<std::pair<tailcut::WorkQueueOptions, double>>& procs) {
  Clock::time_point start = Clock::now();
  std::vector<pid_t> pids;
  for (const auto& [options, ms] : procs) {
    pid_t pid = fork();
    if (pid == 0) _exit(Work(options, ms));
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "hosts_bench: a process failed\n");
      std::exit(1);
    }
  }
  return Seconds(Clock::now() - start);
}

// Redis's own counts: {commands (those inside scripts too), script calls}.
std::pair<long long, long long> RedisCounts(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  auto field = [](const char* text, const char* name) {
    const char* p = text == nullptr ? nullptr : std::strstr(text, name);
    return p == nullptr ? 0LL : std::atoll(p + std::strlen(name));
  };
  redisReply* r = static_cast<redisReply*>(redisCommand(c, "INFO stats"));
  long long commands = field(r ? r->str : nullptr, "total_commands_processed:");
  freeReplyObject(r);
  r = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
  long long scripts = field(r ? r->str : nullptr, "cmdstat_evalsha:calls=") +
                      field(r ? r->str : nullptr, "cmdstat_eval:calls=");
  freeReplyObject(r);
  redisFree(c);
  return {commands, scripts};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hosts_bench: %s needs a value (see --help)\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: hosts_bench [--hosts N] [--procs N] [--items N] [--epochs N]\n"
          "                   [--ms-per-item MS] [--slow-factor F] [--reps N]\n"
          "Simulated hosts of forked processes against a redis-server it starts: per-host\n"
          "static sharding vs one job through the coordinator, with the last host F times\n"
          "slower; then one host with and without a coordinator. Prints makespans over the\n"
          "ideal and Redis commands per item (medians over --reps runs).\n");
      return 0;
    } else if (a == "--hosts") {
      cfg.hosts = std::atoi(next());
    } else if (a == "--procs") {
      cfg.procs = std::atoi(next());
    } else if (a == "--items") {
      cfg.items = std::strtoull(next(), nullptr, 10);
    } else if (a == "--epochs") {
      cfg.epochs = std::strtoull(next(), nullptr, 10);
    } else if (a == "--ms-per-item") {
      cfg.ms_per_item = std::atof(next());
    } else if (a == "--slow-factor") {
      cfg.slow_factor = std::atof(next());
    } else if (a == "--reps") {
      cfg.reps = std::atoi(next());
    } else {
      std::fprintf(stderr, "hosts_bench: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (cfg.hosts < 1 || cfg.procs < 1 || cfg.items < uint64_t(cfg.hosts) || cfg.epochs < 1 ||
      cfg.reps < 1 || cfg.ms_per_item <= 0 || cfg.slow_factor < 1) {
    std::fprintf(stderr, "hosts_bench: arguments out of range (see --help)\n");
    return 2;
  }
  if (tailcut::testing::FindRedisServer().empty()) {
    std::fprintf(stderr,
                 "hosts_bench: redis-server is not installed (apt-get install redis-server)\n");
    return 1;
  }
  tailcut::testing::RedisServer redis({"--appendfsync", "everysec"});

  // Equal files, one per item of the global job; the static shards get a
  // third of them each (the first files to host 0, ...).
  char tmpl[] = "/tmp/tailcut-hosts-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<std::string> files;
  for (uint64_t f = 0; f < cfg.items; ++f) {
    files.push_back(dir + "/part-" + std::to_string(f));
    std::ofstream(files.back()) << std::string(4096, 'x');
  }
  const uint64_t total = cfg.items * cfg.epochs;
  auto ms_of = [&](int host) {
    return host == cfg.hosts - 1 ? cfg.ms_per_item * cfg.slow_factor : cfg.ms_per_item;
  };
  // The ideal: all the work over every process, each at its own speed.
  double rate = 0;  // items per second, all processes
  for (int h = 0; h < cfg.hosts; ++h) rate += cfg.procs * 1000.0 / ms_of(h);
  const double ideal = total / rate;
  auto base = [&](const std::string& name) {
    tailcut::WorkQueueOptions o;
    o.name = name;
    o.num_epochs = cfg.epochs;
    o.num_clients = static_cast<uint32_t>(cfg.procs);
    o.split_tail = false;  // whole files of equal cost: nothing to split
    o.on_notice = [](const std::string&) {};
    return o;
  };

  std::vector<double> stat, glob, one_local, one_global, commands_per_item, scripts_per_item;
  for (int rep = 0; rep < cfg.reps; ++rep) {
    std::string tag = std::to_string(getpid()) + "_" + std::to_string(rep);
    // static: host h reads files [h*n/H, (h+1)*n/H) on a queue of its own
    std::vector<std::pair<tailcut::WorkQueueOptions, double>> procs;
    for (int h = 0; h < cfg.hosts; ++h) {
      tailcut::WorkQueueOptions o = base("hb_static_" + tag + "_" + std::to_string(h));
      o.works.assign(files.begin() + h * cfg.items / cfg.hosts,
                     files.begin() + (h + 1) * cfg.items / cfg.hosts);
      for (int p = 0; p < cfg.procs; ++p) procs.emplace_back(o, ms_of(h));
    }
    stat.push_back(RunAll(procs));
    // global: one job over every file, through the coordinator
    procs.clear();
    auto before = RedisCounts(redis.port());
    for (int h = 0; h < cfg.hosts; ++h) {
      tailcut::WorkQueueOptions o = base("hb_global_" + tag);
      o.works = files;
      o.coordinator = redis.url();
      o.host_id = "host" + std::to_string(h);
      for (int p = 0; p < cfg.procs; ++p) procs.emplace_back(o, ms_of(h));
    }
    glob.push_back(RunAll(procs));
    auto after = RedisCounts(redis.port());
    commands_per_item.push_back(double(after.first - before.first) / total);
    scripts_per_item.push_back(double(after.second - before.second) / total);
    // one host, all processes at full speed, with and without a coordinator
    for (bool coordinated : {false, true}) {
      procs.clear();
      tailcut::WorkQueueOptions o = base("hb_one_" + std::to_string(coordinated) + "_" + tag);
      o.works = files;
      if (coordinated) {
        o.coordinator = redis.url();
        o.host_id = "solo";
      }
      for (int p = 0; p < cfg.procs; ++p) procs.emplace_back(o, cfg.ms_per_item);
      (coordinated ? one_global : one_local).push_back(RunAll(procs));
    }
  }
  std::filesystem::remove_all(dir);

  double one_ideal = total * cfg.ms_per_item / 1000.0 / cfg.procs;
  std::printf(
      "hosts %d x processes %d, %llu items x %llu epochs, %.1f ms per item, host%d %.1fx "
      "slower; medians of %d runs\n",
      cfg.hosts, cfg.procs, static_cast<unsigned long long>(cfg.items),
      static_cast<unsigned long long>(cfg.epochs), cfg.ms_per_item, cfg.hosts - 1, cfg.slow_factor,
      cfg.reps);
  std::printf("%-34s %10s %10s %10s\n", "case", "makespan s", "ideal s", "/ ideal");
  std::printf("%-34s %10.3f %10.3f %10.3f\n", "static per-host sharding", Median(stat), ideal,
              Median(stat) / ideal);
  std::printf("%-34s %10.3f %10.3f %10.3f\n", "global tier (coordinator)", Median(glob), ideal,
              Median(glob) / ideal);
  std::printf("%-34s %10.3f %10.3f %10.3f\n", "one host, no coordinator", Median(one_local),
              one_ideal, Median(one_local) / one_ideal);
  std::printf("%-34s %10.3f %10.3f %10.3f\n", "one host, coordinator", Median(one_global),
              one_ideal, Median(one_global) / one_ideal);
  std::printf("static / global: %.2fx;  one host with / without coordinator: %.3fx\n",
              Median(stat) / Median(glob), Median(one_global) / Median(one_local));
  std::printf(
      "Redis, global case: %.3f script calls (round trips) and %.2f commands (those inside "
      "scripts too) per item\n",
      Median(scripts_per_item), Median(commands_per_item));
  return 0;
}
