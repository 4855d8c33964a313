#include "engine/local_feed.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>

#include "engine/futex.h"
#include "engine/robust_mutex.h"

namespace tailcut::detail {

LocalFeed::Lead LocalFeed::TryLead() noexcept {
  pthread_mutex_t* mu = &seg_->header().feeder_mutex;
  int rc = TryLockRobust(mu);
  if (rc == 0) return Lead::kLeading;
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu);  // the table says what the dead feeder held
    return Lead::kTookOver;
  }
  return Lead::kFollowing;
}

void LocalFeed::Resign() noexcept { pthread_mutex_unlock(&seg_->header().feeder_mutex); }

std::vector<FedBlockInfo> LocalFeed::Blocks(std::vector<std::vector<uint64_t>>* tickets) noexcept {
  std::vector<FedBlockInfo> blocks;
  for (uint32_t i = 0; i < kFedBlocks; ++i) {
    FedBlock& e = seg_->fed_block(i);
    // acquire: pairs with Grant's release stores of first_plus1 and applied; the other fields were
    // written before them.
    uint64_t first_plus1 = e.first_plus1.load(std::memory_order_acquire);
    if (first_plus1 == 0) continue;
    FedBlockInfo b{first_plus1 - 1, e.last.load(std::memory_order_relaxed),
                   e.generation.load(std::memory_order_relaxed)};
    bool applied = e.applied.load(std::memory_order_acquire) == 1;
    // Never trust the segment: a block must lie inside the job.
    if (!applied || b.first >= b.last || b.last > table_->total()) {
      e.applied.store(0, std::memory_order_relaxed);
      e.first_plus1.store(0, std::memory_order_release);
      continue;
    }
    blocks.push_back(b);
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const FedBlockInfo& a, const FedBlockInfo& b) { return a.first < b.first; });
  if (tickets != nullptr) {
    tickets->clear();
    for (const FedBlockInfo& b : blocks) {
      std::vector<uint64_t> mine;
      for (uint64_t t = b.first; t < b.last; ++t)
        if (!seg_->IsSkipped(t)) mine.push_back(t);
      tickets->push_back(std::move(mine));
    }
  }
  return blocks;
}

void LocalFeed::SetSkip(uint64_t ticket, bool skip) noexcept {
  // A ticket done here is never another host's: it needs no skip bit, and
  // the open pieces of a queue restored from an exact checkpoint
  // (FedRestoreState) carry done bits but no grant, in blocks the tier may
  // hand out again for their other tickets. Skipped, they would be completed
  // unread (ClaimOrphan).
  if (skip && seg_->IsDone(ticket)) return;
  uint64_t bit = uint64_t{1} << (ticket % 64);
  // seq_cst: pairs with the seq_cst load in Segment::IsSkipped and the seq_cst cursor load in
  // Grant (see there).
  if (skip)
    seg_->skip_word(ticket / 64).fetch_or(bit, std::memory_order_seq_cst);
  else
    seg_->skip_word(ticket / 64).fetch_and(~bit, std::memory_order_seq_cst);
}

void LocalFeed::RaiseLimit(uint64_t to) noexcept {
  Cursor& cursor = seg_->cursor();
  // relaxed: only the feeder writes the limit.
  uint64_t from = cursor.limit.load(std::memory_order_relaxed);
  if (to <= from) return;
  // Tickets nobody granted us in between belong to other hosts.
  std::vector<std::pair<uint64_t, uint64_t>> ours;
  for (uint32_t i = 0; i < kFedBlocks; ++i) {
    // relaxed: entries are written by this thread alone (we hold the feeder mutex).
    uint64_t first_plus1 = seg_->fed_block(i).first_plus1.load(std::memory_order_relaxed);
    if (first_plus1 != 0)
      ours.emplace_back(first_plus1 - 1, seg_->fed_block(i).last.load(std::memory_order_relaxed));
  }
  auto covered = [&](uint64_t t) {
    for (const auto& [first, last] : ours)
      if (t >= first && t < last) return true;
    return false;
  };
  for (uint64_t t = from; t < to; ++t)
    if (!covered(t)) SetSkip(t, true);
  // release: pairs with TakeOnce's acquire load of the limit: the skip bits above are seen by a
  // taker that sees the new limit.
  cursor.limit.store(to, std::memory_order_release);
  // A cursor standing at the old limit need not walk the skipped run one
  // ticket at a time: step it to the first ticket that is ours. The tickets
  // it passes are skipped, so no sweep takes them for lost.
  uint64_t next = from;
  while (next < to && seg_->IsSkipped(next)) ++next;
  uint64_t expected = from;
  // acq_rel: as a taker's fetch_add on the cursor (I1); fails harmlessly if a taker moved it.
  if (next > from)
    cursor.next_ticket.compare_exchange_strong(expected, next, std::memory_order_acq_rel);
}

bool LocalFeed::Grant(const FedBlockInfo& block, std::span<const uint64_t> tickets) noexcept {
  if (block.first >= block.last || block.last > table_->total()) return false;
  for (uint64_t t : tickets)
    if (t < block.first || t >= block.last) return false;
  // 1. Record the block (or find it again, for a repeated grant).
  FedBlock* entry = nullptr;
  for (uint32_t i = 0; i < kFedBlocks && entry == nullptr; ++i) {
    // relaxed: only this thread writes the table.
    uint64_t first_plus1 = seg_->fed_block(i).first_plus1.load(std::memory_order_relaxed);
    if (first_plus1 == block.first + 1) entry = &seg_->fed_block(i);
  }
  for (uint32_t i = 0; i < kFedBlocks && entry == nullptr; ++i)
    if (seg_->fed_block(i).first_plus1.load(std::memory_order_relaxed) == 0)
      entry = &seg_->fed_block(i);
  if (entry == nullptr) return false;
  entry->applied.store(0, std::memory_order_relaxed);
  entry->last.store(block.last, std::memory_order_relaxed);
  entry->generation.store(block.generation, std::memory_order_relaxed);
  // release: pairs with Blocks()'s acquire load in a successor feeder.
  entry->first_plus1.store(block.first + 1, std::memory_order_release);

  // 2. The block's tickets: ours, unless done on another host already.
  bool below_cursor = false;
  // seq_cst: with the seq_cst skip-bit changes below and a taker's seq_cst CAS of the cursor and
  // load of the bit (NextFedTicket, Segment::IsSkipped), one total order: a taker passing a
  // ticket we give back either sees it given back, or we see it passed and have it swept.
  for (uint64_t t = block.first; t < block.last; ++t)
    SetSkip(t, !std::binary_search(tickets.begin(), tickets.end(), t));
  uint64_t cursor = seg_->cursor().next_ticket.load(std::memory_order_seq_cst);
  for (uint64_t t : tickets) below_cursor |= t < cursor;

  // 3. Beyond the limit: hand the block out through the cursor.
  RaiseLimit(block.last);
  // release: pairs with Blocks()'s acquire load: the bits above are in place.
  entry->applied.store(1, std::memory_order_release);

  // 4. Tickets the cursor already passed (a block re-owned from a dead host):
  // the sweep for lost tickets re-issues those that are not done and not held.
  if (below_cursor)
    // acq_rel: pairs with TrySweep's acquire load of sweeps_pending; the bits cleared above are
    // seen by its bitmap reads.
    seg_->counters().sweeps_pending.fetch_add(1, std::memory_order_acq_rel);
  table_->WakeWaiters();
  return true;
}

std::vector<uint64_t> LocalFeed::Finished(std::span<const uint64_t> tickets) const noexcept {
  // Leases before bits: an ack sets its bit before it frees its lease, so a
  // ticket seen neither held nor done is not finished yet, and one seen done
  // and not held is finished for good (a done ticket is never handed out).
  std::vector<uint64_t> held = table_->HeldTickets();
  std::vector<uint64_t> finished;
  for (uint64_t t : tickets) {
    if (t >= table_->total() || !seg_->IsDone(t)) continue;
    if (!std::binary_search(held.begin(), held.end(), t)) finished.push_back(t);
  }
  return finished;
}

uint64_t LocalFeed::Untaken(std::span<const uint64_t> tickets) const noexcept {
  // acquire: pairs with the takers' RMWs of the cursor; a count only.
  uint64_t cursor = seg_->cursor().next_ticket.load(std::memory_order_acquire);
  uint64_t n = 0;
  for (uint64_t t : tickets) n += t >= cursor;
  return n;
}

void LocalFeed::Forget(uint64_t first) noexcept {
  for (uint32_t i = 0; i < kFedBlocks; ++i) {
    FedBlock& e = seg_->fed_block(i);
    if (e.first_plus1.load(std::memory_order_relaxed) != first + 1) continue;
    e.applied.store(0, std::memory_order_relaxed);
    // release: pairs with Blocks()'s acquire load.
    e.first_plus1.store(0, std::memory_order_release);
  }
}

int LocalFeed::Drop(const FedBlockInfo& block, std::span<const uint64_t> tickets) noexcept {
  Forget(block.first);
  std::vector<uint64_t> finished = Finished(tickets);
  for (uint64_t t : tickets)
    if (!std::binary_search(finished.begin(), finished.end(), t)) SetSkip(t, true);
  // Take back the leases open on them: their owners' acks are refused, and
  // whoever claims the orphan sees the skip bit and completes it unread.
  int taken = 0;
  for (uint64_t l = 0; l < table_->num_leases(); ++l) {
    LeaseEntry& ls = seg_->lease(l);
    // acquire: pairs with the owner's CASes on the word, so the ticket read next is its own.
    uint64_t w = ls.word.load(std::memory_order_acquire);
    if (LeaseStateOf(w) != kLeaseOpen) continue;
    // relaxed: written before the OPEN CAS that the acquire load above read; the CAS in
    // ReturnToOrphan fails if the lease moved on meanwhile.
    uint64_t t = ls.ticket.load(std::memory_order_relaxed);
    if (t < block.first || t >= block.last || !seg_->IsSkipped(t)) continue;
    if (table_->ReturnToOrphan(ls, &w)) ++taken;
  }
  if (taken > 0) table_->WakeWaiters();
  return taken;
}

void LocalFeed::Drained() noexcept { RaiseLimit(table_->total()); }

void LocalFeed::End() noexcept {
  RaiseLimit(table_->total());
  // release: pairs with AllDone's acquire load of fed_end: the skip bits set by RaiseLimit are
  // seen there.
  seg_->counters().fed_end.store(1, std::memory_order_release);
  table_->WakeWaiters();
}

bool LocalFeed::ended() const noexcept {
  // acquire: pairs with End's release store.
  return seg_->counters().fed_end.load(std::memory_order_acquire) == 1;
}

void LocalFeed::Lose(uint32_t reason) noexcept {
  uint32_t expected = 0;
  // seq_cst: pairs with the seq_cst load in lost(), which every round of a taker's loop makes
  // (WorkQueue::Impl::Take); WakeWaiters below wakes those asleep, and one that went to sleep
  // just before it looks again within its futex slice (50 ms). A CAS from 0: a job that ended
  // (1) stays ended, and the first reason stays.
  seg_->counters().fed_end.compare_exchange_strong(expected, kFedLost | (reason & 0xff),
                                                   std::memory_order_seq_cst);
  table_->WakeWaiters();
}

bool LocalFeed::BindRun(uint64_t run) noexcept {
  std::atomic_ref<uint64_t> bound(seg_->header().restore_hash);
  uint64_t expected = 0;
  // seq_cst: processes of a host starting at once agree on one run.
  return bound.compare_exchange_strong(expected, run, std::memory_order_seq_cst) || expected == run;
}

uint32_t LocalFeed::lost() const noexcept {
  // seq_cst: pairs with Lose's CAS.
  uint32_t state = seg_->counters().fed_end.load(std::memory_order_seq_cst);
  return (state & kFedLost) != 0 ? state & 0xff : 0;
}

uint32_t LocalFeed::DemandSeq() const noexcept {
  // seq_cst: pairs with the takers' seq_cst bump (WorkQueue::Impl::Take) and WakeFeeder.
  return seg_->counters().feed_wanted.load(std::memory_order_seq_cst);
}

void LocalFeed::WaitForDemand(uint32_t seq, uint64_t timeout_ns) const noexcept {
  FutexWait(seg_->counters().feed_wanted, seq, timeout_ns);
}

void LocalFeed::WakeFeeder() noexcept {
  // seq_cst: as the takers' bump; the wait above compares the word with what DemandSeq read.
  seg_->counters().feed_wanted.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(seg_->counters().feed_wanted, INT_MAX);
}

}  // namespace tailcut::detail
