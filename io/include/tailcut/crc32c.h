// tailcut/crc32c.h: CRC32C (Castagnoli) and the TFRecord masking.
//
// Pure functions: thread-safe, noexcept, no allocation. Uses the SSE4.2
// crc32 instruction when the CPU has it (checked once), a table otherwise.
#ifndef TAILCUT_CRC32C_H_
#define TAILCUT_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tailcut/export.h"

namespace tailcut {

// CRC32C of data, continuing from crc (0 to start).
TAILCUT_EXPORT uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0) noexcept;
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
TAILCUT_EXPORT uint32_t MaskCrc32c(uint32_t crc) noexcept;
// Appends one TFRecord (header, data, footer) to *out.
TAILCUT_EXPORT void AppendTfrecord(std::string* out, std::string_view data);

}  // namespace tailcut

#endif  // TAILCUT_CRC32C_H_
