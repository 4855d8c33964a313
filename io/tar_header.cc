#include "io/tar_header.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace tailcut::detail {

size_t TarPath::KeyLength() const noexcept {
  const size_t n = size();
  size_t base = 0;
  for (size_t i = 0; i < n; ++i)
    if (at(i) == '/') base = i + 1;
  // WebDataset's ^((?:.*/|)[^.]+)[.]([^/]*)$: at least one character before the dot.
  for (size_t i = base; i < n; ++i)
    if (at(i) == '.') return i > base ? i : 0;
  return 0;
}

bool TarPath::SameKey(const TarPath& other) const noexcept {
  const size_t n = KeyLength();
  if (n == 0 || n != other.KeyLength()) return false;
  for (size_t i = 0; i < n; ++i)
    if (at(i) != other.at(i)) return false;
  return true;
}

std::string TarPath::ToString() const {
  return prefix.empty() ? std::string(name) : std::string(prefix) + "/" + std::string(name);
}

namespace {

// Header fields (POSIX ustar; GNU tar uses the same offsets up to the magic).
constexpr size_t kNameAt = 0, kNameLen = 100;
constexpr size_t kSizeAt = 124, kSizeLen = 12;
constexpr size_t kChksumAt = 148, kChksumLen = 8;
constexpr size_t kTypeAt = 156;
constexpr size_t kMagicAt = 257;
constexpr size_t kPrefixAt = 345, kPrefixLen = 155;

__attribute__((format(printf, 3, 4))) TarDecode Fail(TarError* error, uint64_t offset,
                                                     const char* format, ...) noexcept {
  error->offset = offset;
  va_list args;
  va_start(args, format);
  vsnprintf(error->text, sizeof error->text, format, args);
  va_end(args);
  return TarDecode::kError;
}

const char* AsChars(const std::byte* p) { return reinterpret_cast<const char*>(p); }

std::string_view Field(const std::byte* p, size_t length) {
  return {AsChars(p), strnlen(AsChars(p), length)};
}

// A numeric field: octal digits (leading spaces allowed, ended by a space, a
// NUL or the field's end), or GNU base-256 (first byte 0x80, big-endian).
bool ParseNumber(const std::byte* p, size_t length, uint64_t* value) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  if (u[0] == 0x80) {
    uint64_t v = 0;
    for (size_t i = 1; i < length; ++i) {
      if (v >> 56) return false;  // more than 64 bits
      v = (v << 8) | u[i];
    }
    *value = v;
    return true;
  }
  size_t i = 0;
  while (i < length && u[i] == ' ') ++i;
  uint64_t v = 0;
  bool digits = false;
  for (; i < length && u[i] >= '0' && u[i] <= '7'; ++i) {
    if (v >> 61) return false;
    v = v * 8 + (u[i] - '0');
    digits = true;
  }
  for (; i < length; ++i)
    if (u[i] != ' ' && u[i] != 0) return false;
  if (!digits && u[0] != 0 && u[0] != ' ') return false;
  *value = v;
  return true;
}

// The field as text for a message: printable bytes, others as '?'.
void Printable(const std::byte* p, size_t length, char* out) {
  for (size_t i = 0; i < length; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    out[i] = c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  out[length] = 0;
}

bool AllZero(const std::byte* p) {
  for (size_t i = 0; i < kTarBlock; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

// Header checksum: the sum of the block's bytes with the checksum field read
// as spaces; historic tars summed signed chars, so that sum is accepted too.
bool ChecksumOk(const std::byte* p, uint64_t* stored, uint64_t* computed) {
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    const bool in_field = i >= kChksumAt && i < kChksumAt + kChksumLen;
    const auto b = static_cast<unsigned char>(p[i]);
    unsigned_sum += in_field ? ' ' : b;
    signed_sum += in_field ? ' ' : static_cast<signed char>(b);
  }
  *computed = unsigned_sum;
  if (!ParseNumber(p + kChksumAt, kChksumLen, stored)) return false;
  return *stored == unsigned_sum || static_cast<int64_t>(*stored) == signed_sum;
}

struct Pax {
  bool has_path = false, has_size = false;
  std::string_view path;
  uint64_t size = 0;
};

// Records "<length> <key>=<value>\n", <length> counting the whole record.
bool ParsePax(const std::byte* p, uint64_t size, Pax* pax, uint64_t* bad_at) {
  const char* s = AsChars(p);
  uint64_t at = 0;
  while (at < size) {
    if (s[at] == 0) break;  // NUL padding after the last record
    uint64_t length = 0, i = at;
    while (i < size && s[i] >= '0' && s[i] <= '9' && length < (uint64_t{1} << 40))
      length = length * 10 + (s[i++] - '0');
    *bad_at = at;
    if (i == at || i >= size || s[i] != ' ' || length > size - at || length < i - at + 3 ||
        s[at + length - 1] != '\n')
      return false;
    const std::string_view record(s + i + 1, at + length - 1 - (i + 1));
    const size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) return false;
    const std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      pax->has_path = true;
      pax->path = value;
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty() || value.size() > 19) return false;
      for (char c : value) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
      }
      pax->has_size = true;
      pax->size = v;
    }
    at += length;
  }
  return true;
}

uint64_t Padded(uint64_t size) { return (size + kTarBlock - 1) / kTarBlock * kTarBlock; }

}  // namespace

TarDecode DecodeTarEntry(const std::byte* window, size_t size, bool at_end, uint64_t offset,
                         uint64_t max_extended_bytes, TarEntry* entry, TarError* error) noexcept {
  // Set by extended headers, applied to the member that follows them.
  bool long_path = false, pax_path = false, pax_size = false;
  std::string_view path_override;
  uint64_t size_override = 0;
  size_t at = 0;  // window index of the header block being read
  for (;;) {
    const uint64_t block_offset = offset + at;
    if (size - at < kTarBlock) {
      if (!at_end) return TarDecode::kNeedMore;
      if (size == at && at == 0) return TarDecode::kEnd;
      return Fail(error, block_offset,
                  "truncated header: the file ends at %" PRIu64
                  ", inside the 512-byte header (file cut short?)",
                  offset + size);
    }
    const std::byte* h = window + at;
    if (AllZero(h)) {
      if (at == 0) return TarDecode::kEnd;
      return Fail(
          error, block_offset,
          "the archive ends right after an extended header (long name or pax) that has no member");
    }
    uint64_t stored = 0, computed = 0;
    if (!ChecksumOk(h, &stored, &computed)) {
      char field[kChksumLen + 1];
      Printable(h + kChksumAt, kChksumLen, field);
      return Fail(error, block_offset,
                  "header checksum mismatch (stored '%s', computed %" PRIu64
                  "): a damaged archive, or not a tar file",
                  field, computed);
    }
    uint64_t data_size = 0;
    if (!ParseNumber(h + kSizeAt, kSizeLen, &data_size)) {
      char field[kSizeLen + 1];
      Printable(h + kSizeAt, kSizeLen, field);
      return Fail(error, block_offset,
                  "size field '%s' is neither octal nor base-256: a damaged archive", field);
    }
    const char type = static_cast<char>(h[kTypeAt]);
    const uint64_t data_offset = block_offset + kTarBlock;
    const size_t data_at = at + kTarBlock;

    if (type == 'L' || type == 'x' || type == 'g' || type == 'K') {
      if (data_size > max_extended_bytes)
        return Fail(error, block_offset,
                    "extended header '%c' of %" PRIu64
                    " bytes, more than max_record_bytes (%" PRIu64 "): a damaged archive?",
                    type, data_size, max_extended_bytes);
      if (size - data_at < data_size) {
        if (!at_end) return TarDecode::kNeedMore;
        return Fail(error, block_offset,
                    "truncated extended header: %" PRIu64 " bytes, the file ends at %" PRIu64,
                    data_size, offset + size);
      }
      const std::byte* d = window + data_at;
      if (type == 'L') {
        long_path = true;
        path_override = Field(d, data_size);
      } else if (type == 'x' || type == 'g') {
        Pax pax;
        uint64_t bad_at = 0;
        if (!ParsePax(d, data_size, &pax, &bad_at))
          return Fail(error, data_offset + bad_at, "malformed pax header record");
        if (type == 'g' && (pax.has_path || pax.has_size))
          return Fail(error, block_offset,
                      "a global pax header sets %s, which tailcut does not apply to later members; "
                      "write the shard without global path/size records",
                      pax.has_path ? "path" : "size");
        if (pax.has_path) {
          pax_path = true;
          path_override = pax.path;
        }
        if (pax.has_size) {
          pax_size = true;
          size_override = pax.size;
        }
      }
      at = data_at + Padded(data_size);
      if (at > size) {  // the padding of the last extended header lies past the window
        if (!at_end) return TarDecode::kNeedMore;
        return Fail(error, block_offset,
                    "truncated extended header padding: the file ends at %" PRIu64, offset + size);
      }
      continue;
    }
    if (type == 'S')
      return Fail(error, block_offset,
                  "GNU sparse member: tailcut does not read sparse archives (write the shard "
                  "without --sparse)");

    TarEntry e;
    e.start = offset;
    e.data = data_offset;
    e.size = pax_size ? size_override : data_size;
    e.type = type;
    if (long_path || pax_path) {
      e.path.name = path_override;
    } else {
      e.path.name = Field(h + kNameAt, kNameLen);
      // POSIX ustar ("ustar\0"): a long path is prefix "/" name. GNU tar's
      // magic ("ustar  ") uses those bytes for other things.
      if (std::memcmp(h + kMagicAt, "ustar\0", 6) == 0) {
        const std::string_view prefix = Field(h + kPrefixAt, kPrefixLen);
        if (!prefix.empty()) e.path.prefix = prefix;
      }
    }
    const bool regular = type == '0' || type == '\0' || type == '7';
    const bool directory_name = e.path.size() > 0 && e.path.at(e.path.size() - 1) == '/';
    e.member = regular && !directory_name && e.path.KeyLength() > 0;
    // Data of non-regular entries is skipped by its size too (hard links and
    // directories have none; a tar that stores some is still walked right).
    if (e.size > UINT64_MAX - kTarBlock - e.data)
      return Fail(error, block_offset, "size %" PRIu64 " runs past any file", e.size);
    e.next = e.data + Padded(e.size);
    if (at_end) {
      const uint64_t file_end = offset + size;
      if (e.data + e.size > file_end) {
        char name[64];
        const std::string_view shown = e.path.name.substr(0, sizeof name - 1);
        std::memcpy(name, shown.data(), shown.size());
        name[shown.size()] = 0;
        Fail(error, block_offset,
             "truncated member '%s%s': its header says %" PRIu64 " bytes, the file ends at %" PRIu64
             " (file cut short?)",
             e.path.prefix.empty() ? "" : ".../", name, e.size, file_end);
        e.truncated = true;
      }
      if (e.next > file_end) e.next = file_end;  // no padding after the last member: accept
    }
    *entry = e;
    return TarDecode::kEntry;
  }
}

}  // namespace tailcut::detail
