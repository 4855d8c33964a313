#include "pool/ring_segment.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "tailcut/error.h"

namespace tailcut::detail {

namespace {

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

std::string ShmFree() {
  struct statvfs vfs;
  if (::statvfs("/dev/shm", &vfs) != 0) return "unknown";
  return MiB(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize);
}

std::string Errno() { return std::strerror(errno); }

}  // namespace

std::string RingSegment::ObjectName(const std::string& name) {
  return "tailcut-ring." + std::to_string(::geteuid()) + "." + name;
}

std::string RingSegment::PathOf(const std::string& name) { return "/dev/shm/" + ObjectName(name); }

RingSegment::RingSegment(std::string name, int fd)
    : name_(std::move(name)), path_(PathOf(name_)), fd_(fd) {
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
}

RingSegment::~RingSegment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void RingSegment::Map(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorKind::kIo, "batch ring '" + name_ + "': cannot map " + path_ + ": " + Errno());
  base_ = static_cast<char*>(p);
  size_ = size;
}

std::unique_ptr<RingSegment> RingSegment::CreateExclusive(const std::string& name, size_t size) {
  // O_EXCL: never adopt an object someone else made; fchmod so that the
  // umask cannot widen the mode.
  int fd = ::shm_open(ObjectName(name).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) return nullptr;
  if (fd < 0)
    throw Error(errno == EACCES || errno == EPERM ? ErrorKind::kPermission : ErrorKind::kIo,
                "batch ring '" + name + "': cannot create " + PathOf(name) + ": " + Errno());
  std::unique_ptr<RingSegment> seg(new RingSegment(name, fd));
  ::fchmod(fd, 0600);
  // Reserve every page now: a full /dev/shm must fail here with a message,
  // not with SIGBUS when a loader first writes a slot.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    std::string free = ShmFree();
    seg->UnlinkIfSame();
    throw Error(err == ENOSPC ? ErrorKind::kNoSpace : ErrorKind::kIo,
                "batch ring '" + name + "': cannot reserve " + MiB(size) + " for " + seg->path() +
                    ": " + std::strerror(err) + " (/dev/shm has " + free +
                    " free); free space in /dev/shm or use fewer or smaller slots "
                    "(num_slots, slot_bytes)");
  }
  seg->Map(size);
  return seg;
}

std::unique_ptr<RingSegment> RingSegment::OpenExisting(const std::string& name, size_t min_size,
                                                       std::chrono::milliseconds wait) {
  std::string path = PathOf(name);
  int fd = ::shm_open(ObjectName(name).c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0 && errno == ENOENT)
    throw Error(ErrorKind::kNotFound, "batch ring '" + name + "' does not exist (no " + path + ")");
  if (fd < 0)
    throw Error(errno == EACCES || errno == EPERM ? ErrorKind::kPermission : ErrorKind::kIo,
                "batch ring '" + name + "': cannot open " + path + ": " + Errno() +
                    (errno == EACCES ? "; it belongs to another user: pick another name" : ""));
  std::unique_ptr<RingSegment> seg(new RingSegment(name, fd));
  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorKind::kIo, "batch ring '" + name + "': fstat " + path + ": " + Errno());
  if (st.st_uid != ::geteuid())
    throw Error(ErrorKind::kPermission, "batch ring '" + name + "': " + path + " is owned by uid " +
                                            std::to_string(st.st_uid) + ", not by you (uid " +
                                            std::to_string(::geteuid()) +
                                            "); remove it (as its owner) or pick another name");
  if ((st.st_mode & 0077) != 0)
    throw Error(ErrorKind::kPermission,
                "batch ring '" + name + "': " + path +
                    " is open to other users; tailcut makes 0600 segments. Remove it "
                    "(RemoveBatchRing) and start again");
  auto deadline = std::chrono::steady_clock::now() + wait;
  while (static_cast<size_t>(st.st_size) < min_size) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(
          ErrorKind::kTimeout,
          "batch ring '" + name + "': " + path + " is " + std::to_string(st.st_size) +
              " bytes, too small for a ring, and did not grow for " + std::to_string(wait.count()) +
              " ms (its creator probably died); remove it (RemoveBatchRing) and start again");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (::fstat(fd, &st) != 0)
      throw Error(ErrorKind::kIo, "batch ring '" + name + "': fstat " + path + ": " + Errno());
  }
  seg->Map(static_cast<size_t>(st.st_size));
  return seg;
}

bool RingSegment::UnlinkIfSame() const {
  // Check and unlink under an exclusive flock, so that two removers cannot
  // unlink a ring created in between (see engine/segment.cc).
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
  bool removed = false;
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    removed = ::shm_unlink(ObjectName(name_).c_str()) == 0;
  ::flock(fd_, LOCK_UN);
  return removed;
}

}  // namespace tailcut::detail
