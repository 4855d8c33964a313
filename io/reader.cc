// The Reader: takes items, keeps reads in flight, joins records across chunks.
//
// One thread (the consumer's) drives everything: it prepares reads, submits
// them, reaps completions and parses, at chunk boundaries only. There is no
// reading thread to hand chunks over from; page-cache copies run in the
// kernel's io-wq workers (IOSQE_ASYNC) or in the pread workers, in parallel
// with the consumer. docs/io.md explains the choice and the numbers.
//
// Invariants (checked by the tests, relied on below):
//  1. A chunk is in exactly one place: the free list, in flight (owned by the
//     kernel or a pread worker), ready in its item's order ring, or the
//     consumer's window/source. Only the consumer thread moves it.
//  2. Chunks in an item's order ring cover consecutive file ranges in issue
//     order; the consumer takes them from the head only.
//  3. Items other than the current one hold at most num_chunks - 2 chunks, so
//     the current item can always issue its next read: it never waits on
//     data that only a later item could free.
//  4. At most queue_depth reads are in flight; a read keeps its item slot
//     (and so its fds) alive until it completes, even after the item is gone.
//  5. Every item this Reader took is acked (all records handed out), given
//     back (error, close), dropped after the queue refused it (kStale), or,
//     with defer_acks, taken by the caller (TakeFinished).
#include "tailcut/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <vector>

#include "buffer_arena.h"
#include "engine/process_owner.h"
#include "io_backend.h"

namespace tailcut {

using detail::BufferArena;
using detail::CarryBuffer;
using detail::FormatBytes;
using detail::ReadRequest;
using detail::ReadResult;

namespace {

constexpr uint32_t kNone = UINT32_MAX;
constexpr uint64_t kPage = 4096;
// Bytes read past a slice's end up front, to finish its last record without
// another round trip; more is read on demand.
constexpr uint64_t kOverhang = 64 << 10;
// Growth step of the carry buffer when a record needs more bytes.
constexpr uint64_t kCarryStep = 64 << 10;
constexpr uint64_t kMaxChunkBytes = 1ull << 30;  // results are int32
constexpr int kMaxRetries = 1000;                // -EAGAIN/-EINTR per read
// Reads outstanding this long without any completion get a notice.
constexpr std::chrono::seconds kStallNotice{30};

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) {
  // Single writer: a relaxed load and store, no locked instruction.
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

enum class ChunkState : uint8_t { kFree, kInFlight, kReady, kFailed, kConsumer };

struct ChunkSlot {
  ChunkState state = ChunkState::kFree;
  uint32_t item = kNone;  // item slot that issued the read
  uint64_t item_gen = 0;  // that slot's generation then; a mismatch marks an orphan
  uint64_t offset = 0;    // file offset of the buffer's first byte (aligned when direct)
  uint32_t len = 0;       // bytes asked for (aligned when direct)
  uint32_t want = 0;      // bytes that must arrive: min(len, file size - offset)
  uint32_t done = 0;      // bytes arrived
  int fd = -1;
  bool direct = false;
  int retries = 0;
};

enum class ItemState : uint8_t { kFree, kHeld, kRetiring };

struct ItemSlot {
  ItemState state = ItemState::kFree;
  uint64_t gen = 0;
  WorkItem item;
  std::unique_ptr<RecordParser> parser;
  int fd = -1;        // the fd reads use now
  int fd_other = -1;  // the O_DIRECT fd after a fallback to buffered
  bool direct = false;
  uint64_t align = 1;      // offset/length alignment of reads (direct)
  uint64_t file_size = 0;  // as when the queue was created
  uint64_t end = 0;        // the item's end now: lowered when another process splits the tail off
  uint64_t claimed = 0;    // records starting before this may be handed out (WorkQueue::Claim)
  uint64_t feed_start = 0;
  uint64_t read_end = 0;        // the next read starts here
  uint64_t plan_end = 0;        // reads are issued while read_end < plan_end
  uint64_t extend = 0;          // next on-demand extension of plan_end
  std::vector<uint32_t> order;  // ring of chunk indices in file order
  uint32_t head = 0;
  uint32_t count = 0;
  uint32_t in_flight = 0;     // reads using this slot's fds
  bool begun = false;         // the file opened (and the parser began): reads may follow
  bool failed = false;        // error holds why; no more reads are issued
  bool parse_failed = false;  // the parser said kError (error holds it)
  std::string error;
  ErrorKind error_kind = ErrorKind::kIo;
  uint64_t error_at = UINT64_MAX;  // file offset error names (reads may fail out of order)
  uint64_t unreported = 0;         // records handed out since the last Progress
  bool done = false;               // the parser said kDone
  bool stale = false;              // the queue refused Progress: the item is someone else's

  uint32_t Front() const { return order[head]; }
  void Push(uint32_t chunk) {
    order[(head + count) % order.size()] = chunk;
    ++count;
  }
  uint32_t Pop() {
    uint32_t chunk = order[head];
    head = (head + 1) % order.size();
    --count;
    return chunk;
  }
};

// Formats into a std::string; errors are rare, so allocating here is fine,
// but it must not throw out of a noexcept call.
__attribute__((format(printf, 2, 3))) void SetText(std::string* out, const char* format,
                                                   ...) noexcept {
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

}  // namespace

class Reader::Impl {
 public:
  Impl(WorkQueue& queue, ReaderOptions options) : queue_(queue), options_(std::move(options)) {}

  void Open();
  ~Impl() { Close(); }

  ReadStatus Produce(Record* out, size_t max, size_t* n) noexcept;
  ReadStatus ProduceChunk(ChunkView* out) noexcept;
  // How long the Next* call under way may wait for other processes' items;
  // set at each call (a member, so the per-record loop does not carry it).
  void set_deadline(Deadline deadline) noexcept { deadline_ = deadline; }
  void Close() noexcept;

  const std::string& error() const noexcept { return error_; }
  ErrorKind error_kind() const noexcept { return error_kind_; }
  WorkItem current_item() const noexcept {
    return active_ ? items_[held_[held_head_]].item : WorkItem{};
  }
  size_t items_held() const noexcept { return held_count_; }
  bool defers_acks() const noexcept { return options_.defer_acks; }
  bool TakeFinished(WorkItem* item) noexcept;
  AckStatus AckFinished(const WorkItem& item) noexcept { return AckItem(item); }
  AckStatus GiveBackFinished(const WorkItem& item) noexcept { return GiveBackItem(item); }
  const detail::ProcessOwner& owner() const noexcept { return owner_; }
  // The queue refuses us for good: closed under us, or a forked child's
  // copy. Notes which in gone_; the item in hand is read no further, and the
  // next take fails the Reader (FailGone), never ends it.
  bool QueueGone(TakeStatus s) noexcept {
    return Gone(s == TakeStatus::kClosed, s == TakeStatus::kForked);
  }
  bool QueueGone(AckStatus s) noexcept {
    return Gone(s == AckStatus::kClosed, s == AckStatus::kForked);
  }
  bool Gone(bool closed, bool forked) noexcept {
    if (closed || forked) gone_ = closed ? TakeStatus::kClosed : TakeStatus::kForked;
    return closed || forked;
  }
  ReadStatus FailGone() noexcept;
  ReaderStats stats() const noexcept {
    ReaderStats s;
    s.bytes_read = stats_.bytes_read.load(std::memory_order_relaxed);
    s.records = stats_.records.load(std::memory_order_relaxed);
    s.items_taken = stats_.items_taken.load(std::memory_order_relaxed);
    s.items_acked = stats_.items_acked.load(std::memory_order_relaxed);
    s.items_given_back = stats_.items_given_back.load(std::memory_order_relaxed);
    s.reads = stats_.reads.load(std::memory_order_relaxed);
    s.short_reads = stats_.short_reads.load(std::memory_order_relaxed);
    s.retries = stats_.retries.load(std::memory_order_relaxed);
    s.carried_bytes = stats_.carried_bytes.load(std::memory_order_relaxed);
    s.stale_items = stats_.stale_items.load(std::memory_order_relaxed);
    return s;
  }
  const std::string& memory_state() const noexcept { return memory_state_; }
  std::string_view backend_name() const noexcept { return backend_->name(); }
  uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
  uint32_t num_chunks() const noexcept { return num_chunks_; }
  uint32_t queue_depth() const noexcept { return queue_depth_; }

 private:
  struct Stats {
    std::atomic<uint64_t> bytes_read{0}, records{0}, items_taken{0}, items_acked{0},
        items_given_back{0}, reads{0}, short_reads{0}, retries{0}, carried_bytes{0}, stale_items{0};
  };

  void Notice(const std::string& line) noexcept {
    try {
      if (options_.on_notice) {
        options_.on_notice(line);
      } else {
        fprintf(stderr, "%s\n", line.c_str());
      }
    } catch (...) {
    }
  }

  ItemSlot& Current() { return items_[held_[held_head_]]; }
  uint32_t HeldAt(uint32_t i) const { return held_[(held_head_ + i) % held_.size()]; }

  // Items.
  bool StartItem(const WorkItem& item) noexcept;
  bool OpenFile(ItemSlot& it) noexcept;
  void FailItem(ItemSlot& it, uint64_t offset, const char* what,
                ErrorKind kind = ErrorKind::kIo) noexcept;
  ReadStatus Activate() noexcept;
  void FinishItem() noexcept;
  AckStatus AckItem(const WorkItem& item) noexcept;
  AckStatus GiveBackItem(const WorkItem& item) noexcept;
  void RetireFront() noexcept;
  void GiveBackAll() noexcept;
  ReadStatus Fail(const std::string& message, ErrorKind kind = ErrorKind::kIo) noexcept;
  ReadStatus FailWith(const ItemSlot& it) noexcept { return Fail(it.error, it.error_kind); }
  void ReportProgress(ItemSlot& it, uint64_t position) noexcept;
  void MarkStale(ItemSlot& it, const std::string& where) noexcept;
  uint64_t PlanEnd(const ItemSlot& it) const noexcept;
  void ClaimUpTo(ItemSlot& it, uint64_t up_to) noexcept;

  // Reads.
  void Refill() noexcept;
  void Issue(uint32_t slot) noexcept;
  void Pump(bool wait) noexcept;
  void Complete(const ReadResult& result) noexcept;
  void Resubmit(uint32_t chunk) noexcept;
  void ReleaseChunk(uint32_t chunk) noexcept;
  uint32_t NextChunkOf(ItemSlot& it) noexcept;

  // Record windows.
  bool MoreBytes(ItemSlot& it) noexcept;
  bool TakeWindowChunk(ItemSlot& it) noexcept;
  bool AppendCarry(ItemSlot& it) noexcept;
  void LeaveCarryIfPossible() noexcept;

  WorkQueue& queue_;
  WorkQueue::Dependent uses_queue_{queue_};  // the queue must outlive us
  ReaderOptions options_;
  uint64_t chunk_bytes_ = 0;
  uint32_t num_chunks_ = 0;
  uint32_t queue_depth_ = 0;
  std::unique_ptr<BufferArena> arena_;
  std::unique_ptr<CarryBuffer> carry_;
  std::unique_ptr<detail::IoBackend> backend_;
  std::string memory_state_;
  std::vector<uint64_t> file_sizes_;  // per work file, from the item table

  std::vector<ChunkSlot> chunks_;
  std::vector<uint32_t> free_;  // stack of free chunks
  uint32_t in_flight_ = 0;
  std::vector<ItemSlot> items_;
  std::vector<uint32_t> held_;  // ring of item slots in take order; front is current
  uint32_t held_head_ = 0;
  uint32_t held_count_ = 0;
  // defer_acks: finished items, not acked; [finished_taken_, size) not taken yet.
  std::vector<WorkItem> finished_;
  size_t finished_taken_ = 0;
  std::vector<ReadResult> results_;
  std::set<dev_t> direct_fallback_devices_;

  // The consumer. active_: the front held item is being read.
  bool active_ = false;
  uint64_t stream_off_ = 0;  // file offset of the next byte to take from chunks
  // Window mode (carry_mode_ false): [win_, win_ + win_size_) of chunk win_chunk_
  // holds file bytes from the parser's position on.
  uint32_t win_chunk_ = kNone;
  const std::byte* win_ = nullptr;
  size_t win_size_ = 0;
  uint64_t win_end_off_ = 0;  // file offset just past the window
  // Carry mode: carry bytes [carry_start_, carry_start_ + carry_size_) hold
  // file bytes from the parser's position up to carry_end_off_; they were
  // copied from earlier chunks and from src_chunk_'s first src_used_ bytes.
  bool carry_mode_ = false;
  uint64_t carry_start_ = 0;
  uint64_t carry_size_ = 0;
  uint64_t carry_end_off_ = 0;
  uint32_t src_chunk_ = kNone;
  const std::byte* src_ = nullptr;
  size_t src_size_ = 0;
  size_t src_used_ = 0;
  // kChunks mode: the chunk handed out last, released on the next call.
  uint32_t handed_chunk_ = kNone;

  std::chrono::steady_clock::time_point last_completion_{};
  bool stall_noticed_ = false;
  bool failed_ = false;  // sticky error_
  ErrorKind error_kind_ = ErrorKind::kIo;
  detail::ProcessOwner owner_;
  TakeStatus gone_ = TakeStatus::kOk;  // kClosed or kForked once the queue refuses us
  bool ended_ = false;
  bool closed_ = false;
  bool queue_end_ = false;               // TryTake said kEnd
  Deadline deadline_ = Deadline::max();  // of the Next* call under way
  std::string error_;
  Stats stats_;
};

void Reader::Impl::Open() {
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

  // Parsers first: a bad format is an argument error before any memory is mapped.
  uint32_t slots = options_.prefetch_items + 3;  // current + prefetched + retiring
  items_.resize(slots);
  if (options_.mode == ReadMode::kRecords) {
    for (ItemSlot& it : items_) it.parser = RecordParser::Create(options_.format);
    carry_ = std::make_unique<CarryBuffer>(
        AlignUp(options_.format.max_record_bytes + 2 * kCarryStep, kPage));
  }
  for (ItemSlot& it : items_) it.order.assign(num_chunks_, kNone);
  held_.assign(slots, kNone);
  finished_.reserve(slots);

  // Expected file sizes: what the queue sliced, so every process agrees on
  // where each file ends whatever happened to it since.
  file_sizes_.assign(queue_.paths().size(), 0);
  for (const WorkQueue::Item& item : queue_.items()) {
    if (item.file < file_sizes_.size())
      file_sizes_[item.file] = std::max(file_sizes_[item.file], item.end);
  }

  auto notice = [this](const std::string& line) { Notice(line); };
  arena_ = std::make_unique<BufferArena>(chunk_bytes_, num_chunks_, options_.cuda_register, notice);

  IoBackend choice = options_.backend;
  bool forced = choice != IoBackend::kDefault;
  bool forced_by_env = false;
  if (choice == IoBackend::kDefault) {
    const char* env = std::getenv("TAILCUT_IO");
    if (env && *env) {
      forced = forced_by_env = true;
      if (std::strcmp(env, "uring") == 0) {
        choice = IoBackend::kUring;
      } else if (std::strcmp(env, "pread") == 0) {
        choice = IoBackend::kPread;
      } else {
        throw Error(ErrorKind::kInvalidArgument,
                    std::string("TAILCUT_IO='") + env + "' is not 'uring' or 'pread'");
      }
    } else {
      choice = IoBackend::kUring;
    }
  }
  uint32_t threads = options_.pread_threads == 0 ? 2 : options_.pread_threads;
  bool registered = false;
  if (choice == IoBackend::kUring) {
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
      if (forced_by_env) {
        throw Error(ErrorKind::kIo,
                    "reader: io_uring was asked for (TAILCUT_IO=uring) but is "
                    "unavailable: " +
                        problem + hint +
                        "; unset TAILCUT_IO to fall back to pread threads, or "
                        "set TAILCUT_IO=pread");
      }
      if (forced) {
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

  chunks_.resize(num_chunks_);
  free_.reserve(num_chunks_);
  for (uint32_t i = num_chunks_; i-- > 0;) free_.push_back(i);
  results_.resize(std::max<uint32_t>(queue_depth_, 16));
  win_ = arena_->data();
  src_ = arena_->data();
}

// ---- Items -----------------------------------------------------------------

bool Reader::Impl::OpenFile(ItemSlot& it) noexcept {
  std::string path(it.item.path);
  const char* p = path.c_str();
  it.direct = options_.direct;
  it.align = 1;
  // O_NONBLOCK: a FIFO put in the file's place must not block open();
  // cleared below once the file is known to be the queue's regular file.
  int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (it.direct ? O_DIRECT : 0));
  if (fd < 0 && it.direct && errno == EINVAL) {
    struct stat st {};
    if (stat(p, &st) == 0 && direct_fallback_devices_.insert(st.st_dev).second) {
      Notice("tailcut reader: O_DIRECT is not supported for '" + path +
             "' (open: Invalid argument); reading files on its filesystem buffered");
    }
    it.direct = false;
    fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  }
  if (fd < 0) {
    int err = errno;
    // The queue checked every file when it was created: say what changed since.
    SetText(&it.error, "file '%s': cannot open: %s%s", p, strerror(err),
            err == ENOENT   ? " (removed after the queue was created? restore it or recreate "
                              "the queue)"
            : err == EACCES ? " (made unreadable after the queue was created? fix its "
                              "permissions)"
                            : "");
    it.error_kind = ErrorKindOfErrno(err);
    return false;
  }
  it.fd = fd;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    SetText(&it.error, "file '%s': cannot stat: %s", p, strerror(errno));
    return false;
  }
  if (!S_ISREG(st.st_mode)) {  // e.g. a FIFO renamed over it
    it.error_kind = ErrorKind::kInvalidArgument;
    SetText(&it.error,
            "file '%s' changed since the queue was created: it is no longer a regular file; "
            "recreate the queue or restore the file",
            Printable(path).c_str());
    return false;
  }
  if (static_cast<uint64_t>(st.st_size) < it.file_size) {
    it.error_kind = ErrorKind::kIo;  // the file changed under the queue, like a short read
    SetText(&it.error,
            "file '%s' at offset %" PRIu64 ": the file is %" PRIu64 " bytes, %" PRIu64
            " when the queue was created (truncated? restore it or recreate the queue)",
            p, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_size), it.file_size);
    return false;
  }
  // The very file the queue was made of, not another put in its place. Its
  // mtime may move: bytes appended are not read, and a file restored in
  // place after an error is read again (docs/reliability.md).
  const FileIdentity& then = queue_.files()[it.item.file];
  const FileIdentity now = IdentityOf(st);
  if (now.inode != then.inode || now.device != then.device) {
    it.error_kind = ErrorKind::kConfigMismatch;
    SetText(&it.error,
            "file '%s' changed since the queue was created: %s; recreate the queue or restore the "
            "file",
            Printable(path).c_str(), DescribeFileChange(then, now).c_str());
    return false;
  }
  if (it.direct) {
    // Direct-I/O alignment: statx(STATX_DIOALIGN) where the kernel has it
    // (6.1+); else 4 KiB, a multiple of every common logical block size.
    uint64_t align = kPage;
    struct statx sx {};
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
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
      int buffered = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      struct stat again {};
      if (buffered < 0 || fstat(buffered, &again) != 0 || again.st_ino != st.st_ino ||
          again.st_dev != st.st_dev) {
        SetText(&it.error, "file '%s': cannot open again: %s", p,
                buffered < 0 ? strerror(errno) : "it changed since the first open");
        if (buffered >= 0) close(buffered);
        return false;
      }
      close(fd);
      it.fd = buffered;
      it.direct = false;
    } else {
      it.align = align;
    }
  }
  // io_uring would answer -EAGAIN rather than wait on a non-blocking file.
  fcntl(it.fd, F_SETFL, fcntl(it.fd, F_GETFL) & ~O_NONBLOCK);
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
  ItemSlot& it = items_[slot];
  it.state = ItemState::kHeld;
  it.item = item;
  it.fd = it.fd_other = -1;
  it.head = it.count = 0;
  it.begun = it.failed = it.parse_failed = it.done = it.stale = false;
  it.error.clear();
  it.error_kind = ErrorKind::kIo;
  it.error_at = UINT64_MAX;
  it.unreported = 0;
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
uint64_t Reader::Impl::PlanEnd(const ItemSlot& it) const noexcept {
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
void Reader::Impl::ClaimUpTo(ItemSlot& it, uint64_t up_to) noexcept {
  if (it.stale) return;
  uint64_t end = it.end;
  it.claimed = std::max(it.claimed, up_to);
  AckStatus status = queue_.Claim(it.item, up_to, &end);
  if (QueueGone(status)) {
    it.stale = true;  // read no further; the queue took it back
    return;
  }
  if (status == AckStatus::kStale) {
    MarkStale(it, "");
    return;
  }
  if (end >= it.end) return;
  it.end = end;
  if (it.parser) it.parser->SetEnd(end);
  it.plan_end = std::min(it.plan_end, std::max(PlanEnd(it), it.read_end));
}

void Reader::Impl::FailItem(ItemSlot& it, uint64_t offset, const char* what,
                            ErrorKind kind) noexcept {
  if (it.failed && offset >= it.error_at) return;
  it.failed = true;
  it.error_at = offset;
  it.error_kind = kind;
  std::string path(it.item.path);
  SetText(&it.error, "file '%s' at offset %" PRIu64 ": %s", path.c_str(), offset, what);
}

void Reader::Impl::ReportProgress(ItemSlot& it, uint64_t position) noexcept {
  if (it.stale) return;
  uint64_t offset = std::clamp(position, it.item.begin, it.item.end);
  AckStatus status = queue_.Progress(it.item, offset, it.unreported);
  if (QueueGone(status)) {
    it.stale = true;
  } else if (status == AckStatus::kStale) {
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
void Reader::Impl::MarkStale(ItemSlot& it, const std::string& where) noexcept {
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
    for (const ItemSlot& it : items_) slot_free |= it.state == ItemState::kFree;
    if (!slot_free) {
      Pump(true);
      continue;
    }
    WorkItem item;
    TakeStatus status = queue_.Take(&item, deadline_);
    if (QueueGone(status)) return FailGone();
    if (status == TakeStatus::kEmpty) return ReadStatus::kEmpty;
    if (status == TakeStatus::kEnd) {
      queue_end_ = ended_ = true;
      return ReadStatus::kEnd;
    }
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
  ItemSlot& it = Current();
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
  ItemSlot& it = Current();
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

AckStatus Reader::Impl::AckItem(const WorkItem& item) noexcept {
  AckStatus status = queue_.Ack(item);
  if (status == AckStatus::kOk) {
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

AckStatus Reader::Impl::GiveBackItem(const WorkItem& item) noexcept {
  AckStatus status = queue_.GiveBack(item);
  if (status == AckStatus::kOk) Bump(stats_.items_given_back);
  return status;
}

bool Reader::Impl::TakeFinished(WorkItem* item) noexcept {
  if (finished_taken_ == finished_.size()) return false;
  *item = finished_[finished_taken_++];
  if (finished_taken_ == finished_.size()) {
    finished_.clear();  // keeps the capacity: no allocation in steady state
    finished_taken_ = 0;
  }
  return true;
}

// Drops the front held item: its chunks go back to the pool (reads still in
// flight become orphans, freed as they complete), its fds close once no read
// uses them.
void Reader::Impl::RetireFront() noexcept {
  uint32_t slot = held_[held_head_];
  ItemSlot& it = items_[slot];
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
    ItemSlot& it = Current();
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
      ItemSlot& it = items_[HeldAt(i)];
      if (i > 0 || !active_) others_busy += it.count;
      if (target == kNone && !it.failed && it.read_end < it.plan_end) {
        target = HeldAt(i);
        if (i == 0 && active_) break;
      }
    }
    if (target == kNone) {
      if (queue_end_ || held_count_ >= options_.prefetch_items + 1 || !active_) break;
      bool slot_free = false;
      for (const ItemSlot& it : items_) slot_free |= it.state == ItemState::kFree;
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
  ItemSlot& it = items_[slot];
  uint32_t c = free_.back();
  free_.pop_back();
  ChunkSlot& ch = chunks_[c];
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
  ChunkSlot& ch = chunks_[c];
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
      for (const ChunkSlot& ch : chunks_) {
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
  ChunkSlot& ch = chunks_[c];
  ItemSlot& it = items_[ch.item];
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
uint32_t Reader::Impl::NextChunkOf(ItemSlot& it) noexcept {
  for (;;) {
    if (failed_) return kNone;
    if (it.count > 0) {
      ChunkSlot& ch = chunks_[it.Front()];
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

// ---- Records ---------------------------------------------------------------

// Window mode, window used up: the next chunk becomes the window.
bool Reader::Impl::TakeWindowChunk(ItemSlot& it) noexcept {
  if (win_chunk_ != kNone) {
    ReleaseChunk(win_chunk_);
    win_chunk_ = kNone;
    ReportProgress(it, it.parser->position());
    Refill();
  }
  uint32_t c = NextChunkOf(it);
  if (c == kNone) return false;
  const ChunkSlot& ch = chunks_[c];
  uint64_t start = stream_off_ - ch.offset;
  win_chunk_ = c;
  win_ = arena_->chunk(c) + start;
  win_size_ = ch.want - start;
  win_end_off_ = ch.offset + ch.want;
  stream_off_ = win_end_off_;
  return true;
}

// Carry mode: copies more bytes of the stream into the carry buffer.
bool Reader::Impl::AppendCarry(ItemSlot& it) noexcept {
  if (src_chunk_ == kNone || src_used_ == src_size_) {
    if (src_chunk_ != kNone) {
      ReleaseChunk(src_chunk_);
      src_chunk_ = kNone;
      Refill();
    }
    uint32_t c = NextChunkOf(it);
    if (c == kNone) return false;
    const ChunkSlot& ch = chunks_[c];
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
bool Reader::Impl::MoreBytes(ItemSlot& it) noexcept {
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
    ItemSlot& it = Current();
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
    ItemSlot& it = Current();
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
    const ChunkSlot& ch = chunks_[c];
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
      ChunkSlot& ch = chunks_[c];
      ItemSlot& it = items_[ch.item];
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
  for (ItemSlot& it : items_) {
    if (it.fd >= 0) close(it.fd);
    if (it.fd_other >= 0) close(it.fd_other);
    it.fd = it.fd_other = -1;
    it.state = ItemState::kFree;
  }
  backend_.reset();
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
  if (impl_->owner().forked()) return ReadStatus::kForked;
  size_t n = 0;
  impl_->set_deadline(deadline);
  return impl_->Produce(out, 1, &n);
}
ReadStatus Reader::NextBatch(Record* out, size_t max, size_t* n, Deadline deadline) noexcept {
  *n = 0;
  if (impl_->owner().forked()) return ReadStatus::kForked;
  impl_->set_deadline(deadline);
  ReadStatus status = impl_->Produce(out, max, n);
  if (status != ReadStatus::kOk) *n = 0;  // a failure in mid-batch hands out none
  return status;
}
ReadStatus Reader::NextChunk(ChunkView* out, Deadline deadline) noexcept {
  if (impl_->owner().forked()) return ReadStatus::kForked;
  impl_->set_deadline(deadline);
  return impl_->ProduceChunk(out);
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
AckStatus Reader::AckFinished(const WorkItem& item) noexcept {
  return impl_->owner().forked() ? AckStatus::kForked : impl_->AckFinished(item);
}
AckStatus Reader::GiveBackFinished(const WorkItem& item) noexcept {
  return impl_->owner().forked() ? AckStatus::kForked : impl_->GiveBackFinished(item);
}
ReaderStats Reader::stats() const noexcept { return impl_->stats(); }
const std::string& Reader::memory_state() const noexcept { return impl_->memory_state(); }
std::string_view Reader::backend_name() const noexcept { return impl_->backend_name(); }
uint64_t Reader::chunk_bytes() const noexcept { return impl_->chunk_bytes(); }
uint32_t Reader::num_chunks() const noexcept { return impl_->num_chunks(); }
uint32_t Reader::queue_depth() const noexcept { return impl_->queue_depth(); }

}  // namespace tailcut
