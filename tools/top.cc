// tools/top.cc: `tailcut top`, a live view of one queue and its batch ring.
#include "tools/top.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tailcut/work_queue.h"
#include "tools/pool_status.h"

namespace tailcut_cli {

namespace {

volatile sig_atomic_t g_stop = 0;

std::string Bar(uint64_t done, uint64_t total, int width) {
  int filled = total == 0 ? width : static_cast<int>(static_cast<double>(width) * done / total);
  filled = std::clamp(filled, 0, width);
  std::string bar = "[";
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  bar += ']';
  return bar;
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// Rates count what a client reads, not what it acks: a reader that shuffles
// records acks an item only once its last record has left the buffer, so an
// acked rate stays at 0 while it reads. Records are those its readers report.
struct Sample {
  uint64_t items_taken = 0, records = 0, bytes_acked = 0, at_ns = 0, joined_ns = 0;
};

// One frame. `previous` holds the last sample per client slot (rates are the
// change since then); it is updated. `loaders`: pids the queue's batch ring
// knows as loaders (the other live clients are the ranks), empty without a
// ring. An index work (a map-style dataset's) counts samples, not records
// and bytes. Adds the frame's numbers to *json.
std::string Frame(const tailcut::QueueStats& s, std::map<uint32_t, Sample>* previous,
                  const std::set<int32_t>& loaders, nlohmann::json* json) {
  std::string out;
  const bool samples = s.num_samples != 0;
  uint64_t remaining = s.total - std::min(s.total, s.done + s.in_flight);
  uint64_t live = 0, live_loaders = 0;
  for (const tailcut::ClientStats& c : s.clients) {
    live += c.alive;
    live_loaders += c.alive && loaders.count(c.pid) > 0;
  }
  // A map-style dataset's queue counts epochs up to a cap (100 by default),
  // not the job's: its loop decides how many run.
  out += "queue " + s.name + "   epoch " + std::to_string(std::min(s.epoch + 1, s.num_epochs)) +
         (samples ? " (of at most " + std::to_string(s.num_epochs) + ")   "
                  : "/" + std::to_string(s.num_epochs) + "   ");
  if (!loaders.empty()) {
    // A pool: its loaders take the items, its ranks agree on steps.
    out += "processes " + std::to_string(live - live_loaders) + " ranks, " +
           std::to_string(live_loaders) + " loaders\n";
  } else {
    // Live processes, and every join since the start: DataLoader workers open
    // the queue again each epoch, each a new client, so the second grows.
    out += "clients " + std::to_string(live) + " live, " + std::to_string(s.clients_joined) +
           " joined since the start (" + std::to_string(s.num_clients) + " expected)\n";
  }
  nlohmann::json& q = (*json)["queue"];
  q = {{"name", s.name},
       {"epoch", std::min(s.epoch + 1, s.num_epochs)},
       {"num_epochs", s.num_epochs},
       {"num_samples", s.num_samples},
       {"done", s.done},
       {"in_flight", s.in_flight},
       {"total", s.total},
       {"recovered_items", s.recovered_items},
       {"ranks", loaders.empty() ? nlohmann::json(nullptr) : nlohmann::json(live - live_loaders)},
       {"loaders", loaders.empty() ? nlohmann::json(nullptr) : nlohmann::json(live_loaders)},
       {"clients", nlohmann::json::array()}};
  out += Bar(s.done, s.total, 40) + " " + Fixed(s.total ? 100.0 * s.done / s.total : 100.0, 1) +
         "%   done " + std::to_string(s.done) + "   in flight " + std::to_string(s.in_flight) +
         "   remaining " + std::to_string(remaining) + " of " + std::to_string(s.total) + "\n";
  out += "recovered " + std::to_string(s.recovered_items) + "   tails split " +
         std::to_string(s.splits) + "   stale acks " + std::to_string(s.stale_acks) + "\n\n";

  struct Row {
    const tailcut::ClientStats* c;
    double items_per_s, records_per_s, mb_per_s, idle_pct;
  };
  std::vector<Row> rows;
  std::vector<double> live_rates;
  uint64_t gone_clean = 0;
  for (const tailcut::ClientStats& c : s.clients) {
    Sample now{c.items_taken, c.records, c.bytes_acked, s.now_ns, c.joined_ns};
    auto it = previous->find(c.slot);
    // A slot another client joined since is a new client: its rates start
    // at its join.
    Sample before = it != previous->end() && it->second.joined_ns == c.joined_ns
                        ? it->second
                        : Sample{0, 0, 0, c.joined_ns, c.joined_ns};
    double secs = now.at_ns > before.at_ns ? (now.at_ns - before.at_ns) / 1e9 : 0;
    auto rate = [&](uint64_t a, uint64_t b) { return secs > 0 && a >= b ? (a - b) / secs : 0; };
    Row r{&c, rate(now.items_taken, before.items_taken), rate(now.records, before.records),
          rate(now.bytes_acked, before.bytes_acked) / 1e6,
          c.busy_ns + c.idle_ns ? 100.0 * c.idle_ns / (c.busy_ns + c.idle_ns) : 0};
    (*previous)[c.slot] = now;
    if (c.alive) live_rates.push_back(r.items_per_s);
    // A client gone cleanly (a DataLoader worker at its epoch's end) is
    // counted, not listed: one listed per epoch and worker buries the live.
    bool recovered = c.items_taken > c.items_acked + c.items_given_back;
    if (!c.alive && !recovered) {
      ++gone_clean;
      continue;
    }
    rows.push_back(r);
  }
  // The straggler: the slowest live client still holding items, when it
  // runs at under half the median rate of the live clients.
  const tailcut::ClientStats* straggler = nullptr;
  if (live_rates.size() >= 2) {
    std::vector<double> sorted = live_rates;
    std::sort(sorted.begin(), sorted.end());
    double median = sorted[sorted.size() / 2];
    double slowest = median;
    for (const Row& r : rows)
      if (r.c->alive && r.c->open_items > 0 && r.items_per_s < 0.5 * median &&
          r.items_per_s <= slowest) {
        slowest = r.items_per_s;
        straggler = r.c;
      }
  }
  char line[256];
  const char* role_head = loaders.empty() ? "" : "role   ";
  // An index work's bytes are positions: samples, and no records to count.
  if (samples) {
    std::snprintf(line, sizeof(line), "%5s %8s %-8s %s%9s %10s %6s %6s %7s %6s  %s\n", "slot",
                  "pid", "state", role_head, "items/s", "samples/s", "acked", "open", "idle%",
                  "splits", "");
  } else {
    std::snprintf(line, sizeof(line), "%5s %8s %-8s %s%9s %9s %8s %6s %6s %7s %6s  %s\n", "slot",
                  "pid", "state", role_head, "items/s", "recs/s", "MB/s", "acked", "open", "idle%",
                  "splits", "");
  }
  out += line;
  for (const Row& r : rows) {
    const tailcut::ClientStats& c = *r.c;
    std::string state = c.alive ? "alive" : "gone";
    const char* role = loaders.empty() ? "" : loaders.count(c.pid) ? "loader" : "rank";
    // The role column is shown with a pool only.
    const std::string role_cell =
        loaders.empty() ? "" : (std::string(role) + "      ").substr(0, 7);
    std::string note;
    if (&c == straggler) note = "<- straggler";
    // A pool's ranks take no items: idle is a loader's or a reader's word.
    if (c.alive && c.open_items == 0 && r.items_per_s == 0 && std::string(role) != "rank")
      note = "idle";
    if (!c.alive && c.items_taken > c.items_acked + c.items_given_back) note = "items recovered";
    if (samples) {
      std::snprintf(line, sizeof(line), "%5u %8d %-8s %s%9s %10s %6llu %6llu %7s %6llu  %s\n",
                    c.slot, c.pid, state.c_str(), role_cell.c_str(),
                    Fixed(r.items_per_s, 1).c_str(), Fixed(r.mb_per_s * 1e6, 0).c_str(),
                    static_cast<unsigned long long>(c.items_acked),
                    static_cast<unsigned long long>(c.open_items), Fixed(r.idle_pct, 0).c_str(),
                    static_cast<unsigned long long>(c.splits), note.c_str());
    } else {
      std::snprintf(line, sizeof(line), "%5u %8d %-8s %s%9s %9s %8s %6llu %6llu %7s %6llu  %s\n",
                    c.slot, c.pid, state.c_str(), role_cell.c_str(),
                    Fixed(r.items_per_s, 1).c_str(), Fixed(r.records_per_s, 0).c_str(),
                    Fixed(r.mb_per_s, 1).c_str(), static_cast<unsigned long long>(c.items_acked),
                    static_cast<unsigned long long>(c.open_items), Fixed(r.idle_pct, 0).c_str(),
                    static_cast<unsigned long long>(c.splits), note.c_str());
    }
    out += line;
    nlohmann::json row = {
        {"pid", c.pid},
        {"alive", c.alive},
        {"role", loaders.empty() ? nlohmann::json(nullptr) : nlohmann::json(role)},
        {"items_per_s", r.items_per_s},
        {"items_acked", c.items_acked},
        {"open_items", c.open_items},
        {"idle_share", r.idle_pct / 100},
        {"straggler", &c == straggler}};
    if (samples) {
      row["samples_per_s"] = r.mb_per_s * 1e6;
    } else {
      row["records_per_s"] = r.records_per_s;
      row["mb_per_s"] = r.mb_per_s;
    }
    q["clients"].push_back(std::move(row));
  }
  if (gone_clean > 0)
    out += "(" + std::to_string(gone_clean) + " more gone: closed the queue with nothing open)\n";
  return out;
}

// A trainer is starving when it spent at least this share of the time since
// the last frame (the first frame: its lifetime) waiting for a batch...
constexpr double kStarvingWaitShare = 0.5;
// ...or has been waiting for one this long now.
constexpr double kStarvingWaitSeconds = 1.0;
// The job is input-bound when its ranks, on average, waited this share of
// the window for their batches.
constexpr double kInputBoundShare = 0.1;

struct RingSample {
  uint64_t batches = 0, wait_ns = 0, at_ns = 0, joined_ns = 0;
};

// The ring's part of a frame. `previous` holds the last sample per client
// slot (rates and wait shares are the change since then); it is updated.
std::string RingFrame(const tailcut::BatchRingStats& s, std::map<uint32_t, RingSample>* previous,
                      nlohmann::json* json) {
  std::string out;
  nlohmann::json& r = (*json)["ring"];
  r = {{"name", s.name},
       {"num_slots", s.num_slots},
       {"ready", s.ready},
       {"filling", s.filling},
       {"free", s.free},
       {"published", s.published},
       {"popped", s.popped},
       {"released", s.released},
       {"state", RingStateText(s)},
       {"clients", nlohmann::json::array()}};
  // The verdict: how much of the window the ranks waited for batches, and
  // the loader that published least.
  double rank_wait = 0, window = 0, slowest_rate = -1;
  int ranks = 0;
  int32_t slowest_pid = 0;
  out += "ring " + s.name + "   " + std::to_string(s.num_slots) + " slots x " +
         Fixed(static_cast<double>(s.slot_bytes) / (1 << 20), 1) + " MiB   fill " +
         Bar(s.ready, s.num_slots, 20) + " " + std::to_string(s.ready) + "/" +
         std::to_string(s.num_slots) + " ready   " + std::to_string(s.filling) + " filling   " +
         std::to_string(s.popped) + " popped   " + std::to_string(s.free) + " free\n";
  out += "batches " + std::to_string(s.published) + " published   " + std::to_string(s.released) +
         " released   " + std::to_string(s.redelivered) + " redelivered   " +
         std::to_string(s.reclaimed) + " slots reclaimed   state " + RingStateText(s) + "\n\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%5s %8s %-8s %-6s %9s %8s %6s %8s  %s\n", "slot", "pid",
                "role", "state", "batches/s", "batches", "wait%", "wait s", "");
  out += line;
  for (const tailcut::RingClientStats& c : s.clients) {
    const bool loader = c.role == tailcut::RingRole::kLoader;
    const double waited_s = c.wait_seconds + c.waiting_seconds;
    RingSample now{loader ? c.published : c.popped, static_cast<uint64_t>(waited_s * 1e9), s.now_ns,
                   c.joined_ns};
    // A slot taken over by another process, or counters that went back:
    // start from its joining.
    auto it = previous->find(c.slot);
    RingSample before = it != previous->end() && it->second.joined_ns == c.joined_ns &&
                                it->second.batches <= now.batches &&
                                it->second.wait_ns <= now.wait_ns
                            ? it->second
                            : RingSample{0, 0, c.joined_ns, c.joined_ns};
    (*previous)[c.slot] = now;
    const double secs = now.at_ns > before.at_ns ? (now.at_ns - before.at_ns) / 1e9 : 0;
    const double rate = secs > 0 ? (now.batches - before.batches) / secs : 0;
    const double share = secs > 0 ? std::min(1.0, (now.wait_ns - before.wait_ns) / 1e9 / secs) : 0;
    std::string note;
    if (!loader && c.alive &&
        (share >= kStarvingWaitShare || c.waiting_seconds >= kStarvingWaitSeconds)) {
      note = "<- starving";
    } else if (loader && c.alive && share >= kStarvingWaitShare) {
      note = "waits for free slots";
    }
    std::snprintf(line, sizeof(line), "%5u %8d %-8s %-6s %9s %8llu %6s %8s  %s\n", c.slot, c.pid,
                  loader ? "loader" : "trainer", c.alive ? "alive" : "gone", Fixed(rate, 1).c_str(),
                  static_cast<unsigned long long>(now.batches), Fixed(100 * share, 0).c_str(),
                  Fixed(waited_s, 2).c_str(), note.c_str());
    out += line;
    r["clients"].push_back({{"pid", c.pid},
                            {"role", loader ? "loader" : "trainer"},
                            {"alive", c.alive},
                            {"batches", now.batches},
                            {"batches_per_s", rate},
                            {"wait_share", share},
                            {"wait_seconds", waited_s}});
    if (!c.alive) continue;
    if (loader) {
      if (slowest_rate < 0 || rate < slowest_rate) slowest_rate = rate, slowest_pid = c.pid;
    } else {
      rank_wait += share;
      window = std::max(window, secs);
      ++ranks;
    }
  }
  if (s.clients.empty()) out += "(no loaders or trainers)\n";
  if (ranks > 0) {
    rank_wait /= ranks;
    const bool bound = rank_wait >= kInputBoundShare;
    out += std::string(bound ? "input-bound" : "not input-bound") + ": the ranks waited " +
           Fixed(100 * rank_wait, 0) + "% of the last " + Fixed(window, 1) + " s for batches";
    if (bound && slowest_pid != 0)
      out += "; slowest loader: pid " + std::to_string(slowest_pid) + " (" +
             Fixed(slowest_rate, 1) + " batches/s)";
    out += "\n";
    r["verdict"] = {{"input_bound", bound},
                    {"rank_wait_share", rank_wait},
                    {"window_seconds", window},
                    {"slowest_loader_pid",
                     slowest_pid != 0 ? nlohmann::json(slowest_pid) : nlohmann::json(nullptr)}};
  }
  return out;
}

// The ring part of this frame: its frame with the pool's status (autoscale
// decisions, shares) under it, a line saying it is gone, or nothing when
// top looks for a queue's default ring and there is none.
// Throws kNotFound when a named ring does not exist at the first frame.
std::string RingPart(const std::string& ring, bool named, bool first,
                     std::map<uint32_t, RingSample>* previous, bool* gone,
                     std::set<int32_t>* loaders, nlohmann::json* json) {
  *gone = false;
  tailcut::BatchRingStats stats;
  try {
    stats = tailcut::InspectBatchRing(ring);
  } catch (const tailcut::Error& e) {
    if (e.kind() == tailcut::ErrorKind::kNotFound ||
        (!named && e.kind() == tailcut::ErrorKind::kInvalidArgument)) {
      if (named && first) throw;
      *gone = named;
      previous->clear();
      return named ? "ring " + ring + " is gone (removed by its last process)\n" : "";
    }
    return "ring " + ring + ": unreadable: " + e.what() + "\n";
  }
  for (const tailcut::RingClientStats& c : stats.clients)
    if (c.role == tailcut::RingRole::kLoader) loaders->insert(c.pid);
  return RingFrame(stats, previous, json) + PoolStatusPart(ring);
}

}  // namespace

std::string RingStateText(const tailcut::BatchRingStats& stats) {
  if (stats.closed) return "closed";
  const bool trainers = std::any_of(stats.clients.begin(), stats.clients.end(), [](const auto& c) {
    return c.alive && c.role == tailcut::RingRole::kTrainer;
  });
  if (stats.ready == 0 && trainers) return "STARVING: no batch ready for the trainers; add loaders";
  if (stats.free == 0 && stats.filling == 0) return "full: loaders wait for trainers to release";
  return "flowing";
}

std::string DefaultRingName(const std::string& queue) { return queue + ".pool"; }

int RunTop(const TopOptions& options) {
  const std::string& name = options.queue;
  const bool named_ring = !options.ring.empty();
  const std::string ring = named_ring ? options.ring : DefaultRingName(name);
  std::map<uint32_t, Sample> previous;
  std::map<uint32_t, RingSample> previous_ring;
  bool tty = ::isatty(STDOUT_FILENO) == 1;
  ::signal(SIGINT, [](int) { g_stop = 1; });
  bool first = true;
  while (!g_stop) {
    std::string frame;
    nlohmann::json json = nlohmann::json::object();
    // The ring first: it says which of the queue's processes are loaders.
    bool ring_gone = false;
    std::set<int32_t> loaders;
    std::string ring_part =
        RingPart(ring, named_ring, first, &previous_ring, &ring_gone, &loaders, &json);
    if (!name.empty()) {
      tailcut::QueueStats stats;
      try {
        stats = tailcut::InspectQueue(name);
      } catch (const tailcut::Error& e) {
        if (first || e.kind() != tailcut::ErrorKind::kNotFound) throw;
        std::printf("queue '%s' is gone (finished and removed by its last process)\n",
                    name.c_str());
        return 0;
      }
      frame = Frame(stats, &previous, loaders, &json);
    }
    if (name.empty() && ring_gone) {
      std::fputs(ring_part.c_str(), stdout);
      return 0;
    }
    if (!ring_part.empty()) frame += (frame.empty() ? "" : "\n") + ring_part;
    if (options.json) {
      // One object per frame, one line each: a script reads them as they come.
      std::fputs(
          (json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(),
          stdout);
    } else {
      if (tty && !options.once) std::fputs("\x1b[H\x1b[2J", stdout);
      std::fputs(frame.c_str(), stdout);
      if (!tty && !options.once) std::fputs("\n", stdout);
    }
    std::fflush(stdout);
    first = false;
    if (options.once) return 0;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(options.interval_s * 1000)));
  }
  return 0;
}

}  // namespace tailcut_cli
