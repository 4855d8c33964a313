// libFuzzer target: ReadBatchArrays (tailcut/batch_layout.h) over arbitrary
// bytes: the first 256 are a slot's user header, the rest its data. Every
// array it reports must lie inside the data; ASan catches any read past the
// two spans (each a heap block of its own size).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tailcut/batch_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < tailcut::kBatchHeaderBytes) return 0;
  const size_t data_size = size - tailcut::kBatchHeaderBytes;
  auto header = std::make_unique<std::byte[]>(tailcut::kBatchHeaderBytes);
  auto data = std::make_unique<std::byte[]>(data_size);
  std::memcpy(header.get(), bytes, tailcut::kBatchHeaderBytes);
  if (data_size > 0) std::memcpy(data.get(), bytes + tailcut::kBatchHeaderBytes, data_size);
  uint32_t count = 0, seen = 0;
  std::string problem = tailcut::ReadBatchArrays(
      {header.get(), tailcut::kBatchHeaderBytes}, {data.get(), data_size}, &count,
      [&](uint32_t i, const tailcut::BatchArray& a) {
        uint64_t elements = 1;
        for (uint32_t d = 0; d < a.ndim; ++d) elements *= a.dims[d];
        if (i != seen++ || a.offset > data_size || a.bytes > data_size - a.offset ||
            a.ndim > tailcut::kBatchMaxDims ||
            elements * tailcut::BatchDtypeBytes(a.dtype) != a.bytes)
          std::abort();
      });
  if (problem.empty() ? seen != count : problem.rfind("pooled batch: ", 0) != 0) std::abort();
  return 0;
}
