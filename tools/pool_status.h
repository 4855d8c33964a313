// tools/pool_status.h: the pool status part of `tailcut top`: why a pool
// has the loaders it has (autoscale decisions) and each rank's share of the
// global batch (balance), as the pool's local rank 0 publishes them
// (bindings/python/tailcut/pool/_status.py writes the file).
#ifndef TAILCUT_TOOLS_POOL_STATUS_H_
#define TAILCUT_TOOLS_POOL_STATUS_H_

#include <string>

namespace tailcut_cli {

// /dev/shm/tailcut-pool.<euid>.<ring>.status
std::string PoolStatusPath(const std::string& ring);

// The lines `tailcut top` shows under the ring `ring`:
//   autoscale 3 loaders (min 1, max 8): last +2 at 12:00:01, <why>
//     earlier: -1 at 11:59:40 (4 -> 3), <why>
//   shares  r0 40  r1 40  r2 32  r3 16 records/step (speeds ..., decided at step 16, 12:00:03)
// preceded by an empty line; "" when there is no status file or it holds
// neither part. The file is never trusted: one that is not this user's
// private regular file, is larger than a status can be, is not JSON, or
// lacks a field gives one line saying it is unreadable and why. Times are
// local. Never throws.
std::string PoolStatusPart(const std::string& ring);

}  // namespace tailcut_cli

#endif  // TAILCUT_TOOLS_POOL_STATUS_H_
