#include "pool/ring_core.h"

#include <bit>
#include <new>

namespace tailcut::detail {

namespace {

// A ring operation that loops this often without returning is looking at a
// segment someone damaged (live contention moves on long before).
constexpr int kMaxRingSteps = 1 << 22;

const char* StateName(uint64_t s) {
  switch (s) {
    case kSlotFree:
      return "FREE";
    case kSlotFilling:
      return "FILLING";
    case kSlotReady:
      return "READY";
    case kSlotPopped:
      return "POPPED";
  }
  return "?";
}

#if defined(__SANITIZE_THREAD__)
#define TAILCUT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TAILCUT_TSAN 1
#endif
#endif

#ifdef TAILCUT_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

// ThreadSanitizer pairs a release with an acquire by address. A process
// that maps the ring more than once (a loader handle and a trainer handle,
// as the thread tests do) sees each cell and slot word at several
// addresses, so a slot that goes loader -> trainer -> loader through two
// mappings looks unordered to it, though the same physical words order it.
// These keys stand for a slot whatever the mapping: the ring's creation
// time (the same in every mapping) and the slot's index pick one.
char tsan_slot_keys[4096];

void* TsanKey(const RingHeader& h, uint64_t slot) {
  uint64_t ring = h.created_unix_ns * 0x9E3779B97F4A7C15ull;
  return &tsan_slot_keys[(ring ^ slot) % sizeof(tsan_slot_keys)];
}
#endif

}  // namespace

void RingCore::AnnounceTaken([[maybe_unused]] uint64_t slot) const noexcept {
#ifdef TAILCUT_TSAN
  __tsan_acquire(TsanKey(header(), slot));
#endif
}

void RingCore::AnnouncePushed([[maybe_unused]] uint64_t slot) const noexcept {
#ifdef TAILCUT_TSAN
  __tsan_release(TsanKey(header(), slot));
#endif
}

void RingCore::Initialize(char* base, const RingGeometry& g) {
  // relaxed throughout: not yet shared; the creator's release store of READY (BatchRing::Open)
  // publishes all of it to the attachers' acquire loads.
  RingCore core(base, g);
  new (&core.counters()) RingCounters();
  for (uint64_t c = 0; c < g.max_clients; ++c) {
    RingClient& rc = core.client(c);
    rc.state.store(kRingClientFree, std::memory_order_relaxed);
    rc.role.store(0, std::memory_order_relaxed);
  }
  for (Which which : {Which::kFree, Which::kReady}) {
    RingRef r = core.Ring(which);
    r.ring->head.store(0, std::memory_order_relaxed);
    r.ring->tail.store(0, std::memory_order_relaxed);
    for (uint64_t i = 0; i < g.ring_cells; ++i)
      r.cells[i].store(EmptyCell(0), std::memory_order_relaxed);
  }
  for (uint64_t s = 0; s < g.num_slots; ++s) {
    SlotHeader& sh = core.slot(s);
    sh.word.store(SlotWord(kSlotFree, kNoClient, 0), std::memory_order_relaxed);
    sh.epoch.store(0, std::memory_order_relaxed);
    sh.records.store(0, std::memory_order_relaxed);
    sh.bytes.store(0, std::memory_order_relaxed);
    sh.loader.store(kNoClient, std::memory_order_relaxed);
    core.Push(Which::kFree, s, 0);
  }
}

std::string RingCore::Validate() const {
  for (uint64_t s = 0; s < g_.num_slots; ++s) {
    // acquire throughout Validate: each load pairs with the CAS or release store that last wrote
    // the word; only the values are checked, nothing is read through them.
    uint64_t w = slot(s).word.load(std::memory_order_acquire);
    uint64_t owner = SlotOwnerOf(w);
    if (SlotStateOf(w) > kSlotPopped)
      return "slot " + std::to_string(s) + " has state " + std::to_string(SlotStateOf(w));
    if (owner != kNoClient && owner >= g_.max_clients)
      return "slot " + std::to_string(s) + " (" + StateName(SlotStateOf(w)) + ") names client " +
             std::to_string(owner) + " of " + std::to_string(g_.max_clients);
  }
  for (Which which : {Which::kFree, Which::kReady}) {
    // Live clients may move the ring while we look: a finding counts only
    // if the head did not move meanwhile (else look again, a bounded number
    // of times: a ring that keeps moving is in use, not damaged).
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const IdRing& ring = *Ring(which).ring;
      uint64_t head = ring.head.load(std::memory_order_acquire);
      std::string problem = ValidateRing(which, head);
      if (problem.empty()) break;
      if (ring.head.load(std::memory_order_acquire) == head) return problem;
    }
  }
  return "";
}

std::string RingCore::ValidateRing(Which which, uint64_t head) const {
  const char* name = which == Which::kFree ? "free ring" : "ready ring";
  const uint64_t shift = std::countr_zero(uint64_t{g_.ring_cells});
  RingRef r = Ring(which);
  // acquire here and below: as in Validate; only the values are checked.
  uint64_t tail = r.ring->tail.load(std::memory_order_acquire);
  // The tail is at most a ring ahead of the true head, and each hint lags
  // its true position by at most one per client killed between a cell CAS
  // and the index CAS (R4).
  const uint64_t slack = uint64_t{g_.ring_cells} + g_.max_clients;
  if (tail - head > slack && head - tail > slack)
    return std::string(name) + " positions head " + std::to_string(head) + ", tail " +
           std::to_string(tail) + " are more than " + std::to_string(slack) + " apart";
  for (uint64_t i = 0; i < g_.ring_cells; ++i) {
    uint64_t c = r.cells[i].load(std::memory_order_acquire);
    if (CellFull(c) && CellId(c) >= g_.num_slots)
      return std::string(name) + " cell " + std::to_string(i) + " names slot " +
             std::to_string(CellId(c)) + " of " + std::to_string(g_.num_slots);
    // Seen from the head, a cell holds its own lap, the next one (popped,
    // head not yet moved) or the one before (not yet pushed again).
    uint64_t pos = head + ((i - head) & (g_.ring_cells - 1));
    uint64_t lap = (pos >> shift) & kRingLapMask;
    uint64_t cl = CellLap(c);
    if (cl != lap && cl != ((lap + 1) & kRingLapMask) && cl != ((lap - 1) & kRingLapMask))
      return std::string(name) + " cell " + std::to_string(i) + " has lap " + std::to_string(cl) +
             ", its position " + std::to_string(pos) + " is in lap " + std::to_string(lap);
  }
  return "";
}

RingCore::RingRef RingCore::Ring(Which which) const {
  if (which == Which::kFree)
    return {At<IdRing>(g_.free_ring), At<SharedAtomic<uint64_t>>(g_.free_cells), kSlotFree};
  return {At<IdRing>(g_.ready_ring), At<SharedAtomic<uint64_t>>(g_.ready_cells), kSlotReady};
}

bool RingCore::Push(Which which, uint64_t slot_id, uint64_t generation) noexcept {
  RingRef r = Ring(which);
  const uint64_t mask = g_.ring_cells - 1;
  const int shift = std::countr_zero(uint64_t{g_.ring_cells});
  for (int step = 0; step < kMaxRingSteps; ++step) {
    // Positions are hints (R4): the cell decides. Acquire pairs with the release CAS of whoever
    // advanced the tail; any value is safe, an old one only costs another turn of this loop.
    uint64_t t = r.ring->tail.load(std::memory_order_acquire);
    uint64_t lap = (t >> shift) & kRingLapMask;
    SharedAtomic<uint64_t>& cell = r.cells[t & mask];
    // acquire: pairs with the acq_rel CAS of the popper that emptied this cell for our lap.
    uint64_t c = cell.load(std::memory_order_acquire);
    uint64_t cl = CellLap(c);
    if (cl == lap && !CellFull(c)) {
      // Release pairs with the popper's acquire load of this cell: the slot header and data the
      // author wrote before pushing are visible to whoever pops. On failure, acquire: the loop
      // looks again.
      AnnouncePushed(slot_id);
      if (cell.compare_exchange_strong(c, FullCell(lap, slot_id, generation),
                                       std::memory_order_acq_rel, std::memory_order_acquire)) {
        // release: pairs with the acquire loads of tail here and in ValidateRing; a hint (R4), so a
        // failed CAS (someone moved it on) is fine.
        r.ring->tail.compare_exchange_strong(t, t + 1, std::memory_order_release,
                                             std::memory_order_relaxed);
        return true;
      }
      continue;
    }
    if (cl == lap || cl == ((lap + 1) & kRingLapMask)) {
      // Pushed at t already (and maybe popped): the tail lags; move it on.
      // release: as above.
      r.ring->tail.compare_exchange_strong(t, t + 1, std::memory_order_release,
                                           std::memory_order_relaxed);
      continue;
    }
    // The cell still holds the previous lap: full, unless the tail we read
    // was old. Either way a tail that has not moved means we cannot push.
    // acquire: pairs with the tail CASes above; only compared.
    if (r.ring->tail.load(std::memory_order_acquire) == t) return false;
  }
  return false;
}

RingCore::Result RingCore::Pop(Which which, uint64_t new_state, uint64_t self, uint32_t* slot_id,
                               uint64_t* generation) noexcept {
  RingRef r = Ring(which);
  const uint64_t mask = g_.ring_cells - 1;
  const int shift = std::countr_zero(uint64_t{g_.ring_cells});
  for (int step = 0; step < kMaxRingSteps; ++step) {
    // acquire: pairs with the release CASes of head below; a hint (R4).
    uint64_t h = r.ring->head.load(std::memory_order_acquire);
    uint64_t lap = (h >> shift) & kRingLapMask;
    SharedAtomic<uint64_t>& cell = r.cells[h & mask];
    // Acquire pairs with the pusher's release CAS of the cell: the slot header and data its author
    // wrote before pushing are visible once our CAS on the word below succeeds.
    uint64_t c = cell.load(std::memory_order_acquire);
    uint64_t cl = CellLap(c);
    if (cl == ((lap + 1) & kRingLapMask)) {
      // Popped at h already: the head lags; move it on.
      // release: pairs with the acquire loads of head here and in Validate; a hint (R4), so a
      // failure is fine.
      r.ring->head.compare_exchange_strong(h, h + 1, std::memory_order_release,
                                           std::memory_order_relaxed);
      continue;
    }
    if (cl != lap || !CellFull(c)) {
      // Nothing pushed at h (empty), or an old head: look again if it moved.
      // acquire: only compared, as above.
      if (r.ring->head.load(std::memory_order_acquire) != h) continue;
      return cl == lap ? Result::kEmpty : Result::kCorrupt;
    }
    uint64_t id = CellId(c);
    if (id >= g_.num_slots) return Result::kCorrupt;
    SharedAtomic<uint64_t>& word = slot(id).word;
    // Acquire pairs with the release CAS that put the slot in its state (MoveOwned, RecoverClient,
    // or a completer below).
    uint64_t w = word.load(std::memory_order_acquire);
    uint64_t state = SlotStateOf(w), gen = SlotGenOf(w);
    if (state == r.target_state && GenTagOf(gen) == CellTag(c)) {
      // Live (R2): take the slot by CAS on its word; the entry is then stale.
      uint64_t taken = SlotWord(new_state, self, gen + 1);
      // acq_rel: the acquire half pairs with that same CAS; the release half hands the slot on to
      // whoever acquires the word next (MoveOwned's check of our token, RecoverClient). On failure,
      // acquire: we look again.
      if (!word.compare_exchange_strong(w, taken, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
        continue;
      AnnounceTaken(id);
      // acq_rel: EMPTY for the next lap; pairs with the next pusher's acquire load of the cell.
      // relaxed on failure: someone else emptied it. The head CAS is release, as above.
      if (cell.compare_exchange_strong(c, EmptyCell(lap + 1), std::memory_order_acq_rel,
                                       std::memory_order_relaxed))
        r.ring->head.compare_exchange_strong(h, h + 1, std::memory_order_release,
                                             std::memory_order_relaxed);
      *slot_id = static_cast<uint32_t>(id);
      *generation = (gen + 1) & kGenMask;
      return Result::kOk;
    }
    if ((state == kSlotFilling || state == kSlotPopped) && GenTagOf(gen + 1) == CellTag(c)) {
      // A move in flight (R3): its author pushed and has not CASed yet, or
      // died. Complete it; the author's own CAS then fails, as it expects.
      // acq_rel: completes the author's move (R3). Our acquire of the cell above read the author's
      // push, and the release half passes what it published on to whoever acquires the word next.
      // relaxed on failure: someone else completed or moved it.
      word.compare_exchange_strong(w, SlotWord(r.target_state, SlotOwnerOf(w), gen + 1),
                                   std::memory_order_acq_rel, std::memory_order_relaxed);
      continue;
    }
    // Stale (R2): drop it.
    // acq_rel and release: as when we pop a live entry above.
    if (cell.compare_exchange_strong(c, EmptyCell(lap + 1), std::memory_order_acq_rel,
                                     std::memory_order_relaxed))
      r.ring->head.compare_exchange_strong(h, h + 1, std::memory_order_release,
                                           std::memory_order_relaxed);
  }
  return Result::kCorrupt;
}

RingCore::Result RingCore::MoveOwned(Which which, uint64_t state, uint64_t self, uint32_t slot_id,
                                     uint64_t generation) noexcept {
  if (slot_id >= g_.num_slots) return Result::kStale;
  SharedAtomic<uint64_t>& word = slot(slot_id).word;
  uint64_t w = SlotWord(state, self, generation);
  // acquire: pairs with the CAS in Pop that gave us the slot; only a check of our token.
  if (word.load(std::memory_order_acquire) != w) return Result::kStale;
  // R3: the entry goes first, so a death between the two loses nothing.
  if (!Push(which, slot_id, generation + 1)) return Result::kCorrupt;
  // Release pairs with the acquire load of whoever takes the slot next (Pop, RecoverClient). A
  // failed CAS means someone completed the move for us (R3), so relaxed on failure.
  word.compare_exchange_strong(w, SlotWord(Ring(which).target_state, self, generation + 1),
                               std::memory_order_acq_rel, std::memory_order_relaxed);
  return Result::kOk;
}

RingCore::Result RingCore::TakeFree(uint64_t self, uint32_t* slot_id,
                                    uint64_t* generation) noexcept {
  return Pop(Which::kFree, kSlotFilling, self, slot_id, generation);
}

RingCore::Result RingCore::Publish(uint64_t self, uint32_t slot_id, uint64_t generation) noexcept {
  return MoveOwned(Which::kReady, kSlotFilling, self, slot_id, generation);
}

RingCore::Result RingCore::Abandon(uint64_t self, uint32_t slot_id, uint64_t generation) noexcept {
  return MoveOwned(Which::kFree, kSlotFilling, self, slot_id, generation);
}

RingCore::Result RingCore::TakeReady(uint64_t self, uint32_t* slot_id,
                                     uint64_t* generation) noexcept {
  return Pop(Which::kReady, kSlotPopped, self, slot_id, generation);
}

RingCore::Result RingCore::Release(uint64_t self, uint32_t slot_id, uint64_t generation) noexcept {
  return MoveOwned(Which::kFree, kSlotPopped, self, slot_id, generation);
}

void RingCore::RecoverClient(uint64_t client, uint64_t* reclaimed, uint64_t* redelivered) noexcept {
  for (uint64_t s = 0; s < g_.num_slots; ++s) {
    SharedAtomic<uint64_t>& word = slot(s).word;
    // acquire: pairs with the CAS in Pop that made the slot FILLING or POPPED; for a batch to
    // redeliver, that CAS acquired the loader's push, so the loader's writes reach the next popper
    // through our push and CAS below.
    uint64_t w = word.load(std::memory_order_acquire);
    uint64_t state = SlotStateOf(w);
    if (SlotOwnerOf(w) != client || (state != kSlotFilling && state != kSlotPopped)) continue;
    Which which = state == kSlotFilling ? Which::kFree : Which::kReady;
    // As the owner would (R3): push, then CAS. A recoverer that dies in
    // between leaves a move in flight that the next popper completes.
    if (!Push(which, s, SlotGenOf(w) + 1)) continue;
    // acq_rel: as MoveOwned's CAS, for the dead owner (R3, R5); relaxed on failure: someone
    // completed the move.
    if (word.compare_exchange_strong(w,
                                     SlotWord(Ring(which).target_state, client, SlotGenOf(w) + 1),
                                     std::memory_order_acq_rel, std::memory_order_relaxed))
      ++*(state == kSlotFilling ? reclaimed : redelivered);
  }
}

}  // namespace tailcut::detail
