#include "engine/resume_point.h"

#include <algorithm>

#include "engine/config.h"

namespace tailcut::detail {

namespace {

// How a call moves an offset word of a lease.
enum class OffsetMove {
  kProgress,  // progress word: raise, unless the owner committed
  kCommit,    // progress word: mark committed; the first commit sets it, later ones raise it
  kFloor,     // floor word: raise
};

// Moves `word` of the lease held by `ours` to `offset` as `move` says.
// kStale when its tag is not ours: the lease is being handed on.
ItemStatus MoveOffsetWord(SharedAtomic<uint64_t>& word, uint64_t ours, uint64_t offset,
                          OffsetMove move) noexcept {
  // acquire: pairs with the acq_rel CASes of the word (the owner's other calls, and RetagFloor);
  // the CAS below decides.
  uint64_t w = word.load(std::memory_order_acquire);
  for (;;) {
    uint64_t at = 0;
    if (!ProgressOffset(w, ours, &at)) return ItemStatus::kStale;
    const bool committed = IsCommitted(w);
    if (move == OffsetMove::kProgress && committed) return ItemStatus::kOk;
    const uint64_t next = move == OffsetMove::kCommit && !committed ? offset : std::max(at, offset);
    const uint64_t desired = ProgressWord(next, ours, committed || move == OffsetMove::kCommit);
    if (desired == w) return ItemStatus::kOk;
    // acq_rel: pairs with RetagFloor's CAS of the floor: either ours lands first and the item
    // resumes there, or its retag makes ours fail and the caller hears kStale.
    if (word.compare_exchange_weak(w, desired, std::memory_order_acq_rel)) return ItemStatus::kOk;
  }
}

// The checks Progress and Commit share: the lease is still held by `ours`,
// and offset lies in it, on a record boundary where the format says.
ItemStatus CheckOffset(const LeaseEntry& ls, uint64_t ours, uint64_t offset,
                       uint64_t record_bytes) noexcept {
  // acquire: pairs with the CASes that may have moved the lease on (ReturnToOrphan, ReassignHung
  // in lease.cc and housekeeper.cc); a write that lands after them is caught by the tags of the
  // offset words.
  if (ls.word.load(std::memory_order_acquire) != ours) return ItemStatus::kStale;
  // An offset past the end would make a checkpoint skip the rest of the
  // item. The lease's own range, not the caller's copy of it, is the item.
  // relaxed: written before the word CAS that made the lease ours.
  const uint64_t begin = ls.begin.load(std::memory_order_relaxed);
  const uint64_t end = ls.end.load(std::memory_order_relaxed);
  if (offset < begin || offset > end) return ItemStatus::kOutOfRange;
  // Fixed-size records start at multiples of their size: anything else
  // would resume mid-record. The range's own ends are always fine (a slice
  // owns the records that start in it).
  if (record_bytes != 0 && offset % record_bytes != 0 && offset != begin && offset != end)
    return ItemStatus::kOutOfRange;
  return ItemStatus::kOk;
}

// The floor's offset as a reader of the lease word `word` may trust it:
// written for that word, for the one before it (ClaimOrphan makes an orphan
// OPEN first and writes its floor after: meanwhile it is the orphan's
// floor, which is what ClaimOrphan writes), or for the one after it
// (RetagFloor retags the owner's floor for the orphan word before it moves
// the lease word there). A former owner's words are older than all three.
bool FloorOffset(uint64_t floor, uint64_t word, uint64_t* offset) {
  const uint64_t gen = LeaseGenOf(word);
  for (uint64_t g : {gen, gen + 1, gen - 1}) {
    if (ProgressOffset(floor, LeaseWord(kLeaseOrphan, kNoOwner, g), offset)) return true;
  }
  return false;
}

}  // namespace

uint64_t FixedRecordBytes(std::string_view tag) noexcept {
  constexpr std::string_view kFixed = "fixed:";
  if (tag.size() <= kFixed.size() || tag.substr(0, kFixed.size()) != kFixed) return 0;
  uint64_t n = 0;
  for (char c : tag.substr(kFixed.size())) {
    if (c < '0' || c > '9' || n > kMaxFileBytes) return 0;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

ItemStatus RecordProgress(LeaseEntry& ls, uint64_t ours, uint64_t offset,
                          uint64_t record_bytes) noexcept {
  if (ItemStatus s = CheckOffset(ls, ours, offset, record_bytes); s != ItemStatus::kOk) return s;
  return MoveOffsetWord(ls.progress, ours, offset, OffsetMove::kProgress);
}

ItemStatus RecordCommit(LeaseEntry& ls, uint64_t ours, uint64_t offset,
                        uint64_t record_bytes) noexcept {
  if (ItemStatus s = CheckOffset(ls, ours, offset, record_bytes); s != ItemStatus::kOk) return s;
  // A commit says "delivered up to here"; one below an earlier commit (or
  // below where the item was handed out again) contradicts it. Only the
  // owner moves the floor, so this read is the floor it last wrote.
  // acquire: pairs with the owner's own CASes and RetagFloor's; a foreign
  // tag fails below as kStale.
  uint64_t floor_at = 0;
  if (ProgressOffset(ls.floor.load(std::memory_order_acquire), ours, &floor_at) &&
      offset < floor_at)
    return ItemStatus::kOutOfRange;
  // The progress word first: from now on the owner's Progress no longer
  // moves a checkpoint (read is not delivered). Then the floor: a crash, a
  // give-back or a lease timeout resumes there. Between the two a
  // checkpoint resumes lower, which repeats, never skips.
  if (ItemStatus s = MoveOffsetWord(ls.progress, ours, offset, OffsetMove::kCommit);
      s != ItemStatus::kOk)
    return s;
  return MoveOffsetWord(ls.floor, ours, offset, OffsetMove::kFloor);
}

bool RetagFloor(LeaseEntry& ls, uint64_t expected, uint64_t orphan, uint64_t begin) noexcept {
  // acquire: pairs with the owner's acq_rel CASes of the floor (RecordCommit); the CAS decides.
  uint64_t f = ls.floor.load(std::memory_order_acquire);
  for (;;) {
    uint64_t offset = begin;
    // The owner's floor, or one a racing returner of the same lease word
    // retagged already; anything else (a damaged or taken-over lease) is
    // not this item's.
    if (!FloorOffset(f, expected, &offset)) offset = begin;
    // acquire: pairs with the CASes that move the lease on; a lease that moved on is someone
    // else's now, and so is its floor.
    if (ls.word.load(std::memory_order_acquire) != expected) return false;
    // acq_rel: pairs with RecordCommit's CAS of the floor: one of the two comes first.
    if (ls.floor.compare_exchange_weak(f, ProgressWord(offset, orphan), std::memory_order_acq_rel))
      return true;
  }
}

uint64_t CheckpointResume(uint64_t word, uint64_t begin, uint64_t floor,
                          uint64_t progress) noexcept {
  uint64_t resume = begin;
  FloorOffset(floor, word, &resume);
  // An OPEN lease's highest Progress, until its owner commits. From then on
  // the floor alone: a commit counts once its floor CAS landed, as it does
  // for a crash (one that fails there reports kStale and counts nowhere).
  uint64_t used = 0;
  if (LeaseStateOf(word) == kLeaseOpen && !IsCommitted(progress) &&
      ProgressOffset(progress, word, &used))
    resume = std::max(resume, used);
  return resume;
}

bool IsResumableOffset(uint64_t offset, uint64_t item_begin, uint64_t record_bytes) noexcept {
  return record_bytes == 0 || offset % record_bytes == 0 ||
         (offset >= item_begin && (offset - item_begin) % 4096 == 0);
}

}  // namespace tailcut::detail
