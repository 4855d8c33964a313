// tailcut/global_tier.h: the cross-host tier, on Redis.
//
// One job spans several hosts. Each host keeps its shared-memory WorkQueue;
// one process per host (the feeder) claims blocks of tickets from Redis,
// renews their leases while the host works on them, and acks the tickets the
// host finished. Ticket t in [0, num_items * num_epochs) means epoch
// t / num_items, position t % num_items, as in the local queue.
//
// Contract
//  * Thread safety: a GlobalTier may be used by many threads of one process;
//    calls are serialized on its one connection (a mutex).
//  * Process safety: any number of processes on any number of hosts may open
//    the same job. Each operation is one Lua script, run atomically by Redis.
//  * Fork: a GlobalTier belongs to the process that opened it; a forked child
//    opens its own.
//  * Blocks: Claim hands out a block [first, last) with a generation and a
//    deadline (Redis server time + ttl). The holder renews it before the
//    deadline and acks its tickets. A block whose deadline passed is re-owned
//    by the next Claim with generation + 1, and only its tickets without a
//    done mark are handed out again.
//  * Errors: Open throws tailcut::Error: kInvalidArgument (URL, job name),
//    kPermission (password), kConfigMismatch (names the field), kIo (Redis
//    unreachable), kCorrupt (a state that fails validation, or a job that
//    was lost while hosts ran it and no restore_state is given). Claim,
//    Renew and Ack return refusals as statuses and throw kIo only when Redis
//    stays unreachable for Options::retry_for. No message ever contains the
//    password, and none starts with "tailcut: " (the notice sink adds it).
//  * Losing the job: the run Open created or joined has an id in Redis, and
//    every later call checks, in its script, that the job is still there and
//    still that run, with its cursor, done marks and generations. If not,
//    Claim, Renew and Ack answer kLost, Stats and SaveState throw kCorrupt,
//    and loss() says what was lost; it stays so (no later call asks Redis).
//    Redis merely unreachable is not a loss: calls throw kIo as above.
//
// Invariants (kept by the scripts in global/scripts.cc, see docs/global.md)
//  1. The cursor only grows; a ticket below it was handed out in exactly one
//     block, aligned at a multiple of block_size.
//  2. A done mark is set only by an ack whose generation equals the block's
//     current generation; it is never cleared. The done count is the number
//     of done marks.
//  3. A block is open (in the deadline set) from its Claim until its last
//     ticket is done; a re-owned block keeps its tickets and gets
//     generation + 1, so every earlier holder's Renew and Ack are refused.
//  4. End of data: cursor past the end, no open block, done count == total.
#ifndef TAILCUT_GLOBAL_TIER_H_
#define TAILCUT_GLOBAL_TIER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/error.h"
#include "tailcut/export.h"

namespace tailcut {

// Where Redis runs: redis://[user[:password]@]HOST:PORT/DB.
struct TAILCUT_EXPORT CoordinatorAddress {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // empty: the default user
  std::string password;  // empty: no AUTH
  // The URL without the password, safe to print: redis://user@host:port/db.
  std::string Display() const;
};

// Parses a redis:// URL. Throws kInvalidArgument naming the part that is
// wrong (never echoing the password).
TAILCUT_EXPORT CoordinatorAddress ParseCoordinatorUrl(std::string_view url);
// The URL in TAILCUT_COORDINATOR (or `url` when not empty); the password from
// TAILCUT_REDIS_PASSWORD when the URL has none. Throws kInvalidArgument when
// neither is set.
TAILCUT_EXPORT CoordinatorAddress CoordinatorFromEnvironment(std::string_view url = {});

// What every host of a job must agree on. A mismatch is kConfigMismatch.
struct GlobalJob {
  std::string name;  // no whitespace or braces, at most 200 bytes
  uint64_t num_items = 0;
  uint64_t num_epochs = 1;
  uint64_t block_size = 64;  // tickets per block
  uint64_t seed = 0;
  std::string files_fingerprint;  // the caller's fingerprint of the file table
  // false: `seed` is only a proposal; a job that exists keeps its own seed,
  // which job().seed then reports after Open.
  bool seed_explicit = true;
};

struct GlobalTierOptions {
  std::string coordinator;  // URL; empty: TAILCUT_COORDINATOR
  GlobalJob job;
  std::string host_id;  // empty: hostname:pid
  // Every command: a reply must come within this, else the connection is
  // dropped and the command retried.
  std::chrono::milliseconds command_timeout{2000};
  // How long a call keeps reconnecting (backoff 50 ms doubling to 1 s) before
  // it throws kIo naming the URL.
  std::chrono::milliseconds retry_for{15000};
  // A state from GlobalTier::SaveState(): the process that creates the job
  // starts from it; others joining the job ignore it. It is also the way to
  // create again a job that was lost (GlobalLoss::kGone).
  std::string restore_state;
  // With restore_state: the token of the restore this host takes part in
  // (hosts that restore one checkpoint together pass the same, e.g. drawn by
  // rank 0 and broadcast). The first to open creates the job from the state,
  // replacing a job of that name with another token or none (the run the
  // checkpoint came from, which went on past it); the others join it. Empty:
  // a job that exists is joined and the state ignored.
  std::string restore_token;
  // One-line notices (reconnecting, job created or joined), without a
  // "tailcut: " prefix. Default: stderr, as "tailcut: " + line.
  std::function<void(const std::string&)> on_notice;
};

// A block one host holds. Plain data.
struct GlobalBlock {
  uint64_t first = 0;  // tickets [first, last)
  uint64_t last = 0;
  uint64_t generation = 0;  // fencing token: Renew and Ack must carry it
  bool reclaimed = false;   // re-owned after its holder's deadline passed
  // The tickets to process: [first, last) for a new block, only the tickets
  // without a done mark for a reclaimed one. Ascending.
  std::vector<uint64_t> tickets;
};

enum class GlobalClaimStatus {
  kOk,    // *block is valid
  kWait,  // nothing to hand out now, but open blocks (maybe this host's) may
          // still come back: call again after *retry_after
  kEnd,   // every ticket of every epoch is done
  kLost,  // the job's state in Redis is lost: see GlobalTier::loss()
};

enum class GlobalAckStatus {
  kOk,
  kClosed,   // Renew: every ticket of the block is done; nothing to renew
  kStale,    // the block was re-owned (generation moved): refused, counted
  kInvalid,  // a ticket outside the block
  kLost,     // the job's state in Redis is lost: see GlobalTier::loss()
};

// What Redis lost of the job a GlobalTier joined.
enum class GlobalLoss {
  kNone,
  kGone,         // every key (Redis restarted without persistence, or they were deleted)
  kReplaced,     // the job was created again under its name after this tier joined it
  kCursor,       // its cursor key
  kDoneMarks,    // its done bitmap (done count above 0, no bitmap)
  kGenerations,  // the generation of a block that was claimed
  kOpenBlocks,   // its open blocks (every block handed out, none open, tickets not done)
};

// The error text for a loss of job `job` on `coordinator` (Display() form):
// what was lost and what to do. kNone: "".
TAILCUT_EXPORT std::string GlobalLossMessage(GlobalLoss loss, std::string_view job,
                                             std::string_view coordinator);

struct GlobalHostStats {
  std::string host_id;
  uint64_t claims = 0;        // blocks claimed, new or re-owned
  uint64_t reclaims = 0;      // of those, re-owned after a deadline passed
  uint64_t acked = 0;         // tickets newly marked done
  uint64_t stale_acks = 0;    // refused Ack calls
  uint64_t stale_renews = 0;  // refused Renew calls
};

struct GlobalOpenBlock {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t generation = 0;
  std::string host_id;         // empty: restored from a state, no holder yet
  int64_t deadline_in_ms = 0;  // negative: expired, the next Claim re-owns it
  uint64_t left = 0;           // tickets without a done mark
};

struct GlobalStats {
  std::string job;
  std::string coordinator;  // Display() form
  uint64_t num_items = 0;
  uint64_t num_epochs = 0;
  uint64_t block_size = 0;
  uint64_t total = 0;
  uint64_t cursor = 0;  // next ticket the cursor hands out (may pass total)
  uint64_t done = 0;
  uint64_t stale_acks = 0;                   // sum over hosts
  std::vector<GlobalOpenBlock> open_blocks;  // ascending first
  std::vector<GlobalHostStats> hosts;        // ascending host_id
};

class TAILCUT_EXPORT GlobalTier {
 public:
  // Connects (AUTH, SELECT), loads the scripts, and creates the job or joins
  // it after checking its configuration. Throws tailcut::Error.
  static std::unique_ptr<GlobalTier> Open(GlobalTierOptions options);
  // Stats of the job options.job.name without joining it (only the name,
  // coordinator and timeouts are used): for tools. Throws as Open does, and
  // kNotFound when no such job is on that Redis.
  static GlobalStats Inspect(GlobalTierOptions options);
  ~GlobalTier();
  GlobalTier(const GlobalTier&) = delete;
  GlobalTier& operator=(const GlobalTier&) = delete;

  // Claims a block for this host; its deadline is now + ttl (Redis time).
  // kWait sets *retry_after (when the soonest open block expires, capped
  // at 1 s). kLost: see loss(). Throws kIo (unreachable).
  // A Claim whose reply was lost (Redis restarted) leaves a block that
  // nobody holds; it comes back after ttl.
  GlobalClaimStatus Claim(std::chrono::milliseconds ttl, GlobalBlock* block,
                          std::chrono::milliseconds* retry_after = nullptr);
  // Re-owns the open block whose deadline passed first, as Claim does before
  // anything else, but never takes a new block from the cursor: for a host
  // that has work enough and only looks for a dead host's blocks. kOk
  // (*block, reclaimed), kWait (none has expired; *retry_after: until the
  // soonest deadline, capped at 1 s), kLost. Throws kIo (unreachable).
  GlobalClaimStatus ClaimExpired(std::chrono::milliseconds ttl, GlobalBlock* block,
                                 std::chrono::milliseconds* retry_after = nullptr);
  // Moves the block's deadline to now + ttl. kStale if it was re-owned,
  // kClosed if all its tickets are done.
  GlobalAckStatus Renew(const GlobalBlock& block, std::chrono::milliseconds ttl);
  // Marks tickets of the block done. kStale (nothing marked) if the block
  // was re-owned. A ticket already done counts once. *newly_done: how many
  // marks this call set. Safe to repeat after a lost reply.
  GlobalAckStatus Ack(const GlobalBlock& block, std::span<const uint64_t> tickets,
                      uint64_t* newly_done = nullptr);

  // Throws kIo (unreachable), kCorrupt (the job is lost: loss()).
  GlobalStats Stats();
  // Cursor and done marks of the job as a compact binary string, for a
  // checkpoint (GlobalTierOptions::restore_state). Open blocks are not in it:
  // after a restore their tickets without done marks are handed out again.
  // Throws as Stats.
  std::string SaveState();

  // kNone until a call found the job lost; then what was lost, for good.
  GlobalLoss loss() const noexcept;
  const std::string& host_id() const noexcept;
  const GlobalJob& job() const noexcept;
  // The coordinator's URL without the password (CoordinatorAddress::Display).
  std::string coordinator() const;
  // The id of the run of the job that Open created or joined: a job created
  // again under the same name is another run.
  const std::string& run_id() const noexcept;

  class Impl;

 private:
  explicit GlobalTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An exact checkpoint of a job whose hosts hand out parts of items (a pooled
// loader's batches): the tier's state `tier_state` (SaveState, saved after
// every host's) with its done marks replaced by what the hosts' queues hold
// (WorkQueue::SaveHostState of every host): a ticket is done when a host
// finished it or holds part of it, which that host resumes from its own
// state (FedRestoreState). Every other ticket the tier handed out (a host
// had not started it, or got it after its state was saved) is handed out
// again. Throws kCorrupt (not a state), kInvalidArgument (a host state of
// another job, or saved after the tier's).
TAILCUT_EXPORT std::string GlobalStateWithHosts(const std::string& tier_state,
                                                const std::vector<std::string>& host_states);

}  // namespace tailcut

#endif  // TAILCUT_GLOBAL_TIER_H_
