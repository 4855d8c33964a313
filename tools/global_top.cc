// tools/global_top.cc: `tailcut top --coordinator URL NAME`.
#include "tools/global_top.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "tailcut/global_tier.h"

namespace tailcut_cli {

namespace {

volatile sig_atomic_t g_stop = 0;

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string Pad(const std::string& s, size_t width, bool right = true) {
  if (s.size() >= width) return s;
  std::string pad(width - s.size(), ' ');
  return right ? pad + s : s + pad;
}

std::string Frame(const tailcut::GlobalStats& s, std::map<std::string, uint64_t>* previous,
                  double seconds) {
  std::string out;
  uint64_t items = std::max<uint64_t>(s.num_items, 1);
  out += "job " + s.job + " on " + s.coordinator + "   epoch " +
         std::to_string(std::min(s.cursor, s.total) / items + (s.done < s.total ? 1 : 0)) + "/" +
         std::to_string(s.num_epochs) + "   block " + std::to_string(s.block_size) + " tickets\n";
  int width = 40;
  int filled = s.total == 0 ? width : static_cast<int>(double(width) * s.done / s.total);
  out += "done " + std::to_string(s.done) + "/" + std::to_string(s.total) + " [" +
         std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.') + "] " +
         Fixed(s.total ? 100.0 * s.done / s.total : 100.0, 1) + "%   handed out " +
         std::to_string(std::min(s.cursor, s.total)) + "   open blocks " +
         std::to_string(s.open_blocks.size()) + "   stale acks " + std::to_string(s.stale_acks) +
         "\n\n";
  out += Pad("HOST", 20, false) + Pad("CLAIMS", 8) + Pad("REOWNED", 9) + Pad("ACKED", 9) +
         Pad("ACKED/S", 9) + Pad("STALE", 7) + Pad("OPEN", 6) + Pad("DEADLINE", 10) + "\n";
  for (const tailcut::GlobalHostStats& h : s.hosts) {
    int open = 0;
    int64_t soonest = INT64_MAX;
    for (const tailcut::GlobalOpenBlock& b : s.open_blocks)
      if (b.host_id == h.host_id) {
        ++open;
        soonest = std::min(soonest, b.deadline_in_ms);
      }
    std::string rate = "-";
    auto it = previous->find(h.host_id);
    if (seconds > 0 && it != previous->end())
      rate = Fixed(double(h.acked - std::min(h.acked, it->second)) / seconds, 1);
    (*previous)[h.host_id] = h.acked;
    std::string deadline = open == 0     ? "-"
                           : soonest < 0 ? "EXPIRED"
                                         : Fixed(double(soonest) / 1000.0, 1) + " s";
    out += Pad(h.host_id, 20, false) + Pad(std::to_string(h.claims), 8) +
           Pad(std::to_string(h.reclaims), 9) + Pad(std::to_string(h.acked), 9) + Pad(rate, 9) +
           Pad(std::to_string(h.stale_acks + h.stale_renews), 7) + Pad(std::to_string(open), 6) +
           Pad(deadline, 10) + "\n";
  }
  int unheld = 0;
  for (const tailcut::GlobalOpenBlock& b : s.open_blocks) unheld += b.host_id.empty();
  if (unheld > 0)
    out += std::to_string(unheld) +
           " blocks restored from a checkpoint wait for a host to claim them\n";
  return out;
}

}  // namespace

int RunGlobalTop(const std::string& coordinator, const std::string& job, bool once,
                 double interval_s) {
  tailcut::GlobalTierOptions options;
  options.coordinator = coordinator;
  options.job.name = job;
  options.retry_for = std::chrono::milliseconds(3000);
  options.on_notice = [](const std::string&) {};
  std::map<std::string, uint64_t> previous;
  bool tty = ::isatty(STDOUT_FILENO) == 1;
  ::signal(SIGINT, [](int) { g_stop = 1; });
  auto last = std::chrono::steady_clock::now();
  bool first = true;
  while (!g_stop) {
    tailcut::GlobalStats stats = tailcut::GlobalTier::Inspect(options);
    auto now = std::chrono::steady_clock::now();
    std::string frame =
        Frame(stats, &previous, first ? 0.0 : std::chrono::duration<double>(now - last).count());
    last = now;
    first = false;
    if (tty && !once) std::fputs("\x1b[H\x1b[2J", stdout);
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    if (once) return 0;
    if (stats.done == stats.total) {
      std::printf("job '%s' is done on every host\n", job.c_str());
      return 0;
    }
    if (!tty) std::fputs("\n", stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
  }
  return 0;
}

}  // namespace tailcut_cli
