// The Lua scripts of the global tier; each operation is one script, run
// atomically by Redis. Key layout and contracts: docs/global.md.
#ifndef TAILCUT_GLOBAL_SCRIPTS_H_
#define TAILCUT_GLOBAL_SCRIPTS_H_

#include <string>
#include <vector>

#include "global/redis_connection.h"

namespace tailcut::detail {

// Every script gets the job's keys in this order (one hash tag, so they share
// a cluster slot).
enum JobKey { kConfig, kCursor, kDone, kDeadline, kOwner, kGeneration, kLeft, kHosts, kNumJobKeys };
std::vector<std::string> JobKeys(const std::string& job_name);

extern const Script kCreateScript;  // ARGV: items epochs block seed files [cursor bitmap]
extern const Script kClaimScript;   // ARGV: host ttl_ms
extern const Script kRenewScript;   // ARGV: host first generation ttl_ms
extern const Script kAckScript;     // ARGV: host first generation ticket...
extern const Script kStatsScript;   // ARGV: none
extern const Script kSaveScript;    // ARGV: none

}  // namespace tailcut::detail

#endif  // TAILCUT_GLOBAL_SCRIPTS_H_
