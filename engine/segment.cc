#include "engine/segment.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "engine/crash_point.h"
#include "engine/robust_mutex.h"
#include "tailcut/error.h"

namespace bip = boost::interprocess;

namespace tailcut::detail {

namespace {

size_t AlignUp(size_t v) { return (v + kCacheLine - 1) / kCacheLine * kCacheLine; }

}  // namespace

std::string ByteSize(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  int u = 0;
  while (u + 1 < 6 && bytes >> (10 * (u + 2)) != 0) ++u;
  uint64_t unit = uint64_t{1} << (10 * (u + 1));
  if (bytes % unit == 0) return std::to_string(bytes / unit) + " " + kUnits[u];
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s (%llu bytes)", static_cast<double>(bytes) / unit,
                kUnits[u], static_cast<unsigned long long>(bytes));
  return buf;
}

namespace {

std::string ShmFree() {
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) != 0) return "unknown";
  return ByteSize(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize);
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
  return "/dev/shm/" + ObjectName(queue_name);
}

Segment::Segment(std::string queue_name, int fd, bool created)
    : queue_name_(std::move(queue_name)), path_(PathOf(queue_name_)), fd_(fd), created_(created) {
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
}

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void Segment::Map(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    throw Error(ErrorKindOfErrno(err), "queue '" + queue_name_ + "': cannot map segment " + path_ +
                                           ": " + std::strerror(err));
  }
  base_ = static_cast<char*>(p);
  size_ = size;
}

std::unique_ptr<Segment> Segment::CreateExclusive(const std::string& queue_name, size_t size) {
  std::string object = ObjectName(queue_name);
  int fd = -1;
  try {
    // Boost opens with O_CREAT | O_EXCL and sets the mode with fchmod, so the
    // umask cannot widen it; we keep the descriptor and drop the wrapper.
    bip::shared_memory_object shm(bip::create_only, object.c_str(), bip::read_write,
                                  bip::permissions(0600));
    fd = ::dup(shm.get_mapping_handle().handle);
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::already_exists_error) return nullptr;
    int err = e.get_native_error();
    throw Error(ErrorKindOfErrno(err), "queue '" + queue_name + "': cannot create segment " +
                                           PathOf(queue_name) + ": " + e.what());
  }
  if (fd < 0) {
    int err = errno;
    throw Error(ErrorKindOfErrno(err),
                "queue '" + queue_name + "': dup failed: " + std::strerror(err));
  }
  std::unique_ptr<Segment> seg(new Segment(queue_name, fd, true));
  // Reserve every page now: a full /dev/shm must fail here with a message,
  // not with SIGBUS on first touch in the middle of training.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    std::string free = ShmFree();
    seg->UnlinkIfSame();
    throw Error(ErrorKindOfErrno(err),
                "queue '" + queue_name + "': cannot reserve " + ByteSize(size) + " for segment " +
                    seg->path() + ": " + std::strerror(err) + " (/dev/shm has " + free +
                    " free); free space in /dev/shm (see `tailcut ls`, `tailcut rm NAME`) "
                    "or use fewer items or epochs");
  }
  CrashPoint("create.after_excl");
  seg->Map(size);
  return seg;
}

std::unique_ptr<Segment> Segment::OpenUnmapped(const std::string& queue_name) {
  std::string object = ObjectName(queue_name);
  std::string path = PathOf(queue_name);
  int fd = -1;
  try {
    bip::shared_memory_object shm(bip::open_only, object.c_str(), bip::read_write);
    fd = ::dup(shm.get_mapping_handle().handle);
  } catch (const bip::interprocess_exception& e) {
    int err = e.get_native_error();
    if (e.get_error_code() == bip::not_found_error || err == ENOENT)
      throw Error(ErrorKind::kNotFound,
                  "queue '" + queue_name + "' does not exist (no " + path + ")");
    throw Error(
        ErrorKindOfErrno(err),
        "queue '" + queue_name + "': cannot open segment " + path + ": " + e.what() +
            (err == EACCES ? "; it belongs to another user: remove it or pick another name" : ""));
  }
  std::unique_ptr<Segment> seg(new Segment(queue_name, fd, false));
  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorKind::kIo,
                "queue '" + queue_name + "': fstat " + path + ": " + std::strerror(errno));
  // Never adopt an object someone else made: it could hold anything.
  if (st.st_uid != ::geteuid())
    throw Error(ErrorKind::kPermission,
                "queue '" + queue_name + "': segment " + path + " is owned by uid " +
                    std::to_string(st.st_uid) + ", not by you (uid " + std::to_string(::geteuid()) +
                    "); remove it (as its owner or root) or pick another queue name");
  if ((st.st_mode & 0022) != 0)
    throw Error(ErrorKind::kPermission,
                "queue '" + queue_name + "': segment " + path + " has mode 0" +
                    std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                    std::to_string(st.st_mode & 7) +
                    ", writable by other users; tailcut makes 0600 segments. Remove it with "
                    "`tailcut rm --force " +
                    queue_name + "`");
  // A creator sizes the object in one posix_fallocate, so a size between
  // zero and a header was never made by tailcut.
  if (st.st_size > 0 && static_cast<size_t>(st.st_size) < kMinSegmentSize)
    throw Error(ErrorKind::kCorrupt,
                "queue '" + queue_name + "': segment " + path + " is " +
                    std::to_string(st.st_size) +
                    " bytes, smaller than any tailcut queue; remove it with `tailcut rm --force " +
                    queue_name + "`");
  return seg;
}

bool Segment::MapWhenSized(std::chrono::milliseconds wait, off_t* size) {
  struct stat st;
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (::fstat(fd_, &st) != 0)
      throw Error(ErrorKind::kIo,
                  "queue '" + queue_name_ + "': fstat " + path_ + ": " + std::strerror(errno));
    *size = st.st_size;
    if (static_cast<size_t>(st.st_size) >= kMinSegmentSize) break;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Map(static_cast<size_t>(st.st_size));
  return true;
}

Error Segment::NeverSized(off_t size, std::chrono::milliseconds wait) const {
  return Error(ErrorKind::kTimeout,
               "queue '" + queue_name_ + "': segment " + path_ + " is " + std::to_string(size) +
                   " bytes, too small for a queue, and did not grow for " +
                   std::to_string(wait.count()) + " ms (its creator probably died)");
}

std::unique_ptr<Segment> Segment::OpenExisting(const std::string& queue_name,
                                               std::chrono::milliseconds wait, bool* abandoned) {
  std::unique_ptr<Segment> seg = OpenUnmapped(queue_name);
  off_t size = 0;
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

bool Segment::UnlinkIfSame() const {
  // Check and unlink under an exclusive flock of this object, so that two
  // processes removing the same object cannot interleave: without it, one
  // could check, the other unlink and create a new queue, and the first then
  // unlink that new queue, leaving two queues over the same data. The
  // kernel drops the lock if its holder dies.
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
  bool removed = false;
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    removed = ::shm_unlink(ObjectName(queue_name_).c_str()) == 0;
  ::flock(fd_, LOCK_UN);
  return removed;
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
  off_t size = 0;
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
