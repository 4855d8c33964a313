// The process-local side of a WorkQueue handle: whose it is (fork), which
// items this process finished (a second ack), which objects depend on it
// (Readers), and the token its items' paths carry (tailcut/item_path.h).
// work_queue.cc's public calls ask it before and after each call; none of it
// is in shared memory.
#ifndef TAILCUT_ENGINE_HANDLE_CHECKS_H_
#define TAILCUT_ENGINE_HANDLE_CHECKS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "engine/finished_leases.h"
#include "engine/item_path_token.h"
#include "engine/process_owner.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

class HandleChecks {
 public:
  const ProcessOwner& owner() const noexcept { return owner_; }
  // Once the queue's lease table is known (its number of lease slots).
  void Reset(uint64_t num_leases) { finished_.Reset(num_leases); }

  // kForked or kClosed into *status when the handle refuses every call.
  template <typename Status>
  bool Refused(bool closed, Status* status) const noexcept {
    const bool forked = owner_.forked();
    *status = forked ? Status::kForked : Status::kClosed;
    return forked || closed;
  }
  // kOk, or why a call about `item` is refused before it reaches the lease.
  ItemStatus Check(const WorkItem& item, bool closed) const noexcept;
  // What an item call returned, told apart: a refusal of an item this
  // process finished itself is kAlreadyDone, not kStale. `finishes`: an Ack
  // or GiveBack, remembered when it succeeds. `reassignable`: the queue has
  // a lease timeout or this process a stop timeout (without either nothing
  // takes a live process's item away).
  ItemStatus Explain(const WorkItem& item, ItemStatus status, bool finishes,
                     bool reassignable) noexcept;

  // WorkQueue::Dependent objects alive.
  void AddDependent(int delta) noexcept {
    // relaxed: a count read only by CheckNoDependents, which the caller
    // orders after every Dependent's destruction or breaks the contract.
    dependents_.fetch_add(delta, std::memory_order_relaxed);
  }
  // Aborts the process with a message naming `queue` while one lives.
  void CheckNoDependents(const std::string& queue) const noexcept;

  // What WorkItem::path carries: its debug check fails once this handle, and
  // the queue's table of paths with it, is destroyed.
  uint32_t path_token() const noexcept { return path_token_.value(); }

 private:
  ProcessOwner owner_;
  FinishedLeases finished_;
  std::atomic<int> dependents_{0};
  ItemPathToken path_token_;
};

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_HANDLE_CHECKS_H_
