// The words for a job the coordinator lost (GlobalLoss): one text per loss,
// shared by the tier's errors and every process of a host that learns of the
// loss through its queue (host_feeder.cc).
#include <string>

#include "tailcut/global_tier.h"

namespace tailcut {

std::string GlobalLossMessage(GlobalLoss loss, std::string_view job, std::string_view coordinator) {
  const std::string j(job), c(coordinator);
  const std::string restart = "; restart the job from a checkpoint (restore_state), ";
  auto part = [&](const std::string& what) {
    return "the coordinator " + c + " lost part of job '" + j + "' (" + what +
           ": deleted, or evicted under maxmemory)" + restart +
           "and set maxmemory-policy noeviction on that Redis";
  };
  switch (loss) {
    case GlobalLoss::kNone:
      return "";
    case GlobalLoss::kGone:
      return "the coordinator " + c + " lost job '" + j +
             "' (its keys are gone: Redis restarted without persistence, or they were deleted)" +
             restart +
             "and enable appendonly on that Redis; to start it over from the beginning "
             "instead, delete the key tailcut:{" +
             j + "}:lost there";
    case GlobalLoss::kReplaced:
      return "job '" + j + "' on the coordinator " + c +
             " is another run now (its keys were deleted and the job created again, e.g. "
             "restarted from a checkpoint under the same name): this process belongs to the run "
             "before and must stop";
    case GlobalLoss::kCursor:
      return part("its cursor key is gone");
    case GlobalLoss::kDoneMarks:
      return part("its done marks are gone");
    case GlobalLoss::kGenerations:
      return part("the generations of its blocks are gone");
    case GlobalLoss::kOpenBlocks:
      return part(
          "its open blocks are gone: every block was handed out and none is open, but not every "
          "ticket is done");
  }
  return "";
}

}  // namespace tailcut
