// tailcut/batch_ring.h: a host-wide ring of batches between loader and
// trainer processes.
//
// Loader processes (any number, joining and leaving at run time) fill
// batches in slots of one shared arena and publish them; every trainer
// process of the host pops the next ready batch, uses it in place (no copy
// between processes) and releases it. A slow loader slows nobody, and no
// trainer waits for its own loader.
//
// Contract
//  * Thread safety: a BatchRing may be used by many threads of one process
//    at once. AcquireSlot/Publish/Abandon/Pop/Release are noexcept, lock-free
//    and allocation-free; they make a system call only to sleep (no slot, no
//    batch) or to wake a sleeper.
//  * Process safety: up to Options::max_clients processes may open the same
//    ring, each as a loader or a trainer. Liveness is a robust mutex each
//    holds for its lifetime (never its pid), as for the WorkQueue.
//  * Ownership: AcquireSlot hands the caller one slot to write (FILLING) until
//    it calls Publish or Abandon; Pop hands it one batch to read (POPPED) until
//    it calls Release. The spans stay valid while the BatchRing lives, but the
//    contents belong to the caller only between those calls.
//  * The unit of recovery is the slot. When a client dies at any point:
//     - a loader's unpublished slot (FILLING) goes back to FREE, its content
//       discarded. The loader must not ack the WorkQueue items of a batch
//       until Publish returned kOk: the items of a batch that never got
//       published then come back through the queue's own recovery.
//     - a trainer's popped batch (POPPED, not released) is published again
//       (READY, generation + 1) and popped by another trainer, so each
//       published batch is released exactly once by a live trainer, or left
//       READY and counted in Stats when no trainer is left to pop it.
//    Recovery is done by whichever process finds the death first (while it
//    waits, or in RecoverDeadClients). No slot ever leaks.
//  * Tokens carry the slot's generation: a call with a token whose slot has
//    moved on (released twice, or recovered under a process it thought dead)
//    returns kStale and changes nothing.
//  * Order and end: batches are popped in publish order (FIFO across
//    loaders), whatever their epoch: a batch of epoch e + 1 may come out
//    before epoch e is ended. EndEpoch(e) declares that no batch of epoch
//    <= e will be published any more; Pop(through_epoch = e) then returns
//    kEnd once no batch is ready. Close() ends every epoch. Equal steps for
//    synchronous trainers (every rank the same number of batches per epoch)
//    belong to a layer above: it counts pops per epoch from ReadyBatch::epoch.
//  * Blocking: AcquireSlot and Pop sleep at most until their deadline, and
//    wake at least every 10 ms to look for dead clients; a caller that must
//    answer signals (Python's Ctrl-C) passes short deadlines and loops.
//  * Fork: a BatchRing belongs to the process that opened it; a forked child
//    opens its own. In the child the parent's object is inert: the hot-path
//    calls return kForked, EndEpoch/Close/RecoverDeadClients do nothing,
//    Stats throws ("batch ring 'r' was opened by process X; this is process
//    Y (a forked child must open its own BatchRing)"), and destroying it only
//    unmaps the segment: the parent's client slot and slots are untouched.
//  * CUDA: a trainer's Open registers its mapping of the arena with the CUDA
//    runtime when one can be loaded at run time and has a device
//    (cudaHostRegister, portable; no build dependency on CUDA), so that
//    copying a popped batch to a GPU is DMA from the slot. Once per Open, in
//    the opening process only; undone when the BatchRing is destroyed. It
//    makes a CUDA context on the process's current device: choose the device
//    first. A GPU that refuses is a notice (once per process); a host
//    without a GPU gets none. memory_state() says which.
//  * Lifetime: the first Open creates the segment, later ones attach (the
//    same slot_bytes, num_slots and max_clients, or kConfigMismatch). The last
//    client to leave a closed ring removes it. A ring whose clients all died
//    is stale: the next Open with the same configuration adopts it and
//    recovers its slots (RemoveBatchRing removes it).
//  * Errors: Open, Stats and InspectBatchRing throw tailcut::Error naming the
//    ring, the segment and the fix; the hot path returns RingStatus.
#ifndef TAILCUT_BATCH_RING_H_
#define TAILCUT_BATCH_RING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tailcut/deadline.h"
#include "tailcut/error.h"
#include "tailcut/export.h"

namespace tailcut {

struct BatchRingOptions {
  std::string name = "batch_ring";  // [A-Za-z0-9._-], per user
  uint64_t slot_bytes = 4 << 20;    // bytes of one batch
  uint32_t num_slots = 16;          // batches in flight, 1..4095
  uint32_t max_clients = 64;        // loaders and trainers together, 1..1024
  std::chrono::milliseconds attach_timeout{10000};
  // Trainers: register the arena with the CUDA runtime (see Contract: CUDA).
  // Loaders never do: they only write the slots.
  bool cuda_register = true;
  // Where one-line notices go (a GPU the arena could not be registered
  // with). Default: stderr.
  std::function<void(const std::string&)> on_notice;
};

enum class RingRole { kLoader, kTrainer };

enum class RingStatus {
  kOk,
  kTimeout,  // the deadline passed with no free slot / no ready batch
  kEnd,      // Pop: no batch ready and every epoch asked for has ended
  kClosed,   // Publish: the batch's epoch was already ended
  kStale,    // the token's slot has moved on (its generation): nothing changed
  kInvalid,  // wrong role or bad argument: the caller's mistake
  kCorrupt,  // the segment holds what no client writes (a slot id or size out of
             // range): it was damaged; remove the ring and start again
  kForked,   // called in a forked child of the process that opened the ring
};

// A short lowercase name, e.g. "corrupt", for messages and logs.
TAILCUT_EXPORT const char* RingStatusName(RingStatus status) noexcept;

// Names one slot at one generation.
struct SlotToken {
  uint32_t slot = 0;
  uint64_t generation = 0;
};

// A slot to fill: `data` is slot_bytes long, `user_header` a few bytes for
// the caller's own offsets (e.g. where each tensor starts).
struct WritableBatch {
  SlotToken token;
  std::span<std::byte> data;
  std::span<std::byte> user_header;
};

// A popped batch: `data` is the published bytes.
struct ReadyBatch {
  SlotToken token;
  std::span<const std::byte> data;
  std::span<const std::byte> user_header;
  uint64_t epoch = 0;
  uint64_t records = 0;
  uint32_t loader = 0;  // client slot of its publisher
};

struct RingClientStats {
  uint32_t slot = 0;
  int pid = 0;
  bool alive = false;
  RingRole role = RingRole::kLoader;
  uint64_t acquired = 0, published = 0, abandoned = 0, popped = 0, released = 0;
  double wait_seconds = 0;     // waits for a slot or a batch that ended
  double waiting_seconds = 0;  // the wait it is in now, so far (0: not waiting)
  uint64_t joined_ns = 0;      // CLOCK_MONOTONIC, as BatchRingStats::now_ns
};

struct BatchRingStats {
  std::string name;
  std::string segment_path;
  uint64_t slot_bytes = 0;
  uint32_t num_slots = 0;
  // Slots by state, counted from the slot words (one moment, not atomic).
  uint32_t free = 0, filling = 0, ready = 0, popped = 0;
  uint64_t published = 0, released = 0, reclaimed = 0, redelivered = 0, stale_tokens = 0;
  bool closed = false;
  uint64_t ended_through = 0;  // highest ended epoch + 1 (0: none)
  uint64_t now_ns = 0;         // CLOCK_MONOTONIC when these were read: rates over a lifetime
  std::vector<RingClientStats> clients;
};

class TAILCUT_EXPORT BatchRing {
 public:
  using Clock = std::chrono::steady_clock;  // Deadline is Clock::time_point

  // Creates or attaches to the ring options.name and registers this process
  // in the given role. Throws tailcut::Error (kInvalidArgument, kNoSpace for
  // a full /dev/shm, kPermission, kConfigMismatch, kCorrupt, kTimeout).
  static std::unique_ptr<BatchRing> Open(const BatchRingOptions& options, RingRole role);

  // Loader: a FREE slot to fill, waiting (futex) until `deadline` for one.
  // kOk, kTimeout, kInvalid (a trainer), kCorrupt, kForked.
  RingStatus AcquireSlot(WritableBatch* out, Deadline deadline) noexcept;
  [[deprecated("out-parameter first, deadline last: AcquireSlot(out, deadline)")]] RingStatus
  AcquireSlot(Deadline deadline, WritableBatch* out) noexcept {
    return AcquireSlot(out, deadline);
  }
  // Loader: publishes the first `bytes` of the slot as a batch of `epoch`
  // with `records` records, and wakes a waiting trainer. kOk, kStale,
  // kClosed (the epoch was ended; the slot is still the caller's: Abandon
  // it), kInvalid (bytes > slot_bytes, or epoch == kAllEpochs).
  RingStatus Publish(const SlotToken& token, uint64_t epoch, uint64_t records,
                     uint64_t bytes) noexcept;
  // Loader: hands the slot back unpublished. kOk, kStale.
  RingStatus Abandon(const SlotToken& token) noexcept;

  // Trainer: the next ready batch, waiting (futex) until `deadline`. kOk;
  // kEnd when none is ready and epoch `through_epoch` (kAllEpochs: every
  // epoch) has ended; kTimeout; kInvalid (a loader); kCorrupt; kForked.
  RingStatus Pop(uint64_t through_epoch, ReadyBatch* out, Deadline deadline) noexcept;
  [[deprecated("out-parameter first, deadline last: Pop(through_epoch, out, deadline)")]] RingStatus
  Pop(uint64_t through_epoch, Deadline deadline, ReadyBatch* out) noexcept {
    return Pop(through_epoch, out, deadline);
  }
  // Trainer: gives the batch's slot back to the loaders. kOk, kStale.
  RingStatus Release(const SlotToken& token) noexcept;
  // Any role: calls `fn` with each batch READY now, without taking it (a
  // checkpoint reads what waits in the ring). The spans are the slot's and
  // valid during the call only; a trainer may pop and release the batch
  // meanwhile, so call it when none pops. Returns how many batches left
  // READY while `fn` read them (their contents may be torn). Not the hot
  // path: it allocates nothing but makes a pass over every slot.
  int PeekReady(const std::function<void(const ReadyBatch&)>& fn) const;

  // Any role: no batch of epoch <= `epoch` will be published any more (the
  // caller knows, e.g. from the WorkQueue's end). Wakes waiting trainers.
  void EndEpoch(uint64_t epoch) noexcept;
  // EndEpoch for every epoch.
  void Close() noexcept;

  // Looks for dead clients and recovers their slots (waits do this every
  // few milliseconds). Returns how many it recovered.
  int RecoverDeadClients() noexcept;

  BatchRingStats Stats() const;
  // Whether this process registered the arena with CUDA (a trainer, see
  // Contract: CUDA).
  bool cuda_pinned() const noexcept;
  // One line on the arena: "arena: 64 MiB (16 slots of 4 MiB)", then for a
  // trainer that asked for registration " + CUDA-pinned" or "; not
  // CUDA-pinned: <why>", e.g. "no CUDA device (cudaGetDeviceCount: CUDA
  // error 100 ...)".
  const std::string& memory_state() const noexcept;
  uint32_t client_slot() const noexcept;
  uint64_t slot_bytes() const noexcept;
  uint32_t num_slots() const noexcept;

  // Leaves the ring (and removes it when it was closed and this was the
  // last client).
  ~BatchRing();
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  static constexpr uint64_t kAllEpochs = ~uint64_t{0};
  static constexpr size_t kUserHeaderBytes = 256;

 private:
  struct Impl;
  explicit BatchRing(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Stats of an existing ring without joining it (dead clients found on the
// way are recovered). Throws kNotFound, kCorrupt, kPermission.
TAILCUT_EXPORT BatchRingStats InspectBatchRing(const std::string& name);
// Removes the ring's segment (processes still attached keep their mapping).
// Returns false if there was none. Throws kInvalidArgument (a bad name),
// kPermission (another user's ring), kIo.
TAILCUT_EXPORT bool RemoveBatchRing(const std::string& name);
// /dev/shm/tailcut-ring.<uid>.<name>
TAILCUT_EXPORT std::string BatchRingSegmentPath(const std::string& name);

}  // namespace tailcut

#endif  // TAILCUT_BATCH_RING_H_
