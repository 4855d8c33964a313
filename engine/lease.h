// Every transition of a lease, and so of an item, in one place: the lease
// table of a mapped segment (LeaseTable: what any process may do to any
// lease) and one registered client's side of it (ClientLeases: take, split,
// claim, ack, give back, progress, commit). The invariants I1-I7 and the
// field-by-field memory order are segment_layout.h's; each operation in
// lease.cc names its partner.
//
// A lease word is state | owner | generation; every change is one CAS on it
// that bumps the generation (I4), so a holder whose lease moved on cannot
// touch it again.
//
//            ReserveLease            TakeOnce, TrySplit
//     FREE --------------> TAKING ------------------------> OPEN -+
//     ^ ^ ^                 |   |                           ^ |   |
//     | | |  nothing taken  |   | PublishOrphan             | |   |
//     | | +-----------------+   v               ClaimOrphan | |   |
//     | |                     ORPHAN -----------------------+ |   |
//     | |                       ^  ReturnToOrphan (give back, |   |
//     | |                       +-- death, lease timeout) ----+   | Ack
//     | |   FinishAck (no split pending)                          v
//     | +----------------------------------------------------- ACKING
//     |                                                           |
//     |   SettleSplit              FinishAck (a split pending)    |
//     +-------------- DONE_WAIT <---------------------------------+
//
// TakeOver (not drawn) keeps the state and changes the owner: a repairer or
// a reassigner takes a lease over before it recovers or republishes it.
//
// from -> to           transition                            who
// FREE -> TAKING       ReserveLease, Reissue                 a client, in its own lease region
// TAKING -> OPEN       TakeOnce (a ticket), TrySplit (piece) the lease's owner
// TAKING -> FREE       TakeOnce, TrySplit (nothing taken);   the owner;
//                      RecoverLease                          a recoverer of a dead owner
// TAKING -> ORPHAN     PublishOrphan (from RecoverLease,     a recoverer, a sweeper, a creator,
//                      ReassignTaking, Reissue, a restore)   a reassigner that took it over
// any -> same state    TakeOver                              a repairer or reassigner, as its owner
// OPEN -> ORPHAN       ReturnToOrphan                        the owner (GiveBack, Close), a
//                                                            recoverer, a reassigner, a feeder
// OPEN -> ACKING       Ack; ClaimOrphan (an item skipped     the owner
//                      or committed to its end)
// OPEN -> FREE         ClaimOrphan (an invalid lease)        its claimer, which owns it then
// ORPHAN -> OPEN       ClaimOrphan                           any client
// ACKING -> FREE       FinishAck                             the owner, or its recoverer
// ACKING -> DONE_WAIT  FinishAck (a thief's split pending)   the owner, or its recoverer
// DONE_WAIT -> FREE    SettleSplit                           the thief, housekeeping, a recoverer
//
// Which atomic each CASes, and with which order:
//  * word: acq_rel CAS, except the moves to ORPHAN (MarkOrphan), which are
//    seq_cst and followed by a seq_cst bump of Counters::orphan_seq, so
//    that a taker's scan for orphans is never missed (ClaimOrphan).
//  * ticket: no CAS; stored last with release by whoever fills a TAKING
//    lease (TakeOnce, TrySplit, PublishOrphan), so a recoverer that reads it
//    with acquire sees the fields stored before it.
//  * extent (tail splitting, segment_layout.h's Extent): acq_rel CAS by the
//    owner's Claim, a thief's split (TrySplit), ClaimOrphan's retag, the
//    seal in FinishAck and SettleSplit's clearing of pending (I7).
//  * floor and progress (resume points): acq_rel CAS in resume_point.cc
//    (RecordProgress, RecordCommit, RetagFloor), called from here.
//
// An item (a ticket) is in one of these states:
//   unhanded  at or past the cursor, or below it and lost by a process that
//             died between fetch_add and recording it (a sweep re-issues it)
//   leased    a TAKING lease with its ticket, an OPEN or an ACKING one holds it
//   orphan    an ORPHAN lease holds it, to be handed out again
//   split     an anchor holds [begin, lowered end) and pieces (kLeasePiece)
//             the tails above; its done bit comes from the anchor's ack
//   done      its done bit is set and no lease holds it (I2)
//
// Thread- and process-safe: every method works on shared state with atomics
// (housekeeper.h holds what also takes the segment's robust mutexes). Hot
// path: noexcept, no allocation, no system call but FutexWake when someone
// sleeps in Take. Not copyable; borrows the Segment.
#ifndef TAILCUT_ENGINE_LEASE_H_
#define TAILCUT_ENGINE_LEASE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/segment.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

// The ticket and flags of a lease as one pair. A thief fills a TAKING lease
// as a piece (flags, then ticket) and undoes a failed split (ticket, then
// flags) without changing the lease word, so a reader could take the ticket
// of one moment and the flags of another and mistake a would-be piece for a
// whole item. The flags read on both sides of the ticket tell: false when
// they differ (read again, or skip the lease this time).
inline bool ReadTicketAndFlags(const LeaseEntry& ls, uint64_t* ticket, uint32_t* flags) noexcept {
  // acquire, all three: the ticket load pairs with the release stores of ticket in TakeOnce,
  // TrySplit and PublishOrphan, so the flags stored before it are seen by the second flags load,
  // which also pairs with TrySplit's release store of flags when it undoes a split. Acquire keeps
  // the three loads in this order.
  uint32_t before = ls.flags.load(std::memory_order_acquire);
  *ticket = ls.ticket.load(std::memory_order_acquire);
  *flags = ls.flags.load(std::memory_order_acquire);
  return *flags == before;
}

// The lease table of a segment, the trusted item table and the order of
// tickets; the transitions any process (a client, a recoverer, a tool) may
// make on any lease.
class LeaseTable {
 public:
  // items: the trusted local item table (equal to the segment's).
  LeaseTable(Segment* segment, std::vector<WorkQueue::Item> items, uint64_t num_epochs,
             uint64_t seed, bool shuffle);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  Segment& segment() const { return *seg_; }
  const std::vector<WorkQueue::Item>& items() const { return items_; }
  uint64_t num_items() const { return items_.size(); }
  uint64_t num_epochs() const { return num_epochs_; }
  uint64_t total() const { return total_; }
  uint64_t num_leases() const { return num_leases_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }
  // The item handed out at `position` of `epoch` (the shuffle bijection).
  uint64_t ItemAt(uint64_t epoch, uint64_t position) const noexcept;
  // The item of ticket t.
  const WorkQueue::Item& ItemOf(uint64_t ticket) const noexcept {
    return items_[ItemAt(ticket / items_.size(), ticket % items_.size())];
  }

  // Wakes processes sleeping in Take, if any.
  void WakeWaiters() noexcept;
  // Tickets some lease holds now, sorted; each slot's word and ticket read
  // as a pair. Read the done bitmap after it: an ack sets its bit before it
  // frees its lease, so a ticket seen in neither is not finished yet.
  std::vector<uint64_t> HeldTickets() const noexcept;

  // TAKING -> ORPHAN: fills a TAKING lease (the caller's, or one it took
  // over) with [begin, end) of ticket and a fresh extent. Returns false if
  // the word changed.
  bool PublishOrphan(uint64_t lease, uint64_t expected_word, uint64_t ticket, uint64_t begin,
                     uint64_t end, uint32_t flags) noexcept;
  // Moves a lease to ORPHAN by CAS from *expected to orphan_word, then bumps
  // orphan_seq. Returns whether the CAS succeeded.
  bool MarkOrphan(LeaseEntry& lease, uint64_t* expected, uint64_t orphan_word) noexcept;
  // OPEN -> ORPHAN: hands an OPEN lease (word *expected) back, to be read
  // again from its floor (its begin, raised by its owner's commits): the
  // floor is retagged for the orphan word, then MarkOrphan. Returns whether
  // the lease became ORPHAN (false: it moved on meanwhile).
  bool ReturnToOrphan(LeaseEntry& lease, uint64_t* expected) noexcept;
  // ACKING -> FREE or DONE_WAIT: completes an ack whose owner set ACKING
  // (the owner itself, or whoever recovers it): seals the extent, sets the
  // done bit unless the lease is a piece or preset, and frees the lease (or
  // keeps it in DONE_WAIT while a thief's split of it is pending).
  void FinishAck(uint64_t lease, uint64_t acking_word) noexcept;
  // Clears the anchor's pending mark if it names `thief`, and frees the
  // anchor (DONE_WAIT -> FREE) if it was only kept for that mark (I7).
  void SettleSplit(uint64_t anchor, uint64_t thief) noexcept;
  // Whatever a dead (or absent) owner left in the lease, read as `word` in
  // a state that has an owner, is finished or handed out again: TAKING
  // without a ticket is freed and counted for a sweep (I3), with one it is
  // published as an orphan; a dead thief's piece is published or freed as
  // its split did or did not happen (I7); OPEN is returned to ORPHAN; ACKING
  // is finished.
  void RecoverLease(uint64_t lease, uint64_t word) noexcept;
  // Takes the lease, read as *word, over for client `self` in `state`
  // (a CAS that a late write of anyone else then fails, I4), so that the
  // caller may recover or republish it. Sets *word to the new word.
  bool TakeOver(uint64_t lease, uint64_t* word, uint64_t state, uint64_t self) noexcept;
  // A hung owner's TAKING lease (read as `word`) of `ticket`: taken over by
  // `self`, then published as an orphan. Returns whether it was.
  bool ReassignTaking(uint64_t lease, uint64_t word, uint64_t ticket, uint64_t self) noexcept;
  // Re-issues a lost ticket (I3) through a FREE lease of `self`'s region:
  // FREE -> TAKING -> ORPHAN. False when the region has no free lease now.
  bool Reissue(uint64_t self, uint64_t ticket) noexcept;

 private:
  Segment* seg_;
  std::vector<WorkQueue::Item> items_;
  uint64_t num_epochs_;
  uint64_t total_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t num_leases_;
};

// One registered client's leases: the transitions it makes to take items
// (from orphans, the cursor, or a split tail of another's item) and on the
// items it holds. Process-local state: where its orphan scans start, and
// whether one is due. Thread-safe as WorkQueue is.
class ClientLeases {
 public:
  struct Options {
    bool split_tail = true;
    uint64_t min_split_bytes = 1;
    // Splits fall on multiples of this past the split item's begin (1: anywhere).
    uint64_t split_multiple = 1;
    // FixedRecordBytes of the queue's format (0: any offset is a boundary).
    uint64_t record_bytes = 0;
  };
  // slot: the client slot this process registered in. paths: the queue's
  // paths, for WorkItem::path; borrowed, as the table. path_token: the
  // handle's ItemPath token, which debug builds check a path against.
  ClientLeases(LeaseTable* table, const std::vector<std::string>* paths, uint32_t path_token,
               uint64_t slot, Options options);
  ClientLeases(const ClientLeases&) = delete;
  ClientLeases& operator=(const ClientLeases&) = delete;

  // One attempt to take: an orphan if one was published since the last
  // fruitless scan, else the next ticket below the cursor's limit. False
  // with *limit set when every lease of this client is held.
  bool TakeOnce(WorkItem* out, bool* limit) noexcept;
  // ORPHAN -> OPEN: claims one orphan, scanning all leases.
  bool ClaimOrphan(WorkItem* out) noexcept;
  // Splits the unread tail of the open item with the most left (never this
  // client's own) into a piece of its own. False when none is worth it.
  // Only items of tickets below below_ticket are split.
  bool TrySplit(WorkItem* out, uint64_t below_ticket = UINT64_MAX) noexcept;
  // Whether an orphan may have been published since this client's last
  // scan that found none (orphan_seq moved): a sleeping Take looks again.
  bool OrphanSeqMoved() const noexcept;

  // The item calls on a lease this client holds; `item.lease` is checked
  // against the table by the caller.
  ItemStatus Ack(const WorkItem& item) noexcept;
  ItemStatus GiveBack(const WorkItem& item) noexcept;
  ItemStatus Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept;
  ItemStatus Progress(const WorkItem& item, uint64_t offset, uint64_t records) noexcept;
  ItemStatus Commit(const WorkItem& item, uint64_t offset) noexcept;
  // Returns every OPEN lease of this client to ORPHAN (Close).
  void ReturnAll() noexcept;

 private:
  // A fed queue's next ticket below the cursor's limit, or kNoTicket.
  uint64_t NextFedTicket() noexcept;
  // Reserves a FREE lease of our region as TAKING. Returns false if none.
  bool ReserveLease(uint64_t* lease, uint64_t* taking_word) noexcept;
  // Bytes acked per busy nanosecond of a client, 0 if not known yet.
  double ClientRate(uint64_t slot) const noexcept;
  void FillItem(WorkItem* out, uint64_t lease, uint64_t open_word, uint64_t ticket, uint64_t begin,
                uint64_t end, uint64_t index = kNoTicket) const noexcept;
  ClientEntry& me() const { return seg_->client(slot_); }

  LeaseTable* table_;
  Segment* seg_;
  const std::vector<std::string>* paths_;
  const uint32_t path_token_;
  const uint64_t slot_;
  const uint64_t lease_base_;
  const Options options_;
  std::atomic<uint64_t> orphan_scan_start_{0};
  // orphan_seq as read before this process's last scan that found no
  // orphan (none at first): every orphan published up to it was visible to
  // that scan, so the leases need scanning again only once it moves.
  std::atomic<uint64_t> no_orphans_at_seq_{~uint64_t{0}};
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_LEASE_H_
