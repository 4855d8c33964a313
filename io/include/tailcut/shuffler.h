// tailcut/shuffler.h: records in a seeded random order, within a window.
//
// A Reader hands out the records of one item in file order, item after item.
// A Shuffler mixes them the way tf.data's interleave + shuffle do:
//  * interleave: it reads from several Readers on the same WorkQueue, each
//    with its own item open, picking the Reader of each next record at
//    random, so records of `readers.size()` items arrive mixed;
//  * shuffle: they go into a buffer of buffer_records records; each Next
//    hands out a uniformly random one of them and the next record read
//    takes its place.
// With one process, the same queue seed and the same Shuffler seed, the
// order is the same in every run (the Readers take items in ticket order).
// With max_epoch, records of items of later epochs are never buffered, so a
// pass over one epoch can be shuffled on its own (tailcut.torch does this).
//
//   tailcut::ReaderOptions options;
//   options.format = format;
//   options.defer_acks = true;
//   std::vector<std::unique_ptr<tailcut::Reader>> owned;
//   std::vector<tailcut::Reader*> readers;
//   for (int i = 0; i < 4; ++i) {
//     owned.push_back(tailcut::Reader::Open(*queue, options));
//     readers.push_back(owned.back().get());
//   }
//   tailcut::ShufflerOptions shuffling;
//   shuffling.buffer_records = 8192;
//   shuffling.seed = 7;
//   tailcut::Shuffler shuffler(readers, shuffling);
//   tailcut::Record record;
//   while (shuffler.Next(&record) == tailcut::ReadStatus::kOk) Use(record);
//
// Mixing (shuffler_test's MixingAndCostAgainstAFullShuffleAndFileOrder prints it
// next to a full shuffle; 200,000 records in 64 items taken in file order): with 4
// Readers and 8192 records, 0.01% of neighbours are consecutive records
// (file order: 100%, a full shuffle: 0.002%) and a record moves ~7,000
// places (a full shuffle: ~67,000). A window shuffle cannot move a record
// further than about buffer_records plus the interleaved items' length:
// shuffle the items too (WorkQueueOptions::shuffle) for mixing across the
// whole data set. Records of two epochs mix near the boundary, as with
// tf.data's shuffle after repeat.
//
// Contract
//  * Threads: one thread at a time. The Readers are not owned, must outlive
//    the Shuffler, and nothing else may call their Next* functions.
//  * Records: the Record handed out points into the Shuffler's buffer and is
//    valid until the next Next call.
//  * Exactly once: the Readers must be opened with ReaderOptions::defer_acks,
//    so that an item is acked only once all its records have left the
//    buffer and been used: with ack_on_next (the default), at the first
//    Next after its last record was handed out, as a Reader acks its own;
//    otherwise at Release(). A process that dies, or a Shuffler closed
//    before the end, loses no record: every item not acked goes back to the
//    queue whole (records of it already handed out are then read again, as
//    with a Reader's current item).
//  * Leases: each Reader gets leases for its own items, and a finished item
//    keeps its lease until it is acked: k Readers with prefetch_items p hold
//    k * (p + 1) items plus those whose records are still buffered, within
//    WorkQueueOptions::leases_per_client (8 by default; prefetch_items 0 is
//    the usual choice). At the limit the Readers wait (defer_acks implies
//    ReaderOptions::wait_at_lease_limit) and the buffer drains, which frees
//    leases: the order mixes less then, but nothing stalls.
//  * Deadlines: as Reader::NextRecord. While any Reader waits at the end of
//    the data, the buffer is drained first; kEmpty comes only when the buffer
//    is empty and every Reader not at its end said kEmpty. Before it waits
//    with an empty buffer, Next releases (see Release()): the leases of
//    finished items may be what the queue waits for; a Reader's
//    kHoldsFinished is answered the same way, and Next never returns it.
//  * Checkpoints: the queue's state (WorkQueue::SaveState) alone loses no
//    record. Per item the Shuffler tells its Reader (Reader::ReportUsed)
//    the offset below which every record was handed out: with ack_on_next
//    as it hands each out, otherwise at ReportUsed() and Release(). A
//    restore reads each open item again from there, so records buffered or
//    not handed out yet are read again, and so are records handed out
//    above that offset (out of order, as shuffled): a checkpoint repeats up
//    to about buffer_records records per process and never loses one.
//    SaveState() is the RNG state: with it (and the same queue state, seed
//    and Readers) the restored order is the same in every run. A state of
//    an earlier version carries the records buffered then, restored too.
//  * max_epoch: a Reader whose next record comes from an item of a later
//    epoch is closed (Reader::Close gives that item back whole, since none
//    of its records was buffered) and counts as ended.
//  * Errors: the constructor throws tailcut::Error (kInvalidArgument: not 1
//    to 64 Readers, a Reader without defer_acks, buffer_records 0; kCorrupt:
//    a state that is not a Shuffler state). Next is noexcept; a Reader's
//    error comes after the buffered records are handed out (error() and
//    error_kind() then say what), and sticks. A failed Reader gives back the
//    items it holds; their buffered records are still handed out and will be
//    read again by another process (at least once).
#ifndef TAILCUT_SHUFFLER_H_
#define TAILCUT_SHUFFLER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tailcut/export.h"
#include "tailcut/reader.h"

namespace tailcut {

struct ShufflerOptions {
  size_t buffer_records = 8192;  // records held for shuffling; > 0
  uint64_t seed = 0;
  std::optional<uint64_t> max_epoch;  // buffer no record of an item past it
  // true: each Next first acks the items whose records were all handed out
  // by earlier calls (a record is used once the consumer asks for the next).
  // false: only Release() acks them (and Next, before it waits with an empty
  // buffer), for a consumer that keeps records longer, e.g. packs batches.
  bool ack_on_next = true;
};

class TAILCUT_EXPORT Shuffler {
 public:
  Shuffler(std::vector<Reader*> readers, ShufflerOptions options, std::string_view state = {});
  Shuffler(const Shuffler&) = delete;
  Shuffler& operator=(const Shuffler&) = delete;

  // The next record in shuffled order; *out valid until the next call.
  ReadStatus Next(Record* out, Deadline deadline = Deadline::max()) noexcept;

  // Acks every item whose records were all handed out: the caller has used
  // them (or passed them on to where they outlive this process). Without
  // ack_on_next, calls ReportUsed() first.
  void Release() noexcept;
  // Without ack_on_next: every record handed out so far reached the caller,
  // so a checkpoint taken now counts it as used (see Checkpoints); acks
  // nothing. With ack_on_next Next does this as it hands out each record.
  void ReportUsed() noexcept;
  // Gives back every item not acked (finished items whose records are
  // buffered or were handed out since the last release); the buffer is
  // dropped and Next returns kEnd (or the sticky kError) from now on. The
  // Readers are left open: close them after. Idempotent; the destructor
  // calls it.
  void Close() noexcept;
  ~Shuffler();

  // The RNG state, to restore with the constructor (see Checkpoints).
  std::string SaveState() const;
  size_t buffered() const noexcept { return count_; }
  // The epoch of the item the record handed out last came from.
  uint64_t epoch() const noexcept { return slots_[count_].epoch; }
  // The work file (WorkItem::file, an index into works) the record handed
  // out last came from; kUnknownFile for a record restored from a version 1
  // or 2 state, which did not keep it.
  static constexpr uint32_t kUnknownFile = UINT32_MAX;
  uint32_t file() const noexcept { return slots_[count_].file; }
  const std::string& error() const noexcept { return error_; }
  // After kError: the failing Reader's kind, or kNoSpace (out of memory).
  ErrorKind error_kind() const noexcept { return error_kind_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct BufferedRecord {
    std::vector<std::byte> bytes;  // capacity reused from record to record
    uint64_t offset = 0;
    uint64_t end = 0;  // Record::end
    uint64_t epoch = 0;
    uint32_t file = kUnknownFile;  // WorkItem::file of its item
    uint64_t seq = 0;              // its place among its item's records (Tracked::first_seq)
    uint32_t item = kNone;         // index in items_; kNone for records of a version 1 or 2 state
  };
  // A record of a tracked item, in the order its Reader handed them over.
  struct Pending {
    uint64_t offset = 0;
    bool handed = false;  // handed out by Next
  };
  // An item with records in the buffer, or whose Reader is still reading it.
  struct Tracked {
    WorkItem item;
    uint32_t reader = 0;
    size_t buffered = 0;     // its records in slots_[0, count_)
    bool finished = false;   // its Reader handed it over (TakeFinished): not acked
    bool abandoned = false;  // its Reader gave it back or lost it: never acked here
    bool used = false;       // the entry is in use (else on free_items_)
    // Its records from the first one not handed out on; the front one is
    // never handed (popped once it is), so every record before
    // pending.front().offset (or before read_to, with none pending) was.
    std::deque<Pending> pending;
    uint64_t first_seq = 0;  // seq of pending.front()
    uint64_t read_to = 0;    // Record::end of its last record buffered
    uint64_t handed_to = 0;  // records before it were all handed out
    uint64_t reported = 0;   // handed_to as last passed to Reader::ReportUsed
  };
  // A finished item all of whose records were handed out: acked at the next release.
  struct Done {
    WorkItem item;
    uint32_t reader = 0;
  };
  uint64_t Random() noexcept;
  // Reads until the buffer is full or no Reader has a record now; waits
  // (until deadline) for other processes' items only with the buffer empty
  // and no Reader holding an item.
  ReadStatus Fill(Deadline deadline) noexcept;
  // One round of reads; a Reader waits until `deadline` only while the
  // buffer is empty.
  void FillPass(Deadline deadline) noexcept;
  // Buffers a record of the item readers_[r] is reading; may throw std::bad_alloc.
  void Take(uint32_t r, const Record& record, uint64_t epoch);
  // slots_[count_] was just handed out: moves its item's handed_to on.
  void MarkHanded(const BufferedRecord& slot) noexcept;
  // Tells items_[i]'s Reader how far it was handed out (checkpoints resume there).
  void ReportHanded(uint32_t i) noexcept;
  // Takes the items readers_[r] finished; may throw std::bad_alloc.
  void CollectFinished(uint32_t r);
  // After a record of items_[i] left the buffer, or the item ended: frees
  // the entry once nothing of it is buffered, queueing a finished one for
  // its ack.
  void Drop(uint32_t i) noexcept;
  void Abandon(uint32_t r) noexcept;  // readers_[r]'s current item is not ours to ack

  std::vector<Reader*> readers_;
  std::vector<uint32_t> live_;  // indices of Readers not at their end
  ShufflerOptions options_;
  uint64_t rng_ = 0;
  std::vector<BufferedRecord>
      slots_;  // [0, count_) hold records; slots_[count_] was handed out last
  size_t count_ = 0;
  std::vector<Tracked> items_;
  std::vector<uint32_t> free_items_;
  std::vector<uint32_t> reading_;  // per Reader: its current item in items_, or kNone
  std::vector<Done> done_;         // acked at the next release
  // Readers that said kEmpty with records buffered: not asked again for
  // dry_countdown_ more records (bit r: readers_[r]).
  static constexpr size_t kDryRecords = 64;
  uint64_t dry_ = 0;
  size_t dry_countdown_ = 0;
  bool closed_ = false;
  bool failed_ = false;  // a Reader failed (or memory ran out): kError once drained
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kIo;
};

}  // namespace tailcut

#endif  // TAILCUT_SHUFFLER_H_
