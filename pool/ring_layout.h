// The layout of a batch ring's shared-memory segment.
//
// Plain fixed-size structs at offsets computed from a few counts in the
// header; nothing in the segment is a pointer. Offsets are never stored: an
// attacher recomputes them from the counts and checks that they add up to
// the object's size (ComputeRingGeometry).
//
//   RingHeader | RingCounters | RingClient[max_clients] | SlotHeader[num_slots]
//   | IdRing free | cells[ring_cells] | IdRing ready | cells[ring_cells]
//   | arena: num_slots × slot_stride bytes (page aligned)
//
// A slot's word (state | owner | generation) is the one truth about the
// slot. The two rings only carry (slot id, generation tag) entries that say
// "this slot, at this generation, belongs here"; an entry whose slot has
// moved on is stale and is dropped by whoever finds it at the head.
//
// Invariants (the numbers are referred to in ring_core.cc):
//  R1. A slot word changes only by CAS, and every change bumps the
//      generation. A token (slot, generation) is valid exactly while the word
//      still carries that generation, so a stale token is refused.
//  R2. An entry (id, tag) in the free ring is live while the slot is FREE
//      with generation tag; in the ready ring, while the slot is READY with
//      generation tag. Whoever moves a slot out of FREE or READY does so by
//      CAS on the slot word first; the ring entry is then stale.
//  R3. A move into FREE or READY pushes the entry for generation g + 1
//      first, then CASes the word from generation g. An entry whose tag is
//      the word's generation + 1, in a state that may move to the ring's
//      state (FILLING or POPPED), is a move in flight: whoever finds it may
//      complete the CAS for its author, whose own CAS then fails harmlessly.
//      So a process killed between the push and the CAS loses nothing.
//  R4. A ring cell changes only by CAS: pushing writes FULL over the EMPTY
//      cell of its position, popping writes EMPTY for the next lap. The head
//      and tail positions are hints that anyone advances by CAS past a cell
//      that was already pushed (tail) or emptied (head). A process killed
//      between a cell CAS and the index CAS blocks nobody.
//  R5. Every slot owned by a client (FILLING or POPPED with its owner field)
//      is found by a scan of the slot words when the client dies: FILLING
//      goes back to FREE, POPPED to READY (redelivered). Together with R3
//      no slot ever leaks, and a slot is POPPED by at most one live client.
//  R6. A client slot is ACTIVE only while its life mutex is held by the
//      client's holder thread, or by nobody after the client died (the next
//      trylock gets EOWNERDEAD and recovers it; a recoverer that dies passes
//      EOWNERDEAD on, and every recovery step is a CAS that may be redone).
#ifndef TAILCUT_POOL_RING_LAYOUT_H_
#define TAILCUT_POOL_RING_LAYOUT_H_

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include "engine/shared_atomic.h"
#include "tailcut/export.h"

namespace tailcut::detail {

inline constexpr uint64_t kRingMagic = 0x31474e4952544321ull;  // "!CTRING1"
inline constexpr uint32_t kRingLayoutVersion = 1;
inline constexpr size_t kRingCacheLine = 64;
inline constexpr size_t kSlotAlign = 4096;
inline constexpr uint32_t kMaxRingSlots = 4095;  // ids fit kRingIdBits
inline constexpr uint32_t kMaxRingClients = 1024;
inline constexpr size_t kUserHeaderBytes = 256;
inline constexpr uint64_t kAllEpochs = ~uint64_t{0};

enum RingState : uint32_t { kRingCreating = 0, kRingReady = 1 };
enum RingClientState : uint32_t { kRingClientFree = 0, kRingClientActive = 1 };
enum RingRole : uint32_t { kRoleLoader = 1, kRoleTrainer = 2 };

// Slot word: state (3 bits) | owner client (13 bits) | generation (48 bits).
enum SlotState : uint64_t { kSlotFree = 0, kSlotFilling = 1, kSlotReady = 2, kSlotPopped = 3 };
inline constexpr uint64_t kNoClient = (uint64_t{1} << 13) - 1;
inline constexpr uint64_t kGenMask = (uint64_t{1} << 48) - 1;
inline uint64_t SlotWord(uint64_t state, uint64_t owner, uint64_t gen) {
  return state | (owner << 3) | ((gen & kGenMask) << 16);
}
inline uint64_t SlotStateOf(uint64_t w) { return w & 7; }
inline uint64_t SlotOwnerOf(uint64_t w) { return (w >> 3) & kNoClient; }
inline uint64_t SlotGenOf(uint64_t w) { return w >> 16; }

// Ring cell: lap (28 bits) | full (1) | slot id (12) | generation tag (23).
// EMPTY with lap L is ready for a push at the position of lap L; FULL with
// lap L holds the entry pushed there.
inline constexpr int kRingTagBits = 23;
inline constexpr int kRingIdBits = 12;
inline constexpr uint64_t kRingTagMask = (uint64_t{1} << kRingTagBits) - 1;
inline constexpr uint64_t kRingIdMask = (uint64_t{1} << kRingIdBits) - 1;
inline constexpr uint64_t kRingLapMask = (uint64_t{1} << 28) - 1;
inline uint64_t EmptyCell(uint64_t lap) { return (lap & kRingLapMask) << 36; }
inline uint64_t FullCell(uint64_t lap, uint64_t id, uint64_t gen) {
  return ((lap & kRingLapMask) << 36) | (uint64_t{1} << 35) | ((id & kRingIdMask) << kRingTagBits) |
         (gen & kRingTagMask);
}
inline uint64_t CellLap(uint64_t c) { return c >> 36; }
inline bool CellFull(uint64_t c) { return (c >> 35) & 1; }
inline uint64_t CellId(uint64_t c) { return (c >> kRingTagBits) & kRingIdMask; }
inline uint64_t CellTag(uint64_t c) { return c & kRingTagMask; }
inline uint64_t GenTagOf(uint64_t gen) { return gen & kRingTagMask; }

// magic and state: release stores by the creator (BatchRing::Open), acquire
// loads by attachers and InspectBatchRing: what was written before each store
// is visible after the load that sees it.
struct alignas(kRingCacheLine) RingHeader {
  SharedAtomic<uint64_t> magic;  // written first, once the admin mutex exists
  uint32_t layout_version;
  SharedAtomic<uint32_t> state;  // RingState; READY is published last
  uint64_t total_size;
  uint32_t creator_uid;
  int32_t creator_pid;
  uint64_t created_unix_ns;
  // Configuration, compared field by field on attach.
  uint64_t fingerprint;
  uint64_t slot_bytes;  // usable bytes per slot
  uint32_t num_slots;
  uint32_t max_clients;
  uint32_t ring_cells;  // power of two >= 2 * num_slots
  uint32_t reserved0;
  // Serialises joins and leaves. Robust: a holder that dies hands the next
  // locker EOWNERDEAD.
  pthread_mutex_t admin_mutex;
};

// The futex words and their waiter counts are seq_cst, with a seq_cst fence
// on both sides (Wake and Wait in batch_ring.cc). ended_through_plus1 grows by
// acq_rel CAS (EndEpoch) and is loaded with acquire (Pop, Publish, Leave,
// Stats). The other counters are statistics, relaxed.
struct alignas(kRingCacheLine) RingCounters {
  // Futex words, each bumped when its waiters should look again, with a
  // count of sleepers so that the hot path makes no system call when none.
  SharedAtomic<uint32_t> ready_seq;
  SharedAtomic<uint32_t> ready_waiters;
  SharedAtomic<uint32_t> free_seq;
  SharedAtomic<uint32_t> free_waiters;
  // EndEpoch(e) raises this to e + 1 (Close: kAllEpochs): no batch of an
  // epoch below it is published any more. Only grows.
  SharedAtomic<uint64_t> ended_through_plus1;
  SharedAtomic<uint64_t> published;
  SharedAtomic<uint64_t> released;
  SharedAtomic<uint64_t> reclaimed;    // FILLING slots of dead loaders freed
  SharedAtomic<uint64_t> redelivered;  // POPPED slots of dead trainers made READY again
  SharedAtomic<uint64_t> stale_tokens;
  SharedAtomic<uint64_t> clients_joined;
};

// state: release stores (Register, Leave, RecoverOne) pair with the acquire
// loads of whoever checks a client's life; the life mutex decides. The other
// fields are relaxed: reset before Register's release of state, statistics
// after it.
struct alignas(kRingCacheLine) RingClient {
  pthread_mutex_t life;          // held by the client's holder thread (R6)
  SharedAtomic<uint32_t> state;  // RingClientState
  SharedAtomic<uint32_t> role;   // RingRole
  SharedAtomic<int32_t> pid;     // for people, never for decisions
  SharedAtomic<uint64_t> joined_ns;
  SharedAtomic<uint64_t> left_ns;
  SharedAtomic<uint64_t> acquired;
  SharedAtomic<uint64_t> published;
  SharedAtomic<uint64_t> abandoned;
  SharedAtomic<uint64_t> popped;
  SharedAtomic<uint64_t> released;
  SharedAtomic<uint64_t> wait_ns;  // time spent waiting for a slot or a batch
  // When the client's latest wait that sleeps began (CLOCK_MONOTONIC ns), 0
  // while it does not wait: lets `tailcut top` see a trainer starving now,
  // before its wait ends and is added to wait_ns. With several threads of one
  // client waiting at once, the latest to start (its end clears only its own).
  SharedAtomic<uint64_t> waiting_since_ns;
};
// waiting_since_ns took padding at the end: a segment made before it (zeros
// there, "not waiting") has the same layout, so the version stays 1.
static_assert(sizeof(RingClient) == 128, "RingClient is part of ring layout version 1");

// Written by the slot's owner while it holds it (FILLING); read by a popper
// after the CAS that made the slot POPPED (acquire, pairing through R3's
// release chain with the owner's writes).
struct alignas(kRingCacheLine) SlotHeader {
  SharedAtomic<uint64_t> word;
  SharedAtomic<uint64_t> epoch;
  SharedAtomic<uint64_t> records;
  SharedAtomic<uint64_t> bytes;
  SharedAtomic<uint64_t> loader;  // client slot of the loader that published it
  unsigned char user_header[kUserHeaderBytes];
};

// One bounded MPMC ring of slot ids: 64-bit positions, each index on its
// own cache line, followed by ring_cells cells of 64 bits. Cells change by
// acq_rel CAS only; head and tail move by release CAS and are loaded with
// acquire, but they are hints: nothing is published through them.
struct alignas(kRingCacheLine) IdRing {
  alignas(kRingCacheLine) SharedAtomic<uint64_t> head;  // next position to pop (a hint, R4)
  alignas(kRingCacheLine) SharedAtomic<uint64_t> tail;  // next position to push (a hint, R4)
};

struct RingGeometry {
  uint64_t slot_bytes = 0, slot_stride = 0;
  uint32_t num_slots = 0, max_clients = 0, ring_cells = 0;
  size_t counters = 0, clients = 0, slots = 0, free_ring = 0, free_cells = 0, ready_ring = 0,
         ready_cells = 0, arena = 0, total = 0;
};

// Smallest power of two >= 2 * num_slots: room for every slot's live entry
// plus the stale ones that deaths leave behind.
uint32_t RingCellsFor(uint32_t num_slots);
// total == 0 when the counts are out of range or overflow.
TAILCUT_EXPORT RingGeometry ComputeRingGeometry(uint64_t slot_bytes, uint32_t num_slots,
                                                uint32_t max_clients);

}  // namespace tailcut::detail

#endif  // TAILCUT_POOL_RING_LAYOUT_H_
