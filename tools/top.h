// tools/top.h: `tailcut top NAME`, a live view of one queue.
#ifndef TAILCUT_TOOLS_TOP_H_
#define TAILCUT_TOOLS_TOP_H_

#include <string>

namespace tailcut_cli {

// Shows queue NAME like top: epoch, done/in flight/remaining with a progress
// bar, per-client items/s and MB/s since the last frame, idle clients, the
// straggler flagged, clients that died with their items recovered. Refreshes
// every interval_s seconds until Ctrl-C or until the queue is removed; with
// `once`, prints one frame (rates over each client's lifetime) and returns.
// Throws tailcut::Error (e.g. kNotFound for an unknown queue).
int RunTop(const std::string& name, bool once, double interval_s);

}  // namespace tailcut_cli

#endif  // TAILCUT_TOOLS_TOP_H_
