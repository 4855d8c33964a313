// io/reader_counters.h: a reader's ReaderStats as counters its one reading
// thread bumps and any thread reads (Reader, GlobalOrderReader).
//
// Single writer: Bump is a relaxed load and store, no locked instruction;
// Snapshot reads each counter relaxed, so a snapshot taken while the reader
// runs may mix counts of a moment apart (each one exact), which is all a
// stats() caller is promised.
#ifndef TAILCUT_IO_READER_COUNTERS_H_
#define TAILCUT_IO_READER_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "tailcut/reader.h"

namespace tailcut::detail {

inline void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

struct ReaderCounters {
  std::atomic<uint64_t> bytes_read{0}, records{0}, items_taken{0}, items_acked{0},
      items_given_back{0}, reads{0}, short_reads{0}, retries{0}, carried_bytes{0}, stale_items{0};

  ReaderStats Snapshot() const noexcept {
    ReaderStats s;
    s.bytes_read = bytes_read.load(std::memory_order_relaxed);
    s.records = records.load(std::memory_order_relaxed);
    s.items_taken = items_taken.load(std::memory_order_relaxed);
    s.items_acked = items_acked.load(std::memory_order_relaxed);
    s.items_given_back = items_given_back.load(std::memory_order_relaxed);
    s.reads = reads.load(std::memory_order_relaxed);
    s.short_reads = short_reads.load(std::memory_order_relaxed);
    s.retries = retries.load(std::memory_order_relaxed);
    s.carried_bytes = carried_bytes.load(std::memory_order_relaxed);
    s.stale_items = stale_items.load(std::memory_order_relaxed);
    return s;
  }
};

}  // namespace tailcut::detail

#endif  // TAILCUT_IO_READER_COUNTERS_H_
