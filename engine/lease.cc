#include "engine/lease.h"

#include <algorithm>
#include <climits>
#include <optional>

#include "engine/clock.h"
#include "engine/crash_point.h"
#include "engine/futex.h"
#include "engine/permutation.h"
#include "engine/resume_point.h"

namespace tailcut::detail {

// --- LeaseTable: any process, any lease ----------------------------------

LeaseTable::LeaseTable(Segment* segment, std::vector<WorkQueue::Item> items, uint64_t num_epochs,
                       uint64_t seed, bool shuffle)
    : seg_(segment),
      items_(std::move(items)),
      num_epochs_(num_epochs),
      total_(items_.size() * num_epochs),
      seed_(seed),
      shuffle_(shuffle),
      num_leases_(segment->geometry().num_leases()) {}

uint64_t LeaseTable::ItemAt(uint64_t epoch, uint64_t position) const noexcept {
  if (!shuffle_) return position;
  // Deriving an epoch's round keys costs as much as the walk itself; takes
  // on one thread mostly stay in one epoch, so keep the last one per thread.
  struct Cached {
    const LeaseTable* table;
    uint64_t seed, n, epoch;
    Permutation permutation;
  };
  thread_local std::optional<Cached> cache;
  uint64_t n = items_.size();
  if (!cache || cache->table != this || cache->seed != seed_ || cache->n != n ||
      cache->epoch != epoch)
    cache.emplace(Cached{this, seed_, n, epoch, Permutation(n, seed_, epoch)});
  return cache->permutation(position);
}

void LeaseTable::WakeWaiters() noexcept {
  Counters& c = seg_->counters();
  // seq_cst pairs with the waiter's increment of waiters before it re-checks
  // the queue (Dekker): either it sees our change or we see it waiting.
  if (c.waiters.load(std::memory_order_seq_cst) == 0) return;
  // seq_cst: pairs with Take's load of wake_seq before it sleeps: FUTEX_WAIT then fails at once.
  c.wake_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(c.wake_seq, INT_MAX);
}

bool LeaseTable::MarkOrphan(LeaseEntry& ls, uint64_t* expected, uint64_t orphan_word) noexcept {
  // seq_cst: the release half publishes the lease's fields to ClaimOrphan's acquire CAS;
  // seq_cst, with the bump below, for the orphan_seq argument.
  bool ok = ls.word.compare_exchange_strong(*expected, orphan_word, std::memory_order_seq_cst);
  // After the CAS: a scan that missed this orphan read orphan_seq before it changes (seq_cst total
  // order), so its process scans again. Pairs with the seq_cst loads of orphan_seq in ClaimOrphan,
  // TakeOnce and OrphanSeqMoved (Take's re-check before it sleeps); a scan that reads the bumped
  // value acquires this CAS too.
  if (ok) seg_->counters().orphan_seq.fetch_add(1, std::memory_order_seq_cst);
  return ok;
}

bool LeaseTable::ReturnToOrphan(LeaseEntry& ls, uint64_t* expected) noexcept {
  const uint64_t orphan = NextLeaseWord(*expected, kLeaseOrphan, kNoOwner);
  // The item goes back at its floor; nothing else of the lease changes (a
  // claimed item keeps its extent): ClaimOrphan starts the next owner there.
  // relaxed: we hold the lease, or its owner's death or our CAS on the word handed it to us, so
  // begin is not written any more.
  if (!RetagFloor(ls, *expected, orphan, ls.begin.load(std::memory_order_relaxed))) return false;
  return MarkOrphan(ls, expected, orphan);
}

bool LeaseTable::PublishOrphan(uint64_t lease, uint64_t expected_word, uint64_t ticket,
                               uint64_t begin, uint64_t end, uint32_t flags) noexcept {
  LeaseEntry& ls = seg_->lease(lease);
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

void LeaseTable::SettleSplit(uint64_t anchor, uint64_t thief) noexcept {
  if (anchor >= num_leases_) return;
  LeaseEntry& as = seg_->lease(anchor);
  // acquire: pairs with the extent CASes in TrySplit and ClaimOrphan.
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
    // FinishAck (I6), to the next owner's acquire CAS in ReserveLease.
    as.word.compare_exchange_strong(w, NextLeaseWord(w, kLeaseFree, kNoOwner),
                                    std::memory_order_acq_rel);
    WakeWaiters();
  }
}

void LeaseTable::FinishAck(uint64_t lease, uint64_t acking) noexcept {
  LeaseEntry& ls = seg_->lease(lease);
  // Seal: claim everything, so that no split can start any more; the same
  // CAS tells whether one is in flight.
  // acquire: pairs with the extent CASes of TrySplit and Claim.
  uint64_t e = ls.extent.load(std::memory_order_acquire);
  Extent x = Extent::Of(e);
  while (x.splittable && x.claim < x.end) {
    Extent sealed = x;
    sealed.claim = x.end;
    // acq_rel: pairs with TrySplit's split CAS on this word: one of the two wins;
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
  // acq_rel: the release half pairs with ReserveLease's acquire CAS, so the next
  // owner sees ticket and flags cleared (I6), and with the acquire loads of AllDone, TrySweep and
  // Stats: a reader that sees FREE sees the done bit.
  ls.word.compare_exchange_strong(acking, NextLeaseWord(acking, kLeaseFree, kNoOwner),
                                  std::memory_order_acq_rel);
}

void LeaseTable::RecoverLease(uint64_t lease, uint64_t word) noexcept {
  LeaseEntry& ls = seg_->lease(lease);
  Counters& c = seg_->counters();
  uint64_t state = LeaseStateOf(word);
  // acquire: pairs with the release stores of ticket in TakeOnce, TrySplit and
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
      // acq_rel: the release half pairs with ReserveLease's acquire CAS.
      ls.word.compare_exchange_strong(word, NextLeaseWord(word, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
    }
    SettleSplit(anchor, lease);
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
      // acq_rel: the release half pairs with ReserveLease's acquire CAS.
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
    const WorkQueue::Item& item = ItemOf(ticket);
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
    if (piece) SettleSplit(ls.anchor.load(std::memory_order_relaxed), lease);
    return;
  }
  if (state == kLeaseAcking) FinishAck(lease, word);  // the owner decided to ack
}

bool LeaseTable::TakeOver(uint64_t lease, uint64_t* word, uint64_t state, uint64_t self) noexcept {
  const uint64_t taken = NextLeaseWord(*word, state, self);
  // acq_rel: takes the lease over; the acquire pairs with its last owner's word CAS (its fields are
  // then ours to read), and any later write by anyone else fails (I4).
  if (!seg_->lease(lease).word.compare_exchange_strong(*word, taken, std::memory_order_acq_rel))
    return false;
  *word = taken;
  return true;
}

bool LeaseTable::ReassignTaking(uint64_t lease, uint64_t word, uint64_t ticket,
                                uint64_t self) noexcept {
  // Its owner may be only paused: take the lease over before writing it, so
  // that neither it nor another reassigner writes it after us. Should we die
  // next, our own recovery republishes it. The acquire half of TakeOver's
  // CAS orders the owner's writes, whose ticket the caller acquired
  // (ReadTicketAndFlags), before ours.
  if (self >= seg_->geometry().max_clients || !TakeOver(lease, &word, kLeaseTaking, self))
    return false;
  const WorkQueue::Item& item = ItemOf(ticket);
  return PublishOrphan(lease, word, ticket, item.begin, item.end, 0);
}

bool LeaseTable::Reissue(uint64_t self, uint64_t ticket) noexcept {
  const uint64_t first = self * seg_->geometry().leases_per_client;
  for (uint64_t l = first; l < first + seg_->geometry().leases_per_client; ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // acquire: pairs with the release CAS that freed the lease (FinishAck, SettleSplit,
    // RecoverLease): its ticket is cleared (I6).
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseFree) continue;
    uint64_t taking = NextLeaseWord(w, kLeaseTaking, self);
    // acq_rel: as ReserveLease; the release half publishes TAKING to the acquire loads of the word
    // in sweeps and recoverers.
    if (!ls.word.compare_exchange_strong(w, taking, std::memory_order_acq_rel)) continue;
    // PublishOrphan records the ticket last: should we die first, the lease
    // is a TAKING one without a ticket, and the next sweep finds it again.
    const WorkQueue::Item& item = ItemOf(ticket);
    if (PublishOrphan(l, taking, ticket, item.begin, item.end, 0)) return true;
  }
  return false;
}

std::vector<uint64_t> LeaseTable::HeldTickets() const noexcept {
  std::vector<uint64_t> held;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
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

// --- ClientLeases: one client's takes and item calls ----------------------

ClientLeases::ClientLeases(LeaseTable* table, const std::vector<std::string>* paths,
                           uint32_t path_token, uint64_t slot, Options options)
    : table_(table),
      seg_(&table->segment()),
      paths_(paths),
      path_token_(path_token),
      slot_(slot),
      lease_base_(slot * table->segment().geometry().leases_per_client),
      options_(options) {}

bool ClientLeases::OrphanSeqMoved() const noexcept {
  // seq_cst: pairs with MarkOrphan's seq_cst bump of orphan_seq.
  return seg_->counters().orphan_seq.load(std::memory_order_seq_cst) !=
         no_orphans_at_seq_.load(std::memory_order_relaxed);
}

void ClientLeases::FillItem(WorkItem* out, uint64_t lease, uint64_t open_word, uint64_t ticket,
                            uint64_t begin, uint64_t end, uint64_t index) const noexcept {
  uint64_t n = table_->num_items();
  out->ticket = ticket;
  out->epoch = ticket / n;
  out->index = index != kNoTicket ? index : table_->ItemAt(out->epoch, ticket % n);
  const WorkQueue::Item& item = table_->items()[out->index];
  out->file = item.file;
  out->path = ItemPath::OfQueue((*paths_)[item.file], path_token_);
  out->begin = begin;
  out->end = end;
  out->lease = static_cast<uint32_t>(lease);
  out->generation = LeaseGenOf(open_word);
  out->piece = false;
}

bool ClientLeases::ClaimOrphan(WorkItem* out) noexcept {
  Counters& c = seg_->counters();
  uint64_t n = table_->num_leases();
  // seq_cst: pairs with MarkOrphan's seq_cst bump of orphan_seq after its
  // CAS: an orphan this scan misses was published after this
  // load, so its bump makes the next TakeOnce scan again.
  uint64_t seq_before = c.orphan_seq.load(std::memory_order_seq_cst);
  uint64_t start = orphan_scan_start_.fetch_add(1, std::memory_order_relaxed) % n;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t l = (start + k) % n;
    LeaseEntry& ls = seg_->lease(l);
    // acquire: pairs with MarkOrphan's CAS to ORPHAN; a
    // filter only, the CAS below decides.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseOrphan) continue;
    uint64_t open = NextLeaseWord(w, kLeaseOpen, slot_);
    // acq_rel: the acquire half pairs with MarkOrphan's CAS to ORPHAN
    // (ReturnToOrphan, PublishOrphan), so the fields read below are complete;
    // the release half publishes OPEN to the acquire loads of the word in
    // recoverers, TrySplit, SaveState and Stats.
    if (!ls.word.compare_exchange_strong(w, open, std::memory_order_acq_rel)) continue;
    uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
    uint64_t begin = ls.begin.load(std::memory_order_relaxed);
    uint64_t end = ls.end.load(std::memory_order_relaxed);
    uint32_t flags = ls.flags.load(std::memory_order_relaxed);
    // Where it resumes: its floor, as ReturnToOrphan or PublishOrphan
    // tagged it for the orphan word (a former owner's commits), else begin.
    // relaxed: as the fields above, acquired by our CAS of the word, which
    // MarkOrphan made after ReturnToOrphan's CAS of the floor.
    uint64_t from = begin;
    ProgressOffset(ls.floor.load(std::memory_order_relaxed), w, &from);
    if (begin <= end) {
      // Ours now: tag the extent (a former owner's late Claim, or a thief
      // that read it before, then fails its CAS), and not splittable until
      // we claim. An anchor whose tail was split off ends where the split
      // lowered it, as the extent says once no thief can lower it further.
      // What lies below the floor counts as claimed: no split takes it.
      // acquire: pairs with the extent CASes of TrySplit and of a former
      // owner's late Claim; the CAS below retries on them.
      uint64_t e = ls.extent.load(std::memory_order_acquire);
      Extent x = Extent::Of(e);
      const uint64_t unit = SplitUnit(end - begin);
      const uint64_t floor_units =
          from <= begin ? 0 : ExtentUnits(std::min(from, end) - begin, unit);
      for (;;) {
        Extent y = x;
        y.splittable = false;
        y.tag = GenTag(open, 8);
        y.claim = std::max(x.claim, std::min(floor_units, x.end));
        // acq_rel: pairs with TrySplit's split CAS and Claim's CAS on this
        // word: one that read the extent before our tag fails.
        if (ls.extent.compare_exchange_weak(e, y.Word(), std::memory_order_acq_rel)) {
          x = y;
          break;
        }
        x = Extent::Of(e);
      }
      end = std::min(end, begin + x.end * SplitUnit(end - begin));
    }
    // Never trust the segment: a piece must lie inside its ticket's item.
    bool valid = ticket < table_->total();
    if (valid) {
      const WorkQueue::Item& item = table_->ItemOf(ticket);
      valid = begin <= end && begin >= item.begin && end <= item.end;
    }
    if (!valid) {
      // Drop the bad lease; if it stood for a real ticket, a sweep re-issues it.
      ls.ticket.store(kNoTicket, std::memory_order_relaxed);
      ls.flags.store(0, std::memory_order_relaxed);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS: the
      // next owner sees ticket and flags cleared (I6).
      ls.word.compare_exchange_strong(open, NextLeaseWord(open, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      // acq_rel: pairs with the acquire loads of sweeps_pending in TrySweep
      // and AllDone (housekeeper.cc): a sweep looks for the dropped ticket.
      c.sweeps_pending.fetch_add(1, std::memory_order_acq_rel);
      continue;
    }
    from = std::clamp(from, begin, end);
    // A fed queue's feeder dropped the ticket (its block went to another
    // host), or a former owner committed all of it: complete the lease as
    // an ack would, never hand it out.
    if (seg_->IsSkipped(ticket) || (from > begin && from == end)) {
      uint64_t acking = NextLeaseWord(open, kLeaseAcking, slot_);
      // acq_rel: as Ack's CAS to ACKING; FinishAck then frees the lease.
      if (ls.word.compare_exchange_strong(open, acking, std::memory_order_acq_rel))
        table_->FinishAck(l, acking);
      continue;
    }
    ls.progress.store(ProgressWord(from, open), std::memory_order_relaxed);
    ls.floor.store(ProgressWord(from, open), std::memory_order_relaxed);
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    me().items_recovered.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, l, open, ticket, from, end);
    out->piece = flags & kLeasePiece;
    return true;
  }
  no_orphans_at_seq_.store(seq_before, std::memory_order_relaxed);
  return false;
}

bool ClientLeases::TakeOnce(WorkItem* out, bool* limit) noexcept {
  Counters& c = seg_->counters();
  // Orphans first, but scan for them only when one was published since
  // our last fruitless scan (the end of the data always scans: see Take).
  // seq_cst: pairs with MarkOrphan's seq_cst bump.
  if (c.orphan_seq.load(std::memory_order_seq_cst) !=
          no_orphans_at_seq_.load(std::memory_order_relaxed) &&
      ClaimOrphan(out))
    return true;
  SharedAtomic<uint64_t>& cursor = seg_->cursor().next_ticket;
  // total_tickets, or in a fed queue what its feeder granted so far.
  // acquire: pairs with LocalFeed::Grant's release store, so the skip bits
  // set below the new limit are seen by IsSkipped below.
  SharedAtomic<uint64_t>& granted = seg_->cursor().limit;
  const uint64_t total = table_->total();
  const bool fed = seg_->geometry().fed;
  while (cursor.load(std::memory_order_relaxed) < granted.load(std::memory_order_acquire)) {
    // Reserve a lease of our region before taking a ticket, so that a death
    // right after fetch_add leaves a trace (I3).
    uint64_t l = 0, taking = 0;
    if (!ReserveLease(&l, &taking)) {
      *limit = true;
      return false;
    }
    LeaseEntry& ls = seg_->lease(l);
    CrashPoint("take.after_reserve");
    // acq_rel: the release half pairs with the acquire loads of the cursor
    // in TrySweep and AllDone (housekeeper.cc): who sees the ticket taken sees
    // our TAKING lease (I3). A fed queue advances by CAS (NextFedTicket).
    uint64_t ticket = fed ? NextFedTicket() : cursor.fetch_add(1, std::memory_order_acq_rel);
    CrashPoint("take.after_fetch_add");
    // Nothing recorded yet (the ticket stays kNoTicket): freeing is the CAS.
    // acq_rel: the release half pairs with ReserveLease's acquire CAS.
    auto release = [&] {
      ls.word.compare_exchange_strong(taking, NextLeaseWord(taking, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
    };
    if (ticket >= total) {
      release();
      break;
    }
    // Done before a restore, or (fed) another host's.
    if (seg_->IsDone(ticket) || seg_->IsSkipped(ticket)) {
      release();
      continue;
    }
    uint64_t n = table_->num_items();
    const uint64_t index = table_->ItemAt(ticket / n, ticket % n);
    const WorkQueue::Item& item = table_->items()[index];
    const uint64_t open = NextLeaseWord(taking, kLeaseOpen, slot_);
    ls.begin.store(item.begin, std::memory_order_relaxed);
    ls.end.store(item.end, std::memory_order_relaxed);
    ls.progress.store(ProgressWord(item.begin, open), std::memory_order_relaxed);
    ls.floor.store(ProgressWord(item.begin, open), std::memory_order_relaxed);
    uint64_t length = item.end - item.begin;
    ls.extent.store(Extent::Fresh(ExtentUnits(length, SplitUnit(length)), open).Word(),
                    std::memory_order_relaxed);
    ls.flags.store(0, std::memory_order_relaxed);
    // The ticket last: a lease timeout may republish a TAKING lease once its
    // ticket shows (ReassignHung), and from then on we write nothing more.
    // release: pairs with the acquire loads of ticket in ReadTicketAndFlags,
    // RecoverLease and TrySweep (housekeeper.cc): who sees it sees the fields.
    ls.ticket.store(ticket, std::memory_order_release);
    CrashPoint("take.after_ticket");
    // Fails only if a lease timeout reassigned the ticket while we were paused.
    // acq_rel: the release half publishes the fields to the acquire loads of
    // the word in recoverers, TrySplit, SaveState and Stats.
    if (!ls.word.compare_exchange_strong(taking, open, std::memory_order_acq_rel)) continue;
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, l, open, ticket, item.begin, item.end, index);
    return true;
  }
  return false;
}

uint64_t ClientLeases::NextFedTicket() noexcept {
  // A fetch_add could pass the limit, and a ticket past it is not ours to
  // hand out yet: advance by CAS, and only below the limit.
  SharedAtomic<uint64_t>& cursor = seg_->cursor().next_ticket;
  // acquire (cursor and limit), seq_cst (CAS): as TakeOnce's fetch_add, whose release half
  // publishes the TAKING lease reserved before it to TrySweep and AllDone (I3); the limit's
  // acquire pairs with LocalFeed::Grant's release store.
  uint64_t ticket = cursor.load(std::memory_order_acquire);
  for (;;) {
    if (ticket >= seg_->cursor().limit.load(std::memory_order_acquire)) return kNoTicket;
    // seq_cst: see Segment::IsSkipped, which the caller checks next.
    if (cursor.compare_exchange_weak(ticket, ticket + 1, std::memory_order_seq_cst)) return ticket;
  }
}

bool ClientLeases::ReserveLease(uint64_t* lease, uint64_t* taking_word) noexcept {
  const uint64_t per_client = seg_->geometry().leases_per_client;
  for (uint64_t k = 0; k < per_client; ++k) {
    uint64_t l = lease_base_ + k;
    // acquire: a filter only; the CAS below decides.
    uint64_t w = seg_->lease(l).word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseFree) continue;
    uint64_t taking = NextLeaseWord(w, kLeaseTaking, slot_);
    // acq_rel: the acquire half pairs with the release CAS that freed the
    // lease (FinishAck, SettleSplit, RecoverLease, Reissue; TakeOnce,
    // ClaimOrphan, TrySplit), so its cleared ticket and flags are seen (I6);
    // the release half publishes TAKING to the acquire loads of the word in
    // TrySweep and the recoverers.
    if (seg_->lease(l).word.compare_exchange_strong(w, taking, std::memory_order_acq_rel)) {
      *lease = l;
      *taking_word = taking;
      return true;
    }
  }
  return false;
}

double ClientLeases::ClientRate(uint64_t slot) const noexcept {
  if (slot >= seg_->geometry().max_clients) return 0;
  const ClientEntry& cs = seg_->client(slot);
  uint64_t bytes = cs.bytes_acked.load(std::memory_order_relaxed);
  uint64_t joined = cs.joined_ns.load(std::memory_order_relaxed);
  uint64_t idle = cs.idle_ns.load(std::memory_order_relaxed);
  uint64_t now = CoarseNs();
  if (bytes == 0 || now <= joined + idle) return 0;
  return static_cast<double>(bytes) / static_cast<double>(now - joined - idle);
}

bool ClientLeases::TrySplit(WorkItem* out, uint64_t below_ticket) noexcept {
  if (!options_.split_tail) return false;
  const uint64_t min_part = std::max<uint64_t>(options_.min_split_bytes, 1);
  for (int attempt = 0; attempt < 4; ++attempt) {
    // The open, splittable item with the most unclaimed bytes.
    uint64_t victim = kNoOwner, best = 0, victim_extent = 0, victim_ticket = 0, victim_begin = 0,
             victim_unit = 0, victim_end = 0;
    bool victim_piece = false;
    uint64_t victim_owner = kNoOwner;
    for (uint64_t l = 0; l < table_->num_leases(); ++l) {
      LeaseEntry& ls = seg_->lease(l);
      // acquire: pairs with the owner's CAS to OPEN (TakeOnce, ClaimOrphan,
      // TrySplit), so the fields read below were written before it.
      uint64_t w = ls.word.load(std::memory_order_acquire);
      if (LeaseStateOf(w) != kLeaseOpen || LeaseOwnerOf(w) == slot_) continue;
      uint32_t flags = ls.flags.load(std::memory_order_relaxed);
      if (flags & kLeasePreset) continue;
      // acquire: pairs with the owner's Claim CAS and other thieves' split
      // CASes on the extent; the split CAS below decides.
      uint64_t e = ls.extent.load(std::memory_order_acquire);
      Extent x = Extent::Of(e);
      if (!x.splittable || x.pending != 0) continue;
      uint64_t ticket = ls.ticket.load(std::memory_order_relaxed);
      uint64_t begin = ls.begin.load(std::memory_order_relaxed);
      uint64_t end = ls.end.load(std::memory_order_relaxed);
      // acquire: as the first load; an unchanged word says the lease did not
      // move on to another owner while its fields were read.
      if (ls.word.load(std::memory_order_acquire) != w || ticket >= table_->total() || begin > end)
        continue;
      if (ticket >= below_ticket) continue;
      uint64_t unit = SplitUnit(end - begin);
      uint64_t claimed = std::min(end, begin + x.claim * unit);
      uint64_t current_end = std::min(end, begin + x.end * unit);
      if (current_end <= claimed || current_end - claimed <= best) continue;
      best = current_end - claimed;
      victim = l;
      victim_extent = e;
      victim_ticket = ticket;
      victim_begin = begin;
      victim_unit = unit;
      victim_end = current_end;
      victim_piece = (flags & kLeasePiece) != 0;
      victim_owner = LeaseOwnerOf(w);
    }
    if (victim == kNoOwner || best < 2 * min_part) return false;
    // Split in the middle of what the owner has not claimed yet; an item the
    // owner has not started (it is only prefetched) goes almost whole: all
    // but its first unit, which the owner reads and acks. Not so a piece: a
    // thief starts its piece at once, and taking it whole would only pass it
    // from thief to thief.
    // Between the two, the owner keeps the share of the rest that matches its
    // speed against ours (bytes acked per busy second, from the counters in
    // the segment), so one split leaves it about as much as it can read while
    // we read ours; with no rate known yet, half.
    Extent x = Extent::Of(victim_extent);
    uint64_t end_units = ExtentUnits(victim_end - victim_begin, victim_unit);
    uint64_t rest = end_units - x.claim;
    uint64_t keep = rest / 2;
    double owner_rate = ClientRate(victim_owner), our_rate = ClientRate(slot_);
    if (owner_rate > 0 && our_rate > 0)
      keep =
          static_cast<uint64_t>(static_cast<double>(rest) * owner_rate / (owner_rate + our_rate));
    uint64_t split_units =
        x.claim == 0 && !victim_piece ? 1 : x.claim + std::max<uint64_t>(keep, 1);
    if (options_.split_multiple > 1) {
      // Up to the next multiple past the begin that the extent's units can say.
      const uint64_t m = options_.split_multiple;
      const uint64_t at = (split_units * victim_unit + m - 1) / m * m;
      split_units = ExtentUnits(at, victim_unit);
    }
    uint64_t split = victim_begin + split_units * victim_unit;
    if (split_units <= x.claim || split >= victim_end || victim_end - split < min_part)
      return false;
    // Our piece first, complete, in a lease of our own (I7).
    uint64_t mine, taking;
    if (!ReserveLease(&mine, &taking)) return false;
    LeaseEntry& ps = seg_->lease(mine);
    // Mark it a piece before it names a ticket: a recoverer must never take
    // it for an ordinary TAKING lease and re-issue the whole item.
    ps.anchor.store(static_cast<uint32_t>(victim), std::memory_order_relaxed);
    // seq_cst: pairs with the acquire loads of flags in ReadTicketAndFlags
    // (lease.h); the ticket's release below publishes it too.
    ps.flags.store(kLeasePiece, std::memory_order_seq_cst);
    // release: pairs with the acquire loads of ticket in ReadTicketAndFlags,
    // RecoverLease and TrySweep: who sees the ticket sees the piece flag and
    // the anchor.
    ps.ticket.store(victim_ticket, std::memory_order_release);
    const uint64_t open = NextLeaseWord(taking, kLeaseOpen, slot_);
    ps.begin.store(split, std::memory_order_relaxed);
    ps.end.store(victim_end, std::memory_order_relaxed);
    ps.progress.store(ProgressWord(split, open), std::memory_order_relaxed);
    ps.floor.store(ProgressWord(split, open), std::memory_order_relaxed);
    uint64_t length = victim_end - split;
    ps.extent.store(Extent::Fresh(ExtentUnits(length, SplitUnit(length)), open).Word(),
                    std::memory_order_relaxed);
    CrashPoint("split.after_reserve");
    Extent lowered = x;
    lowered.end = split_units;
    lowered.pending = mine + 1;
    lowered.split = true;
    // seq_cst: pairs with SaveState's seq_cst loads of split_seq before and
    // after its scan.
    seg_->counters().split_seq.fetch_add(1, std::memory_order_seq_cst);
    // acq_rel: pairs with the owner's Claim CAS and FinishAck's seal on the
    // same word: the owner either claimed past our split point first (we
    // fail) or sees the lower end. The release half publishes our piece's
    // fields to those that acquire the extent and find it pending
    // (SettleSplit, ReleaseSettledAnchors, RecoverLease, SaveState).
    if (!seg_->lease(victim).extent.compare_exchange_strong(victim_extent, lowered.Word(),
                                                            std::memory_order_acq_rel)) {
      ps.ticket.store(kNoTicket, std::memory_order_relaxed);
      // release, after the ticket: pairs with the second flags load of
      // ReadTicketAndFlags, which then sees the flags change and retries.
      ps.flags.store(0, std::memory_order_release);
      // acq_rel: the release half pairs with ReserveLease's acquire CAS: the
      // next owner sees ticket and flags cleared (I6).
      ps.word.compare_exchange_strong(taking, NextLeaseWord(taking, kLeaseFree, kNoOwner),
                                      std::memory_order_acq_rel);
      continue;
    }
    // Again after the CAS, still TAKING: a SaveState scan that saw neither
    // bump change had this lease TAKING all along (see SaveState).
    // seq_cst: as the first bump.
    seg_->counters().split_seq.fetch_add(1, std::memory_order_seq_cst);
    CrashPoint("split.after_cas");
    // acq_rel: the release half publishes the piece to the acquire loads of
    // the word in ReleaseSettledAnchors, recoverers, SaveState and Stats.
    ps.word.compare_exchange_strong(taking, open, std::memory_order_acq_rel);
    CrashPoint("split.after_open");
    table_->SettleSplit(victim, mine);
    seg_->counters().splits.fetch_add(1, std::memory_order_relaxed);
    me().splits.fetch_add(1, std::memory_order_relaxed);
    me().items_taken.fetch_add(1, std::memory_order_relaxed);
    FillItem(out, mine, open, victim_ticket, split, victim_end);
    out->piece = true;
    return true;
  }
  return false;
}

ItemStatus ClientLeases::Claim(const WorkItem& item, uint64_t up_to, uint64_t* end) noexcept {
  LeaseEntry& ls = seg_->lease(item.lease);
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  // acquire: pairs with the CASes that may have moved the lease on
  // (ReturnToOrphan, ReassignHung in housekeeper.cc); still ours, its fields
  // below are ours.
  if (ls.word.load(std::memory_order_acquire) != ours) return ItemStatus::kStale;
  uint64_t begin = ls.begin.load(std::memory_order_relaxed);
  uint64_t limit = ls.end.load(std::memory_order_relaxed);
  if ((ls.flags.load(std::memory_order_relaxed) & kLeasePreset) || begin > limit) {
    *end = item.end;  // restored items are never split
    return ItemStatus::kOk;
  }
  uint64_t unit = SplitUnit(limit - begin);
  uint64_t want = up_to <= begin ? 0 : ExtentUnits(std::min(up_to, limit) - begin, unit);
  // acquire: pairs with the extent CASes of TrySplit and ClaimOrphan.
  uint64_t e = ls.extent.load(std::memory_order_acquire);
  Extent x = Extent::Of(e);
  for (;;) {
    // Paused past a lease timeout, we may find the lease another owner's:
    // its extent then carries that owner's tag, and we touch nothing.
    if (x.tag != GenTag(ours, 8)) return ItemStatus::kStale;
    Extent y = x;
    y.splittable = true;
    y.claim = std::max(x.claim, std::min(want, x.end));
    // acq_rel: pairs with TrySplit's split CAS on this word: a thief never
    // splits below what we claimed, nor we claim past its split.
    if (y.Word() == e || ls.extent.compare_exchange_weak(e, y.Word(), std::memory_order_acq_rel)) {
      x = y;
      break;
    }
    x = Extent::Of(e);
  }
  // The fields above may be another owner's if the lease moved on after
  // our first check; then the end would be theirs.
  // acquire: as the first check.
  if (ls.word.load(std::memory_order_acquire) != ours) return ItemStatus::kStale;
  *end = std::min(limit, begin + x.end * unit);
  me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return ItemStatus::kOk;
}

ItemStatus ClientLeases::Ack(const WorkItem& item) noexcept {
  LeaseEntry& ls = seg_->lease(item.lease);
  uint64_t expected = LeaseWord(kLeaseOpen, slot_, item.generation);
  uint64_t acking = NextLeaseWord(expected, kLeaseAcking, slot_);
  // acq_rel: fails if a recoverer or ReassignHung moved the lease on (the
  // acquire half pairs with their CASes); the release half publishes ACKING
  // to a recoverer's acquire load, which finishes the ack should we die.
  if (!ls.word.compare_exchange_strong(expected, acking, std::memory_order_acq_rel)) {
    me().stale_acks.fetch_add(1, std::memory_order_relaxed);
    seg_->counters().stale_acks.fetch_add(1, std::memory_order_relaxed);
    return ItemStatus::kStale;
  }
  CrashPoint("ack.after_mark");
  table_->FinishAck(item.lease, acking);
  ClientEntry& cs = me();
  cs.items_acked.fetch_add(1, std::memory_order_relaxed);
  cs.bytes_acked.fetch_add(item.end - item.begin, std::memory_order_relaxed);
  cs.last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  table_->WakeWaiters();
  return ItemStatus::kOk;
}

ItemStatus ClientLeases::GiveBack(const WorkItem& item) noexcept {
  LeaseEntry& ls = seg_->lease(item.lease);
  uint64_t expected = LeaseWord(kLeaseOpen, slot_, item.generation);
  // acquire: pairs with the CASes that may have moved the lease on
  // (ReturnToOrphan, ReassignHung); ReturnToOrphan's CAS below decides.
  if (ls.word.load(std::memory_order_acquire) != expected) return ItemStatus::kStale;
  CrashPoint("giveback.after_mark");
  if (!table_->ReturnToOrphan(ls, &expected)) return ItemStatus::kStale;
  me().items_given_back.fetch_add(1, std::memory_order_relaxed);
  table_->WakeWaiters();
  return ItemStatus::kOk;
}

void ClientLeases::ReturnAll() noexcept {
  for (uint64_t l = 0; l < table_->num_leases(); ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // acquire: pairs with the CASes that may have moved our leases on
    // (ReassignHung, recoverers); ReturnToOrphan's CAS decides.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseOpen || LeaseOwnerOf(w) != slot_) continue;
    if (table_->ReturnToOrphan(ls, &w)) {
      me().items_given_back.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

ItemStatus ClientLeases::Commit(const WorkItem& item, uint64_t offset) noexcept {
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  ItemStatus s = RecordCommit(seg_->lease(item.lease), ours, offset, options_.record_bytes);
  if (s == ItemStatus::kOk) me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return s;
}

ItemStatus ClientLeases::Progress(const WorkItem& item, uint64_t offset,
                                  uint64_t records) noexcept {
  const uint64_t ours = LeaseWord(kLeaseOpen, slot_, item.generation);
  ItemStatus s = RecordProgress(seg_->lease(item.lease), ours, offset, options_.record_bytes);
  if (s != ItemStatus::kOk) return s;
  if (records != 0) me().records.fetch_add(records, std::memory_order_relaxed);
  me().last_progress_ns.store(CoarseNs(), std::memory_order_relaxed);
  return ItemStatus::kOk;
}

}  // namespace tailcut::detail
