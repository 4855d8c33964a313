// The feeder side of a fed queue: how the cross-host tier (global/) puts
// tickets into one host's shared-memory queue and learns which were finished.
//
// A fed queue hands out only what its feeder granted. The cursor still walks
// the job's tickets in order, but only below Cursor::limit, and it passes
// tickets whose skip bit is set: tickets of blocks another host holds, or
// finished, or that were taken from this host (fencing). A block this host
// re-owns after another host died may lie below the cursor: its tickets lose
// their skip bits and the sweep for lost tickets (I3) re-issues them.
//
// Contract
//  * One feeder per host: TryLead trylocks the segment's robust feeder
//    mutex; the thread that got it calls everything else and Resign. When a
//    feeder dies its successor gets kTookOver and continues from Blocks().
//  * Grant, Drop, Forget, Drained and End are the feeder's alone; Finished and
//    Untaken only read. None allocates on a hot path of the queue: they run
//    on the feeder's own thread, a few times a second.
//  * Ordering: Grant sets skip bits, then raises the limit (release; TakeOnce
//    acquires it). Bits given back below the cursor are seq_cst on both sides
//    (see Segment::IsSkipped), then sweeps_pending is bumped (acq_rel).
//  * The feed's state (Counters::fed_end): 0 feeding, 1 the end (End),
//    kFedLost | reason: the job is lost (Lose). Only the feeder writes it.
//    The queue belongs to one run of the tier's job (BindRun), so a loss
//    recorded in it is the loss of every process that uses it.
#ifndef TAILCUT_ENGINE_LOCAL_FEED_H_
#define TAILCUT_ENGINE_LOCAL_FEED_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/lease.h"
#include "engine/segment.h"
#include "tailcut/export.h"

namespace tailcut::detail {

// A block as the feeder's table in the segment records it.
struct FedBlockInfo {
  uint64_t first = 0;  // tickets [first, last)
  uint64_t last = 0;
  uint64_t generation = 0;  // the tier's fencing token
};

// Counters::fed_end of a lost job: this bit, or'ed with the reason.
inline constexpr uint32_t kFedLost = 0x100;

class TAILCUT_EXPORT LocalFeed {
 public:
  LocalFeed(Segment* segment, LeaseTable* table) : seg_(segment), table_(table) {}

  enum class Lead { kFollowing, kLeading, kTookOver };
  // Tries to become the host's feeder. kTookOver: the previous one died.
  Lead TryLead() noexcept;
  // Stops feeding (the calling thread must be the one that leads).
  void Resign() noexcept;

  // The blocks a feeder recorded and applied, ascending; each with its
  // tickets (those of [first, last) not skipped). Entries that fail a bounds
  // check, or were never applied, are freed: their blocks expire in the tier.
  std::vector<FedBlockInfo> Blocks(std::vector<std::vector<uint64_t>>* tickets) noexcept;
  // Records the block and makes `tickets` (ascending, inside the block: all
  // of it for a new block, those not done elsewhere for a re-owned one) this
  // host's to hand out; the rest of the block, and tickets below it that no
  // grant covered, are skipped. Idempotent. False: the table is full (Forget
  // finished blocks first) or the block is out of range; nothing changed.
  bool Grant(const FedBlockInfo& block, std::span<const uint64_t> tickets) noexcept;
  // Of `tickets`, those finished here: done bit set and no lease holds them.
  std::vector<uint64_t> Finished(std::span<const uint64_t> tickets) const noexcept;
  // Of `tickets`, how many the cursor has not reached yet.
  uint64_t Untaken(std::span<const uint64_t> tickets) const noexcept;
  // Frees the block's table entry (every ticket acked in the tier).
  void Forget(uint64_t first) noexcept;
  // The block was taken from this host (fencing): its tickets not finished
  // are skipped, leases open on them are handed back (their holders' acks are
  // refused, kStale) and then completed without being read; its entry is
  // freed. Returns how many leases it took back.
  int Drop(const FedBlockInfo& block, std::span<const uint64_t> tickets) noexcept;
  // The tier has handed out every block once (its cursor is at the end;
  // only a block that expires can still come): the tickets no grant covers
  // are other hosts' and are skipped, so that this host's settled prefix
  // (WorkQueue::SettledTickets) passes the epochs it finished before the
  // other hosts finish theirs. A block re-owned later lies below the cursor:
  // Grant gives its tickets back and has them swept. Idempotent.
  void Drained() noexcept;
  // Every ticket of the job is done on some host: the rest is skipped and
  // Take returns kEnd here once the local leases are settled.
  void End() noexcept;
  bool ended() const noexcept;
  // The job's state in the tier is lost for good; `reason` (1..255) is the
  // feeder's code for what was lost (Feeder::LossMessage words it). From now
  // on Take returns kJobLost in every process of the host, and takers asleep
  // are woken (at the latest after their futex slice). The first reason stays.
  void Lose(uint32_t reason) noexcept;
  // 0, or the reason Lose recorded.
  uint32_t lost() const noexcept;
  // Binds the host's queue to this process's run of the job (`run`: a hash
  // of the tier's run id, not 0), before the first Take: the first process
  // records it. False if the queue was fed by another run (a segment kept
  // after a crash and resumed, or processes of that run still here): its
  // done and skipped tickets are not this run's, and using them would skip
  // items this run never read.
  bool BindRun(uint64_t run) noexcept;
  // The feeder's sleep between rounds: returns after timeout_ns, or once a
  // taker ran dry (or WakeFeeder was called) since DemandSeq() returned seq.
  uint32_t DemandSeq() const noexcept;
  void WaitForDemand(uint32_t seq, uint64_t timeout_ns) const noexcept;
  // Wakes a feeder in WaitForDemand (any process's: it looks and sleeps again).
  void WakeFeeder() noexcept;
  // The job's tickets (num_items * num_epochs).
  uint64_t total() const noexcept { return table_->total(); }

 private:
  void SetSkip(uint64_t ticket, bool skip) noexcept;
  // Raises the limit to `to`, skipping tickets in [limit, to) that no
  // recorded block covers; steps the cursor over them if it stood at the old
  // limit.
  void RaiseLimit(uint64_t to) noexcept;

  Segment* seg_;
  LeaseTable* table_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_LOCAL_FEED_H_
