// Decoding tar headers (ustar, GNU long names, pax) over a window of file
// bytes: what the tar RecordParser, the sample-start index and TarSample
// share, so that all three cut a shard into the same samples.
//
// An entry is one archive member with the extended headers before it: GNU
// 'L' (long name) and 'K' (long link name) blocks and pax 'x' headers
// (path= and size= are applied; other keys are ignored). A pax 'g' header
// that sets path or size is refused: a slice that starts past it could not
// know it. Members of type '0', '\0' and '7' are regular files; the rest
// (directories, links, devices, FIFOs, volume labels) are skipped; GNU sparse
// members ('S') are refused. The archive ends at the first all-zero block
// (tar writes two) or at the end of the file on a block boundary.
//
// A sample (WebDataset) is a run of consecutive regular members whose paths
// share a key: the path up to the first '.' of its basename
// ("dir/000123.jpg" -> "dir/000123"). A member whose basename has no '.'
// after its first character has no key and belongs to no sample. A skipped
// entry with no data (a directory, a link) inside a run does not end it; one
// with data does, so that finding a sample's end never needs more than
// headers past it.
//
// Contract: noexcept, no allocation; paths are views into the window.
#ifndef TAILCUT_IO_TAR_HEADER_H_
#define TAILCUT_IO_TAR_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tailcut::detail {

inline constexpr size_t kTarBlock = 512;

// A member's path as its headers hold it: ustar splits a long one into
// prefix "/" name; otherwise prefix is empty and name is the whole path.
struct TarPath {
  std::string_view prefix, name;

  size_t size() const noexcept {
    return prefix.empty() ? name.size() : prefix.size() + 1 + name.size();
  }
  char at(size_t i) const noexcept {
    if (prefix.empty()) return name[i];
    if (i < prefix.size()) return prefix[i];
    return i == prefix.size() ? '/' : name[i - prefix.size() - 1];
  }
  // Length of the sample key (the path up to the first '.' of its basename),
  // or 0 when the basename has no '.' after its first character.
  size_t KeyLength() const noexcept;
  // Whether both have keys and the keys are equal.
  bool SameKey(const TarPath& other) const noexcept;
  std::string ToString() const;
};

struct TarEntry {
  uint64_t start = 0;  // file offset of its first header block (extended headers included)
  uint64_t data = 0;   // file offset of its data
  uint64_t size = 0;   // data bytes
  uint64_t next = 0;   // file offset past its data and padding: the next entry
  char type = 0;
  bool member = false;  // a regular file with a key: part of a sample
  // The file ends inside its data (at_end only): the error says so. Its
  // header is sound, so it still tells where the sample before it ends.
  bool truncated = false;
  TarPath path;
};

enum class TarDecode {
  kEntry,     // *entry is set (check entry->truncated before using its data)
  kNeedMore,  // the headers (or an extended header's data) go past the window
  kEnd,       // an all-zero block, or the end of the file on a block boundary
  kError,     // *error_offset and error say what is wrong
};

struct TarError {
  uint64_t offset = 0;
  char text[240] = {};
};

// Decodes the entry whose first header block is at window[0], file offset
// `offset`. `at_end`: the window reaches the end of the file, so a header or
// member cut short is an error, not kNeedMore. Only headers and extended
// header data must be in the window, never the member's data. Extended
// headers longer than max_extended_bytes are an error.
TarDecode DecodeTarEntry(const std::byte* window, size_t size, bool at_end, uint64_t offset,
                         uint64_t max_extended_bytes, TarEntry* entry, TarError* error) noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_TAR_HEADER_H_
