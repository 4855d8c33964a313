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
//   std::vector<std::unique_ptr<tailcut::Reader>> owned;
//   std::vector<tailcut::Reader*> readers;
//   for (int i = 0; i < 4; ++i) {
//     owned.push_back(tailcut::Reader::Open(*queue, options));
//     readers.push_back(owned.back().get());
//   }
//   tailcut::Shuffler shuffler(readers, {.buffer_records = 8192, .seed = 7});
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
//    valid until the next Next call. Each Reader gets leases for its own
//    items: k Readers with prefetch_items p need k * (p + 1) leases
//    (WorkQueueOptions::leases_per_client). Open them with
//    ReaderOptions::wait_at_lease_limit: an item of theirs that another
//    process split keeps its lease until that process finishes its piece.
//  * Deadlines: as Reader::NextRecord. While any Reader waits at the end of
//    the data, the buffer is drained first; kEmpty comes only when the buffer
//    is empty and every Reader not at its end said kEmpty.
//  * Checkpoints: SaveState() returns the RNG state and the records in the
//    buffer (they were read from the queue but not handed out); save it with
//    the queue's state and pass it to the constructor to go on from there.
//    The record handed out last is not in it.
//  * Crashes and early stops: the Readers ack an item once its last record is
//    in the buffer, so the buffered records of acked items exist only here.
//    A process that dies, or a Shuffler destroyed before kEnd/kEmpty without
//    SaveState, loses them (at most buffer_records records): the queue's
//    exactly-once becomes at-most-once for them. Draining to kEnd or kEmpty
//    loses nothing.
//  * max_epoch: a Reader whose next record comes from an item of a later
//    epoch is closed (Reader::Close gives that item back whole, since none
//    of its records was buffered) and counts as ended.
//  * Errors: the constructor throws tailcut::Error (kInvalidArgument: not 1
//    to 64 Readers, buffer_records 0; kCorrupt: a state that is not a Shuffler
//    state). Next is noexcept; a Reader's error comes after the buffered
//    records are handed out (error() and error_kind() then say what), and
//    sticks.
#ifndef TAILCUT_SHUFFLER_H_
#define TAILCUT_SHUFFLER_H_

#include <cstddef>
#include <cstdint>
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
};

class TAILCUT_EXPORT Shuffler {
 public:
  Shuffler(std::vector<Reader*> readers, ShufflerOptions options, std::string_view state = {});
  Shuffler(const Shuffler&) = delete;
  Shuffler& operator=(const Shuffler&) = delete;

  // The next record in shuffled order; *out valid until the next call.
  ReadStatus Next(Record* out, Deadline deadline = Deadline::max()) noexcept;

  // RNG state and buffered records, to restore with the constructor.
  std::string SaveState() const;
  size_t buffered() const noexcept { return count_; }
  // The epoch of the item the record handed out last came from.
  uint64_t epoch() const noexcept { return slots_[count_].epoch; }
  const std::string& error() const noexcept { return error_; }
  // After kError: the failing Reader's kind, or kNoSpace (out of memory).
  ErrorKind error_kind() const noexcept { return error_kind_; }

 private:
  struct Slot {
    std::vector<std::byte> bytes;  // capacity reused from record to record
    uint64_t offset = 0;
    uint64_t epoch = 0;
  };
  uint64_t Random() noexcept;
  // Reads until the buffer is full or no Reader has a record now; waits
  // (until deadline) for other processes' items only with the buffer empty
  // and no Reader holding an item.
  ReadStatus Fill(Deadline deadline) noexcept;
  // One round of reads; a Reader waits until `deadline` only while the
  // buffer is empty.
  void FillPass(Deadline deadline) noexcept;
  void Take(const Record& record, uint64_t epoch);  // may throw std::bad_alloc

  std::vector<Reader*> readers_;
  std::vector<uint32_t> live_;  // indices of Readers not at their end
  ShufflerOptions options_;
  uint64_t rng_ = 0;
  std::vector<Slot> slots_;  // [0, count_) hold records; slots_[count_] was handed out last
  size_t count_ = 0;
  bool failed_ = false;  // a Reader failed (or memory ran out): kError once drained
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kIo;
};

}  // namespace tailcut

#endif  // TAILCUT_SHUFFLER_H_
