// tailcut/batch_layout.h: the arrays of a pooled batch in a BatchRing slot,
// as tailcut.pool's loaders lay them out (docs/ring_layout.md, "Batch layout
// in a slot"; the writer is tailcut/_batch_layout.py's encode_batch).
//
// A batch is any number of C-contiguous arrays in the slot's data, listed by
// a table in the slot's 256-byte user header (or, when it does not fit
// there, in the data after the arrays). ReadBatchArrays reads that table:
// a trainer in C++ gets the arrays a Python loader published, and the
// Python binding makes its numpy views from it.
//
// Contract
//  * Never trusts the bytes: the header and data are shared memory another
//    process wrote. Every field is checked against the bytes that hold it,
//    every size computed without overflow; no array reaches past the data.
//    A batch that does not parse gives the reason (CorruptError's text in
//    Python), never a read out of bounds.
//  * Pure: no allocation of its own on success, no system call; any thread.
//  * The spans are read while the call runs; the caller keeps the batch
//    (its popped slot) until it is done with the arrays.
#ifndef TAILCUT_BATCH_LAYOUT_H_
#define TAILCUT_BATCH_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "tailcut/export.h"

namespace tailcut {

// The user header's size the layout assumes (BatchRing's slots have 256).
inline constexpr size_t kBatchHeaderBytes = 256;
// numpy's limit, and the layout's.
inline constexpr uint32_t kBatchMaxDims = 32;

// The dtype codes of the table, in their order (numpy's names).
enum class BatchDtype : uint8_t {
  kUint8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kFloat32,
  kFloat64,
  kBool,
  kUint16,
  kUint32,
  kUint64,
  kComplex64,
  kComplex128,
};
inline constexpr uint8_t kBatchDtypes = 14;

// Bytes per element of `dtype`.
TAILCUT_EXPORT size_t BatchDtypeBytes(BatchDtype dtype) noexcept;

struct BatchArray {
  BatchDtype dtype;
  uint32_t ndim;
  uint64_t offset;               // of the first byte in the slot data
  uint64_t bytes;                // offset + bytes <= the data's size
  uint64_t dims[kBatchMaxDims];  // the first ndim count; their product * element bytes == bytes
};

// Reads the batch in (`header`, `data`): sets *count to its number of
// arrays, then calls `each(i, array)` for i = 0 .. count - 1 in order.
// Returns "" or what is wrong with the batch (`each` may have been called
// for the arrays before the bad one). *count is set before any call.
TAILCUT_EXPORT std::string ReadBatchArrays(
    std::span<const std::byte> header, std::span<const std::byte> data, uint32_t* count,
    const std::function<void(uint32_t i, const BatchArray& array)>& each);

}  // namespace tailcut

#endif  // TAILCUT_BATCH_LAYOUT_H_
