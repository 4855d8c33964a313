// io/reader_impl.h: Reader::Impl, the Reader's state, shared by its files:
// reader.cc (setup, items, the public class), reader_reads.cc (reads in
// flight and their completions) and reader_records.cc (records and chunks
// for the consumer). Internal: not installed.
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
#ifndef TAILCUT_IO_READER_IMPL_H_
#define TAILCUT_IO_READER_IMPL_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/process_owner.h"
#include "io/buffer_arena.h"
#include "io/call_guard.h"
#include "io/io_backend.h"
#include "io/reader_counters.h"
#include "tailcut/reader.h"

namespace tailcut {
namespace detail {

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

inline uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

enum class ChunkState : uint8_t { kFree, kInFlight, kReady, kFailed, kConsumer };

struct ChunkBuffer {
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

struct HeldItem {
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
  uint64_t used = 0;               // defer_acks: what Progress says (ReportUsed)
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
// but it must not throw out of a noexcept call (defined in reader.cc).
__attribute__((format(printf, 2, 3))) void SetText(std::string* out, const char* format,
                                                   ...) noexcept;

}  // namespace detail

using detail::AlignDown;
using detail::AlignUp;
using detail::BufferArena;
using detail::Bump;
using detail::CarryBuffer;
using detail::ChunkBuffer;
using detail::ChunkState;
using detail::FormatBytes;
using detail::HeldItem;
using detail::ItemState;
using detail::kCarryStep;
using detail::kMaxChunkBytes;
using detail::kMaxRetries;
using detail::kNone;
using detail::kOverhang;
using detail::kPage;
using detail::kStallNotice;
using detail::ReadRequest;
using detail::ReadResult;
using detail::SetText;

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
  // A Next* call begins and ends (io/call_guard.h): a second call under way
  // at once fails the Reader as the first ends.
  bool Enter() noexcept { return calls_.Enter(); }
  ReadStatus Leave(ReadStatus status) noexcept {
    if (calls_.overlapped()) {
      status = Fail(
          "reader: NextRecord/NextBatch/NextChunk called from two threads at once; a Reader is "
          "used by one thread at a time: open one per thread",
          ErrorKind::kInvalidArgument);
    }
    calls_.Leave();
    return status;
  }
  void Close() noexcept;

  const std::string& error() const noexcept { return error_; }
  ErrorKind error_kind() const noexcept { return error_kind_; }
  WorkItem current_item() const noexcept {
    return active_ ? items_[held_[held_head_]].item : WorkItem{};
  }
  size_t items_held() const noexcept { return held_count_; }
  bool defers_acks() const noexcept { return options_.defer_acks; }
  bool TakeFinished(WorkItem* item) noexcept;
  ItemStatus AckFinished(const WorkItem& item) noexcept {
    if (finished_out_ > 0) --finished_out_;
    return AckItem(item);
  }
  ItemStatus GiveBackFinished(const WorkItem& item) noexcept {
    if (finished_out_ > 0) --finished_out_;
    return GiveBackItem(item);
  }
  ItemStatus ReportUsed(const WorkItem& item, uint64_t offset) noexcept;
  // defer_acks: finished items wait for TakeFinished or for the caller's ack.
  bool HoldsFinished() const noexcept {
    return finished_taken_ < finished_.size() || finished_out_ > 0;
  }
  const detail::ProcessOwner& owner() const noexcept { return owner_; }
  // The queue refuses us for good: closed under us, or a forked child's
  // copy. Notes which in gone_; the item in hand is read no further, and the
  // next take fails the Reader (FailGone), never ends it.
  bool QueueGone(TakeStatus s) noexcept {
    return Gone(s == TakeStatus::kClosed, s == TakeStatus::kForked);
  }
  bool QueueGone(ItemStatus s) noexcept {
    return Gone(s == ItemStatus::kClosed, s == ItemStatus::kForked);
  }
  bool Gone(bool closed, bool forked) noexcept {
    if (closed || forked) gone_ = closed ? TakeStatus::kClosed : TakeStatus::kForked;
    return closed || forked;
  }
  ReadStatus FailGone() noexcept;
  ReaderStats stats() const noexcept { return stats_.Snapshot(); }
  const std::string& memory_state() const noexcept { return memory_state_; }
  std::string_view backend_name() const noexcept { return backend_->name(); }
  uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
  uint32_t num_chunks() const noexcept { return num_chunks_; }
  uint32_t queue_depth() const noexcept { return queue_depth_; }

 private:
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

  // Setup, in the order Open calls them (reader.cc).
  // The geometry options: chunk_bytes_, num_chunks_, queue_depth_.
  void CheckGeometry();
  // Item slots, with a parser each and the carry buffer for records, and the
  // file sizes the queue sliced.
  void SetUpItems();
  // The chunk buffers: mapped, locked, CUDA-registered where possible.
  void SetUpArena();
  // io_uring, or pread threads where it is unavailable and was not asked for.
  void SetUpBackend();
  // Chunk slots, all free, and the consumer's window at the arena's start.
  void SetUpChunks();

  HeldItem& Current() { return items_[held_[held_head_]]; }
  uint32_t HeldAt(uint32_t i) const { return held_[(held_head_ + i) % held_.size()]; }

  // Items.
  bool StartItem(const WorkItem& item) noexcept;
  bool OpenFile(HeldItem& it) noexcept;
  void FailItem(HeldItem& it, uint64_t offset, const char* what,
                ErrorKind kind = ErrorKind::kIo) noexcept;
  ReadStatus Activate() noexcept;
  void FinishItem() noexcept;
  ItemStatus AckItem(const WorkItem& item) noexcept;
  ItemStatus GiveBackItem(const WorkItem& item) noexcept;
  void RetireFront() noexcept;
  void GiveBackAll() noexcept;
  ReadStatus Fail(const std::string& message, ErrorKind kind = ErrorKind::kIo) noexcept;
  ReadStatus FailWith(const HeldItem& it) noexcept { return Fail(it.error, it.error_kind); }
  void ReportProgress(HeldItem& it, uint64_t position) noexcept;
  void MarkStale(HeldItem& it, const std::string& where) noexcept;
  uint64_t PlanEnd(const HeldItem& it) const noexcept;
  void ClaimUpTo(HeldItem& it, uint64_t up_to) noexcept;

  // Reads.
  void Refill() noexcept;
  void Issue(uint32_t slot) noexcept;
  void Pump(bool wait) noexcept;
  void Complete(const ReadResult& result) noexcept;
  void Resubmit(uint32_t chunk) noexcept;
  void ReleaseChunk(uint32_t chunk) noexcept;
  uint32_t NextChunkOf(HeldItem& it) noexcept;

  // Record windows.
  bool MoreBytes(HeldItem& it) noexcept;
  bool TakeWindowChunk(HeldItem& it) noexcept;
  bool AppendCarry(HeldItem& it) noexcept;
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

  std::vector<ChunkBuffer> chunks_;
  std::vector<uint32_t> free_;  // stack of free chunks
  uint32_t in_flight_ = 0;
  std::vector<HeldItem> items_;
  std::vector<uint32_t> held_;  // ring of item slots in take order; front is current
  uint32_t held_head_ = 0;
  uint32_t held_count_ = 0;
  // defer_acks: finished items, not acked; [finished_taken_, size) not taken yet.
  std::vector<WorkItem> finished_;
  size_t finished_taken_ = 0;
  size_t finished_out_ = 0;  // taken by the caller (TakeFinished), not acked or given back yet
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
  detail::ReaderCounters stats_;
  detail::CallGuard calls_;
};

}  // namespace tailcut

#endif  // TAILCUT_IO_READER_IMPL_H_
