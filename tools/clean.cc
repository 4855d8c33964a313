// tools/clean.cc: see clean.h.
#include "tools/clean.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <regex>
#include <string>
#include <system_error>
#include <vector>

#include "tailcut/batch_ring.h"
#include "tailcut/error.h"

namespace tailcut_cli {
namespace {

// The lock tailcut/pool/_lifecycle.py takes on a ring's name while it fences a
// dead attempt and opens the ring: an abstract Unix socket bound to
// "\0tailcut-pool.<euid>.<ring>", released by the kernel with its holder.
class RingLock {
 public:
  explicit RingLock(const std::string& ring) : fd_(::socket(AF_UNIX, SOCK_STREAM, 0)) {
    const std::string name = "tailcut-pool." + std::to_string(::geteuid()) + "." + ring;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (fd_ < 0 || name.size() + 1 > sizeof(address.sun_path)) return;
    std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    for (int attempt = 0; attempt < 200; ++attempt) {  // 1 s
      if (::bind(fd_, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
        held_ = true;
        return;
      }
      ::usleep(5000);
    }
  }
  ~RingLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  RingLock(const RingLock&) = delete;
  RingLock& operator=(const RingLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_;
  bool held_ = false;
};

bool AnyAlive(const tailcut::BatchRingStats& stats) {
  return std::any_of(stats.clients.begin(), stats.clients.end(),
                     [](const tailcut::RingClientStats& c) { return c.alive; });
}

// The names in this user's /dev/shm entries "tailcut-<kind>.<euid>.<name>"
// whose name starts with `name_prefix`.
std::vector<std::string> ShmNames(const std::string& kind, const std::string& name_prefix) {
  const std::string head = "tailcut-" + kind + "." + std::to_string(::geteuid()) + ".";
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(head + name_prefix, 0) == 0) names.push_back(file.substr(head.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string KeptText(const tailcut::QueueListing& listing) {
  static const std::regex kAttempt("^torchrun-.+-([0-9]+)$");
  std::smatch match;
  if (listing.kept_reason.rfind("a process of it died", 0) == 0 &&
      std::regex_match(listing.name, match, kAttempt) && match[1].str() != "0") {
    return "a process of it died; a rerun starts at attempt 0 and removes it";
  }
  return listing.kept_reason;
}

int RunClean(const std::string& prefix, bool dry_run, std::ostream& out) {
  const char* verb = dry_run ? "would remove" : "removed";
  int removed = 0, live = 0;
  for (const tailcut::QueueListing& listing : tailcut::ListQueues()) {
    if (listing.name.rfind(prefix, 0) != 0) continue;
    if (!listing.valid) {
      out << "left queue " << listing.name << ": unreadable (" << listing.problem
          << "); remove it with `tailcut rm --force " << listing.name << "`\n";
      continue;
    }
    if (listing.live_clients > 0) {
      ++live;
      continue;
    }
    try {
      if (!dry_run) tailcut::RemoveQueue(listing.name, /*force=*/false);
      out << verb << " queue " << listing.name << " (no live process"
          << (listing.finished ? ", finished" : ", unfinished") << ")\n";
      ++removed;
    } catch (const tailcut::Error& e) {
      // A process joined it meanwhile (kInvalidArgument), or it went.
      if (e.kind() == tailcut::ErrorKind::kInvalidArgument) ++live;
    }
  }
  const std::string uid = std::to_string(::geteuid());
  for (const std::string& ring : ShmNames("ring", prefix)) {
    RingLock lock(ring);
    if (!lock.held()) {
      out << "left batch ring " << ring << ": a process holds its lock (opening it)\n";
      continue;
    }
    try {
      if (AnyAlive(tailcut::InspectBatchRing(ring))) {
        ++live;
        continue;
      }
      if (!dry_run) tailcut::RemoveBatchRing(ring);
      out << verb << " batch ring " << ring << " (no live process)\n";
      ++removed;
    } catch (const tailcut::Error& e) {
      if (e.kind() != tailcut::ErrorKind::kNotFound)
        out << "left batch ring " << ring << ": " << e.what() << '\n';
    }
  }
  // A pool's description, failure record and status live while its ring
  // does; so do their temporary files ("<file>.<pid>.tmp") a writer killed
  // mid-write left.
  static const std::regex kPoolFile(R"(^(.+)\.(json|error|status)(\.[0-9]+\.tmp)?$)");
  for (const std::string& file : ShmNames("pool", prefix)) {
    std::smatch match;
    if (!std::regex_match(file, match, kPoolFile)) continue;
    const std::string ring = match[1].str(), kind = match[2].str();
    std::error_code error;
    if (std::filesystem::exists(tailcut::BatchRingSegmentPath(ring), error) || error) continue;
    const std::string path = "/dev/shm/tailcut-pool." + uid + "." + file;
    if (!dry_run && ::unlink(path.c_str()) != 0) continue;
    out << verb << " pool " << (match[3].matched ? "temporary file of its " : "")
        << (kind == "json"    ? "description "
            : kind == "error" ? "failure record "
                              : "status ")
        << path << " (its ring is gone)\n";
    ++removed;
  }
  out << (dry_run ? "would remove " : "removed ") << removed
      << (removed == 1 ? " object" : " objects") << "; " << live
      << " in use by live processes left alone\n";
  return 0;
}

}  // namespace tailcut_cli
