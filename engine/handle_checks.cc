#include "engine/handle_checks.h"

#include <cstdio>
#include <cstdlib>

namespace tailcut::detail {

AckStatus HandleChecks::Check(const WorkItem& item, bool closed) const noexcept {
  if (owner_.forked()) return AckStatus::kForked;
  if (closed) return AckStatus::kClosed;
  if (!finished_.Valid(item.lease) || item.generation == 0) return AckStatus::kInvalid;
  if (finished_.Finished(item.lease, item.generation)) return AckStatus::kAlreadyDone;
  return AckStatus::kOk;
}

AckStatus HandleChecks::Explain(const WorkItem& item, AckStatus status, bool finishes,
                                bool reassignable) noexcept {
  if (status == AckStatus::kOk && finishes) finished_.Record(item.lease, item.generation);
  if (status == AckStatus::kStale && !reassignable) return AckStatus::kAlreadyDone;
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
