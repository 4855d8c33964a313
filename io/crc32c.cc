// CRC32C, hand-written: the SSE4.2 crc32 instruction when cpuid reports it, a
// slicing-by-8 table otherwise. Small enough that a dependency would cost more
// than it saves; speeds are in docs/record_formats.md.
#include "tailcut/crc32c.h"

#include <array>
#include <cstring>

#include "io/crc32c_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tailcut {
namespace detail {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // Castagnoli, bit-reversed

// kTable[k][b]: the CRC of byte b followed by k zero bytes, so eight table
// lookups advance the CRC by eight bytes at once.
using Table = std::array<std::array<uint32_t, 256>, 8>;
constexpr Table MakeTable() {
  Table t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1)));
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (int b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr Table kTable = MakeTable();

uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void StoreLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

void StoreLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

}  // namespace

uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc) noexcept {
  auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint32_t lo = c ^ LoadLe32(p);
    uint32_t hi = LoadLe32(p + 4);
    c = kTable[7][lo & 0xff] ^ kTable[6][(lo >> 8) & 0xff] ^ kTable[5][(lo >> 16) & 0xff] ^
        kTable[4][lo >> 24] ^ kTable[3][hi & 0xff] ^ kTable[2][(hi >> 8) & 0xff] ^
        kTable[1][(hi >> 16) & 0xff] ^ kTable[0][hi >> 24];
  }
  for (; size > 0; ++p, --size) c = (c >> 8) ^ kTable[0][(c ^ *p) & 0xff];
  return ~c;
}

#if defined(__x86_64__)

bool Crc32cHasHardware() noexcept {
  static const bool has = [] {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2) != 0;
  }();
  return has;
}

// One dependent chain of 8-byte crc32 instructions: about 8 bytes per 3 cycles,
// several GB/s, far above what the parsers need.
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const void* data, size_t size,
                                                          uint32_t crc) noexcept {
  auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; ++p, --size) c32 = __builtin_ia32_crc32qi(c32, *p);
  return ~c32;
}

#else

bool Crc32cHasHardware() noexcept { return false; }

uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc) noexcept {
  return Crc32cTable(data, size, crc);
}

#endif

}  // namespace detail

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) noexcept {
  return detail::Crc32cHasHardware() ? detail::Crc32cHardware(data, size, crc)
                                     : detail::Crc32cTable(data, size, crc);
}

uint32_t MaskCrc32c(uint32_t crc) noexcept { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void AppendTfrecord(std::string* out, std::string_view data) {
  char header[12];
  detail::StoreLe64(header, data.size());
  detail::StoreLe32(header + 8, MaskCrc32c(Crc32c(header, 8)));
  char footer[4];
  detail::StoreLe32(footer, MaskCrc32c(Crc32c(data.data(), data.size())));
  out->append(header, sizeof header);
  out->append(data);
  out->append(footer, sizeof footer);
}

}  // namespace tailcut
