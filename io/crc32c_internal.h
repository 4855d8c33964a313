// io/crc32c_internal.h: the two CRC32C implementations behind tailcut::Crc32c,
// exposed so tests and benchmarks can check and time each one. Not installed.
#ifndef TAILCUT_IO_CRC32C_INTERNAL_H_
#define TAILCUT_IO_CRC32C_INTERNAL_H_

#include <cstddef>
#include <cstdint>

#include "tailcut/export.h"

namespace tailcut::detail {

// True when the CPU has the SSE4.2 crc32 instruction (cpuid, checked once).
TAILCUT_EXPORT bool Crc32cHasHardware() noexcept;
// REQUIRES: Crc32cHasHardware(). Same contract as tailcut::Crc32c.
TAILCUT_EXPORT uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc) noexcept;
// Portable slicing-by-8 table path. Same contract as tailcut::Crc32c.
TAILCUT_EXPORT uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc) noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_CRC32C_INTERNAL_H_
