// tools/tailcut_main.cc: the `tailcut` command-line tool.
//
// Lists this user's queues, shows the counters of one queue and its clients,
// and removes a queue. It reads segments through the library's tool calls
// (ListQueues, InspectQueue, RemoveQueue) and never joins a queue as a client.
//
// Exit status: 0 on success; 1 when an operation fails (the library's message
// goes to stderr as "tailcut: <message>"); 2 on a usage error.
//
// Subcommands live in one dispatch table (kCommands); a new one adds a row and
// a handler and gets `tailcut help NAME` and `NAME --help` for free.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/work_queue.h"
#include "tools/top.h"

#ifndef TAILCUT_VERSION
#define TAILCUT_VERSION "unknown"
#endif

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// A command line that does not fit the command's grammar. Exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------
// Argument parsing

// The arguments of one subcommand after its name: positionals and the flags
// it accepts. "--" ends the flags.
struct ParsedArgs {
  std::vector<std::string> positional;
  std::vector<std::string> flags;  // as given, e.g. "--json"

  bool Has(std::string_view flag) const {
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
  }
};

// REQUIRES: args holds no --help/-h (Main handles those first).
ParsedArgs ParseArgs(std::string_view command, std::span<const std::string> args,
                     std::initializer_list<std::string_view> allowed_flags) {
  ParsedArgs parsed;
  bool flags_done = false;
  for (const std::string& arg : args) {
    if (!flags_done && arg == "--") {
      flags_done = true;
    } else if (!flags_done && arg.size() > 1 && arg[0] == '-') {
      if (std::find(allowed_flags.begin(), allowed_flags.end(), arg) == allowed_flags.end()) {
        throw UsageError("unknown option '" + arg + "' for '" + std::string(command) + "'");
      }
      if (!parsed.Has(arg)) parsed.flags.push_back(arg);
    } else {
      parsed.positional.push_back(arg);
    }
  }
  return parsed;
}

// The single NAME operand of stat and rm.
const std::string& OneName(std::string_view command, const ParsedArgs& parsed) {
  if (parsed.positional.empty()) {
    throw UsageError("'" + std::string(command) + "' needs a queue NAME");
  }
  if (parsed.positional.size() > 1) {
    throw UsageError("'" + std::string(command) + "' takes one queue NAME, got " +
                     std::to_string(parsed.positional.size()));
  }
  return parsed.positional[0];
}

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

uint32_t AliveClients(const tailcut::QueueStats& stats) {
  return static_cast<uint32_t>(std::count_if(stats.clients.begin(), stats.clients.end(),
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
    rates.idle_percent =
        std::min(100.0, 100.0 * static_cast<double>(client.idle_ns) /
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
      line += (last && !columns_[i].right_aligned) ? cell
                                                   : Pad(cell, widths[i], columns_[i].right_aligned);
    }
    out << line << '\n';
  }

  std::vector<Column> columns_;
  std::vector<Row> rows_;
};

// ---------------------------------------------------------------------------
// JSON output (hand-written: one flat object with one array of objects)

// Appends `text` as a JSON string literal. Control characters are escaped;
// bytes that are not valid UTF-8 become U+FFFD so the output always parses.
void AppendJsonString(std::string* out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      switch (byte) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        default:
          if (byte < 0x20 || byte == 0x7f) {
            *out += "\\u00";
            out->push_back(kHex[byte >> 4]);
            out->push_back(kHex[byte & 0xf]);
          } else {
            out->push_back(static_cast<char>(byte));
          }
      }
      ++i;
      continue;
    }
    // A multi-byte UTF-8 sequence: check its length, continuation bytes,
    // and that it is neither overlong, a surrogate, nor above U+10FFFF.
    size_t length = 0;
    uint32_t code_point = 0;
    if ((byte & 0xe0) == 0xc0) {
      length = 2;
      code_point = byte & 0x1f;
    } else if ((byte & 0xf0) == 0xe0) {
      length = 3;
      code_point = byte & 0x0f;
    } else if ((byte & 0xf8) == 0xf0) {
      length = 4;
      code_point = byte & 0x07;
    }
    bool valid = length != 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xc0) == 0x80;
      code_point = (code_point << 6) | (next & 0x3f);
    }
    if (valid) {
      static constexpr uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
      valid = code_point >= kMinimum[length] && code_point <= 0x10ffff &&
              !(code_point >= 0xd800 && code_point <= 0xdfff);
    }
    if (valid) {
      out->append(text.substr(i, length));
      i += length;
    } else {
      *out += "\\ufffd";
      ++i;
    }
  }
  out->push_back('"');
}

// Fields of one JSON object in order, each value already rendered.
class JsonObject {
 public:
  void AddString(std::string_view key, std::string_view value) {
    std::string rendered;
    AppendJsonString(&rendered, value);
    fields_.emplace_back(key, std::move(rendered));
  }
  void AddNumber(std::string_view key, uint64_t value) {
    fields_.emplace_back(key, std::to_string(value));
  }
  void AddSigned(std::string_view key, int64_t value) {
    fields_.emplace_back(key, std::to_string(value));
  }
  void AddBool(std::string_view key, bool value) {
    fields_.emplace_back(key, value ? "true" : "false");
  }
  void AddArray(std::string_view key, const std::vector<JsonObject>& items, int indent) {
    if (items.empty()) {
      fields_.emplace_back(key, "[]");
      return;
    }
    const std::string inner(static_cast<size_t>(indent + 2), ' ');
    std::string rendered = "[\n";
    for (size_t i = 0; i < items.size(); ++i) {
      rendered += inner + items[i].Render(indent + 2);
      rendered += i + 1 < items.size() ? ",\n" : "\n";
    }
    rendered += std::string(static_cast<size_t>(indent), ' ') + "]";
    fields_.emplace_back(key, std::move(rendered));
  }

  // The object with fields one per line, for an object that starts at
  // column `indent`.
  std::string Render(int indent) const {
    const std::string inner(static_cast<size_t>(indent + 2), ' ');
    std::string out = "{\n";
    for (size_t i = 0; i < fields_.size(); ++i) {
      out += inner;
      AppendJsonString(&out, fields_[i].first);
      out += ": " + fields_[i].second;
      out += i + 1 < fields_.size() ? ",\n" : "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ') + "}";
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// The number of fields of an aggregate: the most initializers it accepts.
struct AnyField {
  template <typename T>
  operator T() const noexcept;
};
template <typename T, typename... Fields>
consteval size_t CountFields() {
  if constexpr (requires { T{std::declval<Fields>()..., AnyField{}}; }) {
    return CountFields<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}
// stat --json promises every field: a field added to the header must be
// added below (and to the key lists in tests/tools/cli_test.sh).
static_assert(CountFields<tailcut::QueueStats>() == 18,
              "QueueStats changed: update StatsToJson and tests/tools/cli_test.sh");
static_assert(CountFields<tailcut::ClientStats>() == 16,
              "ClientStats changed: update StatsToJson and tests/tools/cli_test.sh");

// Every field of QueueStats and ClientStats, under the same names.
std::string StatsToJson(const tailcut::QueueStats& stats) {
  JsonObject queue;
  queue.AddString("name", stats.name);
  queue.AddString("segment_path", stats.segment_path);
  queue.AddNumber("num_items", stats.num_items);
  queue.AddNumber("num_epochs", stats.num_epochs);
  queue.AddNumber("total", stats.total);
  queue.AddNumber("done", stats.done);
  queue.AddNumber("in_flight", stats.in_flight);
  queue.AddNumber("handed_out", stats.handed_out);
  queue.AddNumber("epoch", stats.epoch);
  queue.AddNumber("seed", stats.seed);
  queue.AddBool("shuffle", stats.shuffle);
  queue.AddNumber("num_clients", stats.num_clients);
  queue.AddNumber("clients_joined", stats.clients_joined);
  queue.AddNumber("recovered_items", stats.recovered_items);
  queue.AddNumber("stale_acks", stats.stale_acks);
  queue.AddNumber("splits", stats.splits);
  queue.AddNumber("now_ns", stats.now_ns);
  std::vector<JsonObject> clients;
  for (const tailcut::ClientStats& c : stats.clients) {
    JsonObject client;
    client.AddNumber("slot", c.slot);
    client.AddSigned("pid", c.pid);
    client.AddBool("alive", c.alive);
    client.AddNumber("items_taken", c.items_taken);
    client.AddNumber("items_acked", c.items_acked);
    client.AddNumber("items_given_back", c.items_given_back);
    client.AddNumber("items_recovered", c.items_recovered);
    client.AddNumber("bytes_acked", c.bytes_acked);
    client.AddNumber("records", c.records);
    client.AddNumber("stale_acks", c.stale_acks);
    client.AddNumber("splits", c.splits);
    client.AddNumber("open_items", c.open_items);
    client.AddNumber("busy_ns", c.busy_ns);
    client.AddNumber("idle_ns", c.idle_ns);
    client.AddNumber("last_progress_ns", c.last_progress_ns);
    client.AddNumber("joined_ns", c.joined_ns);
    clients.push_back(std::move(client));
  }
  queue.AddArray("clients", clients, 2);
  return queue.Render(0) + "\n";
}

// ---------------------------------------------------------------------------
// Subcommands

int RunLs(std::span<const std::string> args) {
  const ParsedArgs parsed = ParseArgs("ls", args, {});
  if (!parsed.positional.empty()) throw UsageError("'ls' takes no operands");

  std::vector<tailcut::QueueListing> listings = tailcut::ListQueues();
  std::sort(listings.begin(), listings.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });

  Table table({{"NAME"}, {"CLIENTS", true}, {"EPOCH", true}, {"DONE", true}});
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
                      Percent(stats.done, stats.total) + ")"});
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
      << "done       " << stats.done << "/" << stats.total << " (" << Percent(stats.done, stats.total)
      << "), " << stats.in_flight << " in flight, " << stats.handed_out << " handed out\n"
      << "clients    " << AliveClients(stats) << " alive, " << stats.clients_joined << " joined, "
      << stats.num_clients << " expected\n"
      << "recovered  " << stats.recovered_items << " items, " << stats.stale_acks
      << " stale acks, " << stats.splits << " tails split\n";
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

int RunStat(std::span<const std::string> args) {
  const ParsedArgs parsed = ParseArgs("stat", args, {"--json"});
  const std::string& name = OneName("stat", parsed);
  const tailcut::QueueStats stats = tailcut::InspectQueue(name);
  if (parsed.Has("--json")) {
    std::cout << StatsToJson(stats);
  } else {
    PrintStats(stats, std::cout);
  }
  return kExitOk;
}

int RunRm(std::span<const std::string> args) {
  const ParsedArgs parsed = ParseArgs("rm", args, {"--force", "-f"});
  const std::string& name = OneName("rm", parsed);
  const bool force = parsed.Has("--force") || parsed.Has("-f");
  tailcut::RemoveQueue(name, force);
  std::cout << "removed queue " << name << '\n';
  return kExitOk;
}

// ---------------------------------------------------------------------------
// Dispatch

struct Command {
  std::string_view name;
  std::string_view synopsis;  // after "tailcut "
  std::string_view summary;   // one line for the overview
  std::string_view details;   // the rest of `tailcut help NAME`
  int (*run)(std::span<const std::string> args);
};

int RunTopCommand(std::span<const std::string> args) {
  const ParsedArgs parsed = ParseArgs("top", args, {"--once"});
  return tailcut_cli::RunTop(OneName("top", parsed), parsed.Has("--once"), 1.0);
}

// One row per subcommand, in the order `tailcut --help` lists them.
constexpr Command kCommands[] = {
    {"ls", "ls", "list this user's queues with clients, epoch and progress",
     "Lists every queue of this user: its name, live/joined clients, the epoch\n"
     "now handed out (x/N) and the acked items out of all items of all epochs.\n"
     "A segment that cannot be read is listed with the reason.\n"
     "\n"
     "Example:\n"
     "  $ tailcut ls\n"
     "  NAME        CLIENTS  EPOCH                  DONE\n"
     "  imagenet        8/8    2/4  612034/1281167 (47.8%)\n",
     RunLs},
    {"stat", "stat NAME [--json]", "show the counters of one queue and of each client",
     "Shows the queue's counters and one row per client that ever joined:\n"
     "slot, pid, alive or dead, items taken and acked, megabytes (10^6 bytes)\n"
     "acked, acked items per second over the client's lifetime, share of that\n"
     "lifetime spent waiting for items, refused stale acks and open items.\n"
     "Dead clients found on the way have their open items handed back.\n"
     "\n"
     "Options:\n"
     "  --json   print one JSON object with every field of the queue's and the\n"
     "           clients' counters (times are CLOCK_MONOTONIC nanoseconds)\n"
     "\n"
     "Examples:\n"
     "  $ tailcut stat imagenet\n"
     "  $ tailcut stat imagenet --json | python3 -m json.tool\n",
     RunStat},
    {"top", "top NAME [--once]", "live view of one queue: progress, rates, stragglers",
     "Refreshes every second, like top: the epoch, done / in flight / remaining\n"
     "with a progress bar, recovered items, split tails and stale acks, then one\n"
     "row per client with items/s and MB/s since the last refresh, open items,\n"
     "idle share and splits. The slowest live client still holding items is\n"
     "flagged as the straggler when it runs at under half the median rate;\n"
     "clients that died are shown with their items recovered. Ends on Ctrl-C\n"
     "or when the queue's last process removes it.\n"
     "\n"
     "Options:\n"
     "  --once   print one frame (rates over each client's lifetime) and exit\n"
     "\n"
     "Examples:\n"
     "  $ tailcut top imagenet\n"
     "  $ tailcut top imagenet --once\n",
     RunTopCommand},
    {"rm", "rm NAME [--force]", "remove a queue's shared-memory segment",
     "Removes the queue's segment. Refuses while live clients are registered\n"
     "and names their pids; a queue whose clients all died is stale and is\n"
     "removed without --force. Processes still attached keep their mapping\n"
     "until they exit, but new processes will create a fresh queue.\n"
     "\n"
     "Options:\n"
     "  -f, --force   remove even while live clients are registered\n"
     "\n"
     "Examples:\n"
     "  $ tailcut rm imagenet\n"
     "  $ tailcut rm imagenet --force\n",
     RunRm},
};

const Command* FindCommand(std::string_view name) {
  for (const Command& command : kCommands) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

void PrintOverview(std::ostream& out) {
  out << "usage: tailcut <command> [args]\n"
         "       tailcut help <command> | <command> --help\n"
         "       tailcut --version\n"
         "\n"
         "Inspect and manage this user's tailcut work queues (shared-memory\n"
         "segments in /dev/shm).\n"
         "\n"
         "Commands:\n";
  size_t width = 0;
  for (const Command& command : kCommands) width = std::max(width, command.synopsis.size());
  for (const Command& command : kCommands) {
    out << "  " << command.synopsis << std::string(width - command.synopsis.size() + 3, ' ')
        << command.summary << '\n';
  }
  out << "\n"
         "Examples:\n"
         "  tailcut ls\n"
         "  tailcut stat work_queue\n"
         "  tailcut rm work_queue --force\n"
         "\n"
         "Exit status: 0 success, 1 the operation failed, 2 usage error.\n";
}

void PrintCommandHelp(const Command& command, std::ostream& out) {
  std::string summary(command.summary);
  if (!summary.empty() && summary[0] >= 'a' && summary[0] <= 'z') summary[0] -= 'a' - 'A';
  out << "usage: tailcut " << command.synopsis << "\n\n"
      << summary << ".\n\n"
      << command.details;
}

int UsageFailure(const std::string& message, const Command* command) {
  std::cerr << "tailcut: " << message << '\n';
  if (command != nullptr) {
    std::cerr << "usage: tailcut " << command->synopsis << '\n'
              << "Run 'tailcut help " << command->name << "' for details.\n";
  } else {
    std::cerr << "Run 'tailcut --help' for the list of commands.\n";
  }
  return kExitUsage;
}

bool IsHelpFlag(std::string_view arg) { return arg == "--help" || arg == "-h"; }

int Main(const std::vector<std::string>& argv) {
  if (argv.empty()) return UsageFailure("missing command", nullptr);
  const std::string& first = argv[0];
  if (IsHelpFlag(first)) {
    PrintOverview(std::cout);
    return kExitOk;
  }
  if (first == "--version") {
    std::cout << "tailcut " << TAILCUT_VERSION << '\n';
    return kExitOk;
  }
  if (first == "help") {
    if (argv.size() == 1) {
      PrintOverview(std::cout);
      return kExitOk;
    }
    if (argv.size() > 2) return UsageFailure("'help' takes at most one command", nullptr);
    const Command* command = FindCommand(argv[1]);
    if (command == nullptr) return UsageFailure("no help for unknown command '" + argv[1] + "'", nullptr);
    PrintCommandHelp(*command, std::cout);
    return kExitOk;
  }
  const Command* command = FindCommand(first);
  if (command == nullptr) {
    const std::string what = first.starts_with("-") ? "unknown option '" : "unknown command '";
    return UsageFailure(what + first + "'", nullptr);
  }
  const std::span<const std::string> args(argv.begin() + 1, argv.end());
  // --help anywhere before "--" wins over everything else.
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (IsHelpFlag(arg)) {
      PrintCommandHelp(*command, std::cout);
      return kExitOk;
    }
  }
  try {
    return command->run(args);
  } catch (const UsageError& e) {
    return UsageFailure(e.what(), command);
  } catch (const tailcut::Error& e) {
    std::cerr << "tailcut: " << e.what() << '\n';
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "tailcut: " << command->name << ": " << e.what() << '\n';
    return kExitError;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int status = Main(args);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "tailcut: cannot write output\n";
    return kExitError;
  }
  return status;
}
