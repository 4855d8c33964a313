#include "engine/segment.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "engine/crash_point.h"
#include "engine/robust_mutex.h"
#include "tailcut/error.h"

namespace tailcut::detail {

namespace {

size_t AlignUp(size_t v) { return (v + kCacheLine - 1) / kCacheLine * kCacheLine; }

ShmName NameOf(const std::string& queue_name) {
  return {Segment::ObjectName(queue_name), "queue '" + queue_name + "'", "queue",
          "Remove it with `tailcut rm --force " + queue_name + "`"};
}

}  // namespace

Geometry ComputeGeometry(uint64_t num_files, uint64_t num_items, uint64_t total_tickets,
                         uint64_t path_bytes, uint32_t max_clients, uint32_t leases_per_client,
                         bool fed) {
  Geometry g;
  g.num_files = num_files;
  g.num_items = num_items;
  g.total_tickets = total_tickets;
  g.path_bytes = path_bytes;
  g.max_clients = max_clients;
  g.leases_per_client = leases_per_client;
  // Reject counts that could overflow the sums below before using them.
  if (num_files == 0 || num_files > UINT32_MAX || num_items == 0 || num_items > kMaxTickets ||
      total_tickets == 0 || total_tickets > kMaxTickets || total_tickets % num_items != 0 ||
      path_bytes > (uint64_t{1} << 36) || max_clients == 0 || max_clients > kMaxClients ||
      leases_per_client == 0 || leases_per_client > kMaxLeasesPerClient ||
      uint64_t{max_clients} * leases_per_client > kMaxLeases) {
    g.total = 0;
    return g;
  }
  size_t off = AlignUp(sizeof(Header));
  g.counters = off;
  off = AlignUp(off + sizeof(Counters));
  g.cursor = off;
  off = AlignUp(off + sizeof(Cursor));
  g.clients = off;
  off = AlignUp(off + sizeof(ClientEntry) * max_clients);
  g.steps = off;
  off = AlignUp(off + sizeof(StepEntry) * max_clients);
  g.leases = off;
  off = AlignUp(off + sizeof(LeaseEntry) * g.num_leases());
  g.files = off;
  off = AlignUp(off + sizeof(FileEntry) * num_files);
  g.items = off;
  off = AlignUp(off + sizeof(ItemEntry) * num_items);
  g.paths = off;
  off = AlignUp(off + path_bytes);
  g.bitmap = off;
  off = AlignUp(off + sizeof(uint64_t) * g.bitmap_words());
  g.fed = fed;
  if (fed) {
    g.fed_blocks = off;
    off = AlignUp(off + sizeof(FedBlock) * kFedBlocks);
    g.skip = off;
    off = AlignUp(off + sizeof(uint64_t) * g.bitmap_words());
  }
  g.total = off;
  return g;
}

std::string Segment::ObjectName(const std::string& queue_name) {
  return "tailcut." + std::to_string(::geteuid()) + "." + queue_name;
}

std::string Segment::PathOf(const std::string& queue_name) {
  return ShmPath(ObjectName(queue_name));
}

Segment::Segment(std::string queue_name, std::unique_ptr<ShmObject> shm, bool created)
    : queue_name_(std::move(queue_name)), shm_(std::move(shm)), created_(created) {}

Segment::~Segment() = default;

void Segment::Map(size_t size) {
  shm_->Map(size);
  base_ = shm_->base();
  size_ = size;
}

std::unique_ptr<Segment> Segment::CreateExclusive(const std::string& queue_name, size_t size) {
  std::unique_ptr<ShmObject> shm = ShmObject::CreateExclusive(NameOf(queue_name));
  if (shm == nullptr) return nullptr;
  std::unique_ptr<Segment> seg(new Segment(queue_name, std::move(shm), true));
  seg->shm_->Reserve(size,
                     "free space in /dev/shm (see `tailcut ls`, `tailcut rm NAME`) or use "
                     "fewer items or epochs");
  CrashPoint("create.after_excl");
  seg->Map(size);
  return seg;
}

std::unique_ptr<Segment> Segment::OpenUnmapped(const std::string& queue_name) {
  std::unique_ptr<Segment> seg(new Segment(queue_name, ShmObject::Open(NameOf(queue_name)), false));
  // Never adopt an object someone else made, or one others may write: it
  // could hold anything.
  seg->shm_->CheckOwned(0022);
  // A creator sizes the object in one posix_fallocate, so a size between
  // zero and a header was never made by tailcut.
  const uint64_t size = seg->shm_->Size();
  if (size > 0 && size < kMinSegmentSize)
    throw Error(ErrorKind::kCorrupt,
                "queue '" + queue_name + "': segment " + seg->path() + " is " +
                    std::to_string(size) +
                    " bytes, smaller than any tailcut queue; remove it with `tailcut rm --force " +
                    queue_name + "`");
  return seg;
}

bool Segment::MapWhenSized(std::chrono::milliseconds wait, uint64_t* size) {
  *size = shm_->WaitForSize(kMinSegmentSize, wait);
  if (*size < kMinSegmentSize) return false;
  Map(*size);
  return true;
}

Error Segment::NeverSized(uint64_t size, std::chrono::milliseconds wait) const {
  return Error(ErrorKind::kTimeout,
               "queue '" + queue_name_ + "': segment " + path() + " is " + std::to_string(size) +
                   " bytes, too small for a queue, and did not grow for " +
                   std::to_string(wait.count()) + " ms (its creator probably died)");
}

std::unique_ptr<Segment> Segment::OpenExisting(const std::string& queue_name,
                                               std::chrono::milliseconds wait, bool* abandoned) {
  std::unique_ptr<Segment> seg = OpenUnmapped(queue_name);
  uint64_t size = 0;
  if (seg->MapWhenSized(wait, &size)) return seg;
  if (abandoned == nullptr) throw seg->NeverSized(size, wait);
  *abandoned = seg->UnlinkIfSame();
  return nullptr;
}

bool Segment::WaitForMagic(std::chrono::milliseconds wait) const {
  auto deadline = std::chrono::steady_clock::now() + wait;
  // acquire, both: pairs with TryCreate's release store of magic
  // (work_queue.cc), made after the admin mutex and the preamble are written.
  while (header().magic.load(std::memory_order_acquire) != kSegmentMagic) {
    uint64_t m = header().magic.load(std::memory_order_acquire);
    if (m != 0 && m != kSegmentMagic) return true;  // garbage: let Validate name it
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

namespace {

Error Corrupt(const Segment& s, const std::string& what) {
  return Error(ErrorKind::kCorrupt, "queue '" + s.queue_name() + "': segment " + s.path() +
                                        " is not a valid tailcut queue: " + what +
                                        ". Remove it with `tailcut rm --force " + s.queue_name() +
                                        "`");
}

}  // namespace

void Segment::CheckPreamble() const {
  const Header& h = header();
  // acquire: pairs with TryCreate's release store of magic (work_queue.cc):
  // the version and size checked below were written before it.
  if (h.magic.load(std::memory_order_acquire) != kSegmentMagic)
    throw Corrupt(*this, "bad magic number");
  if (h.layout_version != kLayoutVersion)
    throw Corrupt(*this, "layout version " + std::to_string(h.layout_version) +
                             ", this tailcut reads " + std::to_string(kLayoutVersion) +
                             " (a different tailcut version made it)");
  if (h.total_size != size_)
    throw Corrupt(*this, "header says " + std::to_string(h.total_size) + " bytes, object has " +
                             std::to_string(size_));
}

void Segment::Validate() {
  const Header& h = header();
  auto corrupt = [&](const std::string& what) { return Corrupt(*this, what); };
  CheckPreamble();
  if (h.num_items == 0 || h.num_epochs == 0 || h.total_tickets / h.num_epochs != h.num_items ||
      h.total_tickets % h.num_epochs != 0)
    throw corrupt("inconsistent counts (items " + std::to_string(h.num_items) + ", epochs " +
                  std::to_string(h.num_epochs) + ", tickets " + std::to_string(h.total_tickets) +
                  ")");
  if (h.fed > 1) throw corrupt("fed flag " + std::to_string(h.fed) + " is neither 0 nor 1");
  Geometry g = ComputeGeometry(h.num_files, h.num_items, h.total_tickets, h.path_bytes,
                               h.max_clients, h.leases_per_client, h.fed == 1);
  if (g.total == 0) throw corrupt("counts out of range");
  if (g.total != size_)
    throw corrupt("counts need " + std::to_string(g.total) + " bytes, object has " +
                  std::to_string(size_));
  if (h.format[kFormatTagBytes - 1] != '\0') throw corrupt("format tag not terminated");
  geometry_ = g;
  if (!IsRobustMutex(&h.admin_mutex) || !IsRobustMutex(&h.sweep_mutex))
    throw corrupt("its admin or sweep lock is damaged");
  if (g.fed && !IsRobustMutex(&h.feeder_mutex)) throw corrupt("its feeder lock is damaged");
  for (uint64_t c = 0; c < g.max_clients; ++c)
    if (!IsRobustMutex(&client(c).life))
      throw corrupt("the lock of client slot " + std::to_string(c) + " is damaged");
  // The file and item tables are read by tools that have no configuration of
  // their own: check every entry once, here.
  for (uint64_t f = 0; f < g.num_files; ++f) {
    const FileEntry& e = file(f);
    if (e.path_offset > g.path_bytes || e.path_length > g.path_bytes - e.path_offset)
      throw corrupt("file entry " + std::to_string(f) + " points outside the path table");
  }
  for (uint64_t i = 0; i < g.num_items; ++i) {
    const ItemEntry& e = item(i);
    if (e.file >= g.num_files || e.begin > e.end || e.end > file(e.file).size)
      throw corrupt("item " + std::to_string(i) + " is out of range");
  }
}

bool Segment::UnlinkIfSame() const { return shm_->UnlinkIfSame(); }

bool Segment::Remove(const std::string& queue_name) {
  return ShmObject::Unlink(NameOf(queue_name));
}

Attachment AttachSegment(const std::string& queue_name, AttachMode mode,
                         std::chrono::milliseconds wait) {
  Attachment a;
  try {
    a.segment = Segment::OpenUnmapped(queue_name);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kNotFound) throw;
    a.problem = e;
    return a;  // kNotFound
  }
  Segment& seg = *a.segment;
  uint64_t size = 0;
  if (!seg.MapWhenSized(wait, &size)) {
    a.state = AttachState::kUnsized;
    a.problem = seg.NeverSized(size, wait);
    return a;
  }
  if (!seg.WaitForMagic(wait)) {
    a.state = AttachState::kUnpublished;
    a.problem = Corrupt(seg, "bad magic number");
    return a;
  }
  seg.CheckPreamble();
  Header& h = seg.header();
  bool died = false;
  if (mode == AttachMode::kJoin) {
    // The creator holds the admin lock from before its magic until READY,
    // so a state other than READY seen under it is never one a live
    // creator is still writing.
    a.admin = std::make_unique<RobustLock>(&h.admin_mutex);
    int rc = a.admin->Lock(wait, &died);
    if (rc == ETIMEDOUT)
      throw Error(ErrorKind::kTimeout,
                  "queue '" + queue_name + "': process " + std::to_string(h.creator_pid) +
                      " has been creating or changing it for more than " +
                      std::to_string(wait.count()) + " ms; is it stopped? (attach_timeout)");
    if (rc != 0)
      throw Error(ErrorKind::kCorrupt, "queue '" + queue_name + "': segment " + seg.path() +
                                           " has an unusable lock (" + std::strerror(rc) +
                                           "); remove it with `tailcut rm --force " + queue_name +
                                           "`");
  }
  // acquire: pairs with the release stores of state in TryCreate (READY)
  // and of REMOVED in TryAttach, Close (work_queue.cc) and RemoveQueue
  // (queue_tools.cc): what was written before the state is visible.
  const uint32_t state = h.state.load(std::memory_order_acquire);
  if (state != kReady) {
    Error not_ready(ErrorKind::kCorrupt,
                    "queue '" + queue_name + "': segment " + seg.path() +
                        " is not ready (being created, removed, or its creator died); retry, or "
                        "remove it with `tailcut rm --force " +
                        queue_name + "`");
    if (state == kRemoved) {
      a.state = AttachState::kRemoved;
    } else if (state == kCreating || died) {
      a.state = AttachState::kCreating;
    } else if (mode == AttachMode::kInspect) {
      throw not_ready;
    } else {
      throw Error(ErrorKind::kCorrupt, "queue '" + queue_name + "': segment " + seg.path() +
                                           " is in an unknown state; remove it with `tailcut rm "
                                           "--force " +
                                           queue_name + "`");
    }
    a.problem = std::move(not_ready);
    return a;
  }
  seg.Validate();
  a.state = AttachState::kAttached;
  return a;
}

}  // namespace tailcut::detail
