// The Reader's consumer side: record windows over the chunks, records joined
// across chunks in the carry buffer, raw chunks, and closing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/reader_impl.h"

namespace tailcut {

// ---- Records ---------------------------------------------------------------

// Window mode, window used up: the next chunk becomes the window.
bool Reader::Impl::TakeWindowChunk(HeldItem& it) noexcept {
  if (win_chunk_ != kNone) {
    ReleaseChunk(win_chunk_);
    win_chunk_ = kNone;
    ReportProgress(it, it.parser->position());
    Refill();
  }
  uint32_t c = NextChunkOf(it);
  if (c == kNone) return false;
  const ChunkBuffer& ch = chunks_[c];
  uint64_t start = stream_off_ - ch.offset;
  win_chunk_ = c;
  win_ = arena_->chunk(c) + start;
  win_size_ = ch.want - start;
  win_end_off_ = ch.offset + ch.want;
  stream_off_ = win_end_off_;
  return true;
}

// Carry mode: copies more bytes of the stream into the carry buffer.
bool Reader::Impl::AppendCarry(HeldItem& it) noexcept {
  if (src_chunk_ == kNone || src_used_ == src_size_) {
    if (src_chunk_ != kNone) {
      ReleaseChunk(src_chunk_);
      src_chunk_ = kNone;
      Refill();
    }
    uint32_t c = NextChunkOf(it);
    if (c == kNone) return false;
    const ChunkBuffer& ch = chunks_[c];
    uint64_t start = stream_off_ - ch.offset;
    src_chunk_ = c;
    src_ = arena_->chunk(c) + start;
    src_size_ = ch.want - start;
    src_used_ = 0;
    stream_off_ = ch.offset + ch.want;
  }
  uint64_t cap = carry_->capacity();
  uint64_t step = std::max<uint64_t>(carry_size_, kCarryStep);
  if (carry_start_ + carry_size_ + step > cap && carry_start_ > 0) {
    std::memmove(carry_->data(), carry_->data() + carry_start_, carry_size_);
    carry_start_ = 0;
  }
  uint64_t grow =
      std::min<uint64_t>({step, src_size_ - src_used_, cap - carry_start_ - carry_size_});
  if (grow == 0) {
    char what[160];
    snprintf(what, sizeof what, "record larger than max_record_bytes (%" PRIu64 "); raise it",
             options_.format.max_record_bytes);
    FailItem(it, it.parser->position(), what, ErrorKind::kCorrupt);
    return false;
  }
  std::memcpy(carry_->data() + carry_start_ + carry_size_, src_ + src_used_, grow);
  carry_size_ += grow;
  carry_end_off_ += grow;
  src_used_ += grow;
  carry_->Touch(carry_start_ + carry_size_);
  Bump(stats_.carried_bytes, grow);
  return true;
}

// Carry mode: once the carry holds only bytes that the source chunk still has
// in place, parse from the chunk again.
void Reader::Impl::LeaveCarryIfPossible() noexcept {
  if (src_chunk_ == kNone || carry_size_ > src_used_) return;
  win_chunk_ = src_chunk_;
  win_ = src_ + (src_used_ - carry_size_);
  win_size_ = src_size_ - (src_used_ - carry_size_);
  win_end_off_ = stream_off_;
  src_chunk_ = kNone;
  carry_mode_ = false;
  carry_start_ = carry_size_ = 0;
  // No Trim() here: the record just handed out may live in the carry buffer.
}

// How far ahead of the record being handed out the Reader claims its item,
// at most: never more than a chunk. What is claimed no idle process can take.
constexpr uint64_t kClaimStep = 16 << 10;

// The parser needs more bytes than the window has.
bool Reader::Impl::MoreBytes(HeldItem& it) noexcept {
  if (!carry_mode_) {
    if (win_size_ == 0) return TakeWindowChunk(it);
    // A record crosses the chunk's end: carry its head over. Records from
    // the last carry are dead now (a batch ends before this), so pages a
    // huge one left behind can go.
    carry_->Trim();
    std::memcpy(carry_->data(), win_, win_size_);
    carry_->Touch(win_size_);
    Bump(stats_.carried_bytes, win_size_);
    carry_mode_ = true;
    carry_start_ = 0;
    carry_size_ = win_size_;
    carry_end_off_ = win_end_off_;
    ReleaseChunk(win_chunk_);
    win_chunk_ = kNone;
    win_size_ = 0;
    ReportProgress(it, it.parser->position());
    Refill();
  }
  return AppendCarry(it);
}

ReadStatus Reader::Impl::Produce(Record* out, size_t max, size_t* n) noexcept {
  *n = 0;
  if (failed_) return ReadStatus::kError;
  if (closed_ || ended_) return ReadStatus::kEnd;
  if (options_.mode != ReadMode::kRecords) {
    return Fail("reader: NextRecord/NextBatch need ReaderOptions::mode = kRecords",
                ErrorKind::kInvalidArgument);
  }
  if (max == 0) return ReadStatus::kOk;
  for (;;) {
    if (!active_) {
      ReadStatus status = Activate();
      if (status != ReadStatus::kOk) return status;
    }
    HeldItem& it = Current();
    if (it.done || it.stale) {
      if (*n > 0) return ReadStatus::kOk;  // ack on the next call, after these are used
      if (it.done) {
        FinishItem();
      } else {
        RetireFront();
      }
      continue;
    }
    if (!it.begun || it.parse_failed) {
      // Failed before any read (open, size, Begin), or bad data: hand out
      // what this batch holds first.
      if (*n > 0) return ReadStatus::kOk;
      return FailWith(it);
    }
    const std::byte* window;
    size_t size;
    bool eof;
    if (carry_mode_) {
      window = carry_->data() + carry_start_;
      size = carry_size_;
      eof = carry_end_off_ >= it.file_size;
    } else {
      window = win_;
      size = win_size_;
      eof = win_end_off_ >= it.file_size;
    }
    Record record;
    size_t consumed = 0;
    ParseStatus status = it.parser->Next(window, size, eof, &record, &consumed);
    if (carry_mode_) {
      carry_start_ += consumed;
      carry_size_ -= consumed;
    } else {
      win_ += consumed;
      win_size_ -= consumed;
    }
    switch (status) {
      case ParseStatus::kRecord:
        // Claim in small steps as records go out, not a chunk at a time, so
        // that an idle process can split off the tail of a slow consumer's
        // item even within the chunk being read. A record at or past the
        // end that a split just left us belongs to the thief: not handed out.
        if (record.offset >= it.claimed) {
          uint64_t end_before = it.end;
          ClaimUpTo(it, record.offset + std::min(kClaimStep, chunk_bytes_));
          if (it.stale) break;
          if (it.end < end_before && record.offset >= it.end) {
            it.done = true;
            break;
          }
        }
        out[(*n)++] = record;
        ++it.unreported;
        Bump(stats_.records);
        // Leaving the carry buffer moves no bytes: records in it stay valid.
        if (carry_mode_) LeaveCarryIfPossible();
        if (*n == max) return ReadStatus::kOk;
        break;
      case ParseStatus::kDone:
        it.done = true;
        break;
      case ParseStatus::kError:
        it.parse_failed = true;
        it.error_kind = ErrorKind::kCorrupt;
        SetText(&it.error, "%s", it.parser->error().c_str());
        break;
      case ParseStatus::kNeedMore:
        if (carry_mode_ && consumed > 0) LeaveCarryIfPossible();
        // Getting more bytes may release or move what earlier records of
        // this batch point into: end the batch first.
        if (*n > 0) return ReadStatus::kOk;
        if (!MoreBytes(it)) return it.failed ? FailWith(it) : Fail("reader: the ring failed");
        break;
    }
  }
}

ReadStatus Reader::Impl::ProduceChunk(ChunkView* out) noexcept {
  if (failed_) return ReadStatus::kError;
  if (closed_ || ended_) return ReadStatus::kEnd;
  if (options_.mode != ReadMode::kChunks) {
    return Fail("reader: NextChunk needs ReaderOptions::mode = kChunks",
                ErrorKind::kInvalidArgument);
  }
  for (;;) {
    if (!active_) {
      ReadStatus status = Activate();
      if (status != ReadStatus::kOk) return status;
    }
    HeldItem& it = Current();
    if (handed_chunk_ != kNone) {
      ReleaseChunk(handed_chunk_);
      handed_chunk_ = kNone;
      ReportProgress(it, stream_off_);
      Refill();
    }
    if (it.stale) {
      RetireFront();
      continue;
    }
    if (!it.begun) return FailWith(it);
    if (stream_off_ >= it.end) {
      FinishItem();
      continue;
    }
    uint32_t c = NextChunkOf(it);
    if (c == kNone) return it.failed ? FailWith(it) : Fail("reader: the ring failed");
    const ChunkBuffer& ch = chunks_[c];
    ClaimUpTo(it, ch.offset + ch.want);
    if (it.stale || stream_off_ >= it.end) {
      ReleaseChunk(c);  // the rest of the item is someone else's now
      continue;
    }
    uint64_t start = stream_off_ - ch.offset;
    uint64_t stop = std::min(ch.offset + ch.want, it.end);
    out->data = arena_->chunk(c) + start;
    out->size = stop - stream_off_;
    out->offset = stream_off_;
    stream_off_ = stop;
    handed_chunk_ = c;
    ++it.unreported;
    Bump(stats_.records);
    return ReadStatus::kOk;
  }
}

void Reader::Impl::Close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (!arena_ || !backend_) return;  // Open failed half-way
  while (in_flight_ > 0) {
    int n = backend_->Reap(results_.data(), static_cast<int>(results_.size()), true);
    if (n < 0) break;  // the ring is broken; exiting it below cancels the reads
    for (int i = 0; i < n; ++i) {
      // No resubmission now: a read that ends here is done, whatever it got.
      uint32_t c = static_cast<uint32_t>(results_[i].tag);
      ChunkBuffer& ch = chunks_[c];
      HeldItem& it = items_[ch.item];
      --in_flight_;
      --it.in_flight;
      if (it.gen != ch.item_gen || it.state != ItemState::kHeld) {
        ReleaseChunk(c);  // an orphan; its item's fds are closed below
      } else {
        ch.state = ChunkState::kFailed;  // still in its item's ring; GiveBackAll frees it
      }
    }
  }
  GiveBackAll();
  for (HeldItem& it : items_) {
    if (it.fd >= 0) close(it.fd);
    if (it.fd_other >= 0) close(it.fd_other);
    it.fd = it.fd_other = -1;
    it.state = ItemState::kFree;
  }
  backend_.reset();
}

}  // namespace tailcut
