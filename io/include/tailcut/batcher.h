// tailcut/batcher.h: packs a Reader's records into batches.
//
// A Batcher turns the Reader's records into batches of up to max_records
// records (and, optionally, at most max_bytes bytes): the records back to
// back in one block of memory plus offsets, the layout a trainer copies to
// a device in one go.
//
//   tailcut::ReaderOptions options;
//   options.format = format;
//   auto reader = tailcut::Reader::Open(*queue, options);
//   tailcut::BatcherOptions batching;
//   batching.max_records = 256;
//   tailcut::Batcher batcher(*reader, batching);
//   tailcut::Batch batch;
//   while (batcher.Next(&batch) == tailcut::ReadStatus::kOk) {
//     for (size_t i = 0; i < batch.count; ++i) Use(batch.record(i));
//   }
//   if (!batcher.error().empty()) Fail(batcher.error());
//
// Policy
//  * Epochs: a batch never mixes records of two epochs (split_epochs, on by
//    default). The records of the next epoch's item that ended a batch start
//    the next one.
//  * Byte budget: with max_bytes, a batch ends before a record that would
//    take it past max_bytes; that record starts the next batch. A batch
//    always holds at least one record, so one record larger than max_bytes
//    is a batch of its own.
//  * max_epoch: records of items of a later epoch are never handed out: Next
//    returns kEnd at the first of them and closes the Reader, which gives
//    that item back whole (see Reader::Close), so whoever reads it next
//    reads each of its records once.
//  * Short batches: a batch is short (count < the limit) at the end of the
//    data, before a record of another epoch, at the byte budget, when the
//    deadline passes with records already packed, and after the Reader
//    failed (the records read before the failure are handed out first; the
//    next call returns kError).
//  * End of data and deadlines: as Reader::NextBatch. kEmpty (the deadline
//    passed while other processes hold the last items) comes only with an
//    empty batch and with nothing held back: neither the Batcher nor the
//    Reader holds a record or an item then. With short_at_end, once a batch
//    holds a record the Batcher never waits for other processes' items to
//    fill it: it hands out the short batch instead.
//
// Contract
//  * Threads: one thread at a time, like the Reader. While a Batcher is in
//    use, nothing else may call the Reader's Next* functions: the records
//    held back for the next batch point into the Reader's buffers.
//  * Ownership: the Reader is not owned and must outlive the Batcher. The
//    batch memory belongs to the caller's Batch: Next clears and refills
//    batch->storage and batch->offsets, reusing their capacity (no
//    allocation once they are large enough). The caller may move them out
//    after a call (e.g. to hand them to numpy or torch without a copy); the
//    next call then allocates fresh ones.
//  * In place: with zero_copy, a batch that one Reader call delivers whole,
//    as back-to-back records, is not copied: batch->data points into the
//    Reader's buffers (batch->in_place) and stays valid until the next call
//    on this Batcher or its Reader; storage is left empty.
//  * Lifetime: destroying a Batcher drops the records held back for the next
//    batch. They all come from the Reader's current item, which is not acked
//    yet: closing the Reader gives that item back whole, so they are read
//    again, not lost.
//  * Errors: the constructor throws tailcut::Error (kInvalidArgument) for bad
//    options. Next is noexcept; it allocates only while the batch's vectors
//    grow; running out of memory there is kError (the Reader is then closed,
//    which gives its items back). Errors are sticky.
#ifndef TAILCUT_BATCHER_H_
#define TAILCUT_BATCHER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/export.h"
#include "tailcut/reader.h"

namespace tailcut {

struct BatcherOptions {
  size_t max_records = 256;  // records per batch; > 0
  uint64_t max_bytes = 0;    // bytes per batch; 0: no limit
  bool split_epochs = true;  // never mix two epochs in one batch
  // Once a batch holds a record, do not wait for items that other processes
  // hold to fill it (deadline "now" for the rest of the batch).
  bool short_at_end = false;
  // At the end of the data, drop a last batch shorter than the limit (its
  // records are acked and lost to this job) and return kEnd.
  bool drop_last = false;
  bool zero_copy = false;             // hand out whole back-to-back batches in place
  std::optional<uint64_t> max_epoch;  // stop at the first item past it
  // Fill Batch::files: which work file each record came from (a batch may
  // hold the records of several items). One push_back per record, so off
  // unless asked for (format "file", whose records are whole files).
  bool record_files = false;
};

// One batch: record i is data[offsets[i], offsets[i + 1]).
struct Batch {
  const uint8_t* data = nullptr;  // storage.data(), or the Reader's buffers when in_place
  size_t count = 0;
  uint64_t epoch = 0;     // of every record in the batch
  bool in_place = false;  // data points into the Reader's buffers (zero_copy)
  // uint8_t so that the vectors can be handed to numpy / torch as they are.
  std::vector<uint8_t> storage;
  std::vector<int64_t> offsets;  // count + 1 entries; offsets[0] == 0
  // With BatcherOptions::record_files: record i came from works[files[i]]
  // (WorkItem::file); count entries. Empty otherwise.
  std::vector<uint32_t> files;

  size_t bytes() const noexcept { return count == 0 ? 0 : static_cast<size_t>(offsets[count]); }
  std::string_view record(size_t i) const noexcept {
    return {reinterpret_cast<const char*>(data) + offsets[i],
            static_cast<size_t>(offsets[i + 1] - offsets[i])};
  }
};

class TAILCUT_EXPORT Batcher {
 public:
  // Throws tailcut::Error(kInvalidArgument) when max_records is 0.
  Batcher(Reader& reader, BatcherOptions options);
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // The next batch of up to options.max_records records. kOk: *out holds
  // count >= 1 records. kEnd, kEmpty, kError: out->count == 0.
  ReadStatus Next(Batch* out, Deadline deadline = Deadline::max()) noexcept;
  // The same with at most `limit` records (limit >= 1; capped at max_records).
  ReadStatus Next(Batch* out, size_t limit, Deadline deadline = Deadline::max()) noexcept;

  // Records read from the Reader but held back for the next batch.
  size_t held_back() const noexcept { return pending_count_; }
  // After kError: what failed (the Reader's error, or the Batcher's own).
  const std::string& error() const noexcept;
  ErrorKind error_kind() const noexcept;
  const BatcherOptions& options() const noexcept { return options_; }

 private:
  // Appends records [0, n) of `records` to *out within the limits; returns
  // how many fit. May throw std::bad_alloc.
  size_t Append(const Record* records, size_t n, size_t want, Batch* out);
  ReadStatus Fill(Batch* out, size_t want, Deadline deadline);
  ReadStatus Fail(const std::string& message) noexcept;

  Reader& reader_;
  BatcherOptions options_;
  std::vector<Record> records_;  // what the last Reader call handed out
  size_t pending_begin_ = 0;     // records_[pending_begin_, + pending_count_) wait
  size_t pending_count_ = 0;
  uint64_t pending_epoch_ = 0;
  bool ended_ = false;  // kEnd next (the end, or max_epoch, came after a short batch)
  std::string error_;   // the Batcher's own error (out of memory)
  bool failed_ = false;
};

}  // namespace tailcut

#endif  // TAILCUT_BATCHER_H_
