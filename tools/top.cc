// tools/top.cc: `tailcut top NAME`, a live view of one queue.
#include "tools/top.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut_cli {

namespace {

volatile sig_atomic_t g_stop = 0;

std::string Bar(uint64_t done, uint64_t total, int width) {
  int filled = total == 0 ? width : static_cast<int>(static_cast<double>(width) * done / total);
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

struct Sample {
  uint64_t items_acked = 0, bytes_acked = 0, at_ns = 0;
};

// One frame. `previous` holds the last sample per client slot (rates are the
// change since then); it is updated.
std::string Frame(const tailcut::QueueStats& s, std::map<uint32_t, Sample>* previous) {
  std::string out;
  uint64_t remaining = s.total - std::min(s.total, s.done + s.in_flight);
  out += "queue " + s.name + "   epoch " + std::to_string(std::min(s.epoch + 1, s.num_epochs)) +
         "/" + std::to_string(s.num_epochs) + "   clients " + std::to_string(s.clients_joined) +
         " joined (" + std::to_string(s.num_clients) + " expected)\n";
  out += Bar(s.done, s.total, 40) + " " + Fixed(s.total ? 100.0 * s.done / s.total : 100.0, 1) +
         "%   done " + std::to_string(s.done) + "   in flight " + std::to_string(s.in_flight) +
         "   remaining " + std::to_string(remaining) + " of " + std::to_string(s.total) + "\n";
  out += "recovered " + std::to_string(s.recovered_items) + "   tails split " +
         std::to_string(s.splits) + "   stale acks " + std::to_string(s.stale_acks) + "\n\n";

  struct Row {
    const tailcut::ClientStats* c;
    double items_per_s, mb_per_s, idle_pct;
  };
  std::vector<Row> rows;
  std::vector<double> live_rates;
  for (const tailcut::ClientStats& c : s.clients) {
    Sample now{c.items_acked, c.bytes_acked, s.now_ns};
    auto it = previous->find(c.slot);
    Sample before = it != previous->end() && it->second.items_acked <= c.items_acked
                        ? it->second
                        : Sample{0, 0, c.joined_ns};
    double secs = now.at_ns > before.at_ns ? (now.at_ns - before.at_ns) / 1e9 : 0;
    Row r{&c, secs > 0 ? (now.items_acked - before.items_acked) / secs : 0,
          secs > 0 ? (now.bytes_acked - before.bytes_acked) / secs / 1e6 : 0,
          c.busy_ns + c.idle_ns ? 100.0 * c.idle_ns / (c.busy_ns + c.idle_ns) : 0};
    (*previous)[c.slot] = now;
    if (c.alive) live_rates.push_back(r.items_per_s);
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
  std::snprintf(line, sizeof(line), "%5s %8s %-8s %9s %8s %6s %6s %7s %6s  %s\n", "slot", "pid",
                "state", "items/s", "MB/s", "acked", "open", "idle%", "splits", "");
  out += line;
  for (const Row& r : rows) {
    const tailcut::ClientStats& c = *r.c;
    std::string state = c.alive ? "alive" : "gone";
    std::string note;
    if (&c == straggler) note = "<- straggler";
    if (c.alive && c.open_items == 0 && r.items_per_s == 0) note = "idle";
    if (!c.alive && c.items_taken > c.items_acked + c.items_given_back) note = "items recovered";
    std::snprintf(line, sizeof(line), "%5u %8d %-8s %9s %8s %6llu %6llu %7s %6llu  %s\n", c.slot,
                  c.pid, state.c_str(), Fixed(r.items_per_s, 1).c_str(),
                  Fixed(r.mb_per_s, 1).c_str(), static_cast<unsigned long long>(c.items_acked),
                  static_cast<unsigned long long>(c.open_items), Fixed(r.idle_pct, 0).c_str(),
                  static_cast<unsigned long long>(c.splits), note.c_str());
    out += line;
  }
  return out;
}

}  // namespace

int RunTop(const std::string& name, bool once, double interval_s) {
  std::map<uint32_t, Sample> previous;
  bool tty = ::isatty(STDOUT_FILENO) == 1;
  ::signal(SIGINT, [](int) { g_stop = 1; });
  bool first = true;
  while (!g_stop) {
    tailcut::QueueStats stats;
    try {
      stats = tailcut::InspectQueue(name);
    } catch (const tailcut::Error& e) {
      if (first || e.kind() != tailcut::ErrorKind::kNotFound) throw;
      std::printf("queue '%s' is gone (finished and removed by its last process)\n", name.c_str());
      return 0;
    }
    std::string frame = Frame(stats, &previous);
    if (tty && !once) std::fputs("\x1b[H\x1b[2J", stdout);
    std::fputs(frame.c_str(), stdout);
    if (!tty && !once) std::fputs("\n", stdout);
    std::fflush(stdout);
    first = false;
    if (once) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
  }
  return 0;
}

}  // namespace tailcut_cli
