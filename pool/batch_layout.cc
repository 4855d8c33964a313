#include "tailcut/batch_layout.h"

#include <cstring>

namespace tailcut {

namespace {

// The header's fields (docs/ring_layout.md), packed: magic at byte 0, count
// (u32) at 4, where (u8) at 8, table offset and size (u64) at 12 and 20; the
// table at byte 32 when it is in the header;
// the record ranges' locator in the last 16 bytes, which the table must not
// reach.
constexpr char kMagic[4] = {'T', 'C', 'B', '2'};
constexpr uint64_t kRangeAt = 240;
constexpr uint64_t kEntryBytes = 16;        // dtype code, ndim, 6 bytes padding, offset
constexpr char kWhat[] = "pooled batch: ";  // every message's start (strings made on errors only)

uint64_t U64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (the layout's byte order)
  return v;
}

uint32_t U32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Python's repr of 4 bytes (b'TCB2', b'\x00\x01..'), as the Python reader said it.
std::string BytesRepr(const std::byte* p) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "b'";
  for (int i = 0; i < 4; ++i) {
    auto c = static_cast<unsigned char>(p[i]);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out + "'";
}

}  // namespace

size_t BatchDtypeBytes(BatchDtype dtype) noexcept {
  static constexpr uint8_t kBytes[kBatchDtypes] = {1, 1, 2, 4, 8, 2, 4, 8, 1, 2, 4, 8, 8, 16};
  auto i = static_cast<uint8_t>(dtype);
  return i < kBatchDtypes ? kBytes[i] : 0;
}

std::string ReadBatchArrays(std::span<const std::byte> header, std::span<const std::byte> data,
                            uint32_t* count,
                            const std::function<void(uint32_t, const BatchArray&)>& each) {
  *count = 0;
  if (header.size() < kBatchHeaderBytes)
    return std::string(kWhat) + "a header of " + std::to_string(header.size()) +
           " bytes, where the layout has " + std::to_string(kBatchHeaderBytes);
  const std::byte* h = header.data();
  if (std::memcmp(h, kMagic, 4) != 0)
    return std::string(kWhat) + "bad header magic " + BytesRepr(h) +
           " (a loader of another tailcut version?)";
  const uint32_t n = U32(h + 4);
  const auto where = static_cast<uint8_t>(h[8]);
  const uint64_t at = U64(h + 12), size = U64(h + 20);
  if (where > 1) return std::string(kWhat) + "bad array table place " + std::to_string(where);
  const std::span<const std::byte> table = where == 0 ? header.first(kRangeAt) : data;
  const uint64_t limit = table.size();
  if (at % 8 != 0 || at > limit || size > limit - at || n * kEntryBytes > size)
    return std::string(kWhat) + "a table of " + std::to_string(n) + " arrays in " +
           std::to_string(size) + " bytes at " + std::to_string(at) + " is beyond the " +
           std::to_string(limit) + " bytes that may hold it";
  *count = n;
  const uint64_t end = at + size;
  uint64_t pos = at;
  BatchArray a;
  for (uint32_t i = 0; i < n; ++i) {
    if (end - pos < kEntryBytes)
      return std::string(kWhat) + "its array table ends before array " + std::to_string(i);
    const auto code = static_cast<uint8_t>(table[pos]);
    const auto ndim = static_cast<uint8_t>(table[pos + 1]);
    a.offset = U64(&table[pos + 8]);
    pos += kEntryBytes;
    if (code >= kBatchDtypes || ndim > kBatchMaxDims || end - pos < 8ull * ndim)
      return std::string(kWhat) + "bad entry of array " + std::to_string(i) + " (dtype " +
             std::to_string(code) + ", ndim " + std::to_string(ndim) + ")";
    a.dtype = static_cast<BatchDtype>(code);
    a.ndim = ndim;
    // The bytes, saturating; an empty array's other dimensions still count
    // (numpy refuses a shape whose elements overflow), so both products.
    uint64_t bytes = BatchDtypeBytes(a.dtype), nonzero = bytes;
    bool overflow = false;
    for (uint32_t d = 0; d < ndim; ++d) {
      a.dims[d] = U64(&table[pos + 8 * d]);
      overflow |= __builtin_mul_overflow(bytes, a.dims[d], &bytes);
      if (a.dims[d] != 0) overflow |= __builtin_mul_overflow(nonzero, a.dims[d], &nonzero);
    }
    pos += 8ull * ndim;
    if (overflow || nonzero > (uint64_t{1} << 62))
      return std::string(kWhat) + "array " + std::to_string(i) + " at " + std::to_string(a.offset) +
             " has dimensions of more than 2**62 bytes, beyond the batch's " +
             std::to_string(data.size()) + " bytes";
    if (a.offset > data.size() || bytes > data.size() - a.offset)
      return std::string(kWhat) + "array " + std::to_string(i) + " at " + std::to_string(a.offset) +
             " of " + std::to_string(bytes) + " bytes is beyond the batch's " +
             std::to_string(data.size()) + " bytes";
    a.bytes = bytes;
    each(i, a);
  }
  return "";
}

}  // namespace tailcut
