// The Batcher: packs a Reader's records into batches (see batcher.h).
//
// Invariants:
//  1. Held-back records records_[pending_begin_, pending_begin_ +
//     pending_count_) come from the Reader's current item, and the Reader is
//     not called while any are held back: they stay valid, and they start
//     the next batch.
//  2. Records are held back only when a batch is handed out (kOk), so kEmpty
//     and kEnd leave nothing behind.
#include "tailcut/batcher.h"

#include <algorithm>
#include <new>

namespace tailcut {

Batcher::Batcher(Reader& reader, BatcherOptions options)
    : reader_(reader), options_(std::move(options)) {
  if (options_.max_records == 0) {
    throw Error(ErrorKind::kInvalidArgument, "batcher: max_records must be at least 1");
  }
  records_.resize(options_.max_records);
}

ReadStatus Batcher::Next(Batch* out, Deadline deadline) noexcept {
  return Next(out, options_.max_records, deadline);
}

ReadStatus Batcher::Next(Batch* out, size_t limit, Deadline deadline) noexcept {
  out->data = nullptr;
  out->count = 0;
  out->in_place = false;
  out->storage.clear();
  out->offsets.clear();
  out->files.clear();
  // A forked child's copy: held-back records point into the parent's Reader.
  if (reader_.forked()) return ReadStatus::kForked;
  if (failed_) return ReadStatus::kError;
  if (ended_) return ReadStatus::kEnd;
  size_t want = std::clamp<size_t>(limit, 1, options_.max_records);
  ReadStatus status;
  try {
    status = Fill(out, want, deadline);
  } catch (const std::bad_alloc&) {
    out->count = 0;
    out->storage.clear();
    out->offsets.clear();
    out->files.clear();
    pending_count_ = 0;
    reader_.Close();  // gives back the current item: its records are read again
    return Fail("batcher: out of memory packing a batch of up to " + std::to_string(want) +
                " records; lower max_records or set max_bytes");
  }
  if (status != ReadStatus::kOk) {
    out->count = 0;
    out->storage.clear();
    out->offsets.clear();
    out->files.clear();
  } else if (!out->in_place) {
    out->data = out->storage.data();
  }
  return status;
}

// Records [0, n) back to back in one buffer.
static bool BackToBack(const Record* r, size_t n) {
  for (size_t i = 1; i < n; ++i) {
    if (r[i].data != r[i - 1].data + r[i - 1].size) return false;
  }
  return true;
}

size_t Batcher::Append(const Record* records, size_t n, size_t want, Batch* out) {
  // Invariant 1: new and held-back records alike come from the current item.
  const uint32_t file = reader_.current_item().file;
  size_t i = 0;
  for (; i < n && out->count < want; ++i) {
    const uint64_t bytes = out->storage.size();
    if (options_.max_bytes != 0 && out->count > 0 && bytes + records[i].size > options_.max_bytes)
      break;
    const auto* p = reinterpret_cast<const uint8_t*>(records[i].data);
    out->storage.insert(out->storage.end(), p, p + records[i].size);
    out->offsets.push_back(static_cast<int64_t>(bytes + records[i].size));
    if (options_.record_files) out->files.push_back(file);
    ++out->count;
  }
  return i;
}

ReadStatus Batcher::Fill(Batch* out, size_t want, Deadline deadline) {
  out->offsets.reserve(want + 1);
  out->offsets.push_back(0);
  for (;;) {
    const Record* src;
    size_t n = 0;
    uint64_t epoch = 0;
    const bool from_pending = pending_count_ > 0;
    if (from_pending) {
      // Invariant 1: they start this batch (out->count is 0 here).
      src = records_.data() + pending_begin_;
      n = pending_count_;
      epoch = pending_epoch_;
    } else {
      const bool have = out->count > 0;
      Deadline until = have && options_.short_at_end ? Deadline::min() : deadline;
      ReadStatus status = reader_.NextBatch(records_.data(), want - out->count, &n, until);
      if (status == ReadStatus::kEmpty || status == ReadStatus::kHoldsFinished ||
          status == ReadStatus::kError) {
        // A short batch first; the Reader's error is sticky and comes next call.
        return have ? ReadStatus::kOk : status;
      }
      bool past_epoch = false;
      if (status == ReadStatus::kOk) {
        epoch = reader_.current_item().epoch;
        past_epoch = options_.max_epoch && epoch > *options_.max_epoch;
        // These records are dropped unseen; closing gives their item back whole.
        if (past_epoch) reader_.Close();
      }
      if (status == ReadStatus::kEnd || past_epoch) {
        ended_ = true;
        if (!have || (options_.drop_last && out->count < want)) return ReadStatus::kEnd;
        return ReadStatus::kOk;
      }
      if (have && options_.split_epochs && epoch != out->epoch) {
        pending_begin_ = 0;  // another epoch's item: its records start the next batch
        pending_count_ = n;
        pending_epoch_ = epoch;
        return ReadStatus::kOk;
      }
      src = records_.data();
      if (!have && options_.zero_copy && n == want && BackToBack(src, n)) {
        uint64_t bytes = static_cast<uint64_t>(src[n - 1].data + src[n - 1].size - src[0].data);
        if (options_.max_bytes == 0 || bytes <= options_.max_bytes || n == 1) {
          out->data = reinterpret_cast<const uint8_t*>(src[0].data);
          for (size_t i = 0; i < n; ++i) {
            out->offsets.push_back(static_cast<int64_t>(src[i].data - src[0].data + src[i].size));
          }
          if (options_.record_files) out->files.assign(n, reader_.current_item().file);
          out->count = n;
          out->epoch = epoch;
          out->in_place = true;
          return ReadStatus::kOk;
        }
      }
    }
    if (out->count == 0) out->epoch = epoch;
    size_t used = Append(src, n, want, out);
    if (from_pending) {
      pending_begin_ += used;
      pending_count_ -= used;
    } else if (used < n) {
      pending_begin_ = used;  // over the byte budget: they start the next batch
      pending_count_ = n - used;
      pending_epoch_ = epoch;
    }
    if (pending_count_ > 0 || out->count == want) return ReadStatus::kOk;
  }
}

ReadStatus Batcher::Fail(const std::string& message) noexcept {
  failed_ = true;
  try {
    error_ = message;
  } catch (...) {
  }
  return ReadStatus::kError;
}

const std::string& Batcher::error() const noexcept { return failed_ ? error_ : reader_.error(); }

ErrorKind Batcher::error_kind() const noexcept {
  return failed_ ? ErrorKind::kNoSpace : reader_.error_kind();
}

}  // namespace tailcut
