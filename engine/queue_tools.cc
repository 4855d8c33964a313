// Tools' view of queues: list, inspect and remove without joining.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>

#include "engine/config.h"
#include "engine/housekeeper.h"
#include "engine/lease.h"
#include "engine/segment.h"
#include "engine/segment_config.h"
#include "tailcut/work_queue.h"

namespace tailcut {

using namespace detail;

namespace {

struct Opened {
  std::unique_ptr<Segment> segment;
  std::unique_ptr<LeaseTable> table;
  std::unique_ptr<Housekeeper> keeper;
};

// Opens and fully validates a queue that is READY, without waiting for a
// creator or taking its lock. Throws kNotFound, kCorrupt, kPermission,
// kTimeout (an empty object), each naming the segment and what to do.
Opened OpenForTools(const std::string& name) {
  ValidateQueueName(name);
  Attachment a = AttachSegment(name, AttachMode::kInspect, std::chrono::milliseconds(0));
  if (a.state != AttachState::kAttached) throw *a.problem;
  Opened o;
  o.segment = std::move(a.segment);
  const Header& h = o.segment->header();
  o.table = std::make_unique<LeaseTable>(o.segment.get(), ReadItems(*o.segment), h.num_epochs,
                                         h.seed, h.shuffle != 0);
  o.keeper = std::make_unique<Housekeeper>(o.table.get());
  return o;
}

}  // namespace

std::string SegmentPath(const std::string& name) {
  ValidateQueueName(name);
  return Segment::PathOf(name);
}

std::vector<QueueListing> ListQueues() {
  std::vector<QueueListing> out;
  std::string prefix = "tailcut." + std::to_string(::geteuid()) + ".";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (struct dirent* e = ::readdir(dir)) {
    std::string file = e->d_name;
    if (file.rfind(prefix, 0) != 0) continue;
    QueueListing q;
    q.name = file.substr(prefix.size());
    q.segment_path = "/dev/shm/" + file;
    try {
      Opened o = OpenForTools(q.name);
      q.valid = true;
      const Header& h = o.segment->header();
      q.created_unix_ns = h.created_unix_ns;
      q.lease_timeout_ms = h.lease_timeout_ms;
      q.live_clients = o.keeper->LiveClients(kNoOwner);
      q.finished = o.keeper->AllDone();
      // A finished queue is kept only for processes that have yet to join.
      q.kept_reason = KeepReasonText(
          q.finished ? 0 : o.segment->counters().keep_reasons.load(std::memory_order_relaxed),
          o.segment->counters().clients_joined.load(std::memory_order_relaxed), h.num_clients);
    } catch (const Error& err) {
      q.problem = err.what();
    }
    out.push_back(std::move(q));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end(),
            [](const QueueListing& a, const QueueListing& b) { return a.name < b.name; });
  return out;
}

QueueStats InspectQueue(const std::string& name) {
  Opened o = OpenForTools(name);
  o.keeper->CheckClients(kNoOwner);
  return o.keeper->Stats(name);
}

void RemoveQueue(const std::string& name, bool force) {
  ValidateQueueName(name);
  try {
    Opened o = OpenForTools(name);
    std::vector<int> pids = o.keeper->LivePids(kNoOwner);
    if (!pids.empty() && !force) {
      std::string list;
      for (int p : pids) list += (list.empty() ? "" : ", ") + std::to_string(p);
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + name + "' has " + std::to_string(pids.size()) +
                      " live process(es) (pids " + list +
                      "); stop them first, or remove it anyway with --force (they keep running "
                      "on the removed segment)");
    }
    o.segment->UnlinkIfSame();
    // release: pairs with the acquire load of state in AttachSegment
    // (segment.cc) of a process that opened the object before the unlink: it
    // sees REMOVED and starts over.
    o.segment->header().state.store(kRemoved, std::memory_order_release);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound || !force) throw;
    // A segment we cannot validate: --force removes the name anyway.
    if (!Segment::Remove(name))
      throw Error(ErrorKind::kNotFound,
                  "queue '" + name + "' does not exist (no " + Segment::PathOf(name) + ")");
  }
}

}  // namespace tailcut
