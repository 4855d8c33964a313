// Where the samples of a tar shard start, found by one pass over its headers
// (member data is skipped by size, never read): what a tar slice that does
// not begin at offset 0 needs, since tar cannot be resynchronised from an
// arbitrary offset the way TFRecord can.
//
// Contract: control path. Thread-safe: indexes are cached per process, keyed
// by the file's path and identity (device, inode, size, mtime), at most
// kTarIndexCacheFiles of them. Throws tailcut::Error naming the file when it
// cannot be opened or read.
#ifndef TAILCUT_IO_TAR_INDEX_H_
#define TAILCUT_IO_TAR_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/tar_header.h"

namespace tailcut::detail {

inline constexpr size_t kTarIndexCacheFiles = 64;

struct TarIndex {
  std::vector<uint64_t> starts;  // sample start offsets, ascending
  // The scan stopped at a damaged header: starts holds what lies before it.
  bool damaged = false;
  TarError error;
};

// The index of the first file_size bytes of `path`.
std::shared_ptr<const TarIndex> TarSampleIndex(const std::string& path, uint64_t file_size,
                                               uint64_t max_extended_bytes);

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_TAR_INDEX_H_
