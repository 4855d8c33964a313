#include "engine/config.h"

#include <sys/stat.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "engine/permutation.h"

namespace tailcut::detail {

uint64_t HashBytes(const void* data, size_t size, uint64_t seed) noexcept {
  // FNV-1a, finished with SplitMix64 so that small inputs spread over 64 bits.
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return SplitMix64(h);
}

namespace {

// Below this many works a thread pool costs more than it saves.
constexpr size_t kParallelStatThreshold = 256;

uint64_t Mix(uint64_t h, uint64_t v) { return SplitMix64(h ^ v) + 0x9e37; }

// Most items a queue may have. Each costs about 75 bytes of the process's
// memory and of /dev/shm (its entry in the segment, its done bits, its
// entry in QueueConfig::items): 4M items take about 300 MiB, a length of
// 2^30 samples at 256 an item; more slices than that is a mistake, and a
// larger length wants larger items (num_slices) anyway. Checked before
// the item table is built, since a length of 2^40 samples, 256 an item,
// would ask for 300 GiB before anything could refuse it.
constexpr uint64_t kMaxItems = uint64_t{1} << 22;

// At least as many items as SliceFiles(sizes, num_slices) makes, without
// making them: one per file, else at most num_slices plus one per file
// but one (a small file gets one even when its share rounds to none; the
// largest file's share is at least one) and never more than a file has
// bytes. Exact for an index work.
uint64_t ItemCountBound(const std::vector<uint64_t>& sizes, uint64_t num_slices) {
  const uint64_t n = sizes.size();
  if (num_slices <= n) return n;
  unsigned __int128 bytes = 0;
  for (uint64_t s : sizes) bytes += std::max<uint64_t>(s, 1);
  const unsigned __int128 slices = static_cast<unsigned __int128>(num_slices) + n - 1;
  return static_cast<uint64_t>(std::min(bytes, slices));
}

void CheckItemCount(const WorkQueueOptions& options, uint64_t num_slices, uint64_t items) {
  if (items <= kMaxItems) return;
  const std::string queue = "queue '" + options.name + "': ";
  const std::string limit =
      "; the limit is " + std::to_string(kMaxItems) + " items (each takes memory and /dev/shm): ";
  if (options.num_samples != 0) {
    const uint64_t per_item = (options.num_samples + kMaxItems - 1) / kMaxItems;
    throw Error(ErrorKind::kInvalidArgument,
                queue + "num_samples=" + std::to_string(options.num_samples) + " makes " +
                    std::to_string(items) + " items" +
                    (!options.num_slices ? " of " + std::to_string(kSamplesPerItem) + " samples"
                                         : " (num_slices=" + std::to_string(num_slices) + ")") +
                    limit + "pass num_slices=" + std::to_string(kMaxItems) +
                    " or fewer (items of " + std::to_string(per_item) + " samples or more)");
  }
  const bool per_file = num_slices <= options.works.size();
  throw Error(
      ErrorKind::kInvalidArgument,
      queue + std::to_string(options.works.size()) + " works make " + std::to_string(items) +
          " items" +
          (per_file ? " (one per file)" : " (num_slices=" + std::to_string(num_slices) + ")") +
          limit + (per_file ? "use fewer, larger files" : "pass a smaller num_slices"));
}

std::string Quote(const std::string& s) { return "'" + Printable(s) + "'"; }

// The options an index work (num_samples) must not combine with.
void CheckIndexWork(const WorkQueueOptions& options) {
  const std::string queue = "queue '" + options.name + "': ";
  if (!options.works.empty())
    throw Error(ErrorKind::kInvalidArgument,
                queue +
                    "both works and num_samples are set; pass file paths, or num_samples "
                    "for a data set of samples by index, not both");
  if (!options.prefix.empty())
    throw Error(ErrorKind::kInvalidArgument,
                queue + "prefix " + Quote(options.prefix) +
                    " is set with num_samples; an index work has no file: drop the prefix");
  if (!options.format.empty() && options.format != kIndexFormat)
    throw Error(ErrorKind::kInvalidArgument,
                queue + "format " + Quote(options.format) +
                    " is set with num_samples; an index work has no records to parse: drop the "
                    "format");
  if (options.num_samples > kMaxFileBytes)
    throw Error(ErrorKind::kInvalidArgument, queue + "num_samples is " +
                                                 std::to_string(options.num_samples) +
                                                 "; it must be at most 2^48 - 1");
}

}  // namespace

uint64_t QueueConfig::PathsHash() const {
  uint64_t h = paths.size();
  for (const auto& p : paths) h = Mix(h, HashBytes(p.data(), p.size()));
  // An index work's samples_id stands where the paths of files would; none
  // mixes nothing, so the fingerprint of a queue without one is unchanged.
  if (!samples_id.empty()) h = Mix(h, HashBytes(samples_id.data(), samples_id.size()));
  return h;
}

uint64_t QueueConfig::SizesHash() const {
  uint64_t h = sizes.size();
  for (uint64_t s : sizes) h = Mix(h, s);
  return h;
}

uint64_t QueueConfig::Fingerprint() const {
  uint64_t h = Mix(PathsHash(), SizesHash());
  h = Mix(h, num_slices);
  h = Mix(h, items.size());
  h = Mix(h, num_epochs);
  // The order's version, not just 1: a queue or checkpoint made with another
  // permutation must not be read in this one's order (engine/permutation.h).
  h = Mix(h, shuffle ? kPermutationVersion : 0);
  h = Mix(h, seed_explicit ? seed : 0x5eed);
  h = Mix(h, HashBytes(format.data(), format.size()));
  return h;
}

void ValidateQueueName(const std::string& name, const char* what) {
  if (name.empty())
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + " is empty; pass name='something'");
  if (name.size() > kMaxNameLength)
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + " is " + std::to_string(name.size()) +
                    " characters long; the limit is " + std::to_string(kMaxNameLength));
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (ok) continue;
    // Name the whole character: all bytes of a UTF-8 sequence (Printable
    // escapes them should they not be one).
    auto lead = static_cast<unsigned char>(c);
    size_t len = lead >= 0xf0 && lead <= 0xf4   ? 4
                 : lead >= 0xe0 && lead <= 0xef ? 3
                 : lead >= 0xc2 && lead <= 0xdf ? 2
                                                : 1;
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + " " + Quote(name) + " contains '" +
                    Printable(name.substr(i, len)) +
                    "'; use only ASCII letters, digits, '.', '_' and '-'");
  }
  if (name == "." || name == "..")
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + " " + Quote(name) + " is reserved");
}

std::vector<WorkQueue::Item> SliceFiles(const std::vector<uint64_t>& sizes, uint64_t num_slices) {
  // Slices per file: largest-remainder apportionment of num_slices by size,
  // at least one per file and never more than a file has bytes. The result
  // is exactly num_slices whenever num_slices >= the number of files.
  size_t n = sizes.size();
  std::vector<uint64_t> count(n, 1);
  unsigned __int128 total = 0;
  for (uint64_t s : sizes) total += s;
  if (num_slices > n && total > 0) {
    std::vector<std::pair<unsigned __int128, size_t>> remainders;
    uint64_t given = 0;
    for (size_t f = 0; f < n; ++f) {
      unsigned __int128 exact = static_cast<unsigned __int128>(num_slices) * sizes[f];
      uint64_t share = static_cast<uint64_t>(exact / total);
      count[f] = std::clamp<uint64_t>(share, 1, std::max<uint64_t>(sizes[f], 1));
      given += count[f];
      if (count[f] < sizes[f]) remainders.push_back({exact % total, f});
    }
    std::stable_sort(remainders.begin(), remainders.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t k = 0; given < num_slices && k < remainders.size(); ++k) {
      ++count[remainders[k].second];
      ++given;
    }
  }
  std::vector<WorkQueue::Item> items;
  for (size_t f = 0; f < n; ++f) {
    uint64_t size = sizes[f], k = count[f];
    for (uint64_t j = 0; j < k; ++j) {
      uint64_t begin = static_cast<uint64_t>(static_cast<unsigned __int128>(size) * j / k);
      uint64_t end = static_cast<uint64_t>(static_cast<unsigned __int128>(size) * (j + 1) / k);
      items.push_back({static_cast<uint32_t>(f), begin, end});
    }
  }
  return items;
}

QueueConfig ResolveConfig(const WorkQueueOptions& options) {
  ValidateQueueName(options.name);
  if (!options.samples_id.empty() && options.num_samples == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name +
                    "': samples_id is set without num_samples; it says what an index work's "
                    "samples are: pass num_samples too, or drop samples_id");
  if (options.works.empty() && options.num_samples == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name +
                    "': works is empty; pass at least one file path (or num_samples for a data "
                    "set of samples by index)");
  if (options.num_samples != 0) CheckIndexWork(options);
  if (options.works.size() > UINT32_MAX)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name + "': too many works");
  if (options.num_epochs == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': num_epochs is 0; it must be at least 1");
  if (options.num_slices && *options.num_slices == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name +
                    "': num_slices is 0; leave it unset (one item per file) or give 1 or more");
  if (options.num_clients == 0)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': num_clients is 0; it must be at least 1");
  if (options.max_clients == 0 || options.max_clients > kMaxClients)
    throw Error(
        ErrorKind::kInvalidArgument,
        "queue '" + options.name + "': max_clients must be 1.." + std::to_string(kMaxClients));
  if (options.leases_per_client == 0 || options.leases_per_client > kMaxLeasesPerClient)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name +
                                                 "': leases_per_client must be 1.." +
                                                 std::to_string(kMaxLeasesPerClient));
  if (uint64_t{options.max_clients} * options.leases_per_client > kMaxLeases)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': max_clients x leases_per_client is " +
                    std::to_string(uint64_t{options.max_clients} * options.leases_per_client) +
                    "; the limit is " + std::to_string(kMaxLeases));
  // Longer waits are surely mistakes, and would overflow the clocks' arithmetic.
  auto check_duration = [&](std::chrono::milliseconds d, const char* what) {
    if (d.count() < 0 || d > kMaxDuration)
      throw Error(ErrorKind::kInvalidArgument,
                  "queue '" + options.name + "': " + what + " is " + std::to_string(d.count()) +
                      " ms; it must be 0.." + std::to_string(kMaxDuration.count()) +
                      " ms (7 days)");
  };
  check_duration(options.attach_timeout, "attach_timeout");
  check_duration(options.lease_timeout, "lease_timeout");
  check_duration(options.stop_timeout, "stop_timeout");
  check_duration(options.global_ttl, "global_ttl");
  if (options.global_ttl < std::chrono::milliseconds(100))
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': global_ttl is " +
                    std::to_string(options.global_ttl.count()) +
                    " ms; it must be at least 100 ms (the feeder renews every eighth of it)");
  if (options.global_block_size > kMaxTickets)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name + "': global_block_size is " +
                                                 std::to_string(options.global_block_size) +
                                                 "; it must be 0 (automatic) to " +
                                                 std::to_string(kMaxTickets));
  if (options.min_split_bytes == 0 || options.min_split_bytes > kMaxFileBytes)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': min_split_bytes is " +
                    std::to_string(options.min_split_bytes) +
                    "; it must be 1..2^48-1 (to turn tail splitting off, set split_tail=false)");
  if (options.split_multiple == 0 || options.split_multiple > kMaxFileBytes)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name + "': split_multiple is " +
                                                 std::to_string(options.split_multiple) +
                                                 "; it must be 1..2^48-1 (1: split anywhere)");
  if (options.format.size() >= kFormatTagBytes)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name +
                                                 "': format tag longer than " +
                                                 std::to_string(kFormatTagBytes - 1) + " bytes");
  for (char c : options.format) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name + "': format tag " +
                                                   Quote(options.format) +
                                                   " contains a control character; use the tag "
                                                   "RecordFormat::Tag() gives");
  }
  if (options.prefix.find('\0') != std::string::npos)
    throw Error(ErrorKind::kInvalidArgument, "queue '" + options.name + "': prefix " +
                                                 Quote(options.prefix) +
                                                 " contains a NUL byte; no path has one");

  QueueConfig config;
  config.num_epochs = options.num_epochs;
  config.shuffle = options.shuffle;
  config.seed_explicit = options.seed.has_value();
  config.seed = options.seed.value_or(0);
  config.num_slices = options.num_slices.value_or(0);
  config.num_clients = options.num_clients;
  config.max_clients = options.max_clients;
  config.leases_per_client = options.leases_per_client;
  config.format = options.format;

  size_t n = options.works.size();
  config.paths.resize(n);
  config.sizes.resize(n);
  config.identities.resize(n);
  for (size_t i = 0; i < n; ++i) config.paths[i] = options.prefix + options.works[i];

  // Stat in parallel: millions of files on a network filesystem take minutes
  // one by one. The first error by index wins, so the message is stable.
  std::mutex error_mu;
  size_t error_index = n;
  std::string error_message;
  ErrorKind error_kind = ErrorKind::kNotFound;
  auto fail = [&](size_t i, ErrorKind kind, std::string message) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (i < error_index) {
      error_index = i;
      error_kind = kind;
      error_message = std::move(message);
    }
  };
  auto stat_one = [&](size_t i) {
    const std::string& path = config.paths[i];
    std::string where = "work file " + Quote(path) + " (works[" + std::to_string(i) + "])";
    if (path.find('\0') != std::string::npos) {
      fail(i, ErrorKind::kInvalidArgument, where + " contains a NUL byte; no file has such a name");
      return;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      int err = errno;
      fail(i, ErrorKindOfErrno(err),
           where + ": " + std::strerror(err) +
               (err == ENOENT ? "; check the path and the prefix" : ""));
      return;
    }
    if (S_ISDIR(st.st_mode)) {
      fail(i, ErrorKind::kInvalidArgument, where + " is a directory; list the files in it instead");
      return;
    }
    if (!S_ISREG(st.st_mode)) {
      fail(i, ErrorKind::kInvalidArgument, where + " is not a regular file");
      return;
    }
    if (::access(path.c_str(), R_OK) != 0) {
      fail(i, ErrorKindOfErrno(errno),
           where + " is not readable: " + std::strerror(errno) + "; fix its permissions");
      return;
    }
    if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
      fail(i, ErrorKind::kInvalidArgument,
           where + " is " + std::to_string(st.st_size) +
               " bytes, more than tailcut handles in one file (2^48 - 1 bytes, 256 TiB); "
               "split it into smaller files");
      return;
    }
    config.sizes[i] = static_cast<uint64_t>(st.st_size);
    config.identities[i] = IdentityOf(st);
  };
  if (n < kParallelStatThreshold) {
    for (size_t i = 0; i < n; ++i) stat_one(i);
  } else {
    tbb::parallel_for(size_t{0}, n, stat_one);
  }
  if (error_index < n) throw Error(error_kind, "queue '" + options.name + "': " + error_message);

  uint64_t num_slices = config.num_slices;
  if (options.num_samples != 0) {
    // No file: one entry of N positions that no work file can be (its path is empty).
    config.num_samples = options.num_samples;
    config.samples_id = options.samples_id;
    config.paths = {""};
    config.sizes = {options.num_samples};
    config.identities = {FileIdentity{options.num_samples, 0, 0, 0}};
    config.format = kIndexFormat;
    if (num_slices == 0) num_slices = (options.num_samples + kSamplesPerItem - 1) / kSamplesPerItem;
  }
  for (uint64_t s : config.sizes) config.total_bytes += s;
  CheckItemCount(options, num_slices, ItemCountBound(config.sizes, num_slices));
  config.items = SliceFiles(config.sizes, num_slices);
  unsigned __int128 tickets =
      static_cast<unsigned __int128>(config.items.size()) * config.num_epochs;
  if (tickets > kMaxTickets)
    throw Error(ErrorKind::kInvalidArgument,
                "queue '" + options.name + "': " + std::to_string(config.items.size()) +
                    " items x " + std::to_string(config.num_epochs) + " epochs exceeds " +
                    std::to_string(kMaxTickets) + " tickets; use fewer slices or epochs");
  return config;
}

}  // namespace tailcut::detail

namespace tailcut {

FileIdentity IdentityOf(const struct ::stat& st) noexcept {
  return {static_cast<uint64_t>(st.st_size),
          static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
              static_cast<uint64_t>(st.st_mtim.tv_nsec),
          static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
}

std::string DescribeFileChange(const FileIdentity& then, const FileIdentity& now) {
  std::string out;
  auto add = [&](const char* what, const std::string& a, const std::string& b) {
    if (a == b) return;
    out += (out.empty() ? "" : ", ") + std::string(what) + " " + a + " -> " + b;
  };
  auto time = [](uint64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llu.%09llu", static_cast<unsigned long long>(ns / 1000000000),
                  static_cast<unsigned long long>(ns % 1000000000));
    return std::string(buf);
  };
  add("size", std::to_string(then.size), std::to_string(now.size));
  add("inode", std::to_string(then.inode), std::to_string(now.inode));
  add("device", std::to_string(then.device), std::to_string(now.device));
  add("mtime", time(then.mtime_ns), time(now.mtime_ns));
  return out;
}

}  // namespace tailcut
