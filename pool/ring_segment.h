// The POSIX shared-memory object behind a batch ring name: creating it
// exclusively with its pages reserved, opening and mapping an existing one
// that this user owns, and removing it.
//
// A RingSegment owns its descriptor and mapping. Not thread-safe to open or
// close; the mapped contents are shared and accessed with atomics.
#ifndef TAILCUT_POOL_RING_SEGMENT_H_
#define TAILCUT_POOL_RING_SEGMENT_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

namespace tailcut::detail {

class RingSegment {
 public:
  // "tailcut-ring.<uid>.<name>": beside the queues' "tailcut.<uid>.<name>",
  // never mistaken for one.
  static std::string ObjectName(const std::string& name);
  static std::string PathOf(const std::string& name);  // /dev/shm/...

  // Creates the object exclusively (O_EXCL, 0600) with `size` bytes reserved
  // (posix_fallocate) and maps it. Returns nullptr if it exists. Throws
  // kNoSpace (naming what /dev/shm has free), kPermission, kIo.
  static std::unique_ptr<RingSegment> CreateExclusive(const std::string& name, size_t size);
  // Opens and maps an existing object once it is at least `min_size` bytes,
  // waiting up to `wait` for a creator that has not sized it yet. Checks the
  // owner and mode. Throws kNotFound, kPermission, kTimeout, kCorrupt.
  static std::unique_ptr<RingSegment> OpenExisting(const std::string& name, size_t min_size,
                                                   std::chrono::milliseconds wait);
  ~RingSegment();

  // Removes the name if it still refers to this object.
  bool UnlinkIfSame() const;

  char* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }

 private:
  RingSegment(std::string name, int fd);
  void Map(size_t size);

  std::string name_, path_;
  int fd_ = -1;
  char* base_ = nullptr;
  size_t size_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_POOL_RING_SEGMENT_H_
