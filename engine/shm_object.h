// One POSIX shared-memory object in /dev/shm: creating it exclusively,
// opening it, checking its owner, reserving, sizing, mapping and removing it.
// Every shared-memory object of tailcut (a queue's segment, a batch ring's)
// goes through here, so that each failed system call has its errno read at
// once, its kind from ErrorKindOfErrno (tailcut/error.h), and a message that
// names the object and the fix; and so that tests have one seam to make those
// calls fail (InjectShmFailure).
//
// An ShmObject owns its descriptor and its mapping (at most one, made by Map)
// and releases both when destroyed; it never removes the name unless asked.
// Not thread-safe: one thread opens, maps and closes it. Every call here is
// the control path and throws tailcut::Error.
#ifndef TAILCUT_ENGINE_SHM_OBJECT_H_
#define TAILCUT_ENGINE_SHM_OBJECT_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tailcut/error.h"
#include "tailcut/export.h"

namespace tailcut::detail {

// Who an object is, for its name in /dev/shm and for messages.
struct ShmName {
  std::string object;  // the shm_open name, no slash: "tailcut.1000.q"
  std::string owner;   // how messages start: "queue 'q'", "batch ring 'r'"
  std::string kind;    // what the user names: "queue", "batch ring"
  // How a person removes a bad one, a sentence: "Remove it with `tailcut rm
  // --force q`".
  std::string removal;
};

class ShmObject {
 public:
  // Creates `name` exclusively (O_EXCL) with mode 0600, whatever the umask.
  // Returns nullptr if the name exists. Throws naming the path and the fix
  // (kPermission, kInvalidArgument for an unusable name, kNoSpace, kIo); a
  // failure after the name was made removes it again.
  static std::unique_ptr<ShmObject> CreateExclusive(const ShmName& name);
  // Opens `name` read-write, unmapped. Throws kNotFound ("<owner> does not
  // exist (no <path>)"), kPermission (another user's object), others as
  // CreateExclusive.
  static std::unique_ptr<ShmObject> Open(const ShmName& name);
  // Removes `name` whatever it refers to. Returns false if there was none.
  // Throws kPermission (another user's object), others as CreateExclusive.
  static bool Unlink(const ShmName& name);

  ~ShmObject();
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  // Refuses an object another user made, or one whose mode has any bit of
  // `forbidden_mode` (e.g. 0022: writable by others): it could hold
  // anything. Throws kPermission naming owner or mode and the fix.
  void CheckOwned(mode_t forbidden_mode) const;
  // The object's size in bytes now. Throws kIo.
  uint64_t Size() const;
  // Waits up to `wait` for the size to reach `min_size`, looking every 2 ms.
  // Returns the last size seen (below `min_size`: it did not grow).
  uint64_t WaitForSize(uint64_t min_size, std::chrono::milliseconds wait) const;
  // Reserves `size` bytes (posix_fallocate), so that a full /dev/shm fails
  // here and not with SIGBUS on first touch. On failure removes the name
  // (if still this object's) and throws: kNoSpace "<owner>: cannot reserve
  // <size> for segment <path>: <strerror> (/dev/shm has <free> free);
  // <fix>", with `fix` the caller's advice.
  void Reserve(uint64_t size, const std::string& fix);
  // Maps the first `size` bytes read-write, shared. Once only. Throws
  // kNoSpace (no address space or memory), kInvalidArgument, kIo.
  void Map(uint64_t size);

  // Removes the name if it still refers to this object (another process may
  // have replaced it already), under an exclusive flock of the object so
  // that two removers cannot interleave: without it, one could check, the
  // other unlink and create a new object, and the first then unlink that new
  // one. The kernel drops the lock if its holder dies. Returns true if it
  // removed the name. Never throws.
  bool UnlinkIfSame() const noexcept;

  const std::string& path() const { return path_; }  // /dev/shm/<object>
  char* base() const { return base_; }               // null until Map
  uint64_t mapped_size() const { return mapped_size_; }

 private:
  ShmObject(const ShmName& name, int fd);
  // The message of a failed `call` on this object: "<owner>: cannot <call>
  // segment <path>: <strerror>; <fix>".
  Error Failure(const char* call, int err) const;

  ShmName name_;
  std::string path_;
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  char* base_ = nullptr;
  uint64_t mapped_size_ = 0;
};

// "/dev/shm/" + object.
std::string ShmPath(const std::string& object);

// What /dev/shm has free for this user, as ByteSize says it, or "unknown".
std::string DevShmFree();

// A byte count for messages, exact and in the largest binary unit it
// reaches: "900 bytes", "256 KiB", "12.3 MiB (12897484 bytes)".
TAILCUT_EXPORT std::string ByteSize(uint64_t bytes);

// The system calls of this module, for InjectShmFailure.
enum class ShmCall { kOpen, kChmod, kStat, kReserve, kMap, kUnlink };

// Test seam: the next `call` in this process fails with `err` (errno as the
// call would set it) without reaching the kernel; 0 clears. Calls made while
// another thread injects may see it or not.
void InjectShmFailure(ShmCall call, int err);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_SHM_OBJECT_H_
