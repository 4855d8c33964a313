// tools/global_top.h: `tailcut top --coordinator URL NAME`, a live view of
// one job across hosts as its coordinator (Redis) sees it.
#ifndef TAILCUT_TOOLS_GLOBAL_TOP_H_
#define TAILCUT_TOOLS_GLOBAL_TOP_H_

#include <string>

namespace tailcut_cli {

// Refreshes every interval_s seconds until Ctrl-C or until every ticket of
// the job is done: the job's progress, then one row per host with blocks
// claimed and re-owned, tickets acked (and per second since the last frame),
// refused stale calls, open blocks and the soonest deadline. Throws
// tailcut::Error (kIo: Redis unreachable; kCorrupt: no such job there).
int RunGlobalTop(const std::string& coordinator, const std::string& job, bool once,
                 double interval_s);

}  // namespace tailcut_cli

#endif  // TAILCUT_TOOLS_GLOBAL_TOP_H_
