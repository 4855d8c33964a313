// records()/batches() with shuffle_buffer= and interleave=: the records of
// several items at once, mixed by a tailcut::Shuffler (tailcut/shuffler.h),
// and the batches made of them.
//
// What changes against file order (documented in docs/python.md):
//  * Every record is copied (into the Shuffler's buffer, then into a batch):
//    no zero-copy batches.
//  * interleave Readers share the iterator's buffer_budget_bytes (1/k each)
//    and the process's leases: k Readers with prefetch_items p hold up to
//    k * (p + 1) items, which must fit in leases_per_client.
//  * An item is acked once its records have left the buffer and were used:
//    records() at the next record asked for, batches() once the batches
//    holding them were handed out and the next one is asked for. A process
//    that dies, or an iterator closed early, gives its unacked items back
//    whole: at least once, never lost.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "queue.h"
#include "tailcut/batcher.h"
#include "tailcut/reader.h"
#include "tailcut/shuffler.h"

namespace tailcut::python {

constexpr uint64_t kMaxShuffleBuffer = uint64_t{1} << 24;  // records
constexpr uint64_t kMaxInterleave = 64;                    // the Shuffler's limit

// The shuffle keywords of records() and batches().
struct ShuffleArgs {
  uint64_t buffer = 0;           // shuffle_buffer: records held for shuffling
  uint32_t interleave = 1;       // Readers, each with an item of its own
  std::optional<uint64_t> seed;  // shuffle_seed; unset: the queue's seed
  // Not a keyword: set by batches(), whose ShuffledBatches keeps records in
  // batches after Next and releases them itself (ShufflerOptions::ack_on_next).
  bool batched = false;
  // Records come through a Shuffler (a buffer of one record when only
  // interleave is set: the Readers' records mixed one by one).
  bool on() const { return buffer > 0 || interleave > 1; }
};

// Takes shuffle_buffer, interleave and shuffle_seed out of records()'s or
// batches()'s keywords, range-checked (InvalidArgumentError / TypeError
// naming the argument). REQUIRES: the GIL.
ShuffleArgs PopShuffleArgs(py::kwargs& options);

// Shares one iterator's reader options among args.interleave Readers: each
// gets 1/interleave of buffer_budget_bytes (chunk_bytes, unless given, shrinks
// so that each arena holds 4 chunks), and prefetch_items, unless given,
// becomes 0: the k Readers hold k items. Raises
// InvalidArgumentError naming the options and the fix when they cannot fit. `given`: which options
// the caller set.
struct GivenReaderOptions {
  bool chunk_bytes = false;
  bool prefetch_items = false;
};
void ShareReaderOptions(const QueueHandle& h, const ShuffleArgs& args, const char* caller,
                        GivenReaderOptions given, tc::ReaderOptions* ro);

// A notice callback for a group of Readers that passes each distinct line
// on once (k Readers would otherwise each say "io_uring unavailable").
std::function<void(const std::string&)> OncePerLine(std::function<void(const std::string&)> out);

// Batches of shuffled records, like tc::Batcher over a Reader: records are
// packed in the order the Shuffler hands them out; a batch holds the records
// of one epoch (a record of another epoch -- a late item -- waits in a group
// of its own, handed out when full or at the end). The Shuffler must be
// opened with ack_on_next = false: Next releases (acks the items whose
// records were all handed out) when it holds no record back, since the
// batches before were used then. Used under the ReaderState's mu, one
// thread at a time; the Shuffler must outlive it.
class ShuffledBatches {
 public:
  // record_files: fill Batch::files (tc::BatcherOptions::record_files), each
  // record's file from the Shuffler (tc::Shuffler::kUnknownFile for a record
  // of an old state).
  ShuffledBatches(tc::Shuffler& shuffler, bool short_at_end, bool drop_last, bool record_files)
      : shuffler_(shuffler),
        short_at_end_(short_at_end),
        drop_last_(drop_last),
        record_files_(record_files) {}

  // As tc::Batcher::Next: kOk with 1..want records in out->storage and
  // out->offsets (never in place); kEmpty, kEnd, kError with none. kEmpty
  // comes only with nothing held back (the Shuffler's contract).
  tc::ReadStatus Next(tc::Batch* out, size_t want, tc::Deadline deadline) noexcept;
  const std::string& error() const noexcept { return failed_own_ ? error_ : shuffler_.error(); }
  tc::ErrorKind error_kind() const noexcept {
    return failed_own_ ? tc::ErrorKind::kNoSpace : shuffler_.error_kind();
  }

 private:
  struct Group {
    uint64_t epoch = 0;
    std::vector<uint8_t> data;
    std::vector<int64_t> offsets{0};
    std::vector<uint32_t> files;  // with record_files_: one per record
    size_t count() const { return offsets.size() - 1; }
  };
  // Hands out up to `want` records of groups_[i]; may throw std::bad_alloc.
  void Emit(size_t i, size_t want, tc::Batch* out);
  // After kEnd or kError: the groups left, one per call (short ones dropped
  // at the end with drop_last), then `status`.
  tc::ReadStatus Drain(size_t want, tc::Batch* out, tc::ReadStatus status);

  tc::Shuffler& shuffler_;
  bool short_at_end_;
  bool drop_last_;
  bool record_files_;
  std::vector<Group> groups_;  // records read but not handed out; usually one group
  bool ended_ = false;         // the Shuffler said kEnd
  bool failed_ = false;        // the Shuffler said kError, or memory ran out
  bool failed_own_ = false;    // memory ran out here
  std::string error_;
};

}  // namespace tailcut::python
