// The batch ring protocol over mapped memory: the two id rings and every
// move of a slot word (ring_layout.h, invariants R1-R5).
//
// Thread- and process-safe: every method works on shared state with atomics
// only, makes no system call and no allocation, and never follows an id or
// position read from shared memory without a bounds check. Borrows the
// memory; the memory must be laid out by Initialize (or validated by
// Validate) for the same geometry. Built once more under the deterministic
// scheduler (tests/pool), which is why waking and liveness live elsewhere.
//
// Memory order: a slot's header and data, written by its owner while it
// holds the slot, reach the next holder through the release CAS of the ring
// cell the owner pushes (Push) and the popper's acquire load of that cell
// (Pop); every CAS on a slot word is acq_rel, so a move completed by someone
// else (R3) or by a recoverer (R5) passes them on. Head and tail are hints.
#ifndef TAILCUT_POOL_RING_CORE_H_
#define TAILCUT_POOL_RING_CORE_H_

#include <cstdint>
#include <string>

#include "pool/ring_layout.h"

namespace tailcut::detail {

class RingCore {
 public:
  enum class Result { kOk, kEmpty, kStale, kCorrupt };

  RingCore(char* base, const RingGeometry& geometry) : base_(base), g_(geometry) {}

  // Lays out the counters, client slots (not their mutexes), slot words and
  // both rings, with every slot FREE in the free ring. Not concurrent.
  static void Initialize(char* base, const RingGeometry& geometry);
  // Checks every slot word, cell and position once; returns "" or what is
  // wrong (for an error message).
  std::string Validate() const;

  // Free ring → FILLING by `self`: *slot and *generation name the token.
  // kEmpty when no slot is free.
  Result TakeFree(uint64_t self, uint32_t* slot, uint64_t* generation) noexcept;
  // FILLING(self, generation) → READY through the ready ring (R3). The
  // caller has written the slot header fields. kStale, kCorrupt (ring full).
  Result Publish(uint64_t self, uint32_t slot, uint64_t generation) noexcept;
  // FILLING(self, generation) → FREE through the free ring.
  Result Abandon(uint64_t self, uint32_t slot, uint64_t generation) noexcept;
  // Ready ring → POPPED by `self`. kEmpty when no batch is ready.
  Result TakeReady(uint64_t self, uint32_t* slot, uint64_t* generation) noexcept;
  // POPPED(self, generation) → FREE through the free ring.
  Result Release(uint64_t self, uint32_t slot, uint64_t generation) noexcept;

  // Which ring, and the state its live entries' slots are in (R2).
  enum class Which { kFree, kReady };
  // Pushes (slot, generation tag) at the tail. False if the ring is full
  // (only stale entries can fill it: ring_cells >= 2 * num_slots) or corrupt.
  // Public for tests that stop an owner between its push and its CAS (R3).
  bool Push(Which which, uint64_t slot, uint64_t generation) noexcept;

  // Every slot `client` owns: FILLING → FREE, POPPED → READY (R5). Adds to
  // *reclaimed and *redelivered the moves it made. Idempotent.
  void RecoverClient(uint64_t client, uint64_t* reclaimed, uint64_t* redelivered) noexcept;

  // For ThreadSanitizer only (no code without it): the slot's header and
  // data, read after this, were written before the slot's last push (Push
  // announces them). See ring_core.cc for why the atomics alone do not tell it.
  void AnnounceTaken(uint64_t slot) const noexcept;

  RingHeader& header() const { return *At<RingHeader>(0); }
  RingCounters& counters() const { return *At<RingCounters>(g_.counters); }
  RingClient& client(uint64_t i) const { return At<RingClient>(g_.clients)[i]; }
  SlotHeader& slot(uint64_t i) const { return At<SlotHeader>(g_.slots)[i]; }
  char* slot_data(uint64_t i) const { return base_ + g_.arena + i * g_.slot_stride; }
  const RingGeometry& geometry() const { return g_; }

 private:
  struct RingRef {
    IdRing* ring;
    SharedAtomic<uint64_t>* cells;
    uint64_t target_state;
  };
  RingRef Ring(Which which) const;
  // Validate for one ring, seen from `head`.
  std::string ValidateRing(Which which, uint64_t head) const;
  // Pops the first live entry, moving its slot to `new_state` owned by
  // `self` (stale entries on the way are dropped, moves in flight completed).
  Result Pop(Which which, uint64_t new_state, uint64_t self, uint32_t* slot,
             uint64_t* generation) noexcept;
  // The owner's move of its slot from (state, self, generation) to the
  // ring's state, by push then CAS (R3).
  Result MoveOwned(Which which, uint64_t state, uint64_t self, uint32_t slot,
                   uint64_t generation) noexcept;

  // ThreadSanitizer's release before a push of `slot` (see AnnounceTaken).
  void AnnouncePushed(uint64_t slot) const noexcept;

  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

  char* base_;
  RingGeometry g_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_POOL_RING_CORE_H_
