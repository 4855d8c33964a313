// tools/trainer_sim/trainer_sim.cc: see trainer_sim.h.
//
// Messages go through one pipe shared by all children; each is 128 bytes,
// less than PIPE_BUF, so writes are atomic and reads see whole messages.
#include "tools/trainer_sim/trainer_sim.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/error.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace tailcut::trainer_sim {

namespace {

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void Digest::Add(uint64_t id) {
  uint64_t m = Mix(id);
  ++count;
  sum += m;
  xr ^= m * 0xff51afd7ed558ccdull;
}

void Digest::Merge(const Digest& o) {
  count += o.count;
  sum += o.sum;
  xr ^= o.xr;
}

Digest ExpectedDigest(uint64_t records) {
  Digest d;
  for (uint64_t i = 0; i < records; ++i) d.Add(i);
  return d;
}

uint64_t RecordId(const void* data, size_t size) {
  if (size < 12) return UINT64_MAX;
  uint64_t id = 0;
  const char* p = static_cast<const char*>(data);
  for (int i = 0; i < 12; ++i) {
    if (p[i] < '0' || p[i] > '9') return UINT64_MAX;
    id = id * 10 + static_cast<uint64_t>(p[i] - '0');
  }
  return id;
}

// ---------------------------------------------------------------- data

std::vector<std::string> EnsureData(const DataSpec& spec, bool* generated) {
  if (spec.format != "lines" && spec.format != "tfrecord")
    throw std::runtime_error("format must be lines or tfrecord, not " + spec.format);
  if (spec.record_bytes < 16) throw std::runtime_error("record bytes must be >= 16");
  if (spec.files == 0 || spec.records < spec.files)
    throw std::runtime_error("need at least one record per file");
  std::string ext = spec.format == "lines" ? ".txt" : ".tfrecord";
  std::vector<std::string> paths;
  for (uint32_t f = 0; f < spec.files; ++f) {
    char name[32];
    std::snprintf(name, sizeof(name), "/part-%05u", f);
    paths.push_back(spec.dir + name + ext);
  }
  char manifest[256];
  std::snprintf(manifest, sizeof(manifest),
                "tailcut-straggler-data v1 %s records=%llu files=%u bytes=%u\n",
                spec.format.c_str(), static_cast<unsigned long long>(spec.records), spec.files,
                spec.record_bytes);
  std::string manifest_path = spec.dir + "/MANIFEST";
  {
    std::string have;
    if (FILE* in = std::fopen(manifest_path.c_str(), "rb")) {
      char buf[256];
      size_t n = std::fread(buf, 1, sizeof(buf), in);
      have.assign(buf, n);
      std::fclose(in);
    }
    bool all = have == manifest;
    for (const auto& p : paths) {
      struct stat st;
      all = all && ::stat(p.c_str(), &st) == 0;
    }
    if (all) {
      if (generated) *generated = false;
      return paths;
    }
  }
  if (::mkdir(spec.dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw std::runtime_error("cannot create " + spec.dir + ": " + std::strerror(errno));
  ::unlink(manifest_path.c_str());
  std::string payload(spec.record_bytes, 'x');
  std::string out;
  for (uint32_t f = 0; f < spec.files; ++f) {
    uint64_t lo = f * spec.records / spec.files, hi = (f + 1) * spec.records / spec.files;
    FILE* file = std::fopen(paths[f].c_str(), "wb");
    if (file == nullptr)
      throw std::runtime_error("cannot write " + paths[f] + ": " + std::strerror(errno));
    out.clear();
    for (uint64_t id = lo; id < hi; ++id) {
      char digits[24];
      std::snprintf(digits, sizeof(digits), "%012llu", static_cast<unsigned long long>(id));
      std::memcpy(payload.data(), digits, 12);
      payload[12] = ' ';
      for (size_t i = 13; i + 1 < payload.size(); ++i)
        payload[i] = static_cast<char>('a' + (id + i) % 26);
      if (spec.format == "lines") {
        payload.back() = '\n';
        out += payload;
      } else {
        payload.back() = '.';
        AppendTfrecord(&out, payload);
      }
      if (out.size() >= (8u << 20) || id + 1 == hi) {
        if (std::fwrite(out.data(), 1, out.size(), file) != out.size())
          throw std::runtime_error("cannot write " + paths[f] + ": " + std::strerror(errno));
        out.clear();
      }
    }
    if (std::fclose(file) != 0) throw std::runtime_error("cannot write " + paths[f]);
  }
  FILE* m = std::fopen(manifest_path.c_str(), "wb");
  if (m == nullptr) throw std::runtime_error("cannot write " + manifest_path);
  std::fputs(manifest, m);
  std::fclose(m);
  if (generated) *generated = true;
  return paths;
}

// ---------------------------------------------------------------- runs

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kStatic:
      return "static";
    case Strategy::kElastic:
      return "elastic";
    case Strategy::kSplit:
      return "split";
  }
  return "?";
}

bool ParseStrategy(const std::string& name, Strategy* s) {
  if (name == "static")
    *s = Strategy::kStatic;
  else if (name == "elastic")
    *s = Strategy::kElastic;
  else if (name == "split")
    *s = Strategy::kSplit;
  else
    return false;
  return true;
}

bool IsSlow(const RunConfig& c, int rank) { return rank >= c.processes - c.slow; }

double IdealSeconds(const RunConfig& c) {
  double speed =
      (c.processes - c.slow) / c.cost_us + c.slow / (c.cost_us * c.slowdown);  // records/us
  return static_cast<double>(c.records * c.epochs) / speed / 1e6;
}

namespace {

enum MsgKind : uint32_t { kMsgStart = 1, kMsgSegment, kMsgProgress, kMsgDone, kMsgError };

// One message, 128 bytes.
struct Msg {
  uint32_t kind = 0;
  int32_t rank = 0;
  uint64_t epoch = 0, ticket = 0, item = 0;  // segment: the item (item: its index)
  uint64_t begin = 0, end = 0;               // segment: its original range
  uint64_t t0 = 0, t1 = 0;   // segment: work start/end; start: t0; done: t1 = last work end
  uint64_t records = 0;      // segment: its records; progress/done: total so far
  uint64_t sum = 0, xr = 0;  // segment digest
  uint64_t splits = 0, recovered = 0;  // done: from the queue's client stats
  uint32_t piece = 0;
  uint32_t items = 0;  // done: segments
  char text[16] = {};  // error: the start of the message
};
static_assert(sizeof(Msg) == 128 && sizeof(Msg) <= PIPE_BUF);

void Send(int fd, const Msg& m) {
  ssize_t n;
  do n = ::write(fd, &m, sizeof(m));
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(m))) std::_Exit(3);
}

WorkQueueOptions QueueOptionsFor(const RunConfig& c, int rank) {
  WorkQueueOptions o;
  uint64_t slices = c.slices ? c.slices : 10ull * c.processes;
  o.num_epochs = c.epochs;
  o.format = RecordFormat::Parse(c.format).Tag();
  o.min_split_bytes = c.min_split_bytes;
  o.seed = c.seed;
  if (c.strategy == Strategy::kStatic) {
    // Rank r's shard: files r, r + P, r + 2P, ...; its own queue, in order.
    for (size_t f = rank; f < c.paths.size(); f += c.processes) o.works.push_back(c.paths[f]);
    o.num_slices = std::max<uint64_t>(1, slices * o.works.size() / c.paths.size());
    o.shuffle = false;
    o.num_clients = 1;
    o.split_tail = false;
    o.name = c.name + "." + std::to_string(rank);
  } else {
    o.works = c.paths;
    o.num_slices = slices;
    o.num_clients = static_cast<uint32_t>(c.processes);
    o.split_tail = c.strategy == Strategy::kSplit;
    o.name = c.name;
  }
  return o;
}

// The body of one trainer process. Never returns.
[[noreturn]] void TrainerMain(const RunConfig& c, int rank, int fd, uint64_t start_ns) {
  Msg err{};
  err.kind = kMsgError;
  err.rank = rank;
  try {
    WorkQueueOptions qo = QueueOptionsFor(c, rank);
    if (c.strategy == Strategy::kStatic && qo.works.empty()) {
      Msg d{};
      d.kind = kMsgDone;
      d.rank = rank;
      d.t0 = d.t1 = start_ns;
      Send(fd, d);
      std::_Exit(0);
    }
    if (c.quiet_notices) qo.on_notice = [](const std::string&) {};
    auto queue = WorkQueue::Open(qo);
    ReaderOptions ro;
    ro.format = RecordFormat::Parse(c.format);
    ro.chunk_bytes = c.chunk_bytes;
    ro.buffer_budget_bytes = c.buffer_bytes;
    ro.prefetch_items = c.prefetch_items;
    ro.cuda_register = false;
    if (c.quiet_notices) ro.on_notice = [](const std::string&) {};
    auto reader = Reader::Open(*queue, ro);
    const double cost_ns = c.cost_us * 1000.0 * (IsSlow(c, rank) ? c.slowdown : 1.0);

    std::this_thread::sleep_until(
        std::chrono::steady_clock::time_point(std::chrono::nanoseconds(start_ns)));
    Msg start{};
    start.kind = kMsgStart;
    start.rank = rank;
    start.t0 = NowNs();
    Send(fd, start);

    std::vector<Record> batch(c.batch);
    Msg seg{};  // the item being trained on
    bool open = false;
    uint64_t total = 0, last_report = start.t0, work_end = start.t0;
    double target = static_cast<double>(start.t0);
    uint32_t items = 0;
    auto flush = [&]() {
      if (!open) return;
      seg.t1 = work_end;
      Send(fd, seg);
      ++items;
      open = false;
    };
    size_t n = 0;
    ReadStatus st;
    // `target` is when the work handed out so far is done: it advances by the
    // records' cost plus the time spent waiting for data, so a late wake-up
    // from one sleep shortens the next instead of being lost.
    uint64_t before = NowNs();
    while ((st = reader->NextBatch(batch.data(), batch.size(), &n)) == ReadStatus::kOk) {
      uint64_t now = NowNs();
      target += static_cast<double>(now - before);
      WorkItem it = reader->current_item();
      if (!open || it.ticket != seg.ticket || it.begin != seg.begin ||
          (it.piece ? 1u : 0u) != seg.piece) {
        // Only reached after the previous item was acked (the Reader acks
        // it when the consumer asks past its last record).
        flush();
        seg = Msg{};
        seg.kind = kMsgSegment;
        seg.rank = rank;
        seg.epoch = it.epoch;
        seg.ticket = it.ticket;
        seg.item = it.index;
        seg.begin = it.begin;
        seg.end = it.end;
        seg.piece = it.piece ? 1 : 0;
        seg.t0 = now;
        open = true;
      }
      for (size_t i = 0; i < n; ++i) {
        uint64_t id = RecordId(batch[i].data, batch[i].size);
        if (id == UINT64_MAX) throw std::runtime_error("record without id");
        Digest d{seg.records, seg.sum, seg.xr};
        d.Add(id);
        seg.records = d.count;
        seg.sum = d.sum;
        seg.xr = d.xr;
      }
      total += n;
      target += cost_ns * static_cast<double>(n);
      std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
          std::chrono::nanoseconds(static_cast<uint64_t>(target))));
      work_end = before = NowNs();
      if (work_end - last_report >= 100'000'000) {
        Msg p{};
        p.kind = kMsgProgress;
        p.rank = rank;
        p.records = total;
        Send(fd, p);
        last_report = work_end;
      }
    }
    if (st == ReadStatus::kError) throw std::runtime_error(reader->error());
    flush();
    Msg done{};
    done.kind = kMsgDone;
    done.rank = rank;
    done.t0 = start.t0;
    done.t1 = work_end;
    done.records = total;
    done.items = items;
    QueueStats qs = queue->Stats();
    for (const auto& cs : qs.clients)
      if (cs.pid == ::getpid()) {
        done.splits = cs.splits;
        done.recovered = cs.items_recovered;
      }
    reader->Close();
    queue->Close();
    Send(fd, done);
    std::_Exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer %d (pid %d): %s\n", rank, ::getpid(), e.what());
    std::snprintf(err.text, sizeof(err.text), "%s", e.what());
    Send(fd, err);
    std::_Exit(1);
  }
}

}  // namespace

RunResult Run(const RunConfig& config, const TickFn& tick, double tick_s) {
  RunResult r;
  r.config = config;
  r.ideal = IdealSeconds(config);
  r.expected = ExpectedDigest(config.records);
  r.epoch_digests.assign(config.epochs, Digest{});
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  uint64_t start_ns = NowNs() + static_cast<uint64_t>(config.start_delay_s * 1e9);
  r.procs.resize(config.processes);
  for (int p = 0; p < config.processes; ++p) {
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(fds[0]);
      TrainerMain(config, p, fds[1], start_ns);
    }
    r.procs[p].rank = p;
    r.procs[p].pid = pid;
    r.procs[p].slow = IsSlow(config, p);
  }
  ::close(fds[1]);
  auto secs = [&](uint64_t ns) {
    return (static_cast<double>(ns) - static_cast<double>(start_ns)) / 1e9;
  };
  int running = config.processes;
  bool pipe_open = true;
  uint64_t next_tick = start_ns;
  std::vector<Msg> buf(64);
  while (running > 0 || pipe_open) {
    pollfd pfd{fds[0], POLLIN, 0};
    int wait_ms = running > 0 ? 50 : 1000;
    if (pipe_open && ::poll(&pfd, 1, wait_ms) > 0) {
      ssize_t n = ::read(fds[0], buf.data(), buf.size() * sizeof(Msg));
      if (n == 0) pipe_open = false;
      for (ssize_t i = 0; i + static_cast<ssize_t>(sizeof(Msg)) <= n; i += sizeof(Msg)) {
        const Msg& m = buf[i / sizeof(Msg)];
        if (m.rank < 0 || m.rank >= config.processes) continue;
        ProcResult& pr = r.procs[m.rank];
        switch (m.kind) {
          case kMsgStart:
            pr.start = secs(m.t0);
            break;
          case kMsgProgress:
            pr.progress = m.records;
            break;
          case kMsgSegment: {
            Segment s{m.rank,    m.epoch,      m.item,     m.begin,   m.end,
                      m.records, m.piece != 0, secs(m.t0), secs(m.t1)};
            r.segments.push_back(s);
            pr.records += m.records;
            pr.end = std::max(pr.end, s.t1);
            if (m.epoch < r.epoch_digests.size())
              r.epoch_digests[m.epoch].Merge(Digest{m.records, m.sum, m.xr});
            break;
          }
          case kMsgDone:
            pr.done = true;
            pr.end = secs(m.t1);
            pr.progress = m.records;
            pr.items = m.items;
            pr.splits = m.splits;
            pr.recovered = m.recovered;
            break;
          case kMsgError:
            pr.failed = true;
            if (r.error.empty()) r.error = "trainer " + std::to_string(m.rank) + ": " + m.text;
            break;
        }
      }
    } else if (!pipe_open && running > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    }
    int status;
    pid_t pid;
    while (running > 0 && (pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      --running;
      for (auto& pr : r.procs)
        if (pr.pid == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !pr.killed)
          pr.failed = true;
    }
    uint64_t now = NowNs();
    if (tick && now >= next_tick && running > 0) {
      next_tick = now + static_cast<uint64_t>(tick_s * 1e9);
      int victim = tick(r, secs(now));
      if (victim >= 0 && victim < config.processes && !r.procs[victim].killed &&
          !r.procs[victim].done) {
        ::kill(r.procs[victim].pid, SIGKILL);
        r.procs[victim].killed = true;
        r.procs[victim].end = secs(NowNs());
      }
    }
  }
  ::close(fds[0]);
  if (config.strategy == Strategy::kStatic) {
    for (int p = 0; p < config.processes; ++p) try {  // left only by a failed rank
        RemoveQueue(config.name + "." + std::to_string(p), true);
      } catch (const Error&) {
      }
  } else {
    // A queue one of whose processes died is kept for a rerun to resume,
    // finished or not (work_queue.h, Lifetime): after a kill, the run's
    // queue stays unless removed here. Every process of the run is gone.
    try {
      RemoveQueue(config.name, true);
    } catch (const Error&) {  // kNotFound: its last process removed it
    }
  }
  double last = 0;
  for (const auto& pr : r.procs) last = std::max(last, pr.end);
  r.makespan = last;
  int fast = 0;
  for (const auto& pr : r.procs) {
    if (pr.failed && r.error.empty()) r.error = "trainer " + std::to_string(pr.rank) + " failed";
    r.splits += pr.splits;
    r.recovered += pr.recovered;
    if (pr.slow || pr.killed) continue;
    ++fast;
    r.idle_fast_mean += last - pr.end;
    r.idle_fast_max = std::max(r.idle_fast_max, last - pr.end);
  }
  if (fast) r.idle_fast_mean /= fast;
  for (const auto& s : r.segments) r.pieces += s.piece;
  r.exactly_once = r.error.empty();
  for (const auto& d : r.epoch_digests) r.exactly_once = r.exactly_once && d == r.expected;
  return r;
}

}  // namespace tailcut::trainer_sim
