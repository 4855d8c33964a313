// One mapped queue segment: creating, opening, validating and removing the
// POSIX shared-memory object behind a queue name (through ShmObject,
// engine/shm_object.h), and the attach state machine (AttachSegment) that
// joiners and tools share.
//
// A Segment owns its object (descriptor and mapping); accessors return references
// into the mapping, valid for the Segment's lifetime. Accessors take indices
// that the caller has bounds-checked against geometry(). Not thread-safe to
// open or close; the mapped contents are shared and accessed with atomics.
#ifndef TAILCUT_ENGINE_SEGMENT_H_
#define TAILCUT_ENGINE_SEGMENT_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/robust_mutex.h"
#include "engine/segment_layout.h"
#include "engine/shm_object.h"
#include "tailcut/error.h"

namespace tailcut::detail {

// How one attempt to attach to an existing queue segment ended
// (AttachSegment): the attach state machine's outcomes. The steps, in
// order: open the object (owner and mode), wait for its size, wait for its
// magic, check version and size, take the admin lock (kJoin), read the state
// word, validate the counts and tables.
enum class AttachState {
  kAttached,  // READY and valid: use it. kJoin: the admin lock is held.
  kNotFound,  // No object has the name: never created, or removed meanwhile.
  // Still smaller than a header after the wait: its creator died before
  // sizing it (with no wait: or it has not sized it yet).
  kUnsized,
  // No magic number after the wait: its creator died before making its admin
  // lock (with no wait: or it has not made it yet).
  kUnpublished,
  // Not READY yet. kJoin: seen under the admin lock, which a creator holds
  // until READY, so its creator died half-way (so is a state word other than
  // READY or REMOVED left by a lock holder that died). kInspect: being set up,
  // or its creator died.
  kCreating,
  // Marked REMOVED: its remover unlinks it next, unless it died first.
  kRemoved,
};

// Who attaches, and so what the machine may do.
enum class AttachMode {
  kJoin,     // a process joining the queue: takes the admin lock
  kInspect,  // a tool (ls, stat, rm): never locks
};

struct Attachment;

class Segment {
 public:
  // "tailcut.<uid>.<name>" (the shm_open name without the slash).
  static std::string ObjectName(const std::string& queue_name);
  static std::string PathOf(const std::string& queue_name);  // /dev/shm/...

  // Creates the object exclusively (O_EXCL, 0600) with `size` bytes reserved
  // (posix_fallocate). Returns nullptr if it already exists. Throws kNoSpace
  // (naming what /dev/shm has free), kPermission, kInvalidArgument, kIo.
  static std::unique_ptr<Segment> CreateExclusive(const std::string& queue_name, size_t size);

  // Opens an existing object and maps it once its size is at least a header,
  // waiting up to `wait` for a creator that has not sized it yet. Checks the
  // owner and mode. Throws kNotFound, kPermission, kTimeout (abandoned empty
  // object), kCorrupt. With `abandoned` set, an object that stays too small
  // is removed instead (*abandoned = true) and nullptr returned.
  // AttachSegment (below) is the whole attach; this is its first steps.
  static std::unique_ptr<Segment> OpenExisting(const std::string& queue_name,
                                               std::chrono::milliseconds wait,
                                               bool* abandoned = nullptr);
  // Removes the name whatever it refers to (`tailcut rm --force` of a
  // segment that fails validation). Returns false if there was none.
  // Throws kPermission (another user's object), kIo.
  static bool Remove(const std::string& queue_name);
  // Checks what a creator writes before the magic: version and size.
  // Throws kCorrupt.
  void CheckPreamble() const;

  ~Segment();

  // Waits up to `wait` for the magic (creator has set up the admin mutex).
  // Returns false on timeout.
  bool WaitForMagic(std::chrono::milliseconds wait) const;
  // Checks magic, version, size and counts, and computes the geometry.
  // Throws kCorrupt naming the segment and the bad field.
  void Validate();
  // Sets the geometry while creating (before Validate could succeed).
  void SetGeometry(const Geometry& g) { geometry_ = g; }

  // Removes the name if it still refers to this object (another process may
  // have replaced it already). Returns true if it removed it.
  bool UnlinkIfSame() const;

  const std::string& queue_name() const { return queue_name_; }
  const std::string& path() const { return shm_->path(); }
  size_t size() const { return size_; }
  const Geometry& geometry() const { return geometry_; }
  bool created() const { return created_; }

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  Counters& counters() const { return *At<Counters>(geometry_.counters); }
  Cursor& cursor() const { return *At<Cursor>(geometry_.cursor); }
  ClientEntry& client(uint64_t i) const { return At<ClientEntry>(geometry_.clients)[i]; }
  StepEntry& step(uint64_t i) const { return At<StepEntry>(geometry_.steps)[i]; }
  LeaseEntry& lease(uint64_t i) const { return At<LeaseEntry>(geometry_.leases)[i]; }
  FileEntry& file(uint64_t i) const { return At<FileEntry>(geometry_.files)[i]; }
  ItemEntry& item(uint64_t i) const { return At<ItemEntry>(geometry_.items)[i]; }
  char* path_bytes() const { return At<char>(geometry_.paths); }
  SharedAtomic<uint64_t>& done_word(uint64_t i) const {
    return At<SharedAtomic<uint64_t>>(geometry_.bitmap)[i];
  }
  bool IsDone(uint64_t ticket) const {
    // acquire: pairs with FinishAck's acq_rel fetch_or of the bit
    // (lease.cc).
    return (done_word(ticket / 64).load(std::memory_order_acquire) >> (ticket % 64)) & 1;
  }
  // A fed queue only (geometry().fed): tickets this host must not hand out,
  // because another host holds or finished them. Set by the feeder before
  // it raises the cursor's limit past them (release there, acquire here).
  FedBlock& fed_block(uint64_t i) const { return At<FedBlock>(geometry_.fed_blocks)[i]; }
  SharedAtomic<uint64_t>& skip_word(uint64_t i) const {
    return At<SharedAtomic<uint64_t>>(geometry_.skip)[i];
  }
  bool IsSkipped(uint64_t ticket) const {
    return geometry_.fed &&
           // seq_cst: pairs with the seq_cst skip-bit changes and cursor load of LocalFeed::
           // Grant, so that a taker passing a ticket the feeder just gave back to this host
           // either sees it is no longer skipped or was seen passing it (then a sweep re-issues).
           ((skip_word(ticket / 64).load(std::memory_order_seq_cst) >> (ticket % 64)) & 1);
  }

 private:
  friend Attachment AttachSegment(const std::string&, AttachMode, std::chrono::milliseconds);

  Segment(std::string queue_name, std::unique_ptr<ShmObject> shm, bool created);
  // Opens the object unmapped, checking owner, mode and that its size is 0
  // (not sized yet) or at least a header. Throws as OpenExisting.
  static std::unique_ptr<Segment> OpenUnmapped(const std::string& queue_name);
  // Maps the object once it is at least a header, waiting up to `wait`.
  // Returns false, unmapped, if it stayed smaller; *size is what it had.
  bool MapWhenSized(std::chrono::milliseconds wait, uint64_t* size);
  // kTimeout: the object stayed `size` bytes for `wait`.
  Error NeverSized(uint64_t size, std::chrono::milliseconds wait) const;
  void Map(size_t size);
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

  std::string queue_name_;
  std::unique_ptr<ShmObject> shm_;
  bool created_ = false;
  char* base_ = nullptr;  // shm_->base() once mapped, kept here for the accessors
  size_t size_ = 0;
  Geometry geometry_;
};

// The result of AttachSegment. `admin` is declared after `segment`, so it is
// released while its mutex is still mapped.
struct Attachment {
  AttachState state = AttachState::kNotFound;
  // Open in every state but kNotFound; mapped from kUnpublished on.
  std::unique_ptr<Segment> segment;
  // kJoin, in kCreating, kRemoved and kAttached: the admin lock, held.
  std::unique_ptr<RobustLock> admin;
  // Every state but kAttached: what to report when the caller does not
  // recover from it (a joiner removes a dead creator's segment and starts
  // over; a tool reports). It names the segment and what to do.
  std::optional<Error> problem;
};

// The attach state machine: one attempt to attach to the queue segment of
// `queue_name`, waiting up to `wait` at each step that waits for a creator
// (size, magic, admin lock). Nothing is changed or removed: what to do with
// a dead creator's segment is the caller's choice. Throws what no attempt
// recovers from: kPermission (another user's object, or one writable by
// others), kCorrupt (a size no creator makes, a bad magic number, layout
// version or size, an unusable admin lock, an unknown state word, a failed
// Validate), kTimeout (kJoin: the admin lock held past `wait`), kIo.
Attachment AttachSegment(const std::string& queue_name, AttachMode mode,
                         std::chrono::milliseconds wait);

// The size of the largest header a segment can start with; objects smaller
// than this cannot be queues.
inline constexpr size_t kMinSegmentSize = sizeof(Header);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_SEGMENT_H_
