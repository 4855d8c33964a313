#include "engine/shm_object.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace tailcut::detail {

namespace {

// InjectShmFailure's errno per ShmCall; 0: none.
std::atomic<int> g_injected[6];

// The errno injected for `call`, consumed; 0 if none. relaxed, both: the
// test sets it in the thread that makes the call, so nothing pairs.
int Injected(ShmCall call) {
  std::atomic<int>& slot = g_injected[static_cast<int>(call)];
  if (slot.load(std::memory_order_relaxed) == 0) return 0;
  return slot.exchange(0, std::memory_order_relaxed);
}

// The system calls, each behind the seam. They return what the call returns
// and leave errno as it sets it (posix_fallocate returns its error).
int OpenCall(const std::string& object, int flags) {
  if (int err = Injected(ShmCall::kOpen)) return errno = err, -1;
  return ::shm_open(object.c_str(), flags | O_RDWR | O_CLOEXEC, 0600);
}
int ChmodCall(int fd) {
  if (int err = Injected(ShmCall::kChmod)) return errno = err, -1;
  return ::fchmod(fd, 0600);
}
int StatCall(int fd, struct stat* st) {
  if (int err = Injected(ShmCall::kStat)) return errno = err, -1;
  return ::fstat(fd, st);
}
int ReserveCall(int fd, uint64_t size) {
  if (int err = Injected(ShmCall::kReserve)) return err;
  return ::posix_fallocate(fd, 0, static_cast<off_t>(size));
}
void* MapCall(int fd, uint64_t size) {
  if (int err = Injected(ShmCall::kMap)) return errno = err, MAP_FAILED;
  return ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
}
int UnlinkCall(const std::string& object) {
  if (int err = Injected(ShmCall::kUnlink)) return errno = err, -1;
  return ::shm_unlink(object.c_str());
}

// What a person does about `err` from `call` ("open", "map", ...).
std::string FixFor(const ShmName& name, const std::string& call, int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      if (call == "create")
        return "you may not create objects in /dev/shm: it should be a tmpfs with mode 1777";
      return "it belongs to another user: remove it (as its owner or root) or pick another " +
             name.kind + " name";
    case ENAMETOOLONG:
      return "the name is too long for /dev/shm: pick a shorter " + name.kind + " name";
    case EINVAL:
      if (call == "map") return "the object cannot be mapped that large";
      return "the name is not usable in /dev/shm (too long, or with a '/'): pick a shorter " +
             name.kind + " name";
    case EMFILE:
    case ENFILE:
      return "too many open files: close some or raise the limit (ulimit -n)";
    case ENOMEM:
      if (call == "map")
        return "not enough address space or memory: raise the limit (ulimit -v) or use less";
      [[fallthrough]];
    case ENOSPC:
    case EDQUOT:
      return "free space in /dev/shm (see `tailcut ls`, `tailcut clean`)";
    default:
      return "check that /dev/shm is a tmpfs you may write to";
  }
}

// "<owner>: cannot <call> [<size> of ]segment <path>: <strerror>; <fix>".
std::string Message(const ShmName& name, const std::string& path, const std::string& call, int err,
                    const std::string& size = "") {
  return name.owner + ": cannot " + call + (size.empty() ? "" : " " + size + " of") + " segment " +
         path + ": " + std::strerror(err) + "; " + FixFor(name, call, err);
}

}  // namespace

std::string ShmPath(const std::string& object) { return "/dev/shm/" + object; }

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

std::string DevShmFree() {
  struct statvfs vfs;
  if (::statvfs("/dev/shm", &vfs) != 0) return "unknown";
  return ByteSize(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize);
}

void InjectShmFailure(ShmCall call, int err) {
  // relaxed: see Injected.
  g_injected[static_cast<int>(call)].store(err, std::memory_order_relaxed);
}

ShmObject::ShmObject(const ShmName& name, int fd)
    : name_(name), path_(ShmPath(name.object)), fd_(fd) {}

ShmObject::~ShmObject() {
  if (base_ != nullptr) ::munmap(base_, mapped_size_);
  if (fd_ >= 0) ::close(fd_);
}

Error ShmObject::Failure(const char* call, int err) const {
  return Error(ErrorKindOfErrno(err), Message(name_, path_, call, err));
}

std::unique_ptr<ShmObject> ShmObject::CreateExclusive(const ShmName& name) {
  // O_EXCL: never adopt an object someone else made.
  const int fd = OpenCall(name.object, O_CREAT | O_EXCL);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return nullptr;
    throw Error(ErrorKindOfErrno(err), Message(name, ShmPath(name.object), "create", err));
  }
  std::unique_ptr<ShmObject> shm(new ShmObject(name, fd));
  // fchmod: a umask must not narrow 0600, or the job's other processes
  // could not open it; fstat: UnlinkIfSame compares the name's inode with
  // this one. Just created, the name is ours to remove if either fails.
  struct stat st;
  if (ChmodCall(fd) != 0 || StatCall(fd, &st) != 0) {
    const int err = errno;
    UnlinkCall(name.object);
    throw shm->Failure("create", err);
  }
  shm->dev_ = st.st_dev;
  shm->ino_ = st.st_ino;
  return shm;
}

std::unique_ptr<ShmObject> ShmObject::Open(const ShmName& name) {
  const int fd = OpenCall(name.object, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      throw Error(ErrorKind::kNotFound,
                  name.owner + " does not exist (no " + ShmPath(name.object) + ")");
    throw Error(ErrorKindOfErrno(err), Message(name, ShmPath(name.object), "open", err));
  }
  std::unique_ptr<ShmObject> shm(new ShmObject(name, fd));
  struct stat st;
  if (StatCall(fd, &st) != 0) {
    const int err = errno;
    throw shm->Failure("stat", err);
  }
  shm->dev_ = st.st_dev;
  shm->ino_ = st.st_ino;
  return shm;
}

bool ShmObject::Unlink(const ShmName& name) {
  if (UnlinkCall(name.object) == 0) return true;
  const int err = errno;
  if (err == ENOENT) return false;
  throw Error(ErrorKindOfErrno(err), Message(name, ShmPath(name.object), "remove", err));
}

void ShmObject::CheckOwned(mode_t forbidden_mode) const {
  struct stat st;
  if (StatCall(fd_, &st) != 0) {
    const int err = errno;
    throw Failure("stat", err);
  }
  if (st.st_uid != ::geteuid())
    throw Error(ErrorKind::kPermission,
                name_.owner + ": segment " + path_ + " is owned by uid " +
                    std::to_string(st.st_uid) + ", not by you (uid " + std::to_string(::geteuid()) +
                    "); remove it (as its owner or root) or pick another " + name_.kind + " name");
  if ((st.st_mode & forbidden_mode) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "0%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw Error(ErrorKind::kPermission,
                name_.owner + ": segment " + path_ + " has mode " + mode +
                    ((st.st_mode & 0022) != 0 ? ", writable" : ", readable") +
                    " by other users; tailcut makes 0600 segments. " + name_.removal);
  }
}

uint64_t ShmObject::Size() const {
  struct stat st;
  if (StatCall(fd_, &st) != 0) {
    const int err = errno;
    throw Failure("stat", err);
  }
  return static_cast<uint64_t>(st.st_size);
}

uint64_t ShmObject::WaitForSize(uint64_t min_size, std::chrono::milliseconds wait) const {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const uint64_t size = Size();
    if (size >= min_size || std::chrono::steady_clock::now() >= deadline) return size;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void ShmObject::Reserve(uint64_t size, const std::string& fix) {
  const int err = ReserveCall(fd_, size);
  if (err == 0) return;
  const std::string free = DevShmFree();
  UnlinkIfSame();
  throw Error(ErrorKindOfErrno(err), name_.owner + ": cannot reserve " + ByteSize(size) +
                                         " for segment " + path_ + ": " + std::strerror(err) +
                                         " (/dev/shm has " + free + " free); " + fix);
}

void ShmObject::Map(uint64_t size) {
  void* p = MapCall(fd_, size);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw Error(ErrorKindOfErrno(err), Message(name_, path_, "map", err, ByteSize(size)));
  }
  base_ = static_cast<char*>(p);
  mapped_size_ = size;
}

bool ShmObject::UnlinkIfSame() const noexcept {
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
  bool removed = false;
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    removed = UnlinkCall(name_.object) == 0;
  ::flock(fd_, LOCK_UN);
  return removed;
}

}  // namespace tailcut::detail
