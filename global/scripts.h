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
enum JobKey {
  kConfig,
  kCursor,
  kDone,
  kDeadline,
  kOwner,
  kGeneration,
  kLeft,
  kHosts,
  kLost,  // the run id of a job lost while hosts ran it (see job() in scripts.cc)
  kNumJobKeys
};
std::vector<std::string> JobKeys(const std::string& job_name);

// Every script but create takes the run id the caller joined as ARGV[1] and
// answers {'lost', what} when the job it joined is not there any more.
// create's ARGV: items epochs block seed files explicit run [cursor bitmap].
extern const Script kCreateScript;
extern const Script kClaimScript;  // ARGV: run host ttl_ms ['expired']
extern const Script kRenewScript;  // ARGV: run host first generation ttl_ms
extern const Script kAckScript;    // ARGV: run host first generation ticket...
extern const Script kStatsScript;  // ARGV: run ('*': any run)
extern const Script kSaveScript;   // ARGV: run

}  // namespace tailcut::detail

#endif  // TAILCUT_GLOBAL_SCRIPTS_H_
