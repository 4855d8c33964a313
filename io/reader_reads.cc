// The Reader's reads: issuing them (the current item first, then those taken
// ahead), reaping completions, resubmitting short and interrupted ones.
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

// ---- Reads -----------------------------------------------------------------

// Issues reads while the queue depth and the pool allow: the current item
// first, then the prefetched ones in take order, then takes one more item if
// every held item's reads are issued (at most prefetch_items ahead).
void Reader::Impl::Refill() noexcept {
  if (failed_ || closed_) return;
  bool issued = false;
  while (in_flight_ < queue_depth_ && !free_.empty()) {
    uint32_t target = kNone;
    uint32_t others_busy = 0;
    for (uint32_t i = 0; i < held_count_; ++i) {
      HeldItem& it = items_[HeldAt(i)];
      if (i > 0 || !active_) others_busy += it.count;
      if (target == kNone && !it.failed && it.read_end < it.plan_end) {
        target = HeldAt(i);
        if (i == 0 && active_) break;
      }
    }
    if (target == kNone) {
      if (queue_end_ || held_count_ >= options_.prefetch_items + 1 || !active_) break;
      bool slot_free = false;
      for (const HeldItem& it : items_) slot_free |= it.state == ItemState::kFree;
      if (!slot_free) break;
      WorkItem item;
      TakeStatus status = queue_.TryTake(&item);
      if (QueueGone(status)) break;
      if (status == TakeStatus::kEnd) queue_end_ = true;
      if (status != TakeStatus::kOk) break;
      StartItem(item);
      continue;
    }
    // Invariant 3: later items leave two chunks for the current one.
    bool current = active_ && target == held_[held_head_];
    if (!current && others_busy + 2 >= num_chunks_) break;
    Issue(target);
    issued = true;
  }
  if (issued) backend_->Submit();
}

void Reader::Impl::Issue(uint32_t slot) noexcept {
  HeldItem& it = items_[slot];
  uint32_t c = free_.back();
  free_.pop_back();
  ChunkBuffer& ch = chunks_[c];
  uint64_t limit = AlignUp(it.plan_end, it.align);
  ch.state = ChunkState::kInFlight;
  ch.item = slot;
  ch.item_gen = it.gen;
  ch.offset = it.read_end;
  ch.len = static_cast<uint32_t>(std::min(chunk_bytes_, limit - it.read_end));
  ch.want = static_cast<uint32_t>(std::min<uint64_t>(ch.len, it.file_size - it.read_end));
  ch.done = 0;
  ch.fd = it.fd;
  ch.direct = it.direct;
  ch.retries = 0;
  it.read_end += ch.len;
  it.Push(c);
  ++it.in_flight;
  // The stall clock starts when the device goes from idle to busy.
  if (in_flight_ == 0) last_completion_ = std::chrono::steady_clock::now();
  ++in_flight_;
  Bump(stats_.reads);
  backend_->Prepare(ReadRequest{ch.fd, arena_->chunk(c), ch.len, ch.offset, c, ch.direct});
}

void Reader::Impl::Resubmit(uint32_t c) noexcept {
  ChunkBuffer& ch = chunks_[c];
  ++items_[ch.item].in_flight;
  ++in_flight_;
  Bump(stats_.reads);
  backend_->Prepare(ReadRequest{ch.fd, arena_->chunk(c) + ch.done, ch.len - ch.done,
                                ch.offset + ch.done, c, ch.direct});
}

void Reader::Impl::Pump(bool wait) noexcept {
  if (in_flight_ == 0) return;
  int n = backend_->Reap(results_.data(), static_cast<int>(results_.size()), wait);
  auto now = std::chrono::steady_clock::now();
  if (n > 0) {
    last_completion_ = now;
    stall_noticed_ = false;
  } else if (n == 0 && wait) {
    // The backend waited about a second for nothing; callers wait again.
    if (!stall_noticed_ && now - last_completion_ >= kStallNotice) {
      stall_noticed_ = true;
      std::string oldest;
      for (const ChunkBuffer& ch : chunks_) {
        if (ch.state != ChunkState::kInFlight) continue;
        SetText(&oldest, "'%s' at offset %" PRIu64, std::string(items_[ch.item].item.path).c_str(),
                ch.offset + ch.done);
        break;
      }
      Notice("tailcut reader: " + std::to_string(in_flight_) + " reads in flight for " +
             std::to_string(kStallNotice.count()) + " s without a completion (e.g. " + oldest +
             "); the device or filesystem may be stuck; still waiting");
    }
  }
  if (n < 0) {
    // The ring itself failed (not one read): nothing in flight can be trusted.
    std::string text;
    SetText(&text, "reader: waiting for reads failed: %s", strerror(-n));
    Fail(text);
    return;
  }
  for (int i = 0; i < n; ++i) Complete(results_[i]);
  backend_->Submit();  // resubmissions
  Refill();
}

void Reader::Impl::Complete(const ReadResult& result) noexcept {
  uint32_t c = static_cast<uint32_t>(result.tag);
  ChunkBuffer& ch = chunks_[c];
  HeldItem& it = items_[ch.item];
  --in_flight_;
  --it.in_flight;
  if (it.gen != ch.item_gen || it.state != ItemState::kHeld) {
    // An orphan: its item was finished, given back or failed meanwhile.
    ch.state = ChunkState::kFree;
    free_.push_back(c);
    if (it.state == ItemState::kRetiring && it.in_flight == 0) {
      if (it.fd >= 0) close(it.fd);
      if (it.fd_other >= 0) close(it.fd_other);
      it.fd = it.fd_other = -1;
      it.state = ItemState::kFree;
    }
    return;
  }
  int res = result.res;
  uint64_t at = ch.offset + ch.done;
  if (res == -EAGAIN || res == -EINTR) {
    Bump(stats_.retries);
    if (++ch.retries <= kMaxRetries) return Resubmit(c);
  }
  if (res == -EINVAL && ch.direct) {
    // The filesystem took O_DIRECT at open but refuses the read: read this
    // file buffered from here on.
    if (it.direct) {
      int fd = open(std::string(it.item.path).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        it.fd_other = it.fd;
        it.fd = fd;
        it.direct = false;
        struct stat st {};
        if (fstat(fd, &st) == 0 && direct_fallback_devices_.insert(st.st_dev).second) {
          Notice("tailcut reader: O_DIRECT reads fail for '" + std::string(it.item.path) +
                 "' (Invalid argument); reading files on its filesystem buffered");
        }
      }
    }
    if (!it.direct) {
      ch.fd = it.fd;
      ch.direct = false;
      return Resubmit(c);
    }
  }
  char what[256];
  if (res < 0) {
    snprintf(what, sizeof what, "read of %u bytes failed: %s", ch.len - ch.done, strerror(-res));
  } else if (res == 0 && ch.done < ch.want) {
    snprintf(what, sizeof what,
             "read returned end of file, %" PRIu64
             " bytes expected "
             "(file truncated while reading?)",
             it.file_size - at);
  } else {
    ch.done += static_cast<uint32_t>(res);
    Bump(stats_.bytes_read, static_cast<uint64_t>(res));
    if (ch.done >= ch.want) {
      ch.state = ChunkState::kReady;
      return;
    }
    Bump(stats_.short_reads);
    if (!ch.direct || ch.done % it.align == 0) return Resubmit(c);
    // A direct read ends off a block boundary only at the end of the file.
    at = ch.offset + ch.done;
    snprintf(what, sizeof what,
             "read returned end of file, %" PRIu64
             " bytes expected "
             "(file truncated while reading?)",
             it.file_size - at);
  }
  ch.state = ChunkState::kFailed;
  FailItem(it, at, what);
  it.plan_end = it.read_end;  // issue nothing more for it
}

void Reader::Impl::ReleaseChunk(uint32_t c) noexcept {
  if (chunks_[c].state == ChunkState::kFree) return;  // cannot happen; never free twice
  chunks_[c].state = ChunkState::kFree;
  free_.push_back(c);
}

// The current item's next chunk, ready; kNone when the item failed there (or
// has no more bytes: the parser wanted more than the file has).
uint32_t Reader::Impl::NextChunkOf(HeldItem& it) noexcept {
  for (;;) {
    if (failed_) return kNone;
    if (it.count > 0) {
      ChunkBuffer& ch = chunks_[it.Front()];
      if (ch.state == ChunkState::kReady) {
        uint32_t c = it.Pop();
        ch.state = ChunkState::kConsumer;
        return c;
      }
      if (ch.state == ChunkState::kFailed) return kNone;
      Pump(true);  // in flight
      continue;
    }
    if (it.failed) return kNone;
    if (it.read_end >= it.file_size) {
      FailItem(it, it.read_end, "the parser needs bytes past the end of the file");
      return kNone;
    }
    if (it.read_end >= it.plan_end) {
      // The last record runs past what was planned: read on, more each time.
      it.plan_end = std::min(it.file_size, it.read_end + it.extend);
      it.extend *= 2;
    }
    Refill();
    if (it.count == 0) Pump(true);  // wait for a slot in the queue depth
  }
}

}  // namespace tailcut
