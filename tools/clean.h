// tools/clean.h: `tailcut clean`, and what `tailcut ls` says a rerun does
// with a queue kept in /dev/shm.
#ifndef TAILCUT_TOOLS_CLEAN_H_
#define TAILCUT_TOOLS_CLEAN_H_

#include <iosfwd>
#include <string>

#include "tailcut/work_queue.h"

namespace tailcut_cli {

// The KEPT column of `tailcut ls`: the engine's reason, except for a queue
// named by tailcut.torch after a torchrun attempt above 0
// ('torchrun-<job>-<n>', n > 0) that a dead process left: a rerun of the job
// starts at attempt 0 and removes it, so it is not resumed.
std::string KeptText(const tailcut::QueueListing& listing);

// `tailcut clean [PREFIX] [--dry-run]`: removes what dead jobs of this user
// left in
// /dev/shm (only names that start with PREFIX, if not empty): queues no live
// process uses, batch rings no live process uses
// (under the same per-ring lock a PooledLoader takes to open one, so never a
// ring a job is making), and pool descriptions, failure records and status
// files (and their temporary files) whose ring is gone. Never touches a queue or ring with a live
// process. Prints one line per object and a summary to `out`; returns the exit status.
int RunClean(const std::string& prefix, bool dry_run, std::ostream& out);

}  // namespace tailcut_cli

#endif  // TAILCUT_TOOLS_CLEAN_H_
