// tools/pool_status.cc: see pool_status.h.
#include "tools/pool_status.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tailcut_cli {
namespace {

using nlohmann::json;

// A status keeps 8 decisions of a few hundred bytes and one speed per rank:
// far below this, which bounds what top reads from a file it cannot trust.
constexpr size_t kMaxStatusBytes = 64 << 10;
// Decisions shown: the last one on the autoscale line, those before it below.
constexpr size_t kDecisionsShown = 4;
// Ranks shown on the shares line; more are counted.
constexpr size_t kRanksShown = 64;
// A decision's reason is cut at this length.
constexpr size_t kWhyChars = 240;

// Why a status cannot be shown; caught in PoolStatusPart.
class Unreadable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The file's text, or "" when there is none; throws Unreadable.
std::string ReadStatusFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "";
    throw Unreadable(errno == ELOOP ? "a symbolic link" : std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Unreadable(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Unreadable("not a regular file");
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    throw Unreadable("not a private file of user " + std::to_string(::geteuid()));
  std::string text;
  char buffer[8192];
  while (text.size() <= kMaxStatusBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Unreadable(std::strerror(errno));
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  if (text.size() > kMaxStatusBytes)
    throw Unreadable("more than the " + std::to_string(kMaxStatusBytes) + " bytes a status holds");
  return text;
}

const json& Field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end()) throw Unreadable(std::string("no field '") + key + "'");
  return *it;
}

uint64_t Count(const json& object, const char* key) {
  const json& value = Field(object, key);
  if (!value.is_number_unsigned()) throw Unreadable(std::string("'") + key + "' is not a count");
  return value.get<uint64_t>();
}

double Number(const json& value, const char* key) {
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0)
    throw Unreadable(std::string("'") + key + "' is not a number >= 0");
  return value.get<double>();
}

const json& Array(const json& object, const char* key) {
  const json& value = Field(object, key);
  if (!value.is_array()) throw Unreadable(std::string("'") + key + "' is not a list");
  return value;
}

// Text from the file, safe for a terminal: control bytes become '?'.
std::string Text(const json& object, const char* key, size_t max_chars) {
  const json& value = Field(object, key);
  if (!value.is_string()) throw Unreadable(std::string("'") + key + "' is not text");
  std::string text = value.get<std::string>();
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return text;
}

// HH:MM:SS, local time, of Unix seconds.
std::string ClockText(double unix_s) {
  if (unix_s >= 1e12) throw Unreadable("a time past the year 30000");
  const auto t = static_cast<time_t>(unix_s);
  struct tm local {};
  char text[16];
  if (::localtime_r(&t, &local) == nullptr ||
      std::strftime(text, sizeof text, "%H:%M:%S", &local) == 0)
    throw Unreadable("a time that has no clock reading");
  return text;
}

std::string Loaders(uint64_t n) { return std::to_string(n) + (n == 1 ? " loader" : " loaders"); }

// "+2 at 12:00:01 (1 -> 3), <why>"
std::string DecisionText(const json& decision) {
  if (!decision.is_object()) throw Unreadable("a decision is not an object");
  const std::string action = Text(decision, "action", 16);
  if (action != "add" && action != "remove") throw Unreadable("an action other than add, remove");
  const uint64_t before = Count(decision, "before"), after = Count(decision, "after");
  const bool add = action == "add";
  if (add ? after <= before : after >= before)
    throw Unreadable("a decision to " + action + " that does not");
  std::string text = add ? "+" : "-";
  text += std::to_string(add ? after - before : before - after);
  return text + " at " + ClockText(Number(Field(decision, "time"), "time")) + " (" +
         std::to_string(before) + " -> " + std::to_string(after) + "), " +
         Text(decision, "why", kWhyChars);
}

std::string AutoscaleLines(const json& autoscale) {
  if (!autoscale.is_object()) throw Unreadable("'autoscale' is not an object");
  std::string line = "autoscale " + Loaders(Count(autoscale, "loaders")) + " (min " +
                     std::to_string(Count(autoscale, "min")) + ", max " +
                     std::to_string(Count(autoscale, "max")) + "): ";
  const json& decisions = Array(autoscale, "decisions");
  if (decisions.empty()) return line + "no decision yet\n";
  std::string out = line + "last " + DecisionText(decisions.back()) + "\n";
  const size_t shown = std::min(decisions.size(), kDecisionsShown);
  for (size_t i = 1; i < shown; ++i)
    out += "  earlier: " + DecisionText(decisions[decisions.size() - 1 - i]) + "\n";
  return out;
}

std::string SharesLine(const json& balance) {
  if (!balance.is_object()) throw Unreadable("'balance' is not an object");
  const json& records = Array(balance, "records");
  const json& speeds = Array(balance, "speeds");
  if (records.empty() || speeds.size() != records.size())
    throw Unreadable("'records' and 'speeds' are not one per rank");
  const uint64_t step = Count(balance, "step");
  const std::string at = ClockText(Number(Field(balance, "time"), "time"));
  std::string shares = "shares", measured;
  bool any_speed = false;
  const size_t shown = std::min(records.size(), kRanksShown);
  for (size_t r = 0; r < shown; ++r) {
    if (!records[r].is_number_unsigned()) throw Unreadable("a rank's records are not a count");
    const double speed = Number(speeds[r], "speeds");
    any_speed = any_speed || speed > 0;
    char speed_text[32];
    std::snprintf(speed_text, sizeof speed_text, "%.0f", speed);
    shares += "  r" + std::to_string(r) + " " + std::to_string(records[r].get<uint64_t>());
    measured += (r ? "  r" : "r") + std::to_string(r) + " " + (speed > 0 ? speed_text : "-");
  }
  const std::string more = records.size() > shown
                               ? " ... " + std::to_string(records.size() - shown) + " more ranks"
                               : "";
  if (!any_speed) return shares + more + " records/step (equal: no speeds measured yet)\n";
  return shares + more + " records/step (speeds " + measured + more +
         " records/s, decided at step " + std::to_string(step) + ", " + at + ")\n";
}

}  // namespace

std::string PoolStatusPath(const std::string& ring) {
  return "/dev/shm/tailcut-pool." + std::to_string(::geteuid()) + "." + ring + ".status";
}

std::string PoolStatusPart(const std::string& ring) {
  const std::string path = PoolStatusPath(ring);
  try {
    const std::string text = ReadStatusFile(path);
    if (text.empty()) return "";
    const json status = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (status.is_discarded()) throw Unreadable("not JSON (truncated or damaged)");
    if (!status.is_object()) throw Unreadable("not a JSON object");
    if (Count(status, "version") != 1)
      throw Unreadable("version " + Field(status, "version").dump() + ", this top reads 1");
    std::string lines;
    if (status.contains("autoscale")) lines += AutoscaleLines(status["autoscale"]);
    if (status.contains("balance")) lines += SharesLine(status["balance"]);
    return lines.empty() ? "" : "\n" + lines;
  } catch (const Unreadable& e) {
    return "\npool status " + path + ": unreadable (" + e.what() + ")\n";
  } catch (const json::exception& e) {  // a value out of range for its type
    return "\npool status " + path + ": unreadable (" + e.what() + ")\n";
  }
}

}  // namespace tailcut_cli
