// The Shuffler: interleaves several Readers and shuffles through a buffer
// (see shuffler.h).
//
// Invariants:
//  1. slots_[0, count_) hold the buffered records; slots_[count_] holds the
//     record handed out last (valid until the next Next, which may refill
//     that slot). slots_ has buffer_records + 1 entries, or more after a
//     restore of a larger state.
//  2. live_ lists the Readers that have not said kEnd; the Shuffler never
//     calls a Reader after its kEnd or kError.
//  3. Every item a Reader handed over (TakeFinished) is, until it is acked
//     or given back, in exactly one place: items_ (finished, records of it
//     still buffered) or done_ (none buffered, acked at the next release).
//     items_[i].buffered counts the slots in [0, count_) whose item is i.
//  4. reading_[r] is the entry of the item readers_[r] hands out records
//     of; an entry neither finished nor abandoned is some reading_[r].
//  5. items_[i].pending holds, in read order, the records of item i from
//     its first one not handed out on (a slot's seq indexes it from
//     first_seq); so every record of it before handed_to was handed out,
//     and reported <= handed_to is what its Reader last told the queue.
#include "tailcut/shuffler.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace tailcut {

namespace {

// Version 3 is the RNG state alone: the queue's state resumes every item
// below its first record not handed out, so buffered records are read again.
// Versions 1 and 2 carried the buffered records (their queue states counted
// finished items as read to the end): still restored, version 1's records
// taken as epoch 0.
constexpr char kMagic[8] = {'t', 'c', 's', 'h', 'u', 'f', '3', '\0'};
constexpr char kMagicV2[8] = {'t', 'c', 's', 'h', 'u', 'f', '2', '\0'};
constexpr char kMagicV1[8] = {'t', 'c', 's', 'h', 'u', 'f', '1', '\0'};

void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}

bool GetU64(std::string_view* in, uint64_t* v) {
  if (in->size() < 8) return false;
  std::memcpy(v, in->data(), 8);
  in->remove_prefix(8);
  return true;
}

}  // namespace

Shuffler::Shuffler(std::vector<Reader*> readers, ShufflerOptions options, std::string_view state)
    : readers_(std::move(readers)), options_(options) {
  if (readers_.empty() || readers_.size() > 64 ||
      std::count(readers_.begin(), readers_.end(), nullptr) > 0) {
    throw Error(ErrorKind::kInvalidArgument, "shuffler: needs 1 to 64 Readers (got " +
                                                 std::to_string(readers_.size()) +
                                                 ", or a null one)");
  }
  if (options_.buffer_records == 0) {
    throw Error(ErrorKind::kInvalidArgument, "shuffler: buffer_records must be at least 1");
  }
  for (size_t i = 0; i < readers_.size(); ++i) {
    if (!readers_[i]->defers_acks()) {
      throw Error(ErrorKind::kInvalidArgument,
                  "shuffler: Reader " + std::to_string(i) +
                      " acks its own items, so records in the buffer would be lost with the "
                      "process; open every Reader with ReaderOptions::defer_acks = true");
    }
  }
  for (uint32_t i = 0; i < readers_.size(); ++i) live_.push_back(i);
  reading_.assign(readers_.size(), kNone);
  rng_ = options_.seed;
  size_t restored = 0;
  std::vector<BufferedRecord> slots;
  if (!state.empty()) {
    auto corrupt = [](const char* what) {
      return Error(ErrorKind::kCorrupt, std::string("shuffler: the state to restore is ") + what +
                                            "; pass the string SaveState() returned, unchanged");
    };
    if (state.size() < sizeof kMagic) throw corrupt("not a Shuffler state (bad magic)");
    const bool v3 = std::memcmp(state.data(), kMagic, sizeof kMagic) == 0;
    const bool v1 = std::memcmp(state.data(), kMagicV1, sizeof kMagicV1) == 0;
    if (!v3 && !v1 && std::memcmp(state.data(), kMagicV2, sizeof kMagicV2) != 0)
      throw corrupt("not a Shuffler state (bad magic)");
    state.remove_prefix(sizeof kMagic);
    uint64_t count = 0;
    if (!GetU64(&state, &rng_) || (!v3 && !GetU64(&state, &count))) throw corrupt("truncated");
    for (uint64_t i = 0; i < count; ++i) {
      BufferedRecord slot;
      uint64_t size = 0;
      if (!GetU64(&state, &slot.offset) || (!v1 && !GetU64(&state, &slot.epoch)) ||
          !GetU64(&state, &size) || state.size() < size)
        throw corrupt("truncated");
      const auto* p = reinterpret_cast<const std::byte*>(state.data());
      slot.bytes.assign(p, p + size);
      state.remove_prefix(size);
      slots.push_back(std::move(slot));
    }
    if (!state.empty()) throw corrupt("longer than it says (trailing bytes)");
    restored = slots.size();
  }
  slots.resize(std::max(options_.buffer_records, restored) + 1);
  slots_ = std::move(slots);
  count_ = restored;
}

Shuffler::~Shuffler() { Close(); }

std::string Shuffler::SaveState() const {
  std::string out(kMagic, sizeof kMagic);
  PutU64(&out, rng_);
  return out;
}

// splitmix64: one word of state (so a checkpoint is one integer), and good
// enough statistically to pick buffer slots.
uint64_t Shuffler::Random() noexcept {
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

// A lease slot and its generation name one taking of an item.
bool SameTaking(const WorkItem& a, const WorkItem& b) {
  return a.lease == b.lease && a.generation == b.generation;
}

}  // namespace

void Shuffler::Take(uint32_t r, const Record& record, uint64_t epoch) {
  const WorkItem item = readers_[r]->current_item();
  if (reading_[r] != kNone && !SameTaking(items_[reading_[r]].item, item)) Abandon(r);
  if (reading_[r] == kNone) {
    uint32_t i;
    if (!free_items_.empty()) {
      i = free_items_.back();
      free_items_.pop_back();
    } else {
      items_.emplace_back();
      // Reserved here, so that freeing an entry or queueing its ack (Drop,
      // in the noexcept Next) never allocates.
      free_items_.reserve(items_.size());
      done_.reserve(items_.size() + readers_.size());
      i = static_cast<uint32_t>(items_.size() - 1);
    }
    Tracked& t = items_[i];
    t.item = item;
    t.reader = r;
    t.buffered = 0;
    t.finished = t.abandoned = false;
    t.used = true;
    t.pending.clear();
    t.first_seq = 0;
    t.read_to = t.handed_to = t.reported = item.begin;
    reading_[r] = i;
  }
  Tracked& t = items_[reading_[r]];
  BufferedRecord& slot = slots_[count_];
  slot.bytes.assign(record.data, record.data + record.size);
  t.pending.push_back(Pending{record.offset, false});  // the last call that may throw
  slot.offset = record.offset;
  slot.end = record.end;
  slot.epoch = epoch;
  slot.file = item.file;
  slot.seq = t.first_seq + t.pending.size() - 1;
  slot.item = reading_[r];
  t.read_to = record.end;
  ++t.buffered;
  ++count_;
}

void Shuffler::MarkHanded(const BufferedRecord& slot) noexcept {
  Tracked& t = items_[slot.item];
  t.pending[slot.seq - t.first_seq].handed = true;  // in pending: only handed ones leave it
  while (!t.pending.empty() && t.pending.front().handed) {
    t.pending.pop_front();
    ++t.first_seq;
  }
  t.handed_to = t.pending.empty() ? t.read_to : t.pending.front().offset;
}

void Shuffler::ReportHanded(uint32_t i) noexcept {
  Tracked& t = items_[i];
  if (!t.used || t.abandoned || t.handed_to <= t.reported) return;
  t.reported = t.handed_to;
  readers_[t.reader]->ReportUsed(t.item, t.handed_to);
}

void Shuffler::CollectFinished(uint32_t r) {
  WorkItem item;
  while (readers_[r]->TakeFinished(&item)) {
    const uint32_t at = reading_[r];
    if (at != kNone && SameTaking(items_[at].item, item)) {
      items_[at].finished = true;
      reading_[r] = kNone;
      Drop(at);
    } else {
      // An item none of whose records came here (an empty slice): nothing
      // of it is buffered.
      try {
        done_.push_back(Done{item, r});
      } catch (const std::bad_alloc&) {
        readers_[r]->GiveBackFinished(item);
      }
    }
  }
}

void Shuffler::Abandon(uint32_t r) noexcept {
  const uint32_t at = reading_[r];
  if (at == kNone) return;
  items_[at].abandoned = true;
  reading_[r] = kNone;
  Drop(at);
}

void Shuffler::Drop(uint32_t i) noexcept {
  Tracked& t = items_[i];
  if (t.buffered > 0 || (!t.finished && !t.abandoned)) return;
  if (t.finished) {
    try {
      done_.push_back(Done{t.item, t.reader});  // capacity reserved in Take, mostly
    } catch (const std::bad_alloc&) {
      readers_[t.reader]->GiveBackFinished(t.item);  // read again: never lost
    }
  }
  t.used = false;
  free_items_.push_back(i);  // capacity reserved in Take
}

void Shuffler::ReportUsed() noexcept {
  for (uint32_t i = 0; i < items_.size(); ++i) ReportHanded(i);
}

void Shuffler::Release() noexcept {
  // With ack_on_next, Next reported each record as it handed it out.
  if (!options_.ack_on_next) ReportUsed();
  if (done_.empty()) return;
  for (const Done& d : done_) readers_[d.reader]->AckFinished(d.item);
  done_.clear();
  dry_ = 0;  // leases came free, and the end of the data may have come
}

void Shuffler::Close() noexcept {
  if (closed_) return;
  closed_ = true;
  for (const Done& d : done_) readers_[d.reader]->GiveBackFinished(d.item);
  done_.clear();
  for (Tracked& t : items_) {
    if (t.used && t.finished) readers_[t.reader]->GiveBackFinished(t.item);
    t.used = false;
  }
  count_ = 0;
  live_.clear();
}

ReadStatus Shuffler::Fill(Deadline deadline) noexcept {
  // First without waiting for other processes' items: a Reader at the end of
  // the data would otherwise wait for the items its sibling Readers hold,
  // which only this thread can read (forever with Deadline::max()). Only
  // when every Reader holds nothing (each said kEmpty) does one of them wait.
  FillPass(Deadline::min());
  if (count_ == 0 && !failed_ && !live_.empty()) {
    // Finished items hold leases the Readers may be waiting for.
    Release();
    dry_ = 0;
    FillPass(deadline);
  }
  if (count_ > 0) return ReadStatus::kOk;
  // Nothing to hand out. Readers may have handed over items during this call
  // whose records were all handed out by earlier ones (a Reader finishes an
  // item when asked after its last record): ack them now, or a consumer that
  // stops here would give them back at Close.
  if (options_.ack_on_next) Release();
  if (failed_) return ReadStatus::kError;
  return live_.empty() ? ReadStatus::kEnd : ReadStatus::kEmpty;
}

void Shuffler::FillPass(Deadline deadline) noexcept {
  // Readers that said kEmpty during this pass: not asked again in it.
  uint64_t empty_now = 0;  // bit i: live_[i] (at most 64 Readers)
  size_t empties = 0;
  uint64_t released_for = 0;  // bit r: readers_[r] said kHoldsFinished once in this pass
  // Dry Readers sit this pass out while there are records to hand out.
  if (deadline == Deadline::min()) {
    for (size_t i = 0; i < live_.size(); ++i) {
      if (dry_ & (1ull << live_[i])) {
        empty_now |= 1ull << i;
        ++empties;
      }
    }
  }
  while (count_ + 1 < slots_.size() && !failed_ && empties < live_.size()) {
    // Lemire's multiply-shift maps a random word onto [0, live_.size()).
    size_t pick =
        static_cast<size_t>((static_cast<unsigned __int128>(Random()) * live_.size()) >> 64);
    while (empty_now & (1ull << pick)) pick = (pick + 1) % live_.size();
    const uint32_t r = live_[pick];
    Reader& reader = *readers_[r];
    // With records to hand out, never wait for other processes' items.
    Record record;
    ReadStatus status = reader.NextRecord(&record, count_ > 0 ? Deadline::min() : deadline);
    uint64_t epoch = status == ReadStatus::kOk ? reader.current_item().epoch : 0;
    try {
      CollectFinished(r);
      if (status == ReadStatus::kOk && options_.max_epoch && epoch > *options_.max_epoch) {
        // The first record of an item past max_epoch: not buffered, so closing
        // the Reader gives that item back whole; the Reader is done.
        reader.Close();
        status = ReadStatus::kEnd;
      }
      if (status == ReadStatus::kOk) Take(r, record, epoch);
    } catch (const std::bad_alloc&) {
      // Nothing is lost: the items of this Reader not yet handed over stay
      // its own, and Close (or the destructor) gives back the others.
      failed_ = true;
      error_kind_ = ErrorKind::kNoSpace;
      error_ = "shuffler: out of memory buffering records; lower buffer_records";
      return;
    }
    // A Reader that ended, failed (and gave back what it held) or was
    // closed reads its current item no further.
    if (status == ReadStatus::kEnd || status == ReadStatus::kError) Abandon(r);
    if (status == ReadStatus::kHoldsFinished && !(released_for & (1ull << r))) {
      // Only with the buffer empty (else it is not asked to wait): every
      // record of its finished items was handed out, so ack them, which
      // other processes at the end of the data may be waiting for, and ask
      // it again. A second time in this pass it counts as empty.
      released_for |= 1ull << r;
      Release();
      continue;
    }
    switch (status) {
      case ReadStatus::kOk:
        break;
      case ReadStatus::kHoldsFinished:
      case ReadStatus::kEmpty:
        empty_now |= 1ull << pick;
        ++empties;
        if (count_ > 0) {
          // Asking a Reader at the end of the data again at every record
          // costs a scan of the queue each time (orphans, splits): ask again
          // only after kDryRecords records, or once acks free leases.
          dry_ |= 1ull << r;
          dry_countdown_ = kDryRecords;
        }
        break;
      case ReadStatus::kEnd:
        live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(pick));
        // Bits above pick shift down with the indices.
        {
          const uint64_t below = (1ull << pick) - 1;
          empty_now = (empty_now & below) | ((empty_now >> 1) & ~below);
        }
        break;
      case ReadStatus::kForked:  // Next returns it before it gets here
      case ReadStatus::kError:
        failed_ = true;
        error_kind_ = reader.error_kind();
        try {
          error_ = reader.error();
        } catch (...) {
        }
        break;
    }
  }
}

ReadStatus Shuffler::Next(Record* out, Deadline deadline) noexcept {
  // A forked child's copy: the buffered records point into the parent's Readers.
  if (!readers_.empty() && readers_[0]->forked()) return ReadStatus::kForked;
  if (closed_) return failed_ ? ReadStatus::kError : ReadStatus::kEnd;
  if (options_.ack_on_next) Release();
  ReadStatus status = Fill(deadline);
  if (status != ReadStatus::kOk) return status;
  size_t i = static_cast<size_t>((static_cast<unsigned __int128>(Random()) * count_) >> 64);
  --count_;
  std::swap(slots_[i], slots_[count_]);  // moves two vectors: no copy of the bytes
  const BufferedRecord& slot = slots_[count_];
  if (slot.item != kNone) {
    MarkHanded(slot);
    --items_[slot.item].buffered;
    // A record handed out counts as used for a checkpoint (the caller saves
    // one between calls); for a crash only once it asks for the next.
    if (options_.ack_on_next) ReportHanded(slot.item);
    Drop(slot.item);
  }
  if (dry_ != 0 && --dry_countdown_ == 0) dry_ = 0;
  out->data = slot.bytes.data();
  out->size = slot.bytes.size();
  out->offset = slot.offset;
  return ReadStatus::kOk;
}

}  // namespace tailcut
