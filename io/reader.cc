// The Reader: takes items, keeps reads in flight, joins records across chunks.
// This file: setup (option checks, item slots and parsers, the arena, the
// I/O backend), the items a Reader holds, and the public class; the state
// and its invariants are in reader_impl.h.
#include "tailcut/reader.h"

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
#include "tailcut/work_file.h"

namespace tailcut {

namespace detail {

void SetText(std::string* out, const char* format, ...) noexcept {
  char text[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  try {
    out->assign(text);
  } catch (...) {
  }
}

}  // namespace detail

// ---- Setup -----------------------------------------------------------------

// Each step may throw tailcut::Error, naming the option or file and the fix;
// a Reader whose Open throws is destroyed half set up (Close allows for it).
void Reader::Impl::Open() {
  if (queue_.num_samples() != 0)
    throw Error(ErrorKind::kInvalidArgument,
                "reader: queue '" + queue_.name() +
                    "' is an index work (num_samples=" + std::to_string(queue_.num_samples()) +
                    "): it has no file to read; take its items and walk their sample "
                    "indices instead");
  CheckGeometry();
  SetUpItems();  // a bad format is an argument error before any memory is mapped
  SetUpArena();
  SetUpBackend();
  SetUpChunks();
}

void Reader::Impl::CheckGeometry() {
  if (options_.buffer_budget_bytes == 0 || options_.chunk_bytes == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "reader: buffer_budget_bytes and chunk_bytes must be > 0");
  }
  chunk_bytes_ = AlignUp(options_.chunk_bytes, kPage);
  if (chunk_bytes_ > kMaxChunkBytes) {
    throw Error(
        ErrorKind::kInvalidArgument,
        "reader: chunk_bytes (" + std::to_string(options_.chunk_bytes) + ") must be at most 1 GiB");
  }
  uint64_t chunks = options_.buffer_budget_bytes / chunk_bytes_;
  if (chunks < 3) {
    throw Error(ErrorKind::kInvalidArgument,
                "reader: buffer_budget_bytes (" + std::to_string(options_.buffer_budget_bytes) +
                    ") must hold at least 3 chunks of chunk_bytes (" +
                    std::to_string(chunk_bytes_) + "); raise the budget or lower chunk_bytes");
  }
  if (chunks > (1u << 20)) {
    throw Error(ErrorKind::kInvalidArgument,
                "reader: buffer_budget_bytes / chunk_bytes is " + std::to_string(chunks) +
                    " chunks; use larger chunks (at most 1048576 chunks)");
  }
  num_chunks_ = static_cast<uint32_t>(chunks);
  queue_depth_ = options_.queue_depth != 0
                     ? options_.queue_depth
                     : std::min<uint32_t>(16, std::max<uint32_t>(1, num_chunks_ / 2));
  queue_depth_ = std::min(queue_depth_, num_chunks_ - 2);
}

void Reader::Impl::SetUpItems() {
  uint32_t slots = options_.prefetch_items + 3;  // current + prefetched + retiring
  items_.resize(slots);
  if (options_.mode == ReadMode::kRecords) {
    if (!options_.format.FitsTag(queue_.format())) {
      throw Error(ErrorKind::kInvalidArgument,
                  "reader: queue '" + queue_.name() + "' was made with format '" + queue_.format() +
                      "', not '" + options_.format.Tag() +
                      "': every process must read a queue's items the same way; open the Reader "
                      "with the queue's format");
    }
    for (HeldItem& it : items_) it.parser = RecordParser::Create(options_.format);
    carry_ = std::make_unique<CarryBuffer>(
        AlignUp(options_.format.max_record_bytes + 2 * kCarryStep, kPage));
  }
  for (HeldItem& it : items_) it.order.assign(num_chunks_, kNone);
  held_.assign(slots, kNone);
  finished_.reserve(slots);

  // Expected file sizes: what the queue sliced, so every process agrees on
  // where each file ends whatever happened to it since.
  file_sizes_.assign(queue_.paths().size(), 0);
  for (const WorkQueue::Item& item : queue_.items()) {
    if (item.file < file_sizes_.size())
      file_sizes_[item.file] = std::max(file_sizes_[item.file], item.end);
  }
}

void Reader::Impl::SetUpArena() {
  auto notice = [this](const std::string& line) { Notice(line); };
  arena_ = std::make_unique<BufferArena>(chunk_bytes_, num_chunks_, options_.cuda_register, notice);
}

namespace {

// The backend asked for: ReaderOptions::backend, else TAILCUT_IO, else
// io_uring (which falls back to pread threads unless it was asked for).
struct BackendChoice {
  IoBackend backend;
  bool forced;
  bool forced_by_env;
};

BackendChoice ChooseBackend(IoBackend asked) {
  if (asked != IoBackend::kDefault) return {asked, true, false};
  const char* env = std::getenv("TAILCUT_IO");
  if (!env || !*env) return {IoBackend::kUring, false, false};
  if (std::strcmp(env, "uring") == 0) return {IoBackend::kUring, true, true};
  if (std::strcmp(env, "pread") == 0) return {IoBackend::kPread, true, true};
  throw Error(ErrorKind::kInvalidArgument,
              std::string("TAILCUT_IO='") + env + "' is not 'uring' or 'pread'");
}

}  // namespace

void Reader::Impl::SetUpBackend() {
  const BackendChoice choice = ChooseBackend(options_.backend);
  uint32_t threads = options_.pread_threads == 0 ? 2 : options_.pread_threads;
  bool registered = false;
  if (choice.backend == IoBackend::kUring) {
    detail::UringSettings settings;
    settings.queue_depth = queue_depth_;
    settings.arena = arena_->data();
    settings.arena_bytes = arena_->size();
    settings.async_buffered = options_.uring_async_buffered;
    settings.max_async_workers = threads;
    int err = 0;
    std::string problem;
    backend_ = detail::MakeUringBackend(settings, &err, &problem);
    if (!backend_) {
      const char* hint = err == ENOSYS   ? " (kernel too old, or seccomp blocks io_uring)"
                         : err == EPERM  ? " (kernel.io_uring_disabled, or seccomp)"
                         : err == ENOMEM ? " (RLIMIT_MEMLOCK too low for the ring)"
                                         : "";
      if (choice.forced_by_env) {
        throw Error(ErrorKind::kIo,
                    "reader: io_uring was asked for (TAILCUT_IO=uring) but is "
                    "unavailable: " +
                        problem + hint +
                        "; unset TAILCUT_IO to fall back to pread threads, or "
                        "set TAILCUT_IO=pread");
      }
      if (choice.forced) {
        throw Error(ErrorKind::kIo,
                    "reader: io_uring was asked for (backend 'uring') but is "
                    "unavailable: " +
                        problem + hint +
                        "; use backend 'pread', or leave the backend unset to "
                        "fall back to pread threads");
      }
      Notice("tailcut reader: io_uring unavailable: " + problem + hint + "; reading with " +
             std::to_string(threads) + " pread threads (TAILCUT_IO=pread silences this)");
    } else {
      registered = backend_->registered();
      if (!registered && !problem.empty()) {
        Notice("tailcut reader: " + problem + "; reading into unregistered buffers");
      }
    }
  }
  if (!backend_) backend_ = detail::MakePreadBackend(threads, queue_depth_);
  memory_state_ = arena_->Describe(registered, std::strcmp(backend_->name(), "io_uring") == 0);
}

void Reader::Impl::SetUpChunks() {
  chunks_.resize(num_chunks_);
  free_.reserve(num_chunks_);
  for (uint32_t i = num_chunks_; i-- > 0;) free_.push_back(i);
  results_.resize(std::max<uint32_t>(queue_depth_, 16));
  win_ = arena_->data();
  src_ = arena_->data();
}

// ---- Items -----------------------------------------------------------------

bool Reader::Impl::OpenFile(HeldItem& it) noexcept {
  std::string path(it.item.path);
  const char* p = path.c_str();
  const FileIdentity& then = queue_.files()[it.item.file];
  it.direct = options_.direct;
  it.align = 1;
  WorkFile file = OpenWorkFile(path, &then, it.direct ? O_DIRECT : 0);
  if (file.fd < 0 && it.direct && file.open_errno == EINVAL) {
    struct stat st {};
    if (stat(p, &st) == 0 && direct_fallback_devices_.insert(st.st_dev).second) {
      Notice("tailcut reader: O_DIRECT is not supported for '" + path +
             "' (open: Invalid argument); reading files on its filesystem buffered");
    }
    it.direct = false;
    file = OpenWorkFile(path, &then);
  }
  if (file.fd < 0) {
    it.error = std::move(file.error);
    it.error_kind = file.kind;
    return false;
  }
  it.fd = file.fd;
  const struct stat& st = file.st;
  if (it.direct) {
    // Direct-I/O alignment: statx(STATX_DIOALIGN) where the kernel has it
    // (6.1+); else 4 KiB, a multiple of every common logical block size.
    uint64_t align = kPage;
    struct statx sx {};
    if (statx(it.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN)) {
      align = std::max<uint64_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 1});
      if (sx.stx_dio_offset_align == 0) align = 0;  // no direct I/O on this file
    }
    if (align == 0 || align > kPage || chunk_bytes_ % align != 0) {
      if (direct_fallback_devices_.insert(st.st_dev).second) {
        Notice("tailcut reader: O_DIRECT is not supported for '" + path +
               (align == 0 ? std::string("' (statx: no direct-I/O alignment)")
                           : "' (alignment " + std::to_string(align) + ")") +
               "; reading files on its filesystem buffered");
      }
      WorkFile buffered = OpenWorkFile(path, &then);
      if (buffered.fd < 0) {
        it.error = std::move(buffered.error);
        it.error_kind = buffered.kind;
        return false;
      }
      close(it.fd);
      it.fd = buffered.fd;
      it.direct = false;
    } else {
      it.align = align;
    }
  }
  if (!it.direct) posix_fadvise(it.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return true;
}

bool Reader::Impl::StartItem(const WorkItem& item) noexcept {
  uint32_t slot = kNone;
  for (uint32_t i = 0; i < items_.size(); ++i) {
    if (items_[i].state == ItemState::kFree) {
      slot = i;
      break;
    }
  }
  if (slot == kNone) return false;  // the caller checked; cannot happen
  HeldItem& it = items_[slot];
  it.state = ItemState::kHeld;
  it.item = item;
  it.fd = it.fd_other = -1;
  it.head = it.count = 0;
  it.begun = it.failed = it.parse_failed = it.done = it.stale = false;
  it.error.clear();
  it.error_kind = ErrorKind::kIo;
  it.error_at = UINT64_MAX;
  it.unreported = 0;
  it.used = item.begin;
  it.file_size = item.file < file_sizes_.size() ? file_sizes_[item.file] : item.end;
  it.end = item.end;
  it.claimed = item.begin;
  it.feed_start = it.read_end = it.plan_end = item.begin;
  it.extend = chunk_bytes_;
  held_[(held_head_ + held_count_) % held_.size()] = slot;
  ++held_count_;
  Bump(stats_.items_taken);
  // Claim nothing yet, but say that we claim before we read: an idle process
  // may then split the unread tail of this item even while it is only
  // prefetched, instead of waiting for us to get to it.
  ClaimUpTo(it, item.begin);

  if (!OpenFile(it)) {
    it.failed = true;
    return true;
  }
  if (it.parser) {
    try {
      it.feed_start = it.parser->Begin(item.path, it.file_size, item.begin, item.end);
    } catch (const Error& e) {
      it.plan_end = it.read_end;
      it.failed = true;
      it.error_kind = e.kind();
      try {
        it.error = e.what();
      } catch (...) {
      }
      return true;
    } catch (const std::exception& e) {
      it.plan_end = it.read_end;
      it.failed = true;
      try {
        it.error = e.what();
      } catch (...) {
      }
      return true;
    }
  }
  it.plan_end = PlanEnd(it);
  it.read_end = AlignDown(it.feed_start, it.align);
  it.begun = true;
  return true;
}

// Reads complete out of order: keep the earliest failure, the one the
// consumer reaches first.
// Where the first reads of an item stop: its end plus what the last record
// it owns most likely needs; more is read on demand (NextChunkOf).
uint64_t Reader::Impl::PlanEnd(const HeldItem& it) const noexcept {
  uint64_t plan = it.end;
  if (it.parser) {
    switch (options_.format.kind) {
      case RecordFormatKind::kFixed:
        plan = it.end + options_.format.record_bytes;
        break;
      case RecordFormatKind::kFile:
        plan = it.item.begin == 0 ? it.file_size : it.item.begin;
        break;
      default:
        plan = it.end + std::min(kOverhang, chunk_bytes_);
        break;
    }
  }
  return std::min(plan, it.file_size);
}

// Tail splitting, owner side: records (or raw bytes) that start before up_to
// are about to become visible to the consumer, so claim them first. If an
// idle process split the tail off meanwhile, the item now ends earlier: the
// parser stops there and no more is read past it. Lock-free, no system call.
void Reader::Impl::ClaimUpTo(HeldItem& it, uint64_t up_to) noexcept {
  if (it.stale) return;
  uint64_t end = it.end;
  it.claimed = std::max(it.claimed, up_to);
  ItemStatus status = queue_.Claim(it.item, up_to, &end);
  if (QueueGone(status)) {
    it.stale = true;  // read no further; the queue took it back
    return;
  }
  if (status == ItemStatus::kStale) {
    MarkStale(it, "");
    return;
  }
  if (end >= it.end) return;
  it.end = end;
  if (it.parser) it.parser->SetEnd(end);
  it.plan_end = std::min(it.plan_end, std::max(PlanEnd(it), it.read_end));
}

void Reader::Impl::FailItem(HeldItem& it, uint64_t offset, const char* what,
                            ErrorKind kind) noexcept {
  if (it.failed && offset >= it.error_at) return;
  it.failed = true;
  it.error_at = offset;
  it.error_kind = kind;
  std::string path(it.item.path);
  SetText(&it.error, "file '%s' at offset %" PRIu64 ": %s", path.c_str(), offset, what);
}

void Reader::Impl::ReportProgress(HeldItem& it, uint64_t position) noexcept {
  if (it.stale) return;
  // With defer_acks the records parsed are not yet used (they wait in the
  // caller's buffer): a checkpoint resumes where the caller says (ReportUsed).
  uint64_t offset =
      std::clamp(options_.defer_acks ? it.used : position, it.item.begin, it.item.end);
  ItemStatus status = queue_.Progress(it.item, offset, it.unreported);
  if (QueueGone(status)) {
    it.stale = true;
  } else if (status == ItemStatus::kStale) {
    MarkStale(it, " at offset " + std::to_string(offset));
  }
  it.unreported = 0;
}

// Never kEnd for a closed queue: that would end the epoch early in silence.
ReadStatus Reader::Impl::FailGone() noexcept {
  const std::string queue = "reader: queue '" + queue_.name() + "' ";
  if (gone_ == TakeStatus::kClosed)
    return Fail(queue +
                    "was closed while this Reader was reading it; the items it held were "
                    "given back, not finished: close or destroy every Reader before its "
                    "WorkQueue",
                ErrorKind::kInvalidArgument);
  return Fail(queue +
                  "was opened by another process (this is a forked child): open the "
                  "WorkQueue in this process",
              ErrorKind::kInvalidArgument);
}

// The queue reassigned the item (lease timeout): stop reading it. Records of
// it already handed out stay handed out; its new owner reads it from its start.
void Reader::Impl::MarkStale(HeldItem& it, const std::string& where) noexcept {
  it.stale = true;
  Bump(stats_.stale_items);
  try {
    Notice("tailcut reader: item " + std::to_string(it.item.index) + " of '" +
           std::string(it.item.path) + "' was reassigned (lease timeout); stopped reading it" +
           where + "; records of it already handed out will be read again by its new owner");
  } catch (...) {
  }
}

// Makes the front held item current, taking one if none is held. At the end
// of the data Take waits, until the deadline, for items other processes hold:
// kEmpty then, with nothing held, so the next call simply takes again.
ReadStatus Reader::Impl::Activate() noexcept {
  if (gone_ != TakeStatus::kOk) return FailGone();
  while (held_count_ == 0) {
    if (queue_end_) {
      ended_ = true;
      return ReadStatus::kEnd;
    }
    // A slot may still be retiring (reads in flight for a finished item).
    bool slot_free = false;
    for (const HeldItem& it : items_) slot_free |= it.state == ItemState::kFree;
    if (!slot_free) {
      Pump(true);
      continue;
    }
    WorkItem item;
    TakeStatus status;
    if (HoldsFinished() && std::chrono::steady_clock::now() < deadline_) {
      // Other processes may be waiting for exactly the finished items our
      // caller holds, as we would wait for theirs: let it ack them first.
      status = queue_.TryTake(&item);
      if (status == TakeStatus::kTimeout || status == TakeStatus::kLimit)
        return ReadStatus::kHoldsFinished;
    } else {
      status = queue_.Take(&item, deadline_);
    }
    if (QueueGone(status)) return FailGone();
    if (status == TakeStatus::kTimeout) return ReadStatus::kEmpty;
    if (status == TakeStatus::kEnd) {
      queue_end_ = ended_ = true;
      return ReadStatus::kEnd;
    }
    if (status == TakeStatus::kJobLost) return Fail(queue_.JobLossMessage(), ErrorKind::kCorrupt);
    if (status == TakeStatus::kLimit && (options_.wait_at_lease_limit || options_.defer_acks)) {
      // Leases held by items of ours that other processes split (they come
      // free as those processes finish their pieces), or by finished items
      // our caller has not acked yet. Polled: the queue wakes waiters when
      // items come back, not when leases do.
      if (std::chrono::steady_clock::now() >= deadline_) return ReadStatus::kEmpty;
      ::usleep(1000);
      continue;
    }
    if (status == TakeStatus::kLimit) {
      // Only other Readers (or direct users) of this WorkQueue can hold the
      // leases: waiting here could wait for ourselves.
      Fail(
          "reader: the queue hands this process no more items: it already holds "
          "leases_per_client open items (other Readers on the same WorkQueue?); "
          "raise WorkQueueOptions::leases_per_client or lower prefetch_items",
          ErrorKind::kInvalidArgument);
      return ReadStatus::kError;
    }
    if (status == TakeStatus::kOk) StartItem(item);
  }
  HeldItem& it = Current();
  active_ = true;
  stream_off_ = it.feed_start;
  carry_mode_ = false;
  win_chunk_ = kNone;
  win_ = arena_->data();
  win_size_ = 0;
  win_end_off_ = it.feed_start;
  handed_chunk_ = kNone;
  Refill();
  return ReadStatus::kOk;
}

// The current item's records are all handed out: report, ack, retire.
void Reader::Impl::FinishItem() noexcept {
  HeldItem& it = Current();
  if (!it.stale) {
    uint64_t position = it.parser ? it.parser->position() : stream_off_;
    ReportProgress(it, std::max(position, it.item.end));
    if (!it.stale) {
      if (!options_.defer_acks) {
        AckItem(it.item);
      } else {
        try {
          finished_.push_back(it.item);
        } catch (const std::bad_alloc&) {
          AckItem(it.item);  // out of memory: acked as without defer_acks
        }
      }
    }
  }
  RetireFront();
}

ItemStatus Reader::Impl::AckItem(const WorkItem& item) noexcept {
  ItemStatus status = queue_.Ack(item);
  if (status == ItemStatus::kOk) {
    Bump(stats_.items_acked);
  } else if (!QueueGone(status)) {
    Bump(stats_.stale_items);
    try {
      Notice("tailcut reader: the queue refused the ack of item " + std::to_string(item.index) +
             " of '" + std::string(item.path) +
             "' (reassigned after a lease timeout); its records will be read again by its "
             "new owner");
    } catch (...) {
    }
  }
  return status;
}

ItemStatus Reader::Impl::GiveBackItem(const WorkItem& item) noexcept {
  ItemStatus status = queue_.GiveBack(item);
  if (status == ItemStatus::kOk) Bump(stats_.items_given_back);
  return status;
}

bool Reader::Impl::TakeFinished(WorkItem* item) noexcept {
  if (finished_taken_ == finished_.size()) return false;
  *item = finished_[finished_taken_++];
  ++finished_out_;
  if (finished_taken_ == finished_.size()) {
    finished_.clear();  // keeps the capacity: no allocation in steady state
    finished_taken_ = 0;
  }
  return true;
}

ItemStatus Reader::Impl::ReportUsed(const WorkItem& item, uint64_t offset) noexcept {
  if (!options_.defer_acks) return ItemStatus::kInvalid;
  offset = std::clamp(offset, item.begin, item.end);
  for (uint32_t i = 0; i < held_count_; ++i) {
    HeldItem& it = items_[HeldAt(i)];
    if (it.item.lease != item.lease || it.item.generation != item.generation) continue;
    if (it.stale) return ItemStatus::kStale;
    it.used = std::max(it.used, offset);  // what this Reader's own reports say from now on
    break;
  }
  return queue_.Progress(item, offset);
}

// Drops the front held item: its chunks go back to the pool (reads still in
// flight become orphans, freed as they complete), its fds close once no read
// uses them.
void Reader::Impl::RetireFront() noexcept {
  uint32_t slot = held_[held_head_];
  HeldItem& it = items_[slot];
  if (active_) {
    if (win_chunk_ != kNone) ReleaseChunk(win_chunk_);
    if (src_chunk_ != kNone) ReleaseChunk(src_chunk_);
    if (handed_chunk_ != kNone) ReleaseChunk(handed_chunk_);
    win_chunk_ = src_chunk_ = handed_chunk_ = kNone;
    win_size_ = 0;
    carry_mode_ = false;  // no Trim(): records handed out may still be read, even after Close()
    active_ = false;
  }
  while (it.count > 0) {
    uint32_t c = it.Pop();
    if (chunks_[c].state != ChunkState::kInFlight) ReleaseChunk(c);
  }
  ++it.gen;  // reads in flight for it are orphans from now on
  held_head_ = (held_head_ + 1) % held_.size();
  --held_count_;
  if (it.in_flight > 0) {
    it.state = ItemState::kRetiring;
  } else {
    if (it.fd >= 0) close(it.fd);
    if (it.fd_other >= 0) close(it.fd_other);
    it.fd = it.fd_other = -1;
    it.state = ItemState::kFree;
  }
}

void Reader::Impl::GiveBackAll() noexcept {
  while (held_count_ > 0) {
    HeldItem& it = Current();
    if (!it.stale) {
      if (active_ && it.parser) ReportProgress(it, it.parser->position());
      if (active_ && !it.parser) ReportProgress(it, stream_off_);
      if (!it.stale) GiveBackItem(it.item);
    }
    RetireFront();
  }
  WorkItem item;
  while (TakeFinished(&item)) GiveBackItem(item);
}

ReadStatus Reader::Impl::Fail(const std::string& message, ErrorKind kind) noexcept {
  if (!failed_) {
    failed_ = true;
    error_kind_ = kind;
    try {
      error_ = message;
    } catch (...) {
    }
    GiveBackAll();
  }
  return ReadStatus::kError;
}

// ---- Reader ----------------------------------------------------------------

std::unique_ptr<Reader> Reader::Open(WorkQueue& queue, ReaderOptions options) {
  auto impl = std::make_unique<Impl>(queue, std::move(options));
  impl->Open();
  return std::unique_ptr<Reader>(new Reader(std::move(impl)));
}

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() {
  // A forked child's copy: its pread threads and io_uring are the parent's,
  // and its items too. Destroying it would join threads that do not exist
  // here and give back the parent's items: leak it.
  if (impl_->owner().forked()) (void)impl_.release();
}

ReadStatus Reader::NextRecord(Record* out, Deadline deadline) noexcept {
  size_t n = 0;
  return NextBatch(out, 1, &n, deadline);
}
ReadStatus Reader::NextBatch(Record* out, size_t max, size_t* n, Deadline deadline) noexcept {
  *n = 0;
  if (impl_->owner().forked()) return ReadStatus::kForked;
  if (!impl_->Enter()) return ReadStatus::kError;
  impl_->set_deadline(deadline);
  ReadStatus status = impl_->Leave(impl_->Produce(out, max, n));
  if (status != ReadStatus::kOk) *n = 0;  // a failure in mid-batch hands out none
  return status;
}
ReadStatus Reader::NextChunk(ChunkView* out, Deadline deadline) noexcept {
  if (impl_->owner().forked()) return ReadStatus::kForked;
  if (!impl_->Enter()) return ReadStatus::kError;
  impl_->set_deadline(deadline);
  return impl_->Leave(impl_->ProduceChunk(out));
}
void Reader::Close() noexcept {
  if (!impl_->owner().forked()) impl_->Close();
}
const std::string& Reader::error() const noexcept { return impl_->error(); }
ErrorKind Reader::error_kind() const noexcept { return impl_->error_kind(); }
WorkItem Reader::current_item() const noexcept { return impl_->current_item(); }
size_t Reader::items_held() const noexcept { return impl_->items_held(); }
bool Reader::defers_acks() const noexcept { return impl_->defers_acks(); }
bool Reader::forked() const noexcept { return impl_->owner().forked(); }
bool Reader::TakeFinished(WorkItem* item) noexcept {
  return !impl_->owner().forked() && impl_->TakeFinished(item);
}
ItemStatus Reader::ReportUsed(const WorkItem& item, uint64_t offset) noexcept {
  return impl_->owner().forked() ? ItemStatus::kForked : impl_->ReportUsed(item, offset);
}
ItemStatus Reader::AckFinished(const WorkItem& item) noexcept {
  return impl_->owner().forked() ? ItemStatus::kForked : impl_->AckFinished(item);
}
ItemStatus Reader::GiveBackFinished(const WorkItem& item) noexcept {
  return impl_->owner().forked() ? ItemStatus::kForked : impl_->GiveBackFinished(item);
}
ReaderStats Reader::stats() const noexcept { return impl_->stats(); }
const std::string& Reader::memory_state() const noexcept { return impl_->memory_state(); }
std::string_view Reader::backend_name() const noexcept { return impl_->backend_name(); }
uint64_t Reader::chunk_bytes() const noexcept { return impl_->chunk_bytes(); }
uint32_t Reader::num_chunks() const noexcept { return impl_->num_chunks(); }
uint32_t Reader::queue_depth() const noexcept { return impl_->queue_depth(); }

}  // namespace tailcut
