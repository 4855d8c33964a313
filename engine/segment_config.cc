#include "engine/segment_config.h"

#include <unistd.h>

#include <cstring>

#include "engine/clock.h"
#include "engine/permutation.h"
#include "engine/robust_mutex.h"
#include "tailcut/error.h"

namespace tailcut::detail {

void WriteLayout(Segment* segment, const QueueConfig& config, const Geometry& g) {
  Header& h = segment->header();
  // layout_version and total_size are the preamble, written by the creator
  // before it published the magic.
  h.creator_uid = ::geteuid();
  h.creator_pid = ::getpid();
  h.created_unix_ns = RealtimeNs();
  h.fingerprint = config.Fingerprint();
  h.num_files = config.paths.size();
  h.num_items = config.items.size();
  h.num_epochs = config.num_epochs;
  h.total_tickets = config.total_tickets();
  h.total_bytes = config.total_bytes;
  h.num_slices = config.num_slices;
  h.seed = config.seed;
  h.seed_explicit = config.seed_explicit ? 1 : 0;
  h.shuffle = config.shuffle ? 1 : 0;
  h.paths_hash = config.PathsHash();
  h.sizes_hash = config.SizesHash();
  h.num_clients = config.num_clients;
  h.max_clients = config.max_clients;
  h.leases_per_client = config.leases_per_client;
  h.path_bytes = g.path_bytes;
  std::memset(h.format, 0, sizeof(h.format));
  std::memcpy(h.format, config.format.data(), config.format.size());
  InitRobustMutex(&h.sweep_mutex);
  InitRobustMutex(&h.feeder_mutex);
  h.fed = g.fed ? 1 : 0;
  segment->SetGeometry(g);
  // relaxed: not yet shared (see below). A queue of one host may hand out
  // every ticket; a fed one only what its feeder grants.
  segment->cursor().limit.store(g.fed ? 0 : g.total_tickets, std::memory_order_relaxed);
  for (uint64_t i = 0; i < g.max_clients; ++i) InitRobustMutex(&segment->client(i).life);
  uint64_t offset = 0;
  for (uint64_t f = 0; f < g.num_files; ++f) {
    const std::string& p = config.paths[f];
    std::memcpy(segment->path_bytes() + offset, p.data(), p.size());
    const FileIdentity& id = config.identities[f];
    segment->file(f) = FileEntry{offset, p.size(), id.size, id.mtime_ns, id.inode, id.device};
    offset += p.size();
  }
  for (uint64_t i = 0; i < g.num_items; ++i) {
    const WorkQueue::Item& it = config.items[i];
    segment->item(i) = ItemEntry{it.file, it.begin, it.end};
  }
  for (uint64_t l = 0; l < g.num_leases(); ++l)
    // relaxed: not yet shared; the creator's release store of READY in TryCreate (work_queue.cc)
    // publishes the layout.
    segment->lease(l).ticket.store(kNoTicket, std::memory_order_relaxed);
}

namespace {

std::string SegmentPathString(const Segment& s, uint64_t f) {
  const FileEntry& e = s.file(f);
  return std::string(s.path_bytes() + e.path_offset, e.path_length);
}

std::string Opt(uint64_t v) { return v == 0 ? "unset" : std::to_string(v); }

}  // namespace

void CompareConfig(const Segment& s, const QueueConfig& config) {
  const Header& h = s.header();
  auto mismatch = [&](const std::string& what) {
    return Error(ErrorKind::kConfigMismatch,
                 "queue '" + s.queue_name() + "' exists with a different configuration: " + what +
                     ". Use the same options in every process of a job, or another queue name "
                     "(remove the old queue with `tailcut rm " +
                     s.queue_name() + "` once its jobs are gone)");
  };
  // An index work is one file entry with an empty path (config.h).
  const bool theirs_index = h.num_files == 1 && s.file(0).path_length == 0;
  const uint64_t their_samples = theirs_index ? s.file(0).size : 0;
  if (theirs_index != (config.num_samples != 0) || their_samples != config.num_samples) {
    auto works = [](uint64_t samples, uint64_t files) {
      return samples != 0 ? "num_samples=" + std::to_string(samples)
                          : std::to_string(files) + (files == 1 ? " work file" : " work files");
    };
    throw mismatch("works differ: " + works(config.num_samples, config.paths.size()) + " here, " +
                   works(their_samples, h.num_files) + " in segment");
  }
  if (h.num_files != config.paths.size())
    throw mismatch("works differ: " + std::to_string(config.paths.size()) + " files here, " +
                   std::to_string(h.num_files) + " in segment");
  // An index work's samples_id is in the paths' hash (the segment keeps no copy).
  if (config.num_samples != 0 && h.paths_hash != config.PathsHash())
    throw mismatch(
        "the samples differ: the queue was created over another data set of as many samples "
        "(its samples_id differs: for QueueDataset(shuffle='global'), other record files, or "
        "the same in another order or with other record counts or sizes)");
  if (h.paths_hash != config.PathsHash()) {
    for (uint64_t f = 0; f < h.num_files; ++f) {
      std::string theirs = SegmentPathString(s, f);
      if (theirs != config.paths[f])
        throw mismatch("works[" + std::to_string(f) + "] differs: '" + Printable(config.paths[f]) +
                       "' here, '" + Printable(theirs) + "' in segment");
    }
  }
  if (h.sizes_hash != config.SizesHash()) {
    for (uint64_t f = 0; f < h.num_files; ++f)
      if (s.file(f).size != config.sizes[f])
        throw mismatch("size of '" + Printable(config.paths[f]) +
                       "' differs: " + std::to_string(config.sizes[f]) + " bytes here, " +
                       std::to_string(s.file(f).size) +
                       " in segment (the file changed after the queue was created)");
  }
  // Same size is not the same file: one renamed over it, or rewritten in
  // place, is another data set for the items already done.
  for (uint64_t f = 0; f < h.num_files; ++f) {
    const FileEntry& e = s.file(f);
    std::string change =
        DescribeFileChange({e.size, e.mtime_ns, e.inode, e.device}, config.identities[f]);
    if (!change.empty())
      throw mismatch("file '" + Printable(config.paths[f]) +
                     "' changed since the queue was created: " + change +
                     " (recreate the queue, or restore the file)");
  }
  if ((h.fed == 1) != config.fed)
    throw mismatch(std::string(config.fed
                                   ? "this process is fed by a coordinator, the queue is not"
                                   : "the queue is fed by a coordinator, this process is not") +
                   " (set the same coordinator, or none, in every process of a host)");
  if (h.num_slices != config.num_slices)
    throw mismatch("num_slices differs: " + Opt(config.num_slices) + " here, " + Opt(h.num_slices) +
                   " in segment");
  if (h.num_items != config.items.size())
    throw mismatch("item count differs: " + std::to_string(config.items.size()) + " here, " +
                   std::to_string(h.num_items) + " in segment");
  if (h.num_epochs != config.num_epochs)
    throw mismatch("num_epochs differs: " + std::to_string(config.num_epochs) + " here, " +
                   std::to_string(h.num_epochs) + " in segment");
  if ((h.shuffle != 0) != config.shuffle)
    throw mismatch(std::string("shuffle differs: ") + (config.shuffle ? "on" : "off") + " here, " +
                   (h.shuffle ? "on" : "off") + " in segment");
  if (config.seed_explicit && (h.seed_explicit == 0 || h.seed != config.seed))
    throw mismatch("seed differs: " + std::to_string(config.seed) + " here, " +
                   (h.seed_explicit
                        ? std::to_string(h.seed)
                        : "unset (drawn by the creator: " + std::to_string(h.seed) + ")") +
                   " in segment");
  if (!config.seed_explicit && h.seed_explicit != 0)
    throw mismatch("seed differs: unset here, " + std::to_string(h.seed) + " in segment");
  if (std::string(h.format) != config.format)
    throw mismatch("format differs: '" + config.format + "' here, '" + std::string(h.format) +
                   "' in segment");
  if (h.max_clients != config.max_clients)
    throw mismatch("max_clients differs: " + std::to_string(config.max_clients) + " here, " +
                   std::to_string(h.max_clients) + " in segment");
  if (h.leases_per_client != config.leases_per_client)
    throw mismatch("leases_per_client differs: " + std::to_string(config.leases_per_client) +
                   " here, " + std::to_string(h.leases_per_client) + " in segment");
  // The same works, sizes and slicing always give the same items; check the
  // table anyway, since the hot path uses our copy, never the segment's.
  for (uint64_t i = 0; i < h.num_items; ++i) {
    const ItemEntry& e = s.item(i);
    const WorkQueue::Item& it = config.items[i];
    if (e.file != it.file || e.begin != it.begin || e.end != it.end)
      throw mismatch("item " + std::to_string(i) + " differs (a different tailcut version?)");
  }
  // Every field above agrees, so what is left in the fingerprint is the
  // version of the shuffle order (engine/permutation.h): a queue made by a
  // tailcut with another permutation hands out its items in another order.
  if (h.fingerprint != config.Fingerprint())
    throw mismatch(
        "the shuffle order differs: the queue was made by a tailcut whose "
        "permutation is not version " +
        std::to_string(kPermutationVersion) + ", this one's");
}

std::vector<WorkQueue::Item> ReadItems(const Segment& s) {
  std::vector<WorkQueue::Item> items(s.geometry().num_items);
  for (uint64_t i = 0; i < items.size(); ++i) {
    const ItemEntry& e = s.item(i);
    items[i] = {static_cast<uint32_t>(e.file), e.begin, e.end};
  }
  return items;
}

std::string KeepReasonText(uint32_t reasons, uint64_t joined, uint32_t num_clients) {
  std::string out;
  auto add = [&](const std::string& r) { out += (out.empty() ? "" : "; ") + r; };
  if (reasons & kKeepRequested) add("keep_unfinished was set");
  if (reasons & kKeepCrashed) add("a process of it died, so a rerun resumes it");
  if (joined < num_clients)
    add(std::to_string(joined) + " of num_clients=" + std::to_string(num_clients) +
        " processes have joined");
  return out;
}

}  // namespace tailcut::detail
