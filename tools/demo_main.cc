// tailcut-demo: many trainer processes share one work queue.
//
// Generates a data set, starts P trainer processes (one of them k times
// slower, one killed with SIGKILL part-way), lets them pull slices from one
// queue, shows live progress, and proves at the end that every slice of
// every epoch was processed exactly once.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/work_queue.h"

namespace {

struct Args {
  int processes = 8;
  int slow = 1;              // how many processes are slow
  double slowdown = 4.0;     // how much slower they are
  int epochs = 3;
  int files = 32;
  uint64_t file_kib = 1024;
  uint64_t slices = 0;       // 0: 10 x processes
  double us_per_kib = 300;    // "training" cost of the fast processes
  bool kill_one = true;
  std::string dir = "/tmp/tailcut-demo";
  std::string name = "tailcut-demo";
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: tailcut-demo [options]\n"
               "\n"
               "Starts trainer processes that pull slices of a generated data set from one\n"
               "tailcut queue, shows progress, and verifies each slice was used exactly once\n"
               "per epoch.\n"
               "\n"
               "  --processes N     trainer processes (default 8)\n"
               "  --slow N          how many of them are slow (default 1)\n"
               "  --slowdown K      how much slower (default 4)\n"
               "  --epochs N        epochs (default 3)\n"
               "  --files N         generated files (default 32)\n"
               "  --file-kib N      size of each file in KiB (default 1024)\n"
               "  --slices N        work items per epoch (default 10 x processes)\n"
               "  --us-per-kib X    simulated training time per KiB (default 300)\n"
               "  --no-kill         do not kill a process part-way\n"
               "  --dir PATH        where to generate data (default /tmp/tailcut-demo)\n"
               "  --help            this text\n");
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tailcut-demo: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--help" || k == "-h") {
      Usage(stdout);
      std::exit(0);
    } else if (k == "--processes") {
      a->processes = std::atoi(value());
    } else if (k == "--slow") {
      a->slow = std::atoi(value());
    } else if (k == "--slowdown") {
      a->slowdown = std::atof(value());
    } else if (k == "--epochs") {
      a->epochs = std::atoi(value());
    } else if (k == "--files") {
      a->files = std::atoi(value());
    } else if (k == "--file-kib") {
      a->file_kib = std::strtoull(value(), nullptr, 10);
    } else if (k == "--slices") {
      a->slices = std::strtoull(value(), nullptr, 10);
    } else if (k == "--us-per-kib") {
      a->us_per_kib = std::atof(value());
    } else if (k == "--no-kill") {
      a->kill_one = false;
    } else if (k == "--dir") {
      a->dir = value();
    } else {
      std::fprintf(stderr, "tailcut-demo: unknown option %s (see --help)\n", k.c_str());
      return false;
    }
  }
  if (a->processes < 1 || a->processes > 256 || a->slow < 0 || a->slow > a->processes ||
      a->slowdown < 1 || a->epochs < 1 || a->files < 1 || a->file_kib < 1) {
    std::fprintf(stderr, "tailcut-demo: bad option value (see --help)\n");
    return false;
  }
  if (a->slices == 0) a->slices = 10 * static_cast<uint64_t>(a->processes);
  return true;
}

std::vector<std::string> GenerateData(const Args& a) {
  ::mkdir(a.dir.c_str(), 0755);
  std::vector<std::string> paths;
  std::string line;
  for (int f = 0; f < a.files; ++f) {
    std::string path = a.dir + "/part-" + std::to_string(f) + ".txt";
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != a.file_kib * 1024) {
      std::string data;
      data.reserve(a.file_kib * 1024);
      for (uint64_t r = 0; data.size() < a.file_kib * 1024; ++r) {
        line = "file " + std::to_string(f) + " record " + std::to_string(r) + "\n";
        data += line;
      }
      data.resize(a.file_kib * 1024);
      data.back() = '\n';
      FILE* out = std::fopen(path.c_str(), "wb");
      if (out == nullptr || std::fwrite(data.data(), 1, data.size(), out) != data.size()) {
        std::fprintf(stderr, "tailcut-demo: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
        std::exit(1);
      }
      std::fclose(out);
    }
    paths.push_back(path);
  }
  return paths;
}

// What a trainer reports per acked item through its pipe.
struct Done {
  uint64_t epoch, index, bytes;
};

[[noreturn]] void Trainer(const tailcut::WorkQueueOptions& options, double us_per_kib, int out_fd) {
  try {
    auto q = tailcut::WorkQueue::Open(options);
    tailcut::WorkItem item;
    while (q->Take(&item) == tailcut::TakeStatus::kOk) {
      uint64_t bytes = item.end - item.begin;
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(us_per_kib * bytes / 1024)));
      if (q->Ack(item) != tailcut::AckStatus::kOk) continue;
      Done d{item.epoch, item.index, bytes};
      if (::write(out_fd, &d, sizeof(d)) != sizeof(d)) std::_Exit(3);
    }
    q->Close();
    std::_Exit(0);
  } catch (const tailcut::Error& e) {
    std::fprintf(stderr, "tailcut-demo: trainer %d: %s\n", ::getpid(), e.what());
    std::_Exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  std::printf("tailcut-demo: %d trainer processes, %d of them %.0fx slower, %d epochs\n", a.processes,
              a.slow, a.slowdown, a.epochs);
  std::vector<std::string> paths = GenerateData(a);
  std::printf("data: %d files x %llu KiB in %s, %llu slices per epoch\n", a.files,
              static_cast<unsigned long long>(a.file_kib), a.dir.c_str(),
              static_cast<unsigned long long>(a.slices));

  tailcut::WorkQueueOptions options;
  options.works = paths;
  options.num_epochs = static_cast<uint64_t>(a.epochs);
  options.num_slices = a.slices;
  options.num_clients = static_cast<uint32_t>(a.processes);
  options.name = a.name + "." + std::to_string(::getpid());
  options.seed = 42;

  std::vector<pid_t> pids(a.processes);
  std::vector<int> fds(a.processes);
  auto start = std::chrono::steady_clock::now();
  for (int p = 0; p < a.processes; ++p) {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return 1;
    bool slow = p >= a.processes - a.slow;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pipe_fds[0]);
      Trainer(options, slow ? a.us_per_kib * a.slowdown : a.us_per_kib, pipe_fds[1]);
    }
    ::close(pipe_fds[1]);
    ::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    pids[p] = pid;
    fds[p] = pipe_fds[0];
  }

  uint64_t total = a.slices * static_cast<uint64_t>(a.epochs);  // approximate until stats arrive
  std::map<std::pair<uint64_t, uint64_t>, int> seen;
  std::vector<uint64_t> items(a.processes), bytes(a.processes);
  std::vector<bool> running(a.processes, true);
  int victim = a.kill_one && a.processes > 1 ? 0 : -1;
  bool killed = false;
  int alive = a.processes;
  while (alive > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int p = 0; p < a.processes; ++p) {
      Done d;
      while (::read(fds[p], &d, sizeof(d)) == sizeof(d)) {
        ++seen[{d.epoch, d.index}];
        ++items[p];
        bytes[p] += d.bytes;
      }
      int status;
      if (running[p] && ::waitpid(pids[p], &status, WNOHANG) == pids[p]) {
        running[p] = false;
        --alive;
      }
    }
    uint64_t done = 0;
    try {
      tailcut::QueueStats st = tailcut::InspectQueue(options.name);
      total = st.total;
      done = st.done;
    } catch (const tailcut::Error&) {
      done = seen.size();  // the last process removed the queue
    }
    if (!killed && victim >= 0 && done * 5 >= total * 2) {
      ::kill(pids[victim], SIGKILL);
      killed = true;
      std::printf("\n  killed process %d (pid %d) with SIGKILL at %llu of %llu items\n", victim,
                  pids[victim], static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(total));
    }
    int width = 40;
    int filled = total ? static_cast<int>(width * done / total) : 0;
    std::printf("\r  [%s%s] %llu/%llu items", std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), static_cast<unsigned long long>(done),
                static_cast<unsigned long long>(total));
    std::fflush(stdout);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n\n  process  speed   items     MiB   share\n");
  uint64_t sum = 0;
  for (uint64_t n : items) sum += n;
  for (int p = 0; p < a.processes; ++p) {
    bool slow = p >= a.processes - a.slow;
    std::printf("  %7d  %-6s %6llu %7.1f  %5.1f%%%s\n", p, slow ? "slow" : "fast",
                static_cast<unsigned long long>(items[p]), bytes[p] / 1048576.0,
                sum ? 100.0 * items[p] / sum : 0.0, p == victim ? "  (killed)" : "");
  }
  uint64_t duplicated = 0;
  for (auto& [key, count] : seen) duplicated += count > 1;
  uint64_t missing = total - std::min<uint64_t>(total, seen.size());
  std::printf("\n  %d epochs x %llu items = %llu: %llu done, %llu missing, %llu duplicated, in %.1f s\n",
              a.epochs, static_cast<unsigned long long>(total / a.epochs),
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(seen.size()),
              static_cast<unsigned long long>(missing), static_cast<unsigned long long>(duplicated), secs);
  bool ok = missing == 0 && duplicated == 0;
  std::printf("  exactly once per epoch: %s\n", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
