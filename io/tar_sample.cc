#include "tailcut/tar_sample.h"

#include "io/tar_header.h"
#include "tailcut/error.h"

namespace tailcut {

TarSample::TarSample(const Record& record) {
  using detail::TarDecode;
  auto corrupt = [&](uint64_t offset, const std::string& what) {
    return Error(ErrorKind::kCorrupt, "tar sample at offset " + std::to_string(record.offset) +
                                          ": at offset " + std::to_string(offset) + ": " + what +
                                          " (pass a record read in the \"tar\" format)");
  };
  detail::TarPath first;
  size_t at = 0;
  while (at < record.size) {
    detail::TarEntry e;
    detail::TarError error;
    const TarDecode d = detail::DecodeTarEntry(record.data + at, record.size - at, true,
                                               record.offset + at, record.size, &e, &error);
    if (d == TarDecode::kError) throw corrupt(error.offset, error.text);
    if (d != TarDecode::kEntry) break;  // kEnd; kNeedMore cannot happen at the end
    if (e.truncated) throw corrupt(error.offset, error.text);
    if (e.member) {
      if (members_.empty()) {
        first = e.path;
        key_ = e.path.ToString().substr(0, e.path.KeyLength());
      } else if (!e.path.SameKey(first)) {
        throw corrupt(e.start, "member '" + Printable(e.path.ToString()) +
                                   "' has another key than '" + Printable(key_) + "'");
      }
      TarMember m;
      m.path = e.path.ToString();
      m.suffix_at = e.path.KeyLength() + 1;
      m.offset = e.data;
      m.size = static_cast<size_t>(e.size);
      m.data = record.data + (e.data - record.offset);
      members_.push_back(std::move(m));
    }
    at = static_cast<size_t>(e.next - record.offset);
  }
  if (members_.empty()) throw corrupt(record.offset, "no member with a key");
}

const TarMember* TarSample::Find(std::string_view suffix) const noexcept {
  for (const TarMember& m : members_)
    if (m.suffix() == suffix) return &m;
  return nullptr;
}

}  // namespace tailcut
