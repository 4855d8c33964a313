// The resolved configuration of a queue: stat'ed files, the item table and
// the fingerprint that every process of one queue must share.
#ifndef TAILCUT_ENGINE_CONFIG_H_
#define TAILCUT_ENGINE_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tailcut/work_queue.h"

namespace tailcut::detail {

// Upper bound on num_items * num_epochs: the done bitmap is one bit per
// ticket, so this caps it at 512 MiB of /dev/shm.
inline constexpr uint64_t kMaxTickets = uint64_t{1} << 32;
inline constexpr uint32_t kMaxClients = 4096;
inline constexpr uint32_t kMaxLeasesPerClient = 256;
// Lease indices must fit the 14-bit pending field of an extent word.
inline constexpr uint64_t kMaxLeases = (uint64_t{1} << 14) - 2;
// Offsets are kept in 48 bits of a lease's progress word (segment_layout.h).
inline constexpr uint64_t kMaxFileBytes = (uint64_t{1} << 48) - 1;
inline constexpr size_t kMaxNameLength = 200;
// Longest attach_timeout and lease_timeout.
inline constexpr std::chrono::milliseconds kMaxDuration{7LL * 24 * 3600 * 1000};
inline constexpr size_t kFormatTagBytes = 64;

struct QueueConfig {
  std::vector<std::string> paths;  // prefix applied; {""} in an index work
  std::vector<uint64_t> sizes;
  std::vector<FileIdentity> identities;  // sizes included
  std::vector<WorkQueue::Item> items;
  uint64_t num_epochs = 1;
  bool shuffle = true;
  bool seed_explicit = false;
  uint64_t seed = 0;
  uint64_t num_slices = 0;  // 0: one item per file
  uint32_t num_clients = 1;
  uint32_t max_clients = 0;
  uint32_t leases_per_client = 0;
  std::string format;
  uint64_t total_bytes = 0;
  // An index work (WorkQueueOptions::num_samples): one file entry with an
  // empty path (no work file can have one) and size num_samples, whose
  // "bytes" are positions.
  uint64_t num_samples = 0;
  // WorkQueueOptions::samples_id of an index work: part of PathsHash(), as
  // the paths of a queue of files are.
  std::string samples_id;
  // Tickets come from the cross-host tier's feeder (WorkQueueOptions::
  // coordinator): the segment holds the fed block table and skip bitmap.
  bool fed = false;

  uint64_t total_tickets() const { return items.size() * num_epochs; }
  uint64_t PathsHash() const;
  uint64_t SizesHash() const;
  // Hash of everything that defines the data set and its order (seed only
  // when explicit): what a checkpoint must match.
  uint64_t Fingerprint() const;
};

// The format tag of every index work.
inline constexpr char kIndexFormat[] = "index";

// Validates options, stats every work file (in parallel) and slices them;
// an index work has no file to stat.
// Throws tailcut::Error naming the bad option or file.
QueueConfig ResolveConfig(const WorkQueueOptions& options);

// Throws kInvalidArgument unless name is 1..200 characters of [A-Za-z0-9._-];
// the message calls it `what` ("queue name", "batch ring name") and shows it
// through Printable.
void ValidateQueueName(const std::string& name, const char* what = "queue name");

// Items of files with the given sizes: one per file, or about num_slices
// spread by size with at least one per file and no empty slice of a
// non-empty file.
std::vector<WorkQueue::Item> SliceFiles(const std::vector<uint64_t>& sizes, uint64_t num_slices);

uint64_t HashBytes(const void* data, size_t size, uint64_t seed = 0) noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_CONFIG_H_
