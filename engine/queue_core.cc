#include "engine/queue_core.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>

#include "engine/clock.h"
#include "engine/crash_point.h"
#include "engine/futex.h"
#include "engine/permutation.h"
#include "engine/resume_point.h"
#include "engine/robust_mutex.h"

namespace tailcut::detail {

QueueCore::QueueCore(Segment* segment, std::vector<WorkQueue::Item> items, uint64_t num_epochs,
                     uint64_t seed, bool shuffle)
    : seg_(segment),
      items_(std::move(items)),
      num_epochs_(num_epochs),
      total_(items_.size() * num_epochs),
      seed_(seed),
      shuffle_(shuffle),
      num_leases_(segment->geometry().num_leases()) {}

uint64_t QueueCore::ItemAt(uint64_t epoch, uint64_t position) const noexcept {
  if (!shuffle_) return position;
  // Deriving an epoch's round keys costs as much as the walk itself; takes
  // on one thread mostly stay in one epoch, so keep the last one per thread.
  struct Cached {
    const QueueCore* core;
    uint64_t seed, n, epoch;
    Permutation permutation;
  };
  thread_local std::optional<Cached> cache;
  uint64_t n = items_.size();
  if (!cache || cache->core != this || cache->seed != seed_ || cache->n != n ||
      cache->epoch != epoch)
    cache.emplace(Cached{this, seed_, n, epoch, Permutation(n, seed_, epoch)});
  return cache->permutation(position);
}

void QueueCore::WakeWaiters() noexcept {
  Counters& c = seg_->counters();
  // seq_cst pairs with the waiter's increment of waiters before it re-checks
  // the queue (Dekker): either it sees our change or we see it waiting.
  if (c.waiters.load(std::memory_order_seq_cst) == 0) return;
  // seq_cst: pairs with Take's load of wake_seq before it sleeps: FUTEX_WAIT then fails at once.
  c.wake_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(c.wake_seq, INT_MAX);
}

bool QueueCore::MarkOrphan(LeaseSlot& ls, uint64_t* expected, uint64_t orphan_word) noexcept {
  // seq_cst: the release half publishes the lease's fields to ClaimOrphan's acquire CAS
  // (work_queue.cc); seq_cst, with the bump below, for the orphan_seq argument.
  bool ok = ls.word.compare_exchange_strong(*expected, orphan_word, std::memory_order_seq_cst);
  // After the CAS: a scan that missed this orphan read orphan_seq before it changes (seq_cst total
  // order), so its process scans again. Pairs with the seq_cst loads of orphan_seq in ClaimOrphan,
  // TakeOnce and Take (work_queue.cc); a scan that reads the bumped value acquires this CAS too.
  if (ok) seg_->counters().orphan_seq.fetch_add(1, std::memory_order_seq_cst);
  return ok;
}

bool QueueCore::ReturnToOrphan(LeaseSlot& ls, uint64_t* expected) noexcept {
  const uint64_t orphan = NextLeaseWord(*expected, kLeaseOrphan, kNoOwner);
  // The item goes back at its floor; nothing else of the lease changes (a
  // claimed item keeps its extent): ClaimOrphan starts the next owner there.
  // relaxed: we hold the lease, or its owner's death or our CAS on the word handed it to us, so
  // begin is not written any more.
  if (!RetagFloor(ls, *expected, orphan, ls.begin.load(std::memory_order_relaxed))) return false;
  return MarkOrphan(ls, expected, orphan);
}

bool QueueCore::PublishOrphan(uint64_t lease, uint64_t expected_word, uint64_t ticket,
                              uint64_t begin, uint64_t end, uint32_t flags) noexcept {
  LeaseSlot& ls = seg_->lease(lease);
  const uint64_t orphan = NextLeaseWord(expected_word, kLeaseOrphan, kNoOwner);
  // relaxed: only the lease's holder writes these (I6); the release of ticket and MarkOrphan's CAS
  // below publish them.
  ls.begin.store(begin, std::memory_order_relaxed);
  ls.end.store(end, std::memory_order_relaxed);
  ls.progress.store(ProgressWord(begin, orphan), std::memory_order_relaxed);
  ls.floor.store(ProgressWord(begin, orphan), std::memory_order_relaxed);
  ls.extent.store(Extent::Fresh(ExtentUnits(end - begin, SplitUnit(end - begin)), orphan).Word(),
                  std::memory_order_relaxed);
  ls.flags.store(flags, std::memory_order_relaxed);
  // release: pairs with the acquire loads of ticket in RecoverLease, TrySweep and
  // ReadTicketAndFlags (ReassignHung); a reader that sees the ticket sees the fields above.
  ls.ticket.store(ticket, std::memory_order_release);  // last, as in a take
  // The CAS releases the fields above to the claimer's acquire CAS.
  return MarkOrphan(ls, &expected_word, orphan);
}

void QueueCore::SettleSplit(uint64_t anchor, uint64_t thief, uint64_t self) noexcept {
  if (anchor >= num_leases_) return;
  LeaseSlot& as = seg_->lease(anchor);
  // acquire: pairs with the extent CASes in TrySplit and ClaimOrphan (work_queue.cc).
  uint64_t e = as.extent.load(std::memory_order_acquire);
  for (;;) {
    Extent x = Extent::Of(e);
    if (x.pending != thief + 1) break;
    x.pending = 0;
    // acq_rel: pairs with TrySplit's split CAS and FinishAck's seal of this word; pending cleared
    // here is what lets the anchor be freed below (I7).
    if (as.extent.compare_exchange_weak(e, x.Word(), std::memory_order_acq_rel)) break;
  }
  // Several may settle one anchor (its thief, housekeeping, a recoverer),
  // so the free is the CAS alone: FinishAck cleared the ticket and flags
  // while it still owned the lease, and a settler that lost the race must
  // not write into a slot that may already be someone's new lease.
  // acquire (word): pairs with FinishAck's release CAS to DONE_WAIT. acquire (extent): pairs with
  // the CAS that cleared pending (above, or another settler's).
  uint64_t w = as.word.load(std::memory_order_acquire);
  if (LeaseStateOf(w) == kLeaseDoneWait &&
      Extent::Of(as.extent.load(std::memory_order_acquire)).pending == 0) {
    // acq_rel: acquire as above; the release half hands the slot, ticket and flags cleared by
    // FinishAck (I6), to the next owner's acquire CAS in ReserveLease (work_queue.cc).
    as.word.compare_exchange_strong(w, NextLeaseWord(w, kLeaseFree, kNoOwner),
                                    std::memory_order_acq_rel);
    WakeWaiters();
  }
}

void QueueCore::FinishAck(uint64_t lease, uint64_t acking) noexcept {
  LeaseSlot& ls = seg_->lease(lease);
  // Seal: claim everything, so that no split can start any more; the same
  // CAS tells whether one is in flight.
  // acquire: pairs with the extent CASes of TrySplit and Claim (work_queue.cc).
  uint64_t e = ls.extent.load(std::memory_order_acquire);
  Extent x = Extent::Of(e);
  while (x.splittable && x.claim < x.end) {
    Extent sealed = x;
    sealed.claim = x.end;
    // acq_rel: pairs with TrySplit's split CAS on this word (work_queue.cc): one of the two wins;
    // if the split won first, pending says so and is seen below.
    if (ls.extent.compare_exchange_weak(e, sealed.Word(), std::memory_order_acq_rel)) {
      x = sealed;
      break;
    }
    x = Extent::Of(e);
  }
  // relaxed: written by the lease's holder before the word became ACKING; our ACKING word came from
  // Ack's acq_rel CAS (the owner) or from a recoverer's acquire load or CAS of it, which orders
  // them before us.
  uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
  uint32_t flags = ls.flags.load(std::memory_order_relaxed);
  if (ticket < total_ && !(flags & (kLeasePreset | kLeasePiece))) {
    uint64_t bit = uint64_t{1} << (ticket % 64);
    // acq_rel: the release half pairs with the acquire loads of done words in AllDone, TrySweep,
    // SaveState, Stats and Segment::IsDone; they read the bitmap after the leases, and the bit is
    // set before the lease is freed below (I2).
    if (seg_->done_word(ticket / 64).fetch_or(bit, std::memory_order_acq_rel) & bit)
      // relaxed: statistics only (duplicate_acks), nothing is published through it.
      seg_->counters().duplicate_acks.fetch_add(1, std::memory_order_relaxed);
  }
  CrashPoint("ack.after_bit");
  // Cleared while ACKING, which only we own (I6). A DONE_WAIT lease holds no
  // ticket: its piece's thief holds it, or its bit is set.
  // release: pairs with TrySweep's acquire load of the ticket, which may see kNoTicket while the
  // word still says ACKING; the bit set above must then be visible to its bitmap read, or it
  // would re-issue a done ticket. (The word CAS below publishes it to the lease's next owner.)
  ls.ticket.store(kNoTicket, std::memory_order_release);
  ls.flags.store(0, std::memory_order_relaxed);
  if (x.pending != 0) {
    // A thief is between its split CAS and publishing its piece: keep the
    // slot (I7); the thief, or whoever recovers it, frees it.
    // acq_rel: the release half pairs with the acquire load of the word in SettleSplit, which frees
    // the slot once pending clears (I7).
    ls.word.compare_exchange_strong(acking, NextLeaseWord(acking, kLeaseDoneWait, kNoOwner),
                                    std::memory_order_acq_rel);
    return;
  }
  // acq_rel: the release half pairs with ReserveLease's acquire CAS (work_queue.cc), so the next
  // owner sees ticket and flags cleared (I6), and with the acquire loads of AllDone, TrySweep and
  // Stats: a reader that sees FREE sees the done bit.
  ls.word.compare_exchange_strong(acking, NextLeaseWord(acking, kLeaseFree, kNoOwner),
                                  std::memory_order_acq_rel);
}

void QueueCore::ReleaseSettledAnchors() noexcept {
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseSlot& ls = seg_->lease(l);
    // acquire (word): pairs with FinishAck's release CAS to DONE_WAIT. acquire (extent): pairs with
    // TrySplit's split CAS (work_queue.cc) that set pending, so the thief's anchor and flags
    // stores, made before that CAS, are visible below.
    if (LeaseStateOf(ls.word.load(std::memory_order_acquire)) != kLeaseDoneWait) continue;
    Extent x = Extent::Of(ls.extent.load(std::memory_order_acquire));
    uint64_t thief = x.pending == 0 ? kNoOwner : x.pending - 1;
    // The pending thief must hold a TAKING or OPEN piece of this anchor;
    // otherwise the mark is left over from a crash that was settled.
    bool live_piece = false;
    if (thief < num_leases_) {
      LeaseSlot& ts = seg_->lease(thief);
      // acquire: pairs with the thief's CASes on its own word (ReserveLease, then TAKING to OPEN in
      // TrySplit). flags and anchor may be relaxed: the acquire of the anchor's extent above read
      // the thief's split CAS, which the thief made after storing them.
      uint64_t tw = ts.word.load(std::memory_order_acquire);
      live_piece = (LeaseStateOf(tw) == kLeaseTaking || LeaseStateOf(tw) == kLeaseOpen) &&
                   (ts.flags.load(std::memory_order_relaxed) & kLeasePiece) &&
                   ts.anchor.load(std::memory_order_relaxed) == l;
    }
    if (!live_piece) SettleSplit(l, thief, kNoOwner);
  }
}

void QueueCore::RecoverLease(uint64_t lease, uint64_t word) noexcept {
  LeaseSlot& ls = seg_->lease(lease);
  Counters& c = seg_->counters();
  uint64_t state = LeaseStateOf(word);
  // acquire: pairs with the release stores of ticket in TakeOnce, TrySplit (work_queue.cc) and
  // PublishOrphan. The other fields may be relaxed: the owner is dead (I5) or we took the lease
  // over by CAS, so nobody writes them any more, and they were written before the ticket or the
  // owner's last word CAS.
  uint64_t ticket = ls.ticket.load(std::memory_order_acquire);
  bool piece = ls.flags.load(std::memory_order_relaxed) & kLeasePiece;
  if (state == kLeaseTaking && piece) {
    // A thief that died mid-split: its split happened exactly when the
    // anchor's pending mark names this lease (I7).
    // relaxed (anchor): as flags above. acquire (extent): pairs with TrySplit's split CAS, which
    // named this lease as pending (I7).
    uint64_t anchor = ls.anchor.load(std::memory_order_relaxed);
    bool happened =
        anchor < num_leases_ &&
        Extent::Of(seg_->lease(anchor).extent.load(std::memory_order_acquire)).pending == lease + 1;
    if (happened && ticket < total_) {
      if (MarkOrphan(ls, &word, NextLeaseWord(word, kLeaseOrphan, kNoOwner))) {
        c.recovered_items.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
      }
    } else {
      // relaxed: published by the word CAS to FREE below (I6).
      ls.ticket.store(kNoTicket, std::memory_order_relaxed);
      ls.flags.store(0, std::memory_order_relaxed);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS (work_queue.cc).
      ls.word.compare_exchange_strong(word, NextLeaseWord(word, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
    }
    SettleSplit(anchor, lease, kNoOwner);
    return;
  }
  if (state == kLeaseTaking) {
    if (ticket == kNoTicket) {
      // Died between fetch_add and recording its ticket: the ticket (if it
      // got one) is below the cursor, not done and held by nobody. Count the
      // sweep before freeing the slot, so a crash here over-counts, never
      // under-counts (I3).
      // acq_rel: counted before the free below (I3); pairs with the acquire loads of sweeps_pending
      // in TrySweep and AllDone (and AllDone's popcount covers a read made before it).
      c.sweeps_pending.fetch_add(1, std::memory_order_acq_rel);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS (work_queue.cc).
      ls.word.compare_exchange_strong(word, NextLeaseWord(word, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      return;
    }
    if (ticket >= total_ || seg_->IsDone(ticket)) {
      // Past the end, or a done ticket it was skipping.
      // release: as in FinishAck, a sweep that reads kNoTicket here, before the CAS to FREE
      // below, must see the done bit we saw.
      ls.ticket.store(kNoTicket, std::memory_order_release);
      ls.word.compare_exchange_strong(word, NextLeaseWord(word, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      return;
    }
    const WorkQueue::Item& item = items_[ItemAt(ticket / items_.size(), ticket % items_.size())];
    if (PublishOrphan(lease, word, ticket, item.begin, item.end, 0))
      c.recovered_items.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
    return;
  }
  if (state == kLeaseOpen) {
    if (ReturnToOrphan(ls, &word)) {
      c.recovered_items.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistics only.
    }
    // A thief that died after publishing its piece but before settling.
    // relaxed: the owner is gone (I5) and the lease is ORPHAN now; the anchor was written before
    // the owner's word CASes that our acquire read.
    if (piece) SettleSplit(ls.anchor.load(std::memory_order_relaxed), lease, kNoOwner);
    return;
  }
  if (state == kLeaseAcking) FinishAck(lease, word);  // the owner decided to ack
}

void QueueCore::RecoverClient(uint64_t slot, bool admin_held) noexcept {
  ClientSlot& cs = seg_->client(slot);
  // Before anything else: should this recovery be cut short, the segment is
  // kept for the next run all the same.
  // relaxed: Close reads keep_reasons under the admin mutex (work_queue.cc); the mutex, taken below
  // or held by the caller, orders it.
  seg_->counters().keep_reasons.fetch_or(kKeepCrashed, std::memory_order_relaxed);
  CrashPoint("recover.after_claim");
  bool first = true;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    // acquire: pairs with the dead owner's last CAS on the word, so RecoverLease sees the fields it
    // wrote before.
    uint64_t w = seg_->lease(l).word.load(std::memory_order_acquire);
    uint64_t state = LeaseStateOf(w);
    if (state == kLeaseFree || state == kLeaseOrphan || LeaseOwnerOf(w) != slot) continue;
    RecoverLease(l, w);
    if (first) CrashPoint("recover.mid_leases");
    first = false;
  }
  pthread_mutex_consistent(&cs.life);
  bool died = false;
  bool locked = !admin_held && LockRobustFor(&seg_->header().admin_mutex,
                                             std::chrono::milliseconds(5000), &died) == 0;
  // Without the admin lock (only a broken segment withholds it) the slot is
  // still freed: its leases are recovered, which is what matters.
  // release: pairs with the acquire loads of state in CheckClients, LivePidsImpl, RepairLeases,
  // Stats and Register (work_queue.cc): whoever sees the slot FREE sees its leases recovered.
  // left_ns: statistics only.
  cs.state.store(kClientFree, std::memory_order_release);
  cs.left_ns.store(MonotonicNs(), std::memory_order_relaxed);
  if (locked) pthread_mutex_unlock(&seg_->header().admin_mutex);
  pthread_mutex_unlock(&cs.life);
  WakeWaiters();
}

int QueueCore::RepairLeases(uint64_t self, bool admin_held, bool just_registered,
                            std::vector<std::string>* repaired) noexcept {
  static const char* const kStateNames[] = {"FREE",   "TAKING",    "OPEN",    "ORPHAN",
                                            "ACKING", "DONE_WAIT", "state 6", "state 7"};
  const uint64_t max_clients = seg_->geometry().max_clients;
  if (self >= max_clients) return 0;
  int count = 0;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseSlot& ls = seg_->lease(l);
    // acquire: pairs with the owner's CASes on the word. The owner's state is acquired below too:
    // it pairs with the release stores of state in Register, Close (work_queue.cc), RecoverClient.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    uint64_t state = LeaseStateOf(w);
    uint64_t owner = LeaseOwnerOf(w);
    bool valid_state = state <= kLeaseDoneWait;
    if (valid_state && state != kLeaseTaking && state != kLeaseOpen && state != kLeaseAcking)
      continue;  // FREE, ORPHAN and DONE_WAIT have no owner to wait for
    if (valid_state && owner == self && !just_registered) continue;
    std::string why;
    if (!valid_state) {
      why = "its state field is not a lease state";
    } else if (owner == self) {
      why = "its owner, client slot " + std::to_string(owner) + ", was free until now";
    } else if (owner >= max_clients) {
      why = "its owner field names client slot " + std::to_string(owner) + ", past the " +
            std::to_string(max_clients) + " slots";
    } else if (seg_->client(owner).state.load(std::memory_order_acquire) != kClientActive) {
      why = "its owner, client slot " + std::to_string(owner) + ", is not registered";
    } else {
      int rc = TryLockRobust(&seg_->client(owner).life);
      if (rc == EBUSY) continue;  // a live client's
      // Owner-dead: an ordinary recovery. Not held at all: no client leaves
      // a slot ACTIVE and unlocked (Register locks before it marks the slot,
      // Close and recovery free it before they unlock), so it is damage,
      // recovered the same way. Either frees the slot and recovers this lease.
      if (rc == EOWNERDEAD || rc == 0) {
        RecoverClient(owner, admin_held);
        continue;
      }
      why = "its owner, client slot " + std::to_string(owner) + ", has a damaged lock";
    }
    // relaxed: only for the message below; the lease is taken over before anything relies on it.
    uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
    // Take it over first, so that nobody else writes it any more, then
    // recover it as a dead owner's; a word in no valid state as TAKING.
    uint64_t taken = NextLeaseWord(w, valid_state ? state : kLeaseTaking, self);
    // acq_rel: takes the lease over; the acquire pairs with its last owner's word CAS (its fields
    // are then ours to read), and any later write by anyone else fails (I4).
    if (!ls.word.compare_exchange_strong(w, taken, std::memory_order_acq_rel)) continue;
    RecoverLease(l, taken);
    ++count;
    if (repaired != nullptr)
      repaired->push_back("lease " + std::to_string(l) + " (" + kStateNames[state] +
                          ", owner slot " + std::to_string(owner) + ", ticket " +
                          (ticket == kNoTicket ? std::string("none") : std::to_string(ticket)) +
                          "): " + why);
  }
  if (count > 0) WakeWaiters();
  return count;
}

int QueueCore::CheckClients(uint64_t self, bool admin_held) noexcept {
  int recovered = 0;
  for (uint64_t s = 0; s < seg_->geometry().max_clients; ++s) {
    if (s == self) continue;
    ClientSlot& cs = seg_->client(s);
    // acquire: pairs with the release stores of state in Register, Close (work_queue.cc) and
    // RecoverClient; a filter only, the trylock decides.
    if (cs.state.load(std::memory_order_acquire) != kClientActive) continue;
    int rc = TryLockRobust(&cs.life);
    if (rc == EOWNERDEAD) {
      RecoverClient(s, admin_held);
      ++recovered;
    } else if (rc == 0) {
      // Not held: the client is leaving (or left) cleanly.
      pthread_mutex_unlock(&cs.life);
    }
  }
  return recovered;
}

int QueueCore::LiveClients(uint64_t self, bool admin_held) noexcept {
  return static_cast<int>(LivePidsImpl(self, admin_held).size());
}

std::vector<int> QueueCore::LivePids(uint64_t self) noexcept { return LivePidsImpl(self, false); }

std::vector<int> QueueCore::LivePidsImpl(uint64_t self, bool admin_held) noexcept {
  std::vector<int> live;
  for (uint64_t s = 0; s < seg_->geometry().max_clients; ++s) {
    if (s == self) continue;
    ClientSlot& cs = seg_->client(s);
    // acquire: as in CheckClients; pid is for people, never for decisions, so relaxed.
    if (cs.state.load(std::memory_order_acquire) != kClientActive) continue;
    int rc = TryLockRobust(&cs.life);
    if (rc == EBUSY) {
      live.push_back(cs.pid.load(std::memory_order_relaxed));
    } else if (rc == EOWNERDEAD) {
      RecoverClient(s, admin_held);
    } else if (rc == 0) {
      pthread_mutex_unlock(&cs.life);
    }
  }
  return live;
}

int QueueCore::ReassignHung(uint64_t self, uint64_t timeout_ns) noexcept {
  int reassigned = 0;
  uint64_t now = MonotonicNs();
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseSlot& ls = seg_->lease(l);
    // acquire: pairs with the owner's CASes on the word (ReserveLease, TakeOnce, ClaimOrphan,
    // TrySplit), so an OPEN lease's fields are read after they were written.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    uint64_t state = LeaseStateOf(w);
    uint64_t owner = LeaseOwnerOf(w);
    if ((state != kLeaseOpen && state != kLeaseTaking) || owner == self ||
        owner >= seg_->geometry().max_clients)
      continue;
    ClientSlot& cs = seg_->client(owner);
    // relaxed: a timestamp; a stale one only moves the reassignment by one housekeeping round, and
    // the CAS on the word decides.
    uint64_t last = cs.last_progress_ns.load(std::memory_order_relaxed);
    if (last + timeout_ns > now) continue;
    if (state == kLeaseOpen) {
      if (ReturnToOrphan(ls, &w)) {
        // relaxed: statistics only.
        seg_->counters().recovered_items.fetch_add(1, std::memory_order_relaxed);
        ++reassigned;
      }
    } else {
      uint64_t ticket = 0;
      uint32_t flags = 0;
      if (!ReadTicketAndFlags(ls, &ticket, &flags) || (flags & kLeasePiece)) continue;  // mid-split
      if (ticket == kNoTicket) continue;  // mid-fetch_add; it will record it when it runs
      if (ticket >= total_ || seg_->IsDone(ticket)) continue;  // it will free it itself
      // Its owner may be only paused: take the lease over before writing
      // it, so that neither it nor another reassigner writes it after us.
      // Should we die next, our own recovery republishes it.
      uint64_t ours = NextLeaseWord(w, kLeaseTaking, self);
      // acq_rel: takes the TAKING lease over; the acquire half orders the owner's writes, whose
      // ticket ReadTicketAndFlags acquired above, before ours.
      if (self >= seg_->geometry().max_clients ||
          !ls.word.compare_exchange_strong(w, ours, std::memory_order_acq_rel))
        continue;
      const WorkQueue::Item& item = items_[ItemAt(ticket / items_.size(), ticket % items_.size())];
      if (PublishOrphan(l, ours, ticket, item.begin, item.end, 0)) {
        // relaxed: statistics only.
        seg_->counters().recovered_items.fetch_add(1, std::memory_order_relaxed);
        ++reassigned;
      }
    }
  }
  if (reassigned > 0) WakeWaiters();
  return reassigned;
}

std::vector<uint64_t> QueueCore::HeldTickets() const noexcept {
  std::vector<uint64_t> held;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseSlot& ls = seg_->lease(l);
    for (;;) {
      // acquire, all three: the ticket load pairs with the release stores of ticket (TakeOnce,
      // TrySplit, PublishOrphan), and acquire keeps the second word load after it, so w1 == w2
      // means the ticket was read while the word did not change.
      uint64_t w1 = ls.word.load(std::memory_order_acquire);
      uint64_t t = ls.ticket.load(std::memory_order_acquire);
      uint64_t w2 = ls.word.load(std::memory_order_acquire);
      if (w1 != w2) continue;
      if (LeaseStateOf(w1) != kLeaseFree && t != kNoTicket) held.push_back(t);
      break;
    }
  }
  std::sort(held.begin(), held.end());
  return held;
}

void QueueCore::TrySweep(uint64_t self) noexcept {
  Counters& c = seg_->counters();
  // acquire: pairs with the acq_rel increments in RecoverLease, AllDone and ClaimOrphan
  // (work_queue.cc).
  if (self == kNoOwner || c.sweeps_pending.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_t* mu = &seg_->header().sweep_mutex;
  int rc = TryLockRobust(mu);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu);  // a sweep is idempotent: just run it again
  } else if (rc != 0) {
    return;
  }
  // acquire (sweeps_pending): as above, now under sweep_mutex. acquire (cursor): pairs with the
  // release half of TakeOnce's fetch_add (work_queue.cc): every ticket below it had its TAKING
  // lease reserved before, so the scans below see that lease (I3).
  uint64_t pending = c.sweeps_pending.load(std::memory_order_acquire);
  uint64_t cursor = std::min(seg_->cursor().next_ticket.load(std::memory_order_acquire), total_);

  // A live taker between fetch_add and recording its ticket holds a ticket
  // below `cursor` that we cannot see yet: wait until none is in that window.
  uint64_t deadline = MonotonicNs() + 200'000'000;
  for (;;) {
    bool in_window = false;
    for (uint64_t l = 0; l < num_leases_ && !in_window; ++l) {
      LeaseSlot& ls = seg_->lease(l);
      // acquire (word): pairs with ReserveLease's CAS to TAKING. acquire (ticket): pairs with
      // TakeOnce's release store of the ticket (work_queue.cc).
      uint64_t w = ls.word.load(std::memory_order_acquire);
      in_window =
          LeaseStateOf(w) == kLeaseTaking && ls.ticket.load(std::memory_order_acquire) == kNoTicket;
    }
    if (!in_window) break;
    if (MonotonicNs() > deadline) {
      pthread_mutex_unlock(mu);
      return;  // try again later
    }
    CheckClients(self);
    std::this_thread::yield();
  }

  std::vector<uint64_t> held = HeldTickets();

  // Every ticket below the cursor that is not done and not held was lost.
  // Read the bitmap after the leases: an ack sets the bit before freeing.
  bool complete = true;
  uint64_t words = (cursor + 63) / 64;
  for (uint64_t i = 0; i < words && complete; ++i) {
    // acquire: pairs with FinishAck's acq_rel fetch_or. Read after the leases: an ack sets its bit
    // before it frees its lease, so a ticket missing from both was lost.
    uint64_t bits = seg_->done_word(i).load(std::memory_order_acquire);
    // A fed queue: tickets of other hosts are not lost. acquire: pairs with the feeder's release
    // of the limit or of sweeps_pending (LocalFeed), which follow its skip-bit changes.
    if (seg_->geometry().fed) bits |= seg_->skip_word(i).load(std::memory_order_acquire);
    if (bits == ~uint64_t{0}) continue;
    for (uint64_t b = 0; b < 64 && complete; ++b) {
      uint64_t t = i * 64 + b;
      if (t >= cursor) break;
      if ((bits >> b) & 1) continue;
      if (std::binary_search(held.begin(), held.end(), t)) continue;
      // Re-issue t through a lease of our own region, as a take would.
      bool issued = false;
      uint64_t first = self * seg_->geometry().leases_per_client;
      for (uint64_t l = first; l < first + seg_->geometry().leases_per_client && !issued; ++l) {
        LeaseSlot& ls = seg_->lease(l);
        // acquire: pairs with the release CAS that freed the lease (FinishAck, SettleSplit,
        // RecoverLease): its ticket is cleared (I6).
        uint64_t w = ls.word.load(std::memory_order_acquire);
        if (LeaseStateOf(w) != kLeaseFree) continue;
        uint64_t taking = NextLeaseWord(w, kLeaseTaking, self);
        // acq_rel: as ReserveLease (work_queue.cc); the release half publishes TAKING to the
        // acquire loads of the word in sweeps and recoverers.
        if (!ls.word.compare_exchange_strong(w, taking, std::memory_order_acq_rel)) continue;
        // PublishOrphan records t last: should we die first, the lease is a
        // TAKING one without a ticket, and the next sweep finds t again.
        const WorkQueue::Item& item = items_[ItemAt(t / items_.size(), t % items_.size())];
        issued = PublishOrphan(l, taking, t, item.begin, item.end, 0);
        // relaxed: statistics only.
        if (issued) c.recovered_items.fetch_add(1, std::memory_order_relaxed);
      }
      if (!issued) complete = false;  // no free lease now; sweep again later
    }
  }
  // acq_rel: after the re-issues above (each released by its CAS); pairs with the acquire loads of
  // sweeps_pending in TrySweep and AllDone.
  if (complete) c.sweeps_pending.fetch_sub(pending, std::memory_order_acq_rel);
  pthread_mutex_unlock(mu);
  WakeWaiters();
}

bool QueueCore::AllDone() noexcept {
  Counters& c = seg_->counters();
  // acquire: pairs with the release half of TakeOnce's fetch_add (work_queue.cc), so the leases
  // reserved before it are seen below.
  if (seg_->cursor().next_ticket.load(std::memory_order_acquire) < total_) return false;
  // A fed queue ends when every host's tickets are done, which only its
  // feeder learns. acquire: pairs with LocalFeed::End's release store, after
  // which the skip bits cover every ticket no process here finished.
  const bool fed = seg_->geometry().fed;
  if (fed && c.fed_end.load(std::memory_order_acquire) == 0) return false;
  // acquire: pairs with the acq_rel increments in RecoverLease, ClaimOrphan and below.
  if (c.sweeps_pending.load(std::memory_order_acquire) != 0) return false;
  for (uint64_t l = 0; l < num_leases_; ++l)
    // acquire: a FREE read from FinishAck's release CAS makes the done bit it set visible to the
    // bitmap loads below.
    if (LeaseStateOf(seg_->lease(l).word.load(std::memory_order_acquire)) != kLeaseFree)
      return false;
  // Trust, but verify: count the done bits. A shortfall means a ticket was
  // lost without a trace we know of; a sweep finds and re-issues it.
  uint64_t done = 0;
  uint64_t words = (total_ + 63) / 64;
  for (uint64_t i = 0; i < words; ++i) {
    // acquire: pairs with FinishAck's acq_rel fetch_or.
    uint64_t bits = seg_->done_word(i).load(std::memory_order_acquire);
    // acquire: as fed_end above.
    if (fed) bits |= seg_->skip_word(i).load(std::memory_order_acquire);
    if (i == words - 1 && total_ % 64 != 0) bits &= (uint64_t{1} << (total_ % 64)) - 1;
    done += static_cast<uint64_t>(__builtin_popcountll(bits));
  }
  if (done != total_) {
    // acq_rel: pairs with TrySweep's acquire load of sweeps_pending: the next sweep looks for the
    // lost ticket.
    c.sweeps_pending.fetch_add(1, std::memory_order_acq_rel);
    return false;
  }
  return true;
}

QueueStats QueueCore::Stats(const std::string& name) noexcept {
  QueueStats s;
  const Header& h = seg_->header();
  s.name = name;
  s.segment_path = seg_->path();
  s.num_items = items_.size();
  s.num_epochs = num_epochs_;
  s.total = total_;
  s.seed = seed_;
  s.shuffle = shuffle_;
  s.num_clients = h.num_clients;
  Counters& c = seg_->counters();
  // relaxed: statistics only; nothing is published through these counters.
  s.clients_joined = static_cast<uint32_t>(c.clients_joined.load(std::memory_order_relaxed));
  s.recovered_items = c.recovered_items.load(std::memory_order_relaxed);
  s.stale_acks = c.stale_acks.load(std::memory_order_relaxed);
  s.splits = c.splits.load(std::memory_order_relaxed);
  // acquire: pairs with TakeOnce's fetch_add (work_queue.cc); only a count here.
  uint64_t cursor = std::min(seg_->cursor().next_ticket.load(std::memory_order_acquire), total_);
  s.handed_out = cursor;
  s.epoch = cursor / items_.size();
  // Leases before bits (as SaveState): an ack sets its bit before freeing
  // its lease, so a ticket acked meanwhile is counted now or next time,
  // and the count never goes backwards.
  std::vector<uint64_t> open_by_client(seg_->geometry().max_clients, 0);
  std::vector<uint64_t> held;  // tickets of leases still out
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseSlot& ls = seg_->lease(l);
    // seq_cst (acquire would do): a FREE read from FinishAck's release CAS makes the done bit it
    // set visible to the bitmap loads below. ticket is relaxed: written before the OPEN or ORPHAN
    // CAS that this load read.
    uint64_t w = ls.word.load(std::memory_order_seq_cst);
    uint64_t state = LeaseStateOf(w);
    if (state == kLeaseOpen || state == kLeaseOrphan) {
      ++s.in_flight;
      uint64_t t = ls.ticket.load(std::memory_order_relaxed);
      if (t < total_) held.push_back(t);
    } else if (state == kLeaseAcking) {
      ++s.in_flight;
    }
    if (state == kLeaseOpen && LeaseOwnerOf(w) < open_by_client.size())
      ++open_by_client[LeaseOwnerOf(w)];
  }
  // One snapshot of the bits serves both the count and the held tickets.
  uint64_t words = (total_ + 63) / 64;
  std::vector<uint64_t> bits(words);
  for (uint64_t i = 0; i < words; ++i) {
    // seq_cst (acquire would do): pairs with FinishAck's acq_rel fetch_or.
    bits[i] = seg_->done_word(i).load(std::memory_order_seq_cst);
    if (i == words - 1 && total_ % 64 != 0) bits[i] &= (uint64_t{1} << (total_ % 64)) - 1;
    s.done += static_cast<uint64_t>(__builtin_popcountll(bits[i]));
  }
  // A ticket whose bit is set while a piece of it is still out (a split
  // tail, a restored item) is not done yet.
  std::vector<uint64_t> held_done;
  for (uint64_t t : held)
    if ((bits[t / 64] >> (t % 64)) & 1) held_done.push_back(t);
  std::sort(held_done.begin(), held_done.end());
  uint64_t not_yet =
      static_cast<uint64_t>(std::unique(held_done.begin(), held_done.end()) - held_done.begin());
  s.done = s.done > not_yet ? s.done - not_yet : 0;
  s.now_ns = MonotonicNs();
  for (uint64_t i = 0; i < seg_->geometry().max_clients; ++i) {
    ClientSlot& cs = seg_->client(i);
    // relaxed: statistics only, except state, whose acquire pairs with the release stores of state
    // in Register, Close (work_queue.cc) and RecoverClient; pid is for people, never for decisions.
    uint64_t joined = cs.joined_ns.load(std::memory_order_relaxed);
    if (joined == 0) continue;  // never used
    ClientStats cl;
    cl.slot = static_cast<uint32_t>(i);
    cl.pid = cs.pid.load(std::memory_order_relaxed);
    cl.alive = cs.state.load(std::memory_order_acquire) == kClientActive;
    cl.items_taken = cs.items_taken.load(std::memory_order_relaxed);
    cl.items_acked = cs.items_acked.load(std::memory_order_relaxed);
    cl.items_given_back = cs.items_given_back.load(std::memory_order_relaxed);
    cl.items_recovered = cs.items_recovered.load(std::memory_order_relaxed);
    cl.bytes_acked = cs.bytes_acked.load(std::memory_order_relaxed);
    cl.records = cs.records.load(std::memory_order_relaxed);
    cl.stale_acks = cs.stale_acks.load(std::memory_order_relaxed);
    cl.splits = cs.splits.load(std::memory_order_relaxed);
    cl.open_items = open_by_client[i];
    cl.idle_ns = cs.idle_ns.load(std::memory_order_relaxed);
    cl.joined_ns = joined;
    cl.last_progress_ns = cs.last_progress_ns.load(std::memory_order_relaxed);
    uint64_t left = cs.left_ns.load(std::memory_order_relaxed);
    uint64_t until = cl.alive || left == 0 ? s.now_ns : left;
    uint64_t lived = until > joined ? until - joined : 0;
    cl.busy_ns = lived > cl.idle_ns ? lived - cl.idle_ns : 0;
    s.clients.push_back(cl);
  }
  return s;
}

void WriteLayout(Segment* segment, const QueueConfig& config, const Geometry& g) {
  Header& h = segment->header();
  // layout_version and total_size are the preamble, written by the creator
  // before it published the magic.
  h.creator_uid = ::geteuid();
  h.creator_pid = ::getpid();
  h.created_unix_ns = RealtimeNs();
  h.fingerprint = config.Fingerprint();
  h.num_files = config.paths.size();
  h.num_items = config.items.size();
  h.num_epochs = config.num_epochs;
  h.total_tickets = config.total_tickets();
  h.total_bytes = config.total_bytes;
  h.num_slices = config.num_slices;
  h.seed = config.seed;
  h.seed_explicit = config.seed_explicit ? 1 : 0;
  h.shuffle = config.shuffle ? 1 : 0;
  h.paths_hash = config.PathsHash();
  h.sizes_hash = config.SizesHash();
  h.num_clients = config.num_clients;
  h.max_clients = config.max_clients;
  h.leases_per_client = config.leases_per_client;
  h.path_bytes = g.path_bytes;
  std::memset(h.format, 0, sizeof(h.format));
  std::memcpy(h.format, config.format.data(), config.format.size());
  InitRobustMutex(&h.sweep_mutex);
  InitRobustMutex(&h.feeder_mutex);
  h.fed = g.fed ? 1 : 0;
  segment->SetGeometry(g);
  // relaxed: not yet shared (see below). A queue of one host may hand out
  // every ticket; a fed one only what its feeder grants.
  segment->cursor().limit.store(g.fed ? 0 : g.total_tickets, std::memory_order_relaxed);
  for (uint64_t i = 0; i < g.max_clients; ++i) InitRobustMutex(&segment->client(i).life);
  uint64_t offset = 0;
  for (uint64_t f = 0; f < g.num_files; ++f) {
    const std::string& p = config.paths[f];
    std::memcpy(segment->path_bytes() + offset, p.data(), p.size());
    const FileIdentity& id = config.identities[f];
    segment->file(f) = FileEntry{offset, p.size(), id.size, id.mtime_ns, id.inode, id.device};
    offset += p.size();
  }
  for (uint64_t i = 0; i < g.num_items; ++i) {
    const WorkQueue::Item& it = config.items[i];
    segment->item(i) = ItemEntry{it.file, it.begin, it.end};
  }
  for (uint64_t l = 0; l < g.num_leases(); ++l)
    // relaxed: not yet shared; the creator's release store of READY in TryCreate (work_queue.cc)
    // publishes the layout.
    segment->lease(l).ticket.store(kNoTicket, std::memory_order_relaxed);
}

namespace {

std::string SegmentPathString(const Segment& s, uint64_t f) {
  const FileEntry& e = s.file(f);
  return std::string(s.path_bytes() + e.path_offset, e.path_length);
}

std::string Opt(uint64_t v) { return v == 0 ? "unset" : std::to_string(v); }

}  // namespace

void CompareConfig(const Segment& s, const QueueConfig& config) {
  const Header& h = s.header();
  auto mismatch = [&](const std::string& what) {
    return Error(ErrorKind::kConfigMismatch,
                 "queue '" + s.queue_name() + "' exists with a different configuration: " + what +
                     ". Use the same options in every process of a job, or another queue name "
                     "(remove the old queue with `tailcut rm " +
                     s.queue_name() + "` once its jobs are gone)");
  };
  // An index work is one file entry with an empty path (config.h).
  const bool theirs_index = h.num_files == 1 && s.file(0).path_length == 0;
  const uint64_t their_samples = theirs_index ? s.file(0).size : 0;
  if (theirs_index != (config.num_samples != 0) || their_samples != config.num_samples) {
    auto works = [](uint64_t samples, uint64_t files) {
      return samples != 0 ? "num_samples=" + std::to_string(samples)
                          : std::to_string(files) + (files == 1 ? " work file" : " work files");
    };
    throw mismatch("works differ: " + works(config.num_samples, config.paths.size()) + " here, " +
                   works(their_samples, h.num_files) + " in segment");
  }
  if (h.num_files != config.paths.size())
    throw mismatch("works differ: " + std::to_string(config.paths.size()) + " files here, " +
                   std::to_string(h.num_files) + " in segment");
  if (h.paths_hash != config.PathsHash()) {
    for (uint64_t f = 0; f < h.num_files; ++f) {
      std::string theirs = SegmentPathString(s, f);
      if (theirs != config.paths[f])
        throw mismatch("works[" + std::to_string(f) + "] differs: '" + Printable(config.paths[f]) +
                       "' here, '" + Printable(theirs) + "' in segment");
    }
  }
  if (h.sizes_hash != config.SizesHash()) {
    for (uint64_t f = 0; f < h.num_files; ++f)
      if (s.file(f).size != config.sizes[f])
        throw mismatch("size of '" + Printable(config.paths[f]) +
                       "' differs: " + std::to_string(config.sizes[f]) + " bytes here, " +
                       std::to_string(s.file(f).size) +
                       " in segment (the file changed after the queue was created)");
  }
  // Same size is not the same file: one renamed over it, or rewritten in
  // place, is another data set for the items already done.
  for (uint64_t f = 0; f < h.num_files; ++f) {
    const FileEntry& e = s.file(f);
    std::string change =
        DescribeFileChange({e.size, e.mtime_ns, e.inode, e.device}, config.identities[f]);
    if (!change.empty())
      throw mismatch("file '" + Printable(config.paths[f]) +
                     "' changed since the queue was created: " + change +
                     " (recreate the queue, or restore the file)");
  }
  if ((h.fed == 1) != config.fed)
    throw mismatch(std::string(config.fed
                                   ? "this process is fed by a coordinator, the queue is not"
                                   : "the queue is fed by a coordinator, this process is not") +
                   " (set the same coordinator, or none, in every process of a host)");
  if (h.num_slices != config.num_slices)
    throw mismatch("num_slices differs: " + Opt(config.num_slices) + " here, " + Opt(h.num_slices) +
                   " in segment");
  if (h.num_items != config.items.size())
    throw mismatch("item count differs: " + std::to_string(config.items.size()) + " here, " +
                   std::to_string(h.num_items) + " in segment");
  if (h.num_epochs != config.num_epochs)
    throw mismatch("num_epochs differs: " + std::to_string(config.num_epochs) + " here, " +
                   std::to_string(h.num_epochs) + " in segment");
  if ((h.shuffle != 0) != config.shuffle)
    throw mismatch(std::string("shuffle differs: ") + (config.shuffle ? "on" : "off") + " here, " +
                   (h.shuffle ? "on" : "off") + " in segment");
  if (config.seed_explicit && (h.seed_explicit == 0 || h.seed != config.seed))
    throw mismatch("seed differs: " + std::to_string(config.seed) + " here, " +
                   (h.seed_explicit
                        ? std::to_string(h.seed)
                        : "unset (drawn by the creator: " + std::to_string(h.seed) + ")") +
                   " in segment");
  if (!config.seed_explicit && h.seed_explicit != 0)
    throw mismatch("seed differs: unset here, " + std::to_string(h.seed) + " in segment");
  if (std::string(h.format) != config.format)
    throw mismatch("format differs: '" + config.format + "' here, '" + std::string(h.format) +
                   "' in segment");
  if (h.max_clients != config.max_clients)
    throw mismatch("max_clients differs: " + std::to_string(config.max_clients) + " here, " +
                   std::to_string(h.max_clients) + " in segment");
  if (h.leases_per_client != config.leases_per_client)
    throw mismatch("leases_per_client differs: " + std::to_string(config.leases_per_client) +
                   " here, " + std::to_string(h.leases_per_client) + " in segment");
  // The same works, sizes and slicing always give the same items; check the
  // table anyway, since the hot path uses our copy, never the segment's.
  for (uint64_t i = 0; i < h.num_items; ++i) {
    const ItemEntry& e = s.item(i);
    const WorkQueue::Item& it = config.items[i];
    if (e.file != it.file || e.begin != it.begin || e.end != it.end)
      throw mismatch("item " + std::to_string(i) + " differs (a different tailcut version?)");
  }
}

std::string KeepReasonText(uint32_t reasons, uint64_t joined, uint32_t num_clients) {
  std::string out;
  auto add = [&](const std::string& r) { out += (out.empty() ? "" : "; ") + r; };
  if (reasons & kKeepRequested) add("keep_unfinished was set");
  if (reasons & kKeepCrashed) add("a process of it died, so a rerun resumes it");
  if (joined < num_clients)
    add(std::to_string(joined) + " of num_clients=" + std::to_string(num_clients) +
        " processes have joined");
  return out;
}

std::vector<WorkQueue::Item> ReadItems(const Segment& s) {
  std::vector<WorkQueue::Item> items(s.geometry().num_items);
  for (uint64_t i = 0; i < items.size(); ++i) {
    const ItemEntry& e = s.item(i);
    items[i] = {static_cast<uint32_t>(e.file), e.begin, e.end};
  }
  return items;
}

}  // namespace tailcut::detail
