// GlobalOrderReader: an index work's items over record numbers, read by
// number (see tailcut/global_order_reader.h).
//
// State, all touched by the calling thread only:
//  * held_: the items taken and not yet acked or given back, in take order.
//    Only the last one can have positions not yet read (a group fills items
//    in take order), and they finish (all positions handed out) in that
//    order, so acks pop them from the front.
//  * The group: the records of the positions read last (numbers_, data_,
//    ends_), with the runs of consecutive positions of one item that make it
//    up (segs_), and how many of them were handed out (handed_).
//
// Invariants:
//  1. For every held item, begin <= used <= next <= end: positions below
//     `used` were handed out (and reported with Progress), those in [used,
//     next) are in the group not handed out yet, and those in [next, end)
//     are neither read nor claimed beyond what the last claim covered.
//  2. Every position in the group was claimed before it was read.
//  3. A blocking Take happens only when the reader holds no item: held
//     items then are all handed out and acked first (Settle), so this
//     process never waits for others while they wait for it.
#include "tailcut/global_order_reader.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <new>
#include <optional>
#include <vector>

#include "engine/process_owner.h"
#include "io/call_guard.h"
#include "io/reader_counters.h"
#include "tailcut/sample_order.h"

namespace tailcut {

namespace {

constexpr uint32_t kMaxRecordsPerRead = 1u << 20;
constexpr uint64_t kTfrecordHeader = 12;  // u64 length, u32 masked CRC of it
constexpr uint64_t kTfrecordFooter = 4;   // u32 masked CRC of the data
constexpr uint32_t kDefaultLeases = 8;    // WorkQueueOptions::leases_per_client's default
constexpr uint32_t kGlobalShuffleLeases = 32;
constexpr uint64_t kDefaultMinSplit = 64 << 10;  // WorkQueueOptions::min_split_bytes' default
constexpr uint64_t kIndexMinSplit = 8;

using detail::Bump;

}  // namespace

class GlobalOrderReader::Impl {
 public:
  Impl(WorkQueue& queue, std::shared_ptr<const RecordFiles> files, GlobalOrderReaderOptions options)
      : queue_(queue), files_(std::move(files)), options_(std::move(options)) {}
  ~Impl() { Close(); }

  void Open();
  ReadStatus Produce(Record* out, size_t max, size_t* n, Deadline deadline) noexcept;
  void Close() noexcept;

  // A Next* call begins and ends (io/call_guard.h), as the Reader's.
  bool Enter() noexcept { return calls_.Enter(); }
  ReadStatus Leave(ReadStatus status) noexcept {
    if (calls_.overlapped()) {
      status = Fail(
          "global order reader: NextRecord/NextBatch called from two threads at once; a reader "
          "is used by one thread at a time: open one per thread",
          ErrorKind::kInvalidArgument);
    }
    calls_.Leave();
    return status;
  }

  const detail::ProcessOwner& owner() const noexcept { return owner_; }
  const std::string& error() const noexcept { return error_; }
  ErrorKind error_kind() const noexcept { return error_kind_; }
  size_t items_held() const noexcept { return held_.size(); }
  std::span<const uint64_t> numbers() const noexcept {
    return {numbers_.data() + last_first_, last_count_};
  }
  uint64_t epoch() const noexcept { return group_epoch_; }
  WorkItem current_item() const noexcept { return current_; }
  const RecordFiles& files() const noexcept { return *files_; }
  ReaderStats stats() const noexcept { return stats_.Snapshot(); }

 private:
  struct Held {
    WorkItem item;
    uint64_t end;   // its end now: lowered when another process splits the tail off
    uint64_t next;  // the next position to read
    uint64_t used;  // positions below were handed out
    bool stale;     // reassigned (or the queue is gone): read no further, never acked
  };
  // A run of the group: positions [begin, begin + count) of held item
  // `serial`, records [first, first + count) of the group.
  struct Seg {
    uint64_t serial;
    size_t first;
    uint64_t begin;
    size_t count;
  };

  Held& BySerial(uint64_t serial) noexcept { return held_[serial - front_serial_]; }
  bool QueueGone(bool closed, bool forked) noexcept {
    if (closed || forked) gone_ = closed ? TakeStatus::kClosed : TakeStatus::kForked;
    return closed || forked;
  }
  bool QueueGone(ItemStatus s) noexcept {
    return QueueGone(s == ItemStatus::kClosed, s == ItemStatus::kForked);
  }
  bool QueueGone(TakeStatus s) noexcept {
    return QueueGone(s == TakeStatus::kClosed, s == TakeStatus::kForked);
  }

  void Settle() noexcept;
  ReadStatus Fill(size_t want, Deadline deadline) noexcept;
  ReadStatus TakeItem(bool may_wait, Deadline deadline) noexcept;
  bool SetOrder(uint64_t epoch) noexcept;
  void HandOut(Record* out, size_t n) noexcept;
  void MarkStale(Held& h, const char* where) noexcept;
  void GiveBackAll() noexcept;
  ReadStatus Fail(const std::string& message, ErrorKind kind) noexcept;
  ReadStatus FailGone() noexcept;
  void Notice(const std::string& line) noexcept {
    try {
      if (options_.on_notice) {
        options_.on_notice(line);
      } else {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    } catch (...) {
    }
  }

  WorkQueue& queue_;
  WorkQueue::Dependent uses_queue_{queue_};  // the queue must outlive us
  const std::shared_ptr<const RecordFiles> files_;
  const GlobalOrderReaderOptions options_;
  detail::ProcessOwner owner_;

  std::vector<Held> held_;
  uint64_t front_serial_ = 0;  // serial of held_.front()
  std::optional<SampleOrder> order_;
  uint64_t order_epoch_ = 0;

  std::vector<uint64_t> numbers_;  // the group's record numbers
  std::string data_;               // their payloads, back to back
  std::vector<uint64_t> ends_;     // the end of each in data_
  std::vector<Seg> segs_;
  size_t handed_ = 0;      // records of the group handed out
  size_t last_first_ = 0;  // the last kOk call's records: numbers_[last_first_, + last_count_)
  size_t last_count_ = 0;
  uint64_t group_epoch_ = 0;
  WorkItem current_;

  bool ended_ = false;   // the queue said kEnd
  bool closed_ = false;  // Close() was called
  bool failed_ = false;
  TakeStatus gone_ = TakeStatus::kOk;
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kIo;
  detail::CallGuard calls_;
  detail::ReaderCounters stats_;
};

void GlobalOrderReader::Impl::Open() {
  const std::string queue = "global order reader: queue '" + queue_.name() + "'";
  if (queue_.num_samples() == 0)
    throw Error(ErrorKind::kInvalidArgument,
                queue +
                    " is a queue of files, not an index work over record numbers: read it "
                    "with a Reader, or open the queue with "
                    "GlobalOrderReader::QueueOptions(files, options)");
  if (queue_.num_samples() != files_->size())
    throw Error(ErrorKind::kInvalidArgument,
                queue + " is an index work of " + std::to_string(queue_.num_samples()) +
                    " samples, but the " + std::to_string(files_->num_files()) + " files hold " +
                    std::to_string(files_->size()) +
                    " records: open the queue with GlobalOrderReader::QueueOptions(files, "
                    "options) for these files");
  if (options_.records_per_read == 0 || options_.records_per_read > kMaxRecordsPerRead)
    throw Error(ErrorKind::kInvalidArgument, "global order reader: records_per_read (" +
                                                 std::to_string(options_.records_per_read) +
                                                 ") must be between 1 and " +
                                                 std::to_string(kMaxRecordsPerRead));
  if (options_.read_threads == 0)
    throw Error(ErrorKind::kInvalidArgument, "global order reader: read_threads must be >= 1");
  // Enough for a batch that spans many items: no allocation while reading.
  held_.reserve(64);
  segs_.reserve(64);
  numbers_.reserve(options_.records_per_read);
  ends_.reserve(options_.records_per_read);
}

// Acks the items whose every position was handed out (the caller asked for
// more, so it used them), front first; drops stale ones there.
void GlobalOrderReader::Impl::Settle() noexcept {
  size_t done = 0;
  while (done < held_.size()) {
    Held& h = held_[done];
    if (!h.stale) {
      if (h.next < h.end || h.used < h.next) break;
      ItemStatus status = queue_.Ack(h.item);
      if (status == ItemStatus::kOk) {
        Bump(stats_.items_acked);
      } else if (!QueueGone(status)) {
        MarkStale(h, " at its ack");
      }
    } else if (h.used < h.next) {
      break;  // records of it read before it went stale are still to be handed out
    }
    ++done;
  }
  if (done == 0) return;
  held_.erase(held_.begin(), held_.begin() + static_cast<ptrdiff_t>(done));
  front_serial_ += done;
}

bool GlobalOrderReader::Impl::SetOrder(uint64_t epoch) noexcept {
  if (order_ && order_epoch_ == epoch) return true;
  try {
    order_.emplace(queue_, epoch);  // per epoch: a few words (the permutation's keys)
    order_epoch_ = epoch;
    return true;
  } catch (const Error& e) {
    Fail(e.what(), e.kind());
  } catch (const std::exception& e) {
    Fail(e.what(), ErrorKind::kInvalidArgument);
  }
  return false;
}

// Takes one item into held_. kOk: taken. kEmpty: nothing now (TryTake, or
// the deadline passed). kEnd, kError as the call returns them.
ReadStatus GlobalOrderReader::Impl::TakeItem(bool may_wait, Deadline deadline) noexcept {
  WorkItem item;
  TakeStatus status = may_wait ? queue_.Take(&item, deadline) : queue_.TryTake(&item);
  if (QueueGone(status)) return FailGone();
  switch (status) {
    case TakeStatus::kOk:
      break;
    case TakeStatus::kTimeout:
      return ReadStatus::kEmpty;
    case TakeStatus::kEnd:
      ended_ = true;
      return ReadStatus::kEnd;
    case TakeStatus::kJobLost:
      return Fail(queue_.JobLossMessage(), ErrorKind::kCorrupt);
    case TakeStatus::kLimit:
      if (!held_.empty()) return ReadStatus::kEmpty;  // hand out what is read; acks free leases
      return Fail(
          "global order reader: the queue hands this process no more items: it already holds "
          "leases_per_client open items (other readers on the same WorkQueue?); raise "
          "WorkQueueOptions::leases_per_client",
          ErrorKind::kInvalidArgument);
    default:
      return Fail(std::string("global order reader: take: ") + TakeStatusName(status),
                  ErrorKind::kInvalidArgument);
  }
  if (held_.size() == held_.capacity()) {
    try {
      held_.reserve(held_.size() * 2);
    } catch (const std::bad_alloc&) {
      queue_.GiveBack(item);
      return Fail("global order reader: out of memory", ErrorKind::kNoSpace);
    }
  }
  held_.push_back(Held{item, item.end, item.begin, item.begin, false});
  Bump(stats_.items_taken);
  // Claim nothing yet, but say that we claim before we read: an idle process
  // may split the tail of this item from now on.
  uint64_t end = item.end;
  ItemStatus claimed = queue_.Claim(item, item.begin, &end);
  if (QueueGone(claimed)) return FailGone();
  if (claimed == ItemStatus::kStale) MarkStale(held_.back(), "");
  held_.back().end = std::min(held_.back().end, end);
  return ReadStatus::kOk;
}

// Reads the next group: up to `want` positions of held items (taking more of
// one epoch while that needs no wait), claimed, mapped to record numbers and
// read in one ReadRecords call. REQUIRES: the last group was handed out.
ReadStatus GlobalOrderReader::Impl::Fill(size_t want, Deadline deadline) noexcept {
  numbers_.clear();
  segs_.clear();
  handed_ = 0;
  while (numbers_.size() < want) {
    Held* back = held_.empty() ? nullptr : &held_.back();
    if (back == nullptr || back->stale || back->next >= back->end) {
      if (numbers_.empty()) Settle();  // invariant 3: hold nothing finished while waiting
      ReadStatus taken = TakeItem(numbers_.empty(), deadline);
      if (taken == ReadStatus::kError) return taken;
      if (taken != ReadStatus::kOk) {
        if (numbers_.empty()) return taken;
        break;  // hand out what is read
      }
      back = &held_.back();
      if (!numbers_.empty() && back->item.epoch != group_epoch_) break;  // next group's
      continue;
    }
    if (numbers_.empty()) group_epoch_ = back->item.epoch;
    if (!SetOrder(back->item.epoch)) return ReadStatus::kError;
    const uint64_t room = want - numbers_.size();
    const uint64_t up_to = std::min(back->next + room, back->end);
    uint64_t end = back->end;
    ItemStatus claimed = queue_.Claim(back->item, up_to, &end);
    if (QueueGone(claimed)) return FailGone();
    if (claimed == ItemStatus::kStale) {
      MarkStale(*back, " at a claim");
      continue;
    }
    back->end = std::min(back->end, end);
    const uint64_t stop = std::min(up_to, back->end);
    if (stop <= back->next) continue;  // split off up to here: the item is read
    const uint64_t serial = front_serial_ + held_.size() - 1;
    segs_.push_back(
        Seg{serial, numbers_.size(), back->next, static_cast<size_t>(stop - back->next)});
    const size_t at = numbers_.size();
    numbers_.resize(at + static_cast<size_t>(stop - back->next));
    order_->Fill(back->next, stop, numbers_.data() + at);
    back->next = stop;
  }
  data_.clear();
  ends_.clear();
  try {
    ReadRecords(*files_, numbers_, &data_, &ends_, options_.read_threads);
  } catch (const Error& e) {
    return Fail(e.what(), e.kind());
  } catch (const std::bad_alloc&) {
    return Fail("global order reader: out of memory reading " + std::to_string(numbers_.size()) +
                    " records",
                ErrorKind::kNoSpace);
  } catch (const std::exception& e) {
    return Fail(std::string("global order reader: ") + e.what(), ErrorKind::kIo);
  }
  Bump(stats_.reads);
  Bump(stats_.bytes_read, data_.size());
  return ReadStatus::kOk;
}

// Hands out records [handed_, handed_ + n) of the group and reports each
// item's positions among them used (Progress), so a checkpoint taken after
// this call resumes after them.
void GlobalOrderReader::Impl::HandOut(Record* out, size_t n) noexcept {
  const std::byte* base = reinterpret_cast<const std::byte*>(data_.data());
  const bool tfrecord =
      files_->num_files() > 0 && files_->file(0).format.kind == RecordFormatKind::kTfrecord;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = handed_ + i;
    const uint64_t begin = k == 0 ? 0 : ends_[k - 1];
    size_t f;
    uint64_t r;
    files_->Locate(numbers_[k], &f, &r);
    const RecordIndex& index = files_->file(f);
    const uint64_t payload = index.Offset(r);
    Record& rec = out[i];
    rec.data = base + begin;
    rec.size = static_cast<size_t>(ends_[k] - begin);
    rec.offset = tfrecord ? payload - kTfrecordHeader : payload;
    rec.end = payload + rec.size + (tfrecord ? kTfrecordFooter : 0);
  }
  const size_t from = handed_, to = handed_ + n;
  for (const Seg& s : segs_) {
    if (s.first + s.count <= from || s.first >= to) continue;
    Held& h = BySerial(s.serial);
    const uint64_t used = s.begin + (std::min(to, s.first + s.count) - s.first);
    if (!h.stale) {
      ItemStatus status = queue_.Progress(h.item, used, used - h.used);
      if (QueueGone(status)) {
        h.stale = true;  // the next call fails (FailGone)
      } else if (status == ItemStatus::kStale) {
        MarkStale(h, " at a progress report");
      }
    }
    h.used = used;
    current_ = h.item;
  }
  handed_ = to;
  last_first_ = from;
  last_count_ = n;
  Bump(stats_.records, n);
}

ReadStatus GlobalOrderReader::Impl::Produce(Record* out, size_t max, size_t* n,
                                            Deadline deadline) noexcept {
  last_count_ = 0;
  if (failed_) return ReadStatus::kError;
  if (gone_ != TakeStatus::kOk) return FailGone();
  if (closed_) return ReadStatus::kEnd;
  if (out == nullptr || max == 0)
    return Fail("global order reader: NextBatch needs out != null and max >= 1",
                ErrorKind::kInvalidArgument);
  Settle();  // what the last call handed out is used now
  if (gone_ != TakeStatus::kOk) return FailGone();
  if (handed_ == numbers_.size()) {
    if (ended_ && held_.empty()) return ReadStatus::kEnd;
    // A batch reads what it asks for (a group larger would end the next
    // batch short); records one by one read records_per_read ahead.
    const size_t want =
        max == 1 ? options_.records_per_read : std::min<size_t>(max, kMaxRecordsPerRead);
    ReadStatus filled = Fill(want, deadline);
    if (filled != ReadStatus::kOk) {
      if (filled != ReadStatus::kError) current_ = WorkItem{};
      return filled;
    }
  }
  *n = std::min(max, numbers_.size() - handed_);
  HandOut(out, *n);
  return ReadStatus::kOk;
}

void GlobalOrderReader::Impl::MarkStale(Held& h, const char* where) noexcept {
  h.stale = true;
  Bump(stats_.stale_items);
  try {
    Notice("tailcut global order reader: item " + std::to_string(h.item.index) + " of queue '" +
           queue_.name() + "' (positions " + std::to_string(h.item.begin) + " to " +
           std::to_string(h.item.end) + ") was reassigned (lease timeout)" + where +
           "; stopped reading it; its new owner reads it again");
  } catch (...) {
  }
}

void GlobalOrderReader::Impl::GiveBackAll() noexcept {
  for (Held& h : held_) {
    if (h.stale) continue;
    if (queue_.GiveBack(h.item) == ItemStatus::kOk) Bump(stats_.items_given_back);
  }
  front_serial_ += held_.size();
  held_.clear();
  segs_.clear();
  handed_ = numbers_.size();  // nothing left to hand out; the bytes stay until destroyed
  current_ = WorkItem{};
}

ReadStatus GlobalOrderReader::Impl::Fail(const std::string& message, ErrorKind kind) noexcept {
  if (!failed_) {
    failed_ = true;
    error_kind_ = kind;
    try {
      error_ = message;
    } catch (...) {
    }
    GiveBackAll();
  }
  last_count_ = 0;
  return ReadStatus::kError;
}

// Never kEnd for a closed queue: that would end the epoch early in silence.
ReadStatus GlobalOrderReader::Impl::FailGone() noexcept {
  const std::string queue = "global order reader: queue '" + queue_.name() + "' ";
  if (gone_ == TakeStatus::kClosed)
    return Fail(queue +
                    "was closed while this reader was reading it; the items it held were given "
                    "back, not finished: close or destroy every reader before its WorkQueue",
                ErrorKind::kInvalidArgument);
  return Fail(queue +
                  "was opened by another process (this is a forked child): open the WorkQueue "
                  "in this process",
              ErrorKind::kInvalidArgument);
}

void GlobalOrderReader::Impl::Close() noexcept {
  if (closed_) return;
  closed_ = true;
  GiveBackAll();
}

// ---- GlobalOrderReader --------------------------------------------------------

WorkQueueOptions GlobalOrderReader::QueueOptions(const RecordFiles& files,
                                                 WorkQueueOptions options) {
  const uint64_t n = files.size();
  options.works.clear();
  options.prefix.clear();
  options.format.clear();
  options.num_samples = n;
  options.shuffle = true;
  // QueueDataset(shuffle="global")'s item sizes (tailcut/torch/_queue_dataset.py):
  // 64 items, of 256 to 4096 records where there are enough.
  if (!options.num_slices)
    options.num_slices =
        std::min(std::max<uint64_t>(1, n / 256), std::max<uint64_t>((n + 4095) / 4096, 64));
  if (options.leases_per_client == kDefaultLeases) options.leases_per_client = kGlobalShuffleLeases;
  // The Python WorkQueue's for an index work: a tail of 8 records is worth
  // another process's time (splits still fall on the engine's split unit).
  if (options.min_split_bytes == kDefaultMinSplit) options.min_split_bytes = kIndexMinSplit;
  return options;
}

std::unique_ptr<GlobalOrderReader> GlobalOrderReader::Open(WorkQueue& queue,
                                                           std::shared_ptr<const RecordFiles> files,
                                                           GlobalOrderReaderOptions options) {
  if (!files)
    throw Error(ErrorKind::kInvalidArgument,
                "global order reader: files is null; build them with RecordFiles::Build");
  auto impl = std::make_unique<Impl>(queue, std::move(files), std::move(options));
  impl->Open();
  return std::unique_ptr<GlobalOrderReader>(new GlobalOrderReader(std::move(impl)));
}

GlobalOrderReader::GlobalOrderReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GlobalOrderReader::~GlobalOrderReader() {
  // A forked child's copy: the items are the parent's; giving them back
  // here would take them from it. Leak it.
  if (impl_->owner().forked()) (void)impl_.release();
}

ReadStatus GlobalOrderReader::NextRecord(Record* out, Deadline deadline) noexcept {
  size_t n = 0;
  return NextBatch(out, 1, &n, deadline);
}

ReadStatus GlobalOrderReader::NextBatch(Record* out, size_t max, size_t* n,
                                        Deadline deadline) noexcept {
  *n = 0;
  if (impl_->owner().forked()) return ReadStatus::kForked;
  if (!impl_->Enter()) return ReadStatus::kError;
  ReadStatus status = impl_->Leave(impl_->Produce(out, max, n, deadline));
  if (status != ReadStatus::kOk) *n = 0;
  return status;
}

std::span<const uint64_t> GlobalOrderReader::numbers() const noexcept { return impl_->numbers(); }
uint64_t GlobalOrderReader::epoch() const noexcept { return impl_->epoch(); }
WorkItem GlobalOrderReader::current_item() const noexcept { return impl_->current_item(); }
void GlobalOrderReader::Close() noexcept {
  if (!impl_->owner().forked()) impl_->Close();
}
const std::string& GlobalOrderReader::error() const noexcept { return impl_->error(); }
ErrorKind GlobalOrderReader::error_kind() const noexcept { return impl_->error_kind(); }
size_t GlobalOrderReader::items_held() const noexcept { return impl_->items_held(); }
bool GlobalOrderReader::forked() const noexcept { return impl_->owner().forked(); }
ReaderStats GlobalOrderReader::stats() const noexcept { return impl_->stats(); }
const RecordFiles& GlobalOrderReader::files() const noexcept { return impl_->files(); }

}  // namespace tailcut
