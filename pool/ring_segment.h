// The POSIX shared-memory object behind a batch ring name: creating it
// exclusively with its pages reserved, opening and mapping an existing one
// that this user owns, and removing it; every system call through ShmObject
// (engine/shm_object.h).
//
// A RingSegment owns its object (descriptor and mapping). Not thread-safe to
// open or close; the mapped contents are shared and accessed with atomics.
#ifndef TAILCUT_POOL_RING_SEGMENT_H_
#define TAILCUT_POOL_RING_SEGMENT_H_

#include <chrono>
#include <memory>
#include <string>

#include "engine/shm_object.h"

namespace tailcut::detail {

class RingSegment {
 public:
  // "tailcut-ring.<uid>.<name>": beside the queues' "tailcut.<uid>.<name>",
  // never mistaken for one.
  static std::string ObjectName(const std::string& name);
  static std::string PathOf(const std::string& name);  // /dev/shm/...

  // Creates the object exclusively (O_EXCL, 0600) with `size` bytes reserved
  // (posix_fallocate) and maps it. Returns nullptr if it exists. Throws
  // kNoSpace (naming what /dev/shm has free), kPermission, kInvalidArgument,
  // kIo.
  static std::unique_ptr<RingSegment> CreateExclusive(const std::string& name, size_t size);
  // Opens and maps an existing object once it is at least `min_size` bytes,
  // waiting up to `wait` for a creator that has not sized it yet. Checks the
  // owner and mode. Throws kNotFound, kPermission, kTimeout, kNoSpace, kIo.
  static std::unique_ptr<RingSegment> OpenExisting(const std::string& name, size_t min_size,
                                                   std::chrono::milliseconds wait);
  // Removes the name whatever it refers to. Returns false if there was none.
  // Throws kPermission (another user's), kIo.
  static bool Remove(const std::string& name);

  // Removes the name if it still refers to this object.
  bool UnlinkIfSame() const { return shm_->UnlinkIfSame(); }

  char* base() const { return shm_->base(); }
  size_t size() const { return shm_->mapped_size(); }
  const std::string& name() const { return name_; }
  const std::string& path() const { return shm_->path(); }

 private:
  RingSegment(std::string name, std::unique_ptr<ShmObject> shm)
      : name_(std::move(name)), shm_(std::move(shm)) {}

  std::string name_;
  std::unique_ptr<ShmObject> shm_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_POOL_RING_SEGMENT_H_
