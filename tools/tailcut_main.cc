// tools/tailcut_main.cc: the `tailcut` command-line tool.
//
// Lists this user's queues, shows the counters of one queue and its clients,
// follows one live, and removes a queue. It reads segments through the
// library's tool calls (ListQueues, InspectQueue, RemoveQueue) and never joins
// a queue as a client. CLI11 parses the command line and writes --help;
// nlohmann-json writes `stat --json`. docs/cli.md describes the commands.
//
// Exit status: 0 on success; 1 when an operation fails (the library's message
// goes to stderr as "tailcut: <message>"); 2 on a usage error.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tailcut/error.h"
#include "tailcut/stats_fields.h"
#include "tailcut/work_queue.h"
#include "tools/clean.h"
#include "tools/top.h"
#ifdef TAILCUT_CLI_GLOBAL
#include "tools/global_top.h"
#endif

#ifndef TAILCUT_VERSION
#define TAILCUT_VERSION "unknown"
#endif

// stat --json: every field of QueueStats and ClientStats under its own name,
// from the one field list (tailcut/stats_fields.h); found by argument-
// dependent lookup, so in the structs' namespace.
namespace tailcut {
#define TAILCUT_JSON_FIELD(type, name, series, doc) json[#name] = stats.name;
void to_json(nlohmann::json& json, const ClientStats& stats) {
  TAILCUT_CLIENT_STATS_FIELDS(TAILCUT_JSON_FIELD)
}
void to_json(nlohmann::json& json, const QueueStats& stats) {
  TAILCUT_QUEUE_STATS_FIELDS(TAILCUT_JSON_FIELD)
  json["clients"] = stats.clients;
}
#undef TAILCUT_JSON_FIELD
NLOHMANN_JSON_SERIALIZE_ENUM(RingRole,
                             {{RingRole::kLoader, "loader"}, {RingRole::kTrainer, "trainer"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RingClientStats, slot, pid, alive, role, acquired, published,
                                   abandoned, popped, released, wait_seconds, waiting_seconds,
                                   joined_ns)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BatchRingStats, name, segment_path, slot_bytes, num_slots, free,
                                   filling, ready, popped, published, released, reclaimed,
                                   redelivered, stale_tokens, closed, ended_through, now_ns,
                                   clients)
}  // namespace tailcut

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// ---------------------------------------------------------------------------
// Formatting

std::string FormatFixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  return FormatFixed(100.0 * static_cast<double>(part) / static_cast<double>(whole), 1) + "%";
}

// The 1-based epoch now running, as "x/N"; "N/N" once every ticket is out.
std::string EpochText(const tailcut::QueueStats& stats) {
  const uint64_t current = std::min(stats.epoch + 1, stats.num_epochs);
  return std::to_string(current) + "/" + std::to_string(stats.num_epochs);
}

// How long ago a queue was made, e.g. "42s", "7m", "3h05m", "2d04h"; "-" if unknown.
std::string AgeText(uint64_t created_unix_ns) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  if (created_unix_ns == 0 || static_cast<int64_t>(created_unix_ns) > now_ns) return "-";
  const uint64_t s = (static_cast<uint64_t>(now_ns) - created_unix_ns) / 1000000000;
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%llus", static_cast<unsigned long long>(s));
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%llum", static_cast<unsigned long long>(s / 60));
  } else if (s < 86400) {
    std::snprintf(text, sizeof text, "%lluh%02llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60));
  } else {
    std::snprintf(text, sizeof text, "%llud%02lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s / 3600 % 24));
  }
  return text;
}

uint32_t AliveClients(const tailcut::QueueStats& stats) {
  return static_cast<uint32_t>(
      std::count_if(stats.clients.begin(), stats.clients.end(),
                    [](const tailcut::ClientStats& c) { return c.alive; }));
}

// Rates of one client over its lifetime: from joining to now while alive, to
// its last sign of progress once dead.
struct ClientRates {
  uint64_t lifetime_ns = 0;
  std::optional<double> items_per_s;  // acked items per second
  std::optional<double> idle_percent;
};

ClientRates RatesOf(const tailcut::ClientStats& client, uint64_t now_ns) {
  ClientRates rates;
  const uint64_t end_ns = client.alive ? now_ns : client.last_progress_ns;
  if (end_ns > client.joined_ns) {
    rates.lifetime_ns = end_ns - client.joined_ns;
  } else {
    rates.lifetime_ns = client.busy_ns + client.idle_ns;
  }
  if (rates.lifetime_ns > 0) {
    const double seconds = static_cast<double>(rates.lifetime_ns) / 1e9;
    rates.items_per_s = static_cast<double>(client.items_acked) / seconds;
    rates.idle_percent = std::min(100.0, 100.0 * static_cast<double>(client.idle_ns) /
                                             static_cast<double>(rates.lifetime_ns));
  }
  return rates;
}

// A plain text table: left-aligned text columns, right-aligned numbers. A
// row may instead carry one free text after its first cell (not measured).
class Table {
 public:
  struct Column {
    std::string header;
    bool right_aligned = false;
  };

  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

  void AddRow(std::vector<std::string> cells) { rows_.push_back({std::move(cells), {}}); }
  void AddNote(std::string first, std::string note) {
    rows_.push_back({{std::move(first)}, std::move(note)});
  }

  void Print(std::ostream& out) const {
    std::vector<size_t> widths;
    for (const Column& column : columns_) widths.push_back(column.header.size());
    for (const Row& row : rows_) {
      for (size_t i = 0; i < row.cells.size() && i < widths.size(); ++i) {
        widths[i] = std::max(widths[i], row.cells[i].size());
      }
    }
    std::vector<std::string> headers;
    for (const Column& column : columns_) headers.push_back(column.header);
    PrintCells(out, headers, widths);
    for (const Row& row : rows_) {
      if (row.note.empty()) {
        PrintCells(out, row.cells, widths);
      } else {
        out << Pad(row.cells[0], widths[0], false) << "  " << row.note << '\n';
      }
    }
  }

 private:
  struct Row {
    std::vector<std::string> cells;
    std::string note;
  };

  static std::string Pad(const std::string& text, size_t width, bool right) {
    if (text.size() >= width) return text;
    const std::string fill(width - text.size(), ' ');
    return right ? fill + text : text + fill;
  }

  void PrintCells(std::ostream& out, const std::vector<std::string>& cells,
                  const std::vector<size_t>& widths) const {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const std::string& cell = i < cells.size() ? cells[i] : std::string();
      if (i > 0) line += "  ";
      // The last column is not padded on the right: no trailing blanks.
      const bool last = i + 1 == columns_.size();
      line += (last && !columns_[i].right_aligned)
                  ? cell
                  : Pad(cell, widths[i], columns_[i].right_aligned);
    }
    out << line << '\n';
  }

  std::vector<Column> columns_;
  std::vector<Row> rows_;
};

// ---------------------------------------------------------------------------
// Subcommands

int RunLs() {
  std::vector<tailcut::QueueListing> listings = tailcut::ListQueues();
  std::sort(listings.begin(), listings.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });

  Table table(
      {{"NAME"}, {"CLIENTS", true}, {"EPOCH", true}, {"DONE", true}, {"AGE", true}, {"KEPT"}});
  size_t shown = 0;
  for (const tailcut::QueueListing& listing : listings) {
    if (!listing.valid) {
      table.AddNote(listing.name, "unreadable: " + listing.problem);
      ++shown;
      continue;
    }
    tailcut::QueueStats stats;
    try {
      stats = tailcut::InspectQueue(listing.name);
    } catch (const tailcut::Error& e) {
      // Removed between listing and reading: it is simply gone.
      if (e.kind() == tailcut::ErrorKind::kNotFound) continue;
      table.AddNote(listing.name, std::string("unreadable: ") + e.what());
      ++shown;
      continue;
    }
    table.AddRow({listing.name,
                  std::to_string(AliveClients(stats)) + "/" + std::to_string(stats.clients_joined),
                  EpochText(stats),
                  std::to_string(stats.done) + "/" + std::to_string(stats.total) + " (" +
                      Percent(stats.done, stats.total) + ")",
                  AgeText(listing.created_unix_ns),
                  tailcut_cli::KeptText(listing).empty() ? "-" : tailcut_cli::KeptText(listing)});
    ++shown;
  }
  if (shown == 0) {
    std::cout << "no queues\n";
    return kExitOk;
  }
  table.Print(std::cout);
  return kExitOk;
}

void PrintStats(const tailcut::QueueStats& stats, std::ostream& out) {
  out << "queue      " << stats.name << '\n'
      << "segment    " << stats.segment_path << '\n'
      << "items      " << stats.num_items << " x " << stats.num_epochs
      << (stats.num_epochs == 1 ? " epoch" : " epochs") << ", shuffle "
      << (stats.shuffle ? "on" : "off") << ", seed " << stats.seed << '\n'
      << "epoch      " << EpochText(stats) << '\n'
      << "done       " << stats.done << "/" << stats.total << " ("
      << Percent(stats.done, stats.total) << "), " << stats.in_flight << " in flight, "
      << stats.handed_out << " handed out\n"
      << "clients    " << AliveClients(stats) << " alive, " << stats.clients_joined << " joined, "
      << stats.num_clients << " expected\n"
      << "recovered  " << stats.recovered_items << " items, " << stats.stale_acks << " stale acks, "
      << stats.splits << " tails split\n";
  if (stats.clients.empty()) {
    out << "\nno clients registered\n";
    return;
  }
  out << '\n';
  Table table({{"SLOT", true},
               {"PID", true},
               {"STATE"},
               {"TAKEN", true},
               {"ACKED", true},
               {"MB ACKED", true},
               {"ITEMS/S", true},
               {"IDLE%", true},
               {"STALE", true},
               {"OPEN", true}});
  for (const tailcut::ClientStats& c : stats.clients) {
    const ClientRates rates = RatesOf(c, stats.now_ns);
    table.AddRow({std::to_string(c.slot), std::to_string(c.pid), c.alive ? "alive" : "dead",
                  std::to_string(c.items_taken), std::to_string(c.items_acked),
                  FormatFixed(static_cast<double>(c.bytes_acked) / 1e6, 1),
                  rates.items_per_s ? FormatFixed(*rates.items_per_s, 1) : "-",
                  rates.idle_percent ? FormatFixed(*rates.idle_percent, 1) : "-",
                  std::to_string(c.stale_acks), std::to_string(c.open_items)});
  }
  table.Print(out);
}

int RunStat(const std::string& name, bool json) {
  const tailcut::QueueStats stats = tailcut::InspectQueue(name);
  if (json) {
    // Bytes of a name that are not UTF-8 become U+FFFD, so the output always parses.
    std::cout << nlohmann::json(stats).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << '\n';
  } else {
    PrintStats(stats, std::cout);
  }
  return kExitOk;
}

int RunRm(const std::string& name, bool force) {
  tailcut::RemoveQueue(name, force);
  std::cout << "removed queue " << name << '\n';
  return kExitOk;
}

int RunRing(const std::string& name, bool json, bool remove) {
  if (remove) {
    if (!tailcut::RemoveBatchRing(name)) {
      throw tailcut::Error(tailcut::ErrorKind::kNotFound,
                           "no batch ring '" + name + "' (" + tailcut::BatchRingSegmentPath(name) +
                               "); 'tailcut ring NAME' shows one that exists");
    }
    std::cout << "removed batch ring " << name << '\n';
    return kExitOk;
  }
  const tailcut::BatchRingStats stats = tailcut::InspectBatchRing(name);
  if (json) {
    std::cout << nlohmann::json(stats).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << '\n';
    return kExitOk;
  }
  std::cout << "ring       " << stats.name << '\n'
            << "segment    " << stats.segment_path << '\n'
            << "slots      " << stats.num_slots << " x "
            << FormatFixed(static_cast<double>(stats.slot_bytes) / (1 << 20), 1)
            << " MiB: " << stats.free << " free, " << stats.filling << " filling, " << stats.ready
            << " ready, " << stats.popped << " popped\n"
            << "batches    " << stats.published << " published, " << stats.released << " released, "
            << stats.redelivered << " redelivered, " << stats.reclaimed << " slots reclaimed, "
            << stats.stale_tokens << " stale tokens\n"
            << "state      " << tailcut_cli::RingStateText(stats) << '\n';
  if (stats.clients.empty()) {
    std::cout << "\nno clients registered\n";
    return kExitOk;
  }
  std::cout << '\n';
  Table table(
      {{"SLOT", true}, {"PID", true}, {"ROLE"}, {"STATE"}, {"BATCHES", true}, {"WAIT S", true}});
  for (const tailcut::RingClientStats& c : stats.clients) {
    const bool loader = c.role == tailcut::RingRole::kLoader;
    table.AddRow({std::to_string(c.slot), std::to_string(c.pid), loader ? "loader" : "trainer",
                  c.alive ? "alive" : "dead", std::to_string(loader ? c.published : c.popped),
                  FormatFixed(c.wait_seconds, 2)});
  }
  table.Print(std::cout);
  return kExitOk;
}

// ---------------------------------------------------------------------------
// Command line

// A usage error: "tailcut: <message>" and where to read more; status 2.
int UsageFailure(const std::string& message, const CLI::App* command) {
  std::cerr << "tailcut: " << message << '\n';
  if (command != nullptr) {
    std::cerr << "Run 'tailcut help " << command->get_name() << "' for details.\n";
  } else {
    std::cerr << "Run 'tailcut --help' for the list of commands.\n";
  }
  return kExitUsage;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "Inspect and manage this user's tailcut work queues (shared-memory segments in /dev/shm).",
      "tailcut");
  app.get_formatter()->label("Usage", "usage");
  app.get_formatter()->label("SUBCOMMAND", "COMMAND");
  app.get_formatter()->column_width(24);
  app.set_version_flag("--version", "tailcut " TAILCUT_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  tailcut ls\n"
      "  tailcut stat work_queue\n"
      "  tailcut rm work_queue --force\n"
      "\n"
      "Exit status: 0 success, 1 the operation failed, 2 usage error.");

  std::string name;
  bool json = false;
  bool once = false;
  bool force = false;

  CLI::App* ls =
      app.add_subcommand("ls", "list this user's queues with clients, epoch and progress");
  ls->footer(
      "Lists every queue of this user: its name, live/joined clients, the epoch\n"
      "now handed out (x/N), the acked items out of all items of all epochs, its\n"
      "age, and why it stays in /dev/shm when its last process closes it\n"
      "unfinished (a process died, keep was asked, clients still to join; '-':\n"
      "it is removed).\n"
      "A segment that cannot be read is listed with the reason.\n"
      "\n"
      "Example:\n"
      "  $ tailcut ls\n"
      "  NAME      CLIENTS  EPOCH                  DONE    AGE  KEPT\n"
      "  imagenet      8/8    2/4  612034/1281167 (47.8%)  3h05m  -");

  CLI::App* stat = app.add_subcommand("stat", "show the counters of one queue and of each client");
  stat->add_option("NAME", name, "the queue")->required();
  stat->add_flag("--json", json, "print every counter as one JSON object (docs/cli.md)");
  stat->footer(
      "Shows the queue's counters and one row per client that ever joined:\n"
      "slot, pid, alive or dead, items taken and acked, megabytes (10^6 bytes)\n"
      "acked, acked items per second over the client's lifetime, share of that\n"
      "lifetime spent waiting for items, refused stale acks and open items.\n"
      "Dead clients found on the way have their open items handed back.\n"
      "\n"
      "Examples:\n"
      "  $ tailcut stat imagenet\n"
      "  $ tailcut stat imagenet --json | python3 -m json.tool");

  std::string ring_name;
  CLI::App* top = app.add_subcommand(
      "top", "live view of one queue and its batch ring: progress, rates, stragglers, starving");
  top->add_option("NAME", name, "the queue");
  top->add_option("--ring", ring_name,
                  "the batch ring to show (default: NAME.pool, the queue's PooledLoader, if any)");
  top->add_flag("--once", once, "print one frame (rates over each client's lifetime) and exit");
  bool top_json = false;
  top->add_flag("--json", top_json,
                "each frame as one line of JSON: the queue, each process with its role and rates, "
                "the ring, and the verdict (for scripts)");
  std::string coordinator;
  top->add_option("--coordinator", coordinator,
                  "show the job NAME across hosts as this coordinator sees it "
                  "(redis://[user[:password]@]HOST:PORT/DB; TAILCUT_COORDINATOR if empty)");
  top->footer(
      "Refreshes every second, like top: the epoch, done / in flight / remaining\n"
      "with a progress bar, recovered items, split tails and stale acks, then one\n"
      "row per client with items/s and MB/s since the last refresh (samples/s\n"
      "for a map-style dataset's queue), open items, idle share and splits;\n"
      "with a pool, each process is a rank or a loader. The slowest live client\n"
      "still holding items is\n"
      "flagged as the straggler when it runs at under half the median rate;\n"
      "clients that died are shown with their items recovered. Ends on Ctrl-C\n"
      "or when the queue's last process removes it.\n"
      "\n"
      "Below the queue, its batch ring of pooled loaders (NAME.pool, or --ring):\n"
      "fill level (batches ready out of slots), one row per loader (batches\n"
      "published per second) and trainer (batches popped per second) with the\n"
      "share of the time since the last refresh each spent waiting and its\n"
      "total wait. A trainer that waited half of that time for a batch, or has\n"
      "been waiting for one for a second, is flagged as starving: add loaders.\n"
      "Under the ring, the pool's status when it has one: with num_workers=(min,\n"
      "max), the loaders it keeps and its last decisions with their reasons; with\n"
      "balance=, each rank's records per step and the speeds that decided them.\n"
      "With --ring and no NAME, only the ring; it ends when the ring is removed.\n"
      "Last, the verdict: input-bound when the ranks waited 10% or more of the\n"
      "window for batches, with the loader that published least. --json prints\n"
      "each frame's numbers as one line of JSON instead.\n"
      "\n"
      "With --coordinator, the job NAME across hosts instead (docs/global.md):\n"
      "done / total, then one row per host with blocks claimed and re-owned,\n"
      "tickets acked (and per second), refused stale calls, open blocks and the\n"
      "soonest deadline. Ends when every host is done. The password is never shown.\n"
      "\n"
      "Examples:\n"
      "  $ tailcut top imagenet\n"
      "  $ tailcut top imagenet --once\n"
      "  $ tailcut top --ring imagenet.pool\n"
      "  $ tailcut top --coordinator redis://redis.internal:6379/0 imagenet");

  CLI::App* rm = app.add_subcommand("rm", "remove a queue's shared-memory segment");
  rm->add_option("NAME", name, "the queue")->required();
  rm->add_flag("-f,--force", force, "remove even while live clients are registered");
  rm->footer(
      "Removes the queue's segment. Refuses while live clients are registered\n"
      "and names their pids; a queue whose clients all died is stale and is\n"
      "removed without --force. Processes still attached keep their mapping\n"
      "until they exit, but new processes will create a fresh queue.\n"
      "\n"
      "Examples:\n"
      "  $ tailcut rm imagenet\n"
      "  $ tailcut rm imagenet --force");

  bool remove = false;
  CLI::App* ring =
      app.add_subcommand("ring", "show a batch ring of pooled loaders: slots, loaders, trainers");
  ring->add_option("NAME", name, "the batch ring")->required();
  ring->add_flag("--json", json, "print every counter as one JSON object (docs/cli.md)");
  ring->add_flag("--rm", remove, "remove the ring's segment instead");
  ring->footer(
      "Shows the slots of a batch ring by state, the batches published and\n"
      "released, and one row per loader (batches published) and trainer\n"
      "(batches popped) with the seconds each spent waiting: loaders for a\n"
      "free slot, trainers for a ready batch. The state line says STARVING\n"
      "when live trainers find no batch ready, the sign to add loaders.\n"
      "\n"
      "Examples:\n"
      "  $ tailcut ring imagenet\n"
      "  $ tailcut ring imagenet --json\n"
      "  $ tailcut ring imagenet --rm");

  bool dry_run = false;
  CLI::App* clean = app.add_subcommand(
      "clean", "remove the queues, batch rings and pool files dead jobs left in /dev/shm");
  std::string prefix;
  clean->add_option("PREFIX", prefix, "only names that start with PREFIX (e.g. a job's)");
  clean->add_flag("-n,--dry-run", dry_run, "only say what would be removed");
  clean->footer(
      "Removes this user's queues and batch rings that no live process uses,\n"
      "and pool descriptions, failure records and status files whose ring is\n"
      "gone. Never touches a queue or ring with a live process, nor a ring a\n"
      "job is opening. A kept queue is what a rerun would resume: clean\n"
      "forgets it.\n"
      "\n"
      "Examples:\n"
      "  $ tailcut clean --dry-run\n"
      "  $ tailcut clean torchrun-train-");

  CLI::App* help = app.add_subcommand("help", "show the help of a command");
  for (CLI::App* command : {ls, stat, top, rm, ring, clean, help}) command->group("Commands");
  std::string topic;
  help->add_option("COMMAND", topic, "the command");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    if (chosen.empty() && argc > 1) {  // CLI11 would say "A subcommand is required"
      const std::string what = argv[1][0] == '-' ? "unknown option '" : "unknown command '";
      return UsageFailure(what + argv[1] + "'", nullptr);
    }
    return UsageFailure(e.what(), chosen.empty() ? nullptr : chosen.front());
  }

  try {
    if (help->parsed()) {
      if (topic.empty()) {
        std::cout << app.help();
        return kExitOk;
      }
      const CLI::App* command = nullptr;
      for (const CLI::App* c : {ls, stat, top, rm, ring, clean, help}) {
        if (c->get_name() == topic) command = c;
      }
      if (command == nullptr)
        return UsageFailure("no help for unknown command '" + topic + "'", nullptr);
      std::cout << command->help("tailcut");
      return kExitOk;
    }
    if (ls->parsed()) return RunLs();
    if (stat->parsed()) return RunStat(name, json);
    if (top->parsed() && (!coordinator.empty() || top->count("--coordinator") > 0)) {
#ifdef TAILCUT_CLI_GLOBAL
      if (name.empty()) return UsageFailure("top --coordinator needs the job's NAME", top);
      return tailcut_cli::RunGlobalTop(coordinator, name, once, 1.0);
#else
      return UsageFailure(
          "this tailcut was built without the cross-host tier (hiredis): no --coordinator", top);
#endif
    }
    if (top->parsed()) {
      if (name.empty() && ring_name.empty())
        return UsageFailure("top needs a queue NAME, or --ring RING", top);
      return tailcut_cli::RunTop({name, ring_name, once, 1.0, top_json});
    }
    if (ring->parsed()) return RunRing(name, json, remove);
    if (clean->parsed()) return tailcut_cli::RunClean(prefix, dry_run, std::cout);
    return RunRm(name, force);
  } catch (const tailcut::Error& e) {
    // The cross-host tier's messages name tailcut themselves.
    std::string_view what = e.what();
    if (what.rfind("tailcut: ", 0) == 0) what.remove_prefix(9);
    std::cerr << "tailcut: " << what << '\n';
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "tailcut: " << app.get_subcommands().front()->get_name() << ": " << e.what()
              << '\n';
    return kExitError;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const int status = Main(argc, argv);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "tailcut: cannot write output\n";
    return kExitError;
  }
  return status;
}
