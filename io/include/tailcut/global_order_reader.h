// tailcut/global_order_reader.h: records of many files in the global order
// (one seeded permutation of all of them), for a C++ trainer.
//
// The records of a RecordFiles (tailcut/record_index.h) are numbered
// 0..N-1; a WorkQueue opened as an index work over them (num_samples = N,
// QueueOptions below) hands out items of positions of its per-epoch
// permutation, and SampleOrder (tailcut/sample_order.h) maps each position to
// a record number. A GlobalOrderReader runs that loop: it takes items, claims
// their positions, maps them to record numbers, reads the records with
// ReadRecords and hands them out one by one or in batches, as a Reader does
// for file slices. It is QueueDataset(files, shuffle="global") of the Python
// package, in C++: with the queue QueueOptions makes and the same seed, the
// same records in the same order.
//
//   auto files = tailcut::RecordFiles::Build(paths, format, index_options);
//   WorkQueueOptions queue_options;
//   queue_options.name = "train";
//   queue_options.seed = 7;
//   auto queue = tailcut::WorkQueue::Open(
//       tailcut::GlobalOrderReader::QueueOptions(*files, queue_options));
//   auto reader = tailcut::GlobalOrderReader::Open(*queue, files);
//   tailcut::Record batch[256];
//   size_t n;
//   while (reader->NextBatch(batch, 256, &n) == tailcut::ReadStatus::kOk) Train(batch, n);
//   if (!reader->error().empty()) Fail(reader->error());
//
// Why a class of its own and not a mode of Reader: the Reader is a state
// machine over chunks of one file slice at a time (reads in flight, records
// joined across chunk buffers, a parser per item); here an item is a range of
// positions whose records lie anywhere in any file, read by number in one
// call. The two share the queue's protocol (take, claim, progress, ack, give
// back), not their reading, so each stays small; ReadStatus, Record,
// ReaderStats and Deadline are the Reader's, so a trainer switches between
// them by changing the open call.
//
// Contract
//  * Threads: used by one thread at a time (it may move between threads, not
//    be shared by them); stats() may be read from any thread. Two Next* calls
//    that overlap are detected as by the Reader: the second returns kError at
//    once, touching nothing, and the first ends with the sticky kError, the
//    items given back.
//  * Fork: belongs to the process that opened it. In a forked child every
//    Next* call returns kForked and touches nothing; destroying the parent's
//    object there gives nothing back (the items are the parent's).
//  * Ownership: the WorkQueue is not owned and must outlive the reader
//    (destroying it first aborts naming the queue; closing it under the
//    reader makes the next call fail with kError saying so). The RecordFiles
//    is shared (kept alive by the reader). The reader owns the buffer its
//    records point into.
//  * Items: the reader takes an item when it needs positions, never ahead (an
//    item held is one a faster process cannot take). A batch takes positions
//    from as many items of one epoch as it needs, taking the next one only
//    when it would not wait (WorkQueue::TryTake): a batch is short when the
//    next item is not to be had at once, at the end of an epoch (a batch
//    never mixes epochs), at the end of the data, and when records that
//    NextRecord read ahead (records_per_read) are left to hand out first. An item is acked when its
//    last record was handed out and the caller asks for more (the next Next*
//    call), as the Reader does: a process that dies while using the last
//    records of an item loses none of them (the item comes back whole).
//  * Progress: when a call hands records out, the reader reports them used
//    (WorkQueue::Progress: the position after the last one handed out, and
//    how many) before it returns. A checkpoint (WorkQueue::SaveState) taken
//    after a call, e.g. after the step that trained on its batch, resumes
//    exactly after that batch's last record, mid-item included. Close()
//    and the destructor give back every item not acked, finished ones
//    included, as the Reader's Close() does: the queue hands a given-back
//    item out again from its start.
//  * Tail splitting: positions are claimed (WorkQueue::Claim) before their
//    records are read; only what the batch (or records_per_read) needs is
//    claimed, so a process with nothing left to take may split off the
//    unclaimed tail of an item this reader holds. The reader then stops where
//    the item now ends.
//  * Records: a Record points into the reader's buffer and is valid until the
//    next Next* call (all records of a batch together). Record::data and size
//    are the payload (as the Reader hands it out); Record::offset is where
//    the record starts in its file (a TFRecord's header, a tar sample's first
//    header), Record::end where its payload ends (a TFRecord's data CRC
//    included, a line's newline not). numbers() gives the record numbers of
//    the last call's records (RecordFiles::Locate: which file); epoch() their
//    epoch.
//  * End of data: as the Reader. When nothing is left to take but other live
//    processes hold items, a call holding no record waits for them until its
//    Deadline, then returns kEmpty holding no item (items_held() == 0); the
//    next call continues with nothing lost or repeated.
//  * Lease timeout: an item the queue reassigned (stale at a claim or a
//    progress report) is read no further and counted in stats().stale_items;
//    records of it already read are still handed out (under a lease timeout
//    a record is delivered at least once, as with the Reader).
//  * Errors: Open throws tailcut::Error (kInvalidArgument naming the queue
//    and the numbers that disagree). The Next* calls are noexcept. Per
//    record they take no lock, allocate nothing and make no system call;
//    the work is per read of a group (one ReadRecords call, which sorts the
//    group's records by file and offset and copies them from each file's
//    mapping) and per item (take, claim, ack). A read that fails (a file
//    changed or truncated since it was indexed, a TFRecord whose data CRC
//    fails) returns kError and error() names the file and the offset; the
//    error is sticky, and every item the reader holds is given back at once
//    (none acked, none lost).
#ifndef TAILCUT_GLOBAL_ORDER_READER_H_
#define TAILCUT_GLOBAL_ORDER_READER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "tailcut/deadline.h"
#include "tailcut/export.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"
#include "tailcut/record_index.h"
#include "tailcut/work_queue.h"

namespace tailcut {

struct GlobalOrderReaderOptions {
  // Records NextRecord reads at once (one ReadRecords call; NextBatch reads
  // the batch asked for, at most 1 << 20). Between 1 and 1 << 20.
  uint32_t records_per_read = 64;
  // ReadRecords' threads: more than one helps only files read with pread (a
  // file that cannot be mapped) on a cold disk.
  uint32_t read_threads = 1;
  // Where one-line notices go (an item reassigned). Default: stderr.
  std::function<void(const std::string&)> on_notice;
};

class TAILCUT_EXPORT GlobalOrderReader {
 public:
  // The queue QueueDataset(files, shuffle="global") opens for these records,
  // from `options` (name, seed, num_epochs, num_clients, ...): an index work
  // of files.size() samples (works, prefix and format cleared), shuffled,
  // num_slices when unset min(max(1, N / 256), max(ceil(N / 4096), 64)), and
  // leases_per_client 32 and min_split_bytes 8 (records) when left at their
  // defaults (a batch holds its items open until it is handed on; Python's
  // WorkQueue splits an index work's tails down to 8 samples). Pure.
  static WorkQueueOptions QueueOptions(const RecordFiles& files, WorkQueueOptions options);

  // Takes no item yet. Throws tailcut::Error (kInvalidArgument): files null,
  // a queue of files (use Reader), a queue whose num_samples is not
  // files->size(), or bad options (naming the field).
  static std::unique_ptr<GlobalOrderReader> Open(WorkQueue& queue,
                                                 std::shared_ptr<const RecordFiles> files,
                                                 GlobalOrderReaderOptions options = {});

  // Closes (see Close()); in a forked child gives nothing back.
  ~GlobalOrderReader();
  GlobalOrderReader(const GlobalOrderReader&) = delete;
  GlobalOrderReader& operator=(const GlobalOrderReader&) = delete;

  // The next record; *out valid until the next call.
  ReadStatus NextRecord(Record* out, Deadline deadline = Deadline::max()) noexcept;
  // Up to max records into out[0..*n). kOk means *n >= 1; any other status
  // means *n == 0. Short as described in the Contract (Items).
  ReadStatus NextBatch(Record* out, size_t max, size_t* n,
                       Deadline deadline = Deadline::max()) noexcept;

  // The record numbers of the records the last kOk call handed out, in the
  // order handed out (empty after any other status).
  std::span<const uint64_t> numbers() const noexcept;
  // The epoch of the records the last kOk call handed out.
  uint64_t epoch() const noexcept;
  // The item the last record handed out came from (a default WorkItem before
  // the first record and after an end, an error or Close()).
  WorkItem current_item() const noexcept;

  // Gives back every item not acked (see Contract) and frees the buffer's
  // hold on them; records handed out by the last call stay readable until
  // the reader is destroyed. Idempotent; afterwards the Next* calls return
  // kEnd (or the sticky kError).
  void Close() noexcept;

  // After kError: what and where, e.g. "tfrecord file '/d/a.tfrecord' at
  // offset 4096: data CRC mismatch (...)". Empty otherwise.
  const std::string& error() const noexcept;
  // After kError: kIo, kNotFound, kPermission, kConfigMismatch (a file
  // changed since it was indexed), kCorrupt (a TFRecord's data CRC),
  // kInvalidArgument (a misuse).
  ErrorKind error_kind() const noexcept;
  // Items this reader holds now (taken, not acked or given back). 0 after
  // kEmpty, kEnd, kError and Close().
  size_t items_held() const noexcept;
  // True in a forked child of the process that opened it. No system call.
  bool forked() const noexcept;
  // bytes_read: payload bytes read; records: handed out; reads: ReadRecords
  // calls; items_*, stale_items as the Reader's; the rest stay 0.
  ReaderStats stats() const noexcept;
  const RecordFiles& files() const noexcept;

  class Impl;

 private:
  explicit GlobalOrderReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tailcut

#endif  // TAILCUT_GLOBAL_ORDER_READER_H_
