// tools/top.h: `tailcut top`, a live view of one queue and its batch ring.
#ifndef TAILCUT_TOOLS_TOP_H_
#define TAILCUT_TOOLS_TOP_H_

#include <string>

#include "tailcut/batch_ring.h"

namespace tailcut_cli {

struct TopOptions {
  // The queue (may be empty when `ring` is given): epoch, done/in flight/
  // remaining with a progress bar, per-client items/s and MB/s, idle
  // clients, the straggler flagged, dead clients with their items recovered.
  std::string queue;
  // The batch ring of pooled loaders to show below it. Empty: the ring of
  // the queue's PooledLoader, "<queue>.pool", when there is one. Named, it
  // must exist when top starts.
  std::string ring;
  // One frame (rates over each client's lifetime), then return.
  bool once = false;
  double interval_s = 1.0;
  // Each frame as one line of JSON (the numbers of the text frame: queue,
  // clients with their role and rates, ring, verdict) instead of text.
  bool json = false;
};

// Refreshes every interval_s seconds until Ctrl-C or until what it shows is
// removed (the queue; the ring when no queue is shown). Rates are the change
// since the last frame. Throws tailcut::Error (e.g. kNotFound for an unknown
// queue or a named ring that does not exist).
int RunTop(const TopOptions& options);

// The ring's state line, shared with `tailcut ring`: "closed", "STARVING:
// ..." when live trainers find no batch ready, "full: ..." when loaders wait
// for free slots, else "flowing".
std::string RingStateText(const tailcut::BatchRingStats& stats);

// Ring name of a queue's PooledLoader: "<queue>.pool".
std::string DefaultRingName(const std::string& queue);

}  // namespace tailcut_cli

#endif  // TAILCUT_TOOLS_TOP_H_
