#include "pool/ring_segment.h"

#include <unistd.h>

#include "tailcut/error.h"

namespace tailcut::detail {

namespace {

ShmName NameOf(const std::string& name) {
  return {RingSegment::ObjectName(name), "batch ring '" + name + "'", "batch ring",
          "Remove it (RemoveBatchRing, or `tailcut ring --rm " + name + "`) and start again"};
}

}  // namespace

std::string RingSegment::ObjectName(const std::string& name) {
  return "tailcut-ring." + std::to_string(::geteuid()) + "." + name;
}

std::string RingSegment::PathOf(const std::string& name) { return ShmPath(ObjectName(name)); }

std::unique_ptr<RingSegment> RingSegment::CreateExclusive(const std::string& name, size_t size) {
  std::unique_ptr<ShmObject> shm = ShmObject::CreateExclusive(NameOf(name));
  if (shm == nullptr) return nullptr;
  std::unique_ptr<RingSegment> seg(new RingSegment(name, std::move(shm)));
  // Every page now: a full /dev/shm must fail here with a message, not with
  // SIGBUS when a loader first writes a slot.
  seg->shm_->Reserve(size,
                     "free space in /dev/shm or use fewer or smaller slots "
                     "(num_slots, slot_bytes)");
  seg->shm_->Map(size);
  return seg;
}

std::unique_ptr<RingSegment> RingSegment::OpenExisting(const std::string& name, size_t min_size,
                                                       std::chrono::milliseconds wait) {
  std::unique_ptr<RingSegment> seg(new RingSegment(name, ShmObject::Open(NameOf(name))));
  // Neither another user's object nor one others may read or write: a ring
  // carries the job's data.
  seg->shm_->CheckOwned(0077);
  const uint64_t size = seg->shm_->WaitForSize(min_size, wait);
  if (size < min_size)
    throw Error(ErrorKind::kTimeout,
                "batch ring '" + name + "': " + seg->path() + " is " + std::to_string(size) +
                    " bytes, too small for a ring, and did not grow for " +
                    std::to_string(wait.count()) +
                    " ms (its creator probably died); remove it (RemoveBatchRing) and start again");
  seg->shm_->Map(size);
  return seg;
}

bool RingSegment::Remove(const std::string& name) { return ShmObject::Unlink(NameOf(name)); }

}  // namespace tailcut::detail
