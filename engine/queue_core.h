// The queue protocol over a mapped, validated segment: what every process
// (a WorkQueue or a tool) may do to shared state — find and recover dead
// clients, sweep lost tickets, decide the end of data, read statistics.
//
// Thread- and process-safe: every method works on shared state with atomics
// or under the segment's robust mutexes. Not copyable; borrows the Segment.
#ifndef TAILCUT_ENGINE_QUEUE_CORE_H_
#define TAILCUT_ENGINE_QUEUE_CORE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/segment.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

// The ticket and flags of a lease as one pair. A thief fills a TAKING lease
// as a piece (flags, then ticket) and undoes a failed split (ticket, then
// flags) without changing the lease word, so a reader could take the ticket
// of one moment and the flags of another and mistake a would-be piece for a
// whole item. The flags read on both sides of the ticket tell: false when
// they differ (read again, or skip the lease this time).
inline bool ReadTicketAndFlags(const LeaseSlot& ls, uint64_t* ticket, uint32_t* flags) noexcept {
  // acquire, all three: the ticket load pairs with the release stores of ticket in TakeOnce and
  // TrySplit (work_queue.cc) and PublishOrphan, so the flags stored before it are seen by the
  // second flags load, which also pairs with TrySplit's release store of flags when it undoes a
  // split. Acquire keeps the three loads in this order.
  uint32_t before = ls.flags.load(std::memory_order_acquire);
  *ticket = ls.ticket.load(std::memory_order_acquire);
  *flags = ls.flags.load(std::memory_order_acquire);
  return *flags == before;
}

class QueueCore {
 public:
  // items: the trusted local item table (equal to the segment's).
  QueueCore(Segment* segment, std::vector<WorkQueue::Item> items, uint64_t num_epochs,
            uint64_t seed, bool shuffle);

  Segment& segment() const { return *seg_; }
  const std::vector<WorkQueue::Item>& items() const { return items_; }
  uint64_t num_items() const { return items_.size(); }
  uint64_t total() const { return total_; }
  uint64_t num_leases() const { return num_leases_; }
  uint64_t seed() const { return seed_; }
  uint64_t ItemAt(uint64_t epoch, uint64_t position) const noexcept;

  // Trylocks the life mutex of every active client other than `self` (may
  // be kNoOwner); recovers each dead one. Returns how many it recovered.
  // admin_held: the caller holds the admin mutex (recovery needs it).
  int CheckClients(uint64_t self, bool admin_held = false) noexcept;
  // Reassigns open items of live clients (other than self) whose last
  // progress is older than timeout_ns. Returns how many.
  int ReassignHung(uint64_t self, uint64_t timeout_ns) noexcept;
  // Recovers leases that no registered client can ever finish, as if their
  // owner had died: a lease TAKING, OPEN or ACKING whose owner slot is out of
  // range, not ACTIVE, or ACTIVE without its life mutex held (a slot in that
  // state is freed), and a lease word in no valid state. Only damage to a
  // segment makes such leases; left alone they would keep Take waiting for
  // ever. Each is first taken over by CAS, so a late write by anyone else
  // fails; self must be a registered slot (the taker-over). With
  // just_registered, leases owned by self are damage too (a process that has
  // only just joined holds none). Appends a line per lease to *repaired if
  // given. Returns how many.
  int RepairLeases(uint64_t self, bool admin_held, bool just_registered = false,
                   std::vector<std::string>* repaired = nullptr) noexcept;
  // Frees DONE_WAIT anchors whose pending split was settled.
  void ReleaseSettledAnchors() noexcept;
  // Re-issues tickets lost by processes that died between fetch_add and
  // recording their ticket (I3). Uses a lease slot of `self`'s region.
  void TrySweep(uint64_t self) noexcept;
  // True once every ticket is done and no lease is held.
  bool AllDone() noexcept;
  // Tickets some lease holds now, sorted; each slot's word and ticket read
  // as a pair. Read the done bitmap after it: an ack sets its bit before it
  // frees its lease, so a ticket seen in neither is not finished yet.
  std::vector<uint64_t> HeldTickets() const noexcept;
  // Number of live clients other than self, after recovering dead ones.
  int LiveClients(uint64_t self, bool admin_held = false) noexcept;
  // Pids of live clients other than self.
  std::vector<int> LivePids(uint64_t self) noexcept;
  // Wakes processes sleeping in Take, if any.
  void WakeWaiters() noexcept;

  // Moves a TAKING lease (the caller's, or a dead client's) to ORPHAN with
  // [begin, end) of ticket and a fresh extent. Returns false if it changed.
  bool PublishOrphan(uint64_t lease, uint64_t expected_word, uint64_t ticket, uint64_t begin,
                     uint64_t end, uint32_t flags) noexcept;
  // Moves a lease to ORPHAN by CAS from *expected to orphan_word, then bumps
  // orphan_seq. Returns whether the CAS succeeded.
  bool MarkOrphan(LeaseSlot& lease, uint64_t* expected, uint64_t orphan_word) noexcept;
  // Hands an OPEN lease (word *expected) back as ORPHAN, to be read again
  // from its floor (its begin, raised by its owner's commits): the floor is
  // retagged for the orphan word, then MarkOrphan. Returns whether the
  // lease became ORPHAN (false: it moved on meanwhile).
  bool ReturnToOrphan(LeaseSlot& lease, uint64_t* expected) noexcept;
  // Clears the anchor's pending mark if it names `thief`, and frees the
  // anchor if it was only kept for that mark (I7).
  void SettleSplit(uint64_t anchor, uint64_t thief, uint64_t self) noexcept;
  // Completes an ack whose owner set ACKING (the owner itself, or whoever
  // recovers it): seals the extent, sets the done bit unless the lease is a
  // piece or preset, and frees the lease (or keeps it in DONE_WAIT while a
  // thief's split of it is pending).
  void FinishAck(uint64_t lease, uint64_t acking_word) noexcept;

  QueueStats Stats(const std::string& name) noexcept;

 private:
  void RecoverClient(uint64_t slot, bool admin_held) noexcept;
  std::vector<int> LivePidsImpl(uint64_t self, bool admin_held) noexcept;
  void RecoverLease(uint64_t lease, uint64_t word) noexcept;

  Segment* seg_;
  std::vector<WorkQueue::Item> items_;
  uint64_t num_epochs_;
  uint64_t total_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t num_leases_;
};

// Creator side: writes the header, tables and initial state (not READY).
void WriteLayout(Segment* segment, const QueueConfig& config, const Geometry& geometry);
// Attacher side: throws kConfigMismatch naming the first field that differs.
void CompareConfig(const Segment& segment, const QueueConfig& config);
// Why a queue is kept when unfinished, in words ("" when it is not):
// KeepReason bits, and fewer than num_clients processes joined so far.
std::string KeepReasonText(uint32_t reasons, uint64_t joined, uint32_t num_clients);
// Reads the item table of a validated segment.
std::vector<WorkQueue::Item> ReadItems(const Segment& segment);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_QUEUE_CORE_H_
