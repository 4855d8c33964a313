#include "engine/housekeeper.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "engine/clock.h"
#include "engine/crash_point.h"
#include "engine/robust_mutex.h"

namespace tailcut::detail {

void Housekeeper::ReleaseSettledAnchors() noexcept {
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // acquire (word): pairs with FinishAck's release CAS to DONE_WAIT. acquire (extent): pairs with
    // TrySplit's split CAS (lease.cc) that set pending, so the thief's anchor and flags
    // stores, made before that CAS, are visible below.
    if (LeaseStateOf(ls.word.load(std::memory_order_acquire)) != kLeaseDoneWait) continue;
    Extent x = Extent::Of(ls.extent.load(std::memory_order_acquire));
    uint64_t thief = x.pending == 0 ? kNoOwner : x.pending - 1;
    // The pending thief must hold a TAKING or OPEN piece of this anchor;
    // otherwise the mark is left over from a crash that was settled.
    bool live_piece = false;
    if (thief < num_leases_) {
      LeaseEntry& ts = seg_->lease(thief);
      // acquire: pairs with the thief's CASes on its own word (ReserveLease, then TAKING to OPEN in
      // TrySplit). flags and anchor may be relaxed: the acquire of the anchor's extent above read
      // the thief's split CAS, which the thief made after storing them.
      uint64_t tw = ts.word.load(std::memory_order_acquire);
      live_piece = (LeaseStateOf(tw) == kLeaseTaking || LeaseStateOf(tw) == kLeaseOpen) &&
                   (ts.flags.load(std::memory_order_relaxed) & kLeasePiece) &&
                   ts.anchor.load(std::memory_order_relaxed) == l;
    }
    if (!live_piece) table_->SettleSplit(l, thief);
  }
}

void Housekeeper::RecoverClient(uint64_t slot, bool admin_held) noexcept {
  ClientEntry& cs = seg_->client(slot);
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
    table_->RecoverLease(l, w);
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
  table_->WakeWaiters();
}

int Housekeeper::RepairLeases(uint64_t self, bool admin_held, bool just_registered,
                              std::vector<std::string>* repaired) noexcept {
  static const char* const kStateNames[] = {"FREE",   "TAKING",    "OPEN",    "ORPHAN",
                                            "ACKING", "DONE_WAIT", "state 6", "state 7"};
  const uint64_t max_clients = seg_->geometry().max_clients;
  if (self >= max_clients) return 0;
  int count = 0;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
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
    if (!table_->TakeOver(l, &w, valid_state ? state : kLeaseTaking, self)) continue;
    table_->RecoverLease(l, w);
    ++count;
    if (repaired != nullptr)
      repaired->push_back("lease " + std::to_string(l) + " (" + kStateNames[state] +
                          ", owner slot " + std::to_string(owner) + ", ticket " +
                          (ticket == kNoTicket ? std::string("none") : std::to_string(ticket)) +
                          "): " + why);
  }
  if (count > 0) table_->WakeWaiters();
  return count;
}

int Housekeeper::CheckClients(uint64_t self, bool admin_held) noexcept {
  int recovered = 0;
  for (uint64_t s = 0; s < seg_->geometry().max_clients; ++s) {
    if (s == self) continue;
    ClientEntry& cs = seg_->client(s);
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

int Housekeeper::LiveClients(uint64_t self, bool admin_held) noexcept {
  return static_cast<int>(LivePidsImpl(self, admin_held).size());
}

std::vector<int> Housekeeper::LivePids(uint64_t self) noexcept { return LivePidsImpl(self, false); }

std::vector<int> Housekeeper::LivePidsImpl(uint64_t self, bool admin_held) noexcept {
  std::vector<int> live;
  for (uint64_t s = 0; s < seg_->geometry().max_clients; ++s) {
    if (s == self) continue;
    ClientEntry& cs = seg_->client(s);
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

int Housekeeper::ReassignHung(uint64_t self, uint64_t timeout_ns) noexcept {
  int reassigned = 0;
  uint64_t now = MonotonicNs();
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // acquire: pairs with the owner's CASes on the word (ReserveLease, TakeOnce, ClaimOrphan,
    // TrySplit), so an OPEN lease's fields are read after they were written.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    uint64_t state = LeaseStateOf(w);
    uint64_t owner = LeaseOwnerOf(w);
    if ((state != kLeaseOpen && state != kLeaseTaking) || owner == self ||
        owner >= seg_->geometry().max_clients)
      continue;
    ClientEntry& cs = seg_->client(owner);
    // relaxed, all three: time stamps and a setting published with the slot; a stale one only
    // moves the reassignment by one housekeeping round, and the CAS on the word decides.
    const uint64_t last = cs.last_progress_ns.load(std::memory_order_relaxed);
    const uint64_t stop = cs.stop_timeout_ns.load(std::memory_order_relaxed);
    const bool hung = timeout_ns > 0 && last + timeout_ns <= now;
    const bool stopped = stop > 0 && cs.heartbeat_ns.load(std::memory_order_relaxed) + stop <= now;
    if (!hung && !stopped) continue;
    if (state == kLeaseOpen) {
      if (table_->ReturnToOrphan(ls, &w)) {
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
      if (table_->ReassignTaking(l, w, ticket, self)) {
        // relaxed: statistics only.
        seg_->counters().recovered_items.fetch_add(1, std::memory_order_relaxed);
        ++reassigned;
      }
    }
  }
  if (reassigned > 0) table_->WakeWaiters();
  return reassigned;
}

void Housekeeper::TrySweep(uint64_t self) noexcept {
  Counters& c = seg_->counters();
  // acquire: pairs with the acq_rel increments in RecoverLease, AllDone and ClaimOrphan
  // (lease.cc).
  if (self == kNoOwner || c.sweeps_pending.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_t* mu = &seg_->header().sweep_mutex;
  int rc = TryLockRobust(mu);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu);  // a sweep is idempotent: just run it again
  } else if (rc != 0) {
    return;
  }
  // acquire (sweeps_pending): as above, now under sweep_mutex. acquire (cursor): pairs with the
  // release half of TakeOnce's fetch_add (lease.cc): every ticket below it had its TAKING
  // lease reserved before, so the scans below see that lease (I3).
  uint64_t pending = c.sweeps_pending.load(std::memory_order_acquire);
  uint64_t cursor = std::min(seg_->cursor().next_ticket.load(std::memory_order_acquire), total_);

  // A live taker between fetch_add and recording its ticket holds a ticket
  // below `cursor` that we cannot see yet: wait until none is in that window.
  uint64_t deadline = MonotonicNs() + 200'000'000;
  for (;;) {
    bool in_window = false;
    for (uint64_t l = 0; l < num_leases_ && !in_window; ++l) {
      LeaseEntry& ls = seg_->lease(l);
      // acquire (word): pairs with ReserveLease's CAS to TAKING. acquire (ticket): pairs with
      // TakeOnce's release store of the ticket (lease.cc).
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

  std::vector<uint64_t> held = table_->HeldTickets();

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
      bool issued = table_->Reissue(self, t);
      // relaxed: statistics only.
      if (issued) c.recovered_items.fetch_add(1, std::memory_order_relaxed);
      if (!issued) complete = false;  // no free lease now; sweep again later
    }
  }
  // acq_rel: after the re-issues above (each released by its CAS); pairs with the acquire loads of
  // sweeps_pending in TrySweep and AllDone.
  if (complete) c.sweeps_pending.fetch_sub(pending, std::memory_order_acq_rel);
  pthread_mutex_unlock(mu);
  table_->WakeWaiters();
}

bool Housekeeper::AllDone() noexcept {
  Counters& c = seg_->counters();
  // acquire: pairs with the release half of TakeOnce's fetch_add (lease.cc), so the leases
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

uint64_t Housekeeper::LowestHeldTicket(uint64_t from) const noexcept {
  uint64_t lowest = UINT64_MAX;
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // seq_cst (acquire would do), as in Stats: an OPEN or ORPHAN word read here makes its ticket,
    // written before the CAS that published the word, visible to the relaxed load below.
    const uint64_t state = LeaseStateOf(ls.word.load(std::memory_order_seq_cst));
    if (state != kLeaseOpen && state != kLeaseOrphan) continue;
    const uint64_t t = ls.ticket.load(std::memory_order_relaxed);
    if (t >= from && t < lowest) lowest = t;
  }
  return lowest;
}

uint64_t Housekeeper::SettledPrefix(uint64_t from) const noexcept {
  // A ticket's done bit is set while pieces of it may still be out: a split tail, and every
  // piece of a restored state (the restore sets the bit and publishes the piece as an orphan).
  // Those tickets are held, not settled. Leases are read before and after the bits: a piece out
  // when its ticket's bit was set is seen by one of the two reads unless it was acked meanwhile.
  const uint64_t held_before = LowestHeldTicket(from);
  // acquire: pairs with the feeder's release store of the limit (LocalFeed::RaiseLimit): the
  // skip bits it set below the new limit are seen below. On one host it is total_tickets.
  const uint64_t limit = std::min(seg_->cursor().limit.load(std::memory_order_acquire), total_);
  const uint64_t settled = std::min(SettledBits(from, limit), held_before);
  return std::min(settled, LowestHeldTicket(from));
}

uint64_t Housekeeper::SettledBits(uint64_t from, uint64_t limit) const noexcept {
  const bool fed = seg_->geometry().fed;
  for (uint64_t t = from; t < limit; t = (t / 64 + 1) * 64) {
    // acquire: pairs with FinishAck's acq_rel fetch_or of the done bit; a ticket seen done has
    // its item's records consumed (a pool's loader acks after it published them).
    uint64_t settled = seg_->done_word(t / 64).load(std::memory_order_acquire);
    // seq_cst: as Segment::IsSkipped.
    if (fed) settled |= seg_->skip_word(t / 64).load(std::memory_order_seq_cst);
    uint64_t open = ~settled >> (t % 64);
    if (open != 0) return std::min(limit, t + static_cast<uint64_t>(__builtin_ctzll(open)));
  }
  return std::max(from, limit);
}

QueueStats Housekeeper::Stats(const std::string& name) noexcept {
  QueueStats s;
  const Header& h = seg_->header();
  s.name = name;
  s.segment_path = seg_->path();
  s.num_items = table_->num_items();
  s.num_epochs = table_->num_epochs();
  // An index work is one file entry without a path (config.h), sized num_samples.
  if (seg_->geometry().num_files == 1 && seg_->file(0).path_length == 0)
    s.num_samples = seg_->file(0).size;
  s.total = total_;
  s.seed = table_->seed();
  s.shuffle = table_->shuffle();
  s.num_clients = h.num_clients;
  Counters& c = seg_->counters();
  // relaxed: statistics only; nothing is published through these counters.
  s.clients_joined = static_cast<uint32_t>(c.clients_joined.load(std::memory_order_relaxed));
  s.recovered_items = c.recovered_items.load(std::memory_order_relaxed);
  s.stale_acks = c.stale_acks.load(std::memory_order_relaxed);
  s.splits = c.splits.load(std::memory_order_relaxed);
  // acquire: pairs with TakeOnce's fetch_add (lease.cc); only a count here.
  uint64_t cursor = std::min(seg_->cursor().next_ticket.load(std::memory_order_acquire), total_);
  s.handed_out = cursor;
  s.epoch = cursor / table_->num_items();
  // Leases before bits (as SaveState): an ack sets its bit before freeing
  // its lease, so a ticket acked meanwhile is counted now or next time,
  // and the count never goes backwards.
  std::vector<uint64_t> open_by_client(seg_->geometry().max_clients, 0);
  std::vector<uint64_t> held;  // tickets of leases still out
  for (uint64_t l = 0; l < num_leases_; ++l) {
    LeaseEntry& ls = seg_->lease(l);
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
    ClientEntry& cs = seg_->client(i);
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

}  // namespace tailcut::detail
