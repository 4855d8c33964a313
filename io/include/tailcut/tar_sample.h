// tailcut/tar_sample.h: the members of one WebDataset sample, a Record read
// in the "tar" format (tailcut/record_format.h).
//
// A tar record is the sample's raw bytes, headers included, from its first
// member's first header block to the end of its last member's data. TarSample
// decodes those headers again and lists the members: their paths, their
// suffixes (what WebDataset calls the extension: the path after the key's
// first '.', e.g. "jpg", "json", "seg.png") and views of their data.
//
//   tailcut::TarSample sample(record);
//   const tailcut::TarMember* image = sample.Find("jpg");
//   Decode(image->data, image->size);
//
// Contract
//  * Construction is the control path: it allocates, and throws
//    tailcut::Error (kCorrupt) naming the offset when the bytes are not one
//    sample (a damaged header, members of more than one key, no member).
//  * A TarSample keeps no copy of the data: members' data points into the
//    record's bytes and is valid as long as they are. Immutable: any thread
//    may read it.
#ifndef TAILCUT_TAR_SAMPLE_H_
#define TAILCUT_TAR_SAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/export.h"
#include "tailcut/record_format.h"

namespace tailcut {

struct TAILCUT_EXPORT TarMember {
  std::string path;      // the member's path in the archive, e.g. "train/000123.jpg"
  size_t suffix_at = 0;  // where its suffix starts in path
  const std::byte* data = nullptr;
  size_t size = 0;
  uint64_t offset = 0;  // file offset of its data

  // The path after the key's '.', e.g. "jpg".
  std::string_view suffix() const noexcept { return std::string_view(path).substr(suffix_at); }
};

class TAILCUT_EXPORT TarSample {
 public:
  explicit TarSample(const Record& record);

  // The members' shared key, e.g. "train/000123".
  const std::string& key() const noexcept { return key_; }
  // In archive order; directories and other non-regular entries left out.
  const std::vector<TarMember>& members() const noexcept { return members_; }
  // The first member with this suffix, or null.
  const TarMember* Find(std::string_view suffix) const noexcept;

 private:
  std::string key_;
  std::vector<TarMember> members_;
};

}  // namespace tailcut

#endif  // TAILCUT_TAR_SAMPLE_H_
