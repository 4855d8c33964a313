// Housekeeping of a queue that many processes share: what any of them (a
// WorkQueue or a tool) does to keep it whole and to read it — find and
// recover dead clients, repair leases no client can finish, reassign the
// items of hung ones, sweep lost tickets, decide the end of the data, and
// read the statistics. The lease transitions it makes are lease.h's.
//
// Thread- and process-safe: every method works on shared state with atomics
// or under the segment's robust mutexes. Not copyable; borrows the
// LeaseTable (and through it the Segment).
#ifndef TAILCUT_ENGINE_HOUSEKEEPER_H_
#define TAILCUT_ENGINE_HOUSEKEEPER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/lease.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

class Housekeeper {
 public:
  explicit Housekeeper(LeaseTable* table)
      : table_(table),
        seg_(&table->segment()),
        total_(table->total()),
        num_leases_(table->num_leases()) {}
  Housekeeper(const Housekeeper&) = delete;
  Housekeeper& operator=(const Housekeeper&) = delete;

  // Trylocks the life mutex of every active client other than `self` (may
  // be kNoOwner); recovers each dead one. Returns how many it recovered.
  // admin_held: the caller holds the admin mutex (recovery needs it).
  int CheckClients(uint64_t self, bool admin_held = false) noexcept;
  // Reassigns open items of live clients (other than self) whose last
  // progress is older than timeout_ns (the queue's lease timeout; 0: never),
  // or whose heartbeat is older than their own stop timeout (a stopped
  // process, WorkQueueOptions::stop_timeout). Returns how many.
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
  // WorkQueue::SettledTickets: the first ticket at or above `from` that is
  // neither done nor (fed) skipped, or that a lease holds (a piece of a done
  // ticket still out), and below the cursor's limit; the limit (or `from`,
  // if above it) when there is none.
  uint64_t SettledPrefix(uint64_t from) const noexcept;
  // Number of live clients other than self, after recovering dead ones.
  int LiveClients(uint64_t self, bool admin_held = false) noexcept;
  // Pids of live clients other than self.
  std::vector<int> LivePids(uint64_t self) noexcept;

  QueueStats Stats(const std::string& name) noexcept;

 private:
  // The lowest ticket at or above `from` an OPEN or ORPHAN lease holds; UINT64_MAX if none.
  uint64_t LowestHeldTicket(uint64_t from) const noexcept;
  // The first ticket in [from, limit) whose done (or, fed, skip) bit is clear; else max(from,
  // limit).
  uint64_t SettledBits(uint64_t from, uint64_t limit) const noexcept;
  void RecoverClient(uint64_t slot, bool admin_held) noexcept;
  std::vector<int> LivePidsImpl(uint64_t self, bool admin_held) noexcept;

  LeaseTable* table_;
  Segment* seg_;
  uint64_t total_;
  uint64_t num_leases_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_HOUSEKEEPER_H_
