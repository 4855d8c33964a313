// tailcut/reader.h: the per-process reader of work items.
//
// A Reader takes items (file slices) from a WorkQueue, reads them with
// io_uring (or a pool of pread threads) into one arena of chunk buffers, and
// hands the bytes to the consumer as records, batches of records or raw
// chunks, in file order, one item after another.
//
//   auto queue = tailcut::WorkQueue::Open(queue_options);
//   tailcut::ReaderOptions options;  // a {.format = ...} initializer warns
//   options.format = format;         // under -Wextra (fields left out)
//   auto reader = tailcut::Reader::Open(*queue, options);
//   tailcut::Record record;
//   while (reader->NextRecord(&record) == tailcut::ReadStatus::kOk) Use(record);
//   if (!reader->error().empty()) Fail(reader->error());
//
// Contract
//  * Threads: a Reader is used by one thread at a time (it may move between
//    threads, not be shared by them). stats() may be read from any thread.
//    Two Next* calls that overlap are detected (one relaxed atomic exchange
//    per call): the second returns kError at once, touching nothing, and the
//    first ends with the sticky kError ("called from two threads at once"),
//    the Reader's items given back, so records are never handed out wrong.
//  * Fork: a Reader belongs to the process that opened it; a forked child must
//    open its own (the buffers are not even mapped in the child). In the
//    child every call returns kForked (AckFinished, GiveBackFinished: the
//    queue's kForked) and touches nothing; destroying the parent's Reader
//    there frees nothing either (its threads and ring are the parent's).
//  * Ownership: the WorkQueue is not owned and must outlive the Reader:
//    destroying it first aborts with a message naming the queue (see
//    work_queue.h, Handles). A queue closed under the Reader makes the next
//    call fail (kError) with "queue 'q' was closed while this Reader was
//    reading it", never end early. The Reader owns its buffers, files, ring
//    and threads.
//  * Items: the Reader takes at most prefetch_items items beyond the one being
//    read. The current item is acked when its last record has been handed out
//    and the consumer asks for the next (with ReaderOptions::defer_acks, the
//    caller acks it instead: see TakeFinished); Progress(item, offset, records) is
//    reported as each chunk is used up, so a checkpoint resumes mid-item.
//    With defer_acks the records handed out are not used yet (they wait in
//    the caller's buffer), so the offset reported is only what the caller
//    said was used (ReportUsed), the item's begin until it does: a
//    checkpoint never counts as used a record the caller did not use.
//    Close() (and the destructor) gives back every item not acked, the
//    current one included (the queue hands a given-back item out again from
//    its start, so records of it already handed out may be read again).
//  * Tail splitting: before records (or bytes) of a chunk become visible, the
//    Reader claims them (WorkQueue::Claim). A process with nothing left to
//    take may split off the unclaimed tail of the current item; the Reader
//    then stops where the item now ends. current_item() keeps the original
//    range.
//  * Records: a Record (or ChunkView) points into the Reader's buffers and is
//    valid until the next NextRecord/NextBatch/NextChunk call. All records of
//    one batch stay valid together. Close() leaves the bytes of the last ones
//    as they are; the memory is unmapped when the Reader is destroyed.
//  * End of data: when nothing is left to take but other live processes
//    still hold items (which come back if they die or give them back), the
//    Next* calls wait for them, at most until their deadline, and then return
//    kEmpty. kEmpty comes only when the Reader holds no item (items_held() is
//    0): every record it read was handed out, nothing is stranded, and
//    Close() then gives back nothing. The next call continues as if the wait
//    had never stopped: no record is lost or repeated. The wait sleeps on the
//    queue's futex and wakes as soon as an item comes back or all are done.
//    The deadline bounds only this wait: reads of the Reader's own items in
//    flight are always waited for (device time). With defer_acks the Reader
//    never waits while its caller holds finished items it has not acked
//    (each process would wait for the others' forever): kHoldsFinished.
//  * Lease timeout: if the queue reassigned an item this Reader holds (it
//    looked hung), the Reader stops reading that item at the next claim or
//    progress report and counts it in stats().stale_items. Records of it
//    already handed out stay handed out, and the process the queue gives the
//    item to reads it again from its start: under a lease timeout a record
//    is delivered at least once, not exactly once.
//  * Errors: Open throws tailcut::Error (bad options, no memory, io_uring
//    forced but unavailable). The Next* calls are noexcept; per record they
//    take no lock, allocate nothing and make no system call. System calls
//    happen at chunk boundaries (submit, wait) and item boundaries (take,
//    open the next item's file). A failed read, a truncated or vanished file
//    or a corrupt record returns kError; error() names the file and offset.
//    The error is sticky: every later call returns kError. The failing item
//    and all other items the Reader holds are given back at once (none is
//    acked, none is lost), so another process, or a new Reader, gets them.
#ifndef TAILCUT_READER_H_
#define TAILCUT_READER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tailcut/export.h"
#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace tailcut {

// Which I/O path reads the files.
enum class IoBackend {
  // The TAILCUT_IO environment variable ("uring" or "pread") when set, which
  // then forces that path; otherwise io_uring, falling back to pread with a
  // one-line notice when the ring cannot be set up (ENOSYS: old kernel or
  // seccomp; EPERM: kernel.io_uring_disabled; ENOMEM: RLIMIT_MEMLOCK).
  kDefault,
  kUring,  // io_uring only; Open throws if it is unavailable
  kPread,  // a small pool of threads calling pread(2)
};

// What the Next* calls hand out.
enum class ReadMode {
  kRecords,  // NextRecord / NextBatch: records of options.format
  kChunks,   // NextChunk: the raw bytes [begin, end) of each item, no parsing
};

struct ReaderOptions {
  RecordFormat format;
  ReadMode mode = ReadMode::kRecords;
  // One arena of this many bytes (rounded down to whole chunks) holds every
  // chunk buffer; it must hold at least 3 chunks. Records that cross chunk
  // boundaries are joined in a separate carry buffer that grows on demand up
  // to format.max_record_bytes (see docs/io.md).
  uint64_t buffer_budget_bytes = 64ull << 20;
  // Bytes per read and per buffer; rounded up to a multiple of 4 KiB.
  uint64_t chunk_bytes = 4ull << 20;
  // Reads in flight at once. 0: min(16, chunks / 2). At most chunks - 2.
  uint32_t queue_depth = 0;
  // Items taken ahead of the current one. Small on purpose: an item held here
  // is an item a faster process cannot take.
  uint32_t prefetch_items = 2;
  // O_DIRECT: offsets, lengths and buffers aligned to the file's direct-I/O
  // alignment. A file whose filesystem refuses O_DIRECT is read buffered,
  // with a notice once per filesystem.
  bool direct = false;
  IoBackend backend = IoBackend::kDefault;
  // io_uring, buffered reads: set IOSQE_ASYNC so that the kernel's workers copy
  // page-cache-hot data in parallel with the consumer (see docs/io.md).
  bool uring_async_buffered = true;
  // Threads that copy buffered reads: the pread backend's workers, and the
  // most io-wq workers an io_uring Reader lets run its IOSQE_ASYNC reads. 0: 2.
  uint32_t pread_threads = 0;
  // Register the arena with the CUDA runtime (cudaHostRegister) when one can
  // be loaded at run time and has a device. No build dependency on CUDA.
  bool cuda_register = true;
  // When the Reader holds no item and the queue refuses it one because this
  // process holds leases_per_client items: false (the default) fails with
  // kInvalidArgument, since another user of the same WorkQueue holds them and
  // waiting could wait for ourselves; true waits as at the end of the data
  // (until the deadline, then kEmpty). For Readers whose siblings free leases
  // as they read (a Shuffler's): an item of this process that another process
  // split stays leased until that process finishes its piece.
  bool wait_at_lease_limit = false;
  // For a caller that keeps records after the next Next* call (a Shuffler's
  // buffer): an item whose last record was handed out is not acked but waits
  // for TakeFinished, and the caller acks it (AckFinished) once its records
  // are used, or gives it back (GiveBackFinished). Those items keep their
  // leases until then, so the Reader waits at the lease limit as with
  // wait_at_lease_limit.
  bool defer_acks = false;
  // Where one-line notices go (fallbacks, memory locking, CUDA). Default: stderr.
  std::function<void(const std::string&)> on_notice;
};

enum class ReadStatus {
  kOk,     // a record, batch or chunk was handed out
  kEnd,    // every item of every epoch is done
  kError,  // error() says what, where; sticky
  kEmpty,  // nothing yet: the deadline passed while other live processes still
           // hold items (which come back if they die); call again
  // ReaderOptions::defer_acks only: nothing to read now, and the caller holds
  // finished items (TakeFinished, or not taken yet) that it has not acked or
  // given back. The Reader would wait for other processes' items here, and
  // they may be waiting for these: take them, ack (or give back) those whose
  // records were used, and call again. Comes only where the call would wait
  // (a deadline in the future); holding nothing, the Reader waits as usual.
  kHoldsFinished,
  kForked,  // called in a forked child of the process that opened the Reader
};

// A short lowercase name, e.g. "forked", for messages and logs.
TAILCUT_EXPORT const char* ReadStatusName(ReadStatus status) noexcept;

// The Next* calls wait for items that other processes hold until their
// Deadline (tailcut/deadline.h): by default until an item comes back or all
// are done.

// Raw bytes of the current item (ReadMode::kChunks): file bytes
// [offset, offset + size) of current_item().path.
struct ChunkView {
  const std::byte* data = nullptr;
  size_t size = 0;
  uint64_t offset = 0;
};

// Counters since Open. Written by the reading thread only, readable anywhere.
struct ReaderStats {
  uint64_t bytes_read = 0;  // bytes that reads returned
  uint64_t records = 0;     // records (or chunks in kChunks mode) handed out
  uint64_t items_taken = 0;
  uint64_t items_acked = 0;
  uint64_t items_given_back = 0;
  uint64_t reads = 0;          // reads submitted, resubmissions included
  uint64_t short_reads = 0;    // completions with fewer bytes than asked
  uint64_t retries = 0;        // -EAGAIN / -EINTR resubmissions
  uint64_t carried_bytes = 0;  // bytes copied to join records across chunks
  // Items the queue reassigned to another process (lease timeout) while this
  // Reader held them: it stopped reading each where it was (see Contract).
  uint64_t stale_items = 0;
};

class TAILCUT_EXPORT Reader {
 public:
  // Sets up the arena, the I/O backend and the parsers; takes no item yet.
  // Throws tailcut::Error: kInvalidArgument for bad options (naming the field)
  // or a format the queue's format tag does not allow (RecordFormat::FitsTag;
  // ReadMode::kRecords only), naming both, or an index work (no file),
  // kNoSpace when the arena cannot be mapped, kIo when a forced io_uring
  // cannot be set up.
  static std::unique_ptr<Reader> Open(WorkQueue& queue, ReaderOptions options);

  // Closes (see Close()).
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The next record. kOk: *out is valid until the next call on this Reader.
  // kEmpty: deadline passed at the end of the data (see Contract).
  ReadStatus NextRecord(Record* out, Deadline deadline = Deadline::max()) noexcept;
  // Up to max records into out[0..*n). kOk means *n >= 1; any other status
  // means *n == 0. A batch ends early at a chunk boundary or at the end of an
  // item (so all its records come from current_item() and stay valid together
  // until the next call).
  ReadStatus NextBatch(Record* out, size_t max, size_t* n,
                       Deadline deadline = Deadline::max()) noexcept;
  // ReadMode::kChunks: the next piece of the current item's bytes.
  ReadStatus NextChunk(ChunkView* out, Deadline deadline = Deadline::max()) noexcept;

  // ReaderOptions::defer_acks: the oldest item whose records were all handed
  // out and that nobody took yet, into *item; false when there is none. The
  // caller then owns it: it must AckFinished or GiveBackFinished it (dying
  // with it gives it back). Items the Reader stopped reading because the
  // queue reassigned them (stats().stale_items) never come here.
  bool TakeFinished(WorkItem* item) noexcept;
  // Acks an item TakeFinished gave (kStale, with a notice, if the queue
  // reassigned it meanwhile: its new owner reads it again). Counted in
  // stats() as the Reader's own acks are. Also after Close().
  ItemStatus AckFinished(const WorkItem& item) noexcept;
  // Gives back an item TakeFinished gave: it is handed out again from its
  // start (or its last WorkQueue::Commit), so its records are read again.
  ItemStatus GiveBackFinished(const WorkItem& item) noexcept;
  // ReaderOptions::defer_acks: every record of `item` (the current one, one
  // taken ahead, or one TakeFinished gave) that starts before `offset` was
  // used, so a checkpoint (WorkQueue::SaveState) resumes the item there.
  // Pass the smallest offset of a record not used yet, or Record::end of the
  // last one when all were. Offsets below an earlier report are ignored for
  // the Reader's own items (they only move forward); the offset is clamped
  // to the item. WorkQueue::Progress's statuses; kInvalid without defer_acks.
  ItemStatus ReportUsed(const WorkItem& item, uint64_t offset) noexcept;

  // Waits for reads in flight, gives back every item not acked (the current
  // one too: it is handed out again from its start, and with defer_acks the
  // finished ones nobody took), closes files and frees the buffers. Idempotent;
  // afterwards the Next* calls return kEnd (or the sticky kError).
  void Close() noexcept;

  // After kError: e.g. "file '/d/a.txt' at offset 4096: read returned end of
  // file, 8192 bytes expected (file truncated while reading?)". Empty otherwise.
  const std::string& error() const noexcept;
  // After kError, what kind of failure: kIo (a read failed, or the file is
  // shorter than when the queue was created), kNotFound / kPermission (the
  // file cannot be opened), kCorrupt (a record fails validation or exceeds
  // max_record_bytes), kInvalidArgument (a misuse, e.g. NextChunk in
  // kRecords mode).
  ErrorKind error_kind() const noexcept;
  // The item being read (the one the last record came from); a default
  // WorkItem before the first record and after the end.
  WorkItem current_item() const noexcept;
  // Items this Reader holds now: the current one (even when all its records
  // are out but it is not acked yet) plus those taken ahead. 0 means the next
  // Next* call must take an item first, which is where it may wait (kEmpty).
  size_t items_held() const noexcept;
  // ReaderOptions::defer_acks as opened.
  bool defers_acks() const noexcept;
  // True in a forked child of the process that opened the Reader (every call
  // returns kForked there). No system call.
  bool forked() const noexcept;
  ReaderStats stats() const noexcept;
  // One line on the buffers, e.g. "buffers: 64 MiB locked + io_uring-registered"
  // or "buffers: 64 MiB not locked: RLIMIT_MEMLOCK is 8 MiB; raise it with
  // `ulimit -l unlimited` or LimitMEMLOCK=infinity (systemd)"; "+ CUDA-pinned"
  // where the CUDA runtime registered them, else (with cuda_register) ending
  // in "; not CUDA-pinned: <why>", e.g. "no CUDA device (cudaGetDeviceCount:
  // CUDA error 35 ...)". A host without a GPU gets no notice, only this.
  const std::string& memory_state() const noexcept;
  // "io_uring" or "pread".
  std::string_view backend_name() const noexcept;
  // The validated geometry: chunk bytes, number of chunks, queue depth.
  uint64_t chunk_bytes() const noexcept;
  uint32_t num_chunks() const noexcept;
  uint32_t queue_depth() const noexcept;

  class Impl;

 private:
  explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tailcut

#endif  // TAILCUT_READER_H_
