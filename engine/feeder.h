// The seam between a host's queue and the cross-host tier that feeds it.
//
// libtailcut knows no Redis: a WorkQueue opened with a coordinator loads
// libtailcut_global (beside libtailcut) at run time and asks it for a Feeder.
// So single-host programs and libtailcut itself carry no hiredis dependency,
// and code written for one host runs on many when TAILCUT_COORDINATOR is set.
//
// Lifetime: WorkQueue::Open creates the Feeder before the local segment (the
// job's seed comes from the tier), calls Start once the segment is mapped,
// and Stop in Close, before the segment is unmapped. Start runs the feeder's
// own thread; every process of a host runs one, and the one that wins
// LocalFeed::TryLead feeds.
#ifndef TAILCUT_ENGINE_FEEDER_H_
#define TAILCUT_ENGINE_FEEDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tailcut/export.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

class LocalFeed;

// What every host of a job must agree on, from the local configuration.
struct FeedJob {
  std::string name;        // the queue's name: the job's name in the tier
  uint64_t num_items = 0;  // after slicing
  uint64_t num_epochs = 0;
  bool seed_explicit = false;
  uint64_t seed = 0;         // when explicit; else the job's is adopted
  uint64_t fingerprint = 0;  // paths, sizes, slicing, shuffle, format
};

class Feeder {
 public:
  virtual ~Feeder() = default;
  // The seed every host of the job uses.
  virtual uint64_t seed() const = 0;
  // Starts feeding `feed` (it outlives Stop). Throws tailcut::Error.
  virtual void Start(LocalFeed* feed) = 0;
  // Stops the feeder's thread; a leading feeder acks what its host finished
  // and resigns first. Idempotent.
  virtual void Stop() noexcept = 0;
  // The job's state in the tier, for a checkpoint (WorkQueue::SaveState).
  virtual std::string SaveState() = 0;
  // The tier's state saved now with the done marks of the hosts' states
  // (GlobalStateWithHosts): WorkQueue::SaveStateWithHosts.
  virtual std::string SaveStateWithHosts(const std::vector<std::string>& host_states) = 0;
  // When the feed says the job is lost (LocalFeed::lost(), recorded by this
  // host's leading feeder, in any process): what was lost and what to do.
  // "" otherwise. Any process of the host words it the same.
  virtual std::string LossMessage() const = 0;
};

// Resolves options.coordinator (or TAILCUT_COORDINATOR; empty: none) and, if
// there is one, connects and creates or joins the job. Returns nullptr with
// no coordinator. Throws tailcut::Error: the tier's errors, or kNotFound when
// libtailcut_global cannot be loaded (naming it and how to get it).
std::unique_ptr<Feeder> OpenFeeder(const WorkQueueOptions& options, const FeedJob& job);

// The symbol libtailcut_global exports for OpenFeeder: returns a new Feeder
// or throws. C++ on both sides: the two libraries are built together.
using FeederFactory = Feeder* (*)(const WorkQueueOptions& options, const FeedJob& job);
inline constexpr const char* kFeederFactorySymbol = "tailcut_open_feeder_v1";

// The coordinator URL options or the environment name ("" for none), and
// the host's identity (options.host_id, TAILCUT_HOST_ID, else the hostname).
TAILCUT_EXPORT std::string ResolveCoordinator(const WorkQueueOptions& options);
// Throws kInvalidArgument for an id that cannot name a segment.
TAILCUT_EXPORT std::string ResolveHostId(const WorkQueueOptions& options);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_FEEDER_H_
