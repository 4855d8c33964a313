#include "engine/handle_checks.h"

#include <cstdio>
#include <cstdlib>

namespace tailcut::detail {

ItemStatus HandleChecks::Check(const WorkItem& item, bool closed) const noexcept {
  if (owner_.forked()) return ItemStatus::kForked;
  if (closed) return ItemStatus::kClosed;
  if (!finished_.Valid(item.lease) || item.generation == 0) return ItemStatus::kInvalid;
  if (finished_.Finished(item.lease, item.generation)) return ItemStatus::kAlreadyDone;
  return ItemStatus::kOk;
}

ItemStatus HandleChecks::Explain(const WorkItem& item, ItemStatus status, bool finishes,
                                 bool reassignable) noexcept {
  if (status == ItemStatus::kOk && finishes) finished_.Record(item.lease, item.generation);
  if (status == ItemStatus::kStale && !reassignable) return ItemStatus::kAlreadyDone;
  return status;
}

void HandleChecks::CheckNoDependents(const std::string& queue) const noexcept {
  // relaxed: see AddDependent.
  const int n = dependents_.load(std::memory_order_relaxed);
  if (n == 0) return;
  // A Reader left with a dangling queue would crash later, somewhere else.
  std::fprintf(stderr,
               "tailcut: queue '%s' destroyed while %d Reader(s) still use it; destroy every "
               "Reader (and Shuffler) of a WorkQueue before the WorkQueue\n",
               queue.c_str(), n);
  std::abort();
}

}  // namespace tailcut::detail
