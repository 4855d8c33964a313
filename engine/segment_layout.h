// The layout of a queue's shared-memory segment.
//
// Plain fixed-size structs at offsets computed from a few counts in the
// header; nothing in the segment is a pointer, and every index read from it
// is bounds-checked before use. Offsets are never stored: an attacher
// recomputes them from the counts and checks they match the object's size.
//
//   Header | Counters | Cursor | ClientEntry[max_clients] | StepEntry[max_clients]
//   | LeaseEntry[max_clients * leases_per_client]
//   | FileEntry[num_files] | ItemEntry[num_items] | path bytes | done bitmap (u64 words)
//   [ | FedBlock[kFedBlocks] | skip bitmap (u64 words) ]   only in a fed queue
//
// Invariants (the numbers are referred to in lease.cc and housekeeper.cc):
//  I1. Ticket t in [0, total) is handed out by the cursor at most once: the
//      cursor only grows (fetch_add).
//  I2. A ticket's done bit is set at most once per item completion and never
//      cleared; bit set and no lease holding the ticket means done.
//  I3. Every ticket below the cursor that is not done is held by exactly one
//      lease (TAKING with its ticket, OPEN, ORPHAN or ACKING), or was lost by
//      a process that died between fetch_add and recording the ticket; such a
//      death leaves a TAKING lease with no ticket, counted in sweeps_pending,
//      and a sweep (under sweep_mutex) re-issues the lost ticket.
//  I4. A lease word changes only by CAS and every change bumps its
//      generation, so a holder whose lease was reassigned cannot ack it.
//  I6. A FREE lease's ticket is kNoTicket: whoever frees a lease clears the
//      ticket first, so a taker never writes a slot it does not own yet.
//      Only a lease's sole owner writes its fields: an ack clears them while
//      ACKING, before DONE_WAIT, because several may race to free a
//      DONE_WAIT anchor (by CAS alone, writing nothing).
//  I7. A split is one CAS on the anchor's extent word, made only after the
//      thief filled its own TAKING lease with the piece; the CAS records the
//      thief's lease as pending until the piece is OPEN. So a recoverer knows
//      whether a dead thief's split happened: exactly when pending names it.
//      An anchor is never freed (reused) while pending is set.
//  I5. A client slot is ACTIVE only while its life mutex is held by the
//      client's holder thread, or by nobody after the client died (the next
//      trylock gets EOWNERDEAD and recovers it exactly once; a recoverer that
//      dies passes EOWNERDEAD on to the next).
//
// Memory order, in short (each operation in lease.cc and housekeeper.cc
// names its partner): a lease's fields are written only by its holder and
// published by the release half of the CAS on its word, or by the release
// store of its ticket, which is written last; whoever reads them acquires
// the word or the ticket first. An ack sets its done bit (acq_rel fetch_or)
// before it frees the lease, so a reader that acquires a FREE word and then
// loads the bitmap sees the bit (AllDone, TrySweep, Stats, SaveState).
#ifndef TAILCUT_ENGINE_SEGMENT_LAYOUT_H_
#define TAILCUT_ENGINE_SEGMENT_LAYOUT_H_

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "engine/config.h"
#include "engine/shared_atomic.h"
#include "tailcut/export.h"

namespace tailcut::detail {

inline constexpr uint64_t kSegmentMagic = 0x3155434c49415421ull;  // "!TAILCU1"
// 3: FileEntry holds each file's identity (mtime, inode, device); the header
// the queue's lease timeout, its lifetime and why it is kept.
// 4: fed queues (the cross-host tier): the cursor's limit, the feeder mutex,
// the fed block table and the skip bitmap; orphan_seq on a line of its own.
// 5: a lease's resume point (floor) apart from its progress; the progress
// word carries whether its owner committed; anchor is 32 bits.
// 6: SplitUnit starts at 1 (was 4 KiB): an extent's units mean other offsets.
inline constexpr uint32_t kLayoutVersion = 6;
inline constexpr size_t kCacheLine = 64;

enum SegmentState : uint32_t { kCreating = 0, kReady = 1, kRemoved = 2 };
enum ClientState : uint32_t { kClientFree = 0, kClientActive = 1 };

// Lease word: state (3 bits) | owner client slot (13 bits) | generation (48 bits).
enum LeaseState : uint64_t {
  kLeaseFree = 0,
  kLeaseTaking = 1,    // owner reserved it; ticket may still be kNoTicket
  kLeaseOpen = 2,      // owner holds [begin, end) of ticket
  kLeaseOrphan = 3,    // waiting to be handed out again
  kLeaseAcking = 4,    // owner decided to ack; a recoverer completes it
  kLeaseDoneWait = 5,  // acked anchor kept until a thief's split of it is settled
};
inline constexpr uint64_t kNoTicket = ~uint64_t{0};
inline constexpr uint64_t kNoOwner = (uint64_t{1} << 13) - 1;
static_assert(kMaxClients < kNoOwner);

inline uint64_t LeaseWord(uint64_t state, uint64_t owner, uint64_t generation) {
  return state | (owner << 3) | (generation << 16);
}
inline uint64_t LeaseStateOf(uint64_t word) { return word & 7; }
inline uint64_t LeaseOwnerOf(uint64_t word) { return (word >> 3) & kNoOwner; }
inline uint64_t LeaseGenOf(uint64_t word) { return word >> 16; }
// The same lease in a new state and owner, one generation later (I4).
inline uint64_t NextLeaseWord(uint64_t word, uint64_t state, uint64_t owner) {
  return LeaseWord(state, owner, (LeaseGenOf(word) + 1) & ((uint64_t{1} << 48) - 1));
}

// Lease flag: the ticket's done bit was set when the lease was made (a piece
// restored from a checkpoint), so its ack must not set it again.
inline constexpr uint32_t kLeasePreset = 1;
// Lease flag: a tail split off another lease (its anchor). Its ack sets no
// done bit: the anchor's ack does, and "done" is "bit set and no lease holds
// the ticket".
inline constexpr uint32_t kLeasePiece = 2;

// The low bits of a lease word's generation, kept in words that are written
// after a check of the lease word (a paused owner's Claim or Progress may
// land after its lease was reassigned and taken again): a tag that does not
// match the lease word marks such a late write.
inline uint64_t GenTag(uint64_t lease_word, int bits) {
  return LeaseGenOf(lease_word) & ((uint64_t{1} << bits) - 1);
}

// Extent word of a lease, for tail splitting. Offsets are relative to the
// lease's begin in units of SplitUnit(end - begin) bytes:
//   bits 0-19  end: the owner stops at the first record starting at or past it
//   bits 20-39 claim: the owner may hand out records starting before it
//   bits 40-53 pending: lease index + 1 of a thief between its split CAS and
//              publishing its piece (0: none)
//   bits 54-61 tag: GenTag(8) of the word its owner holds the lease by (set
//              when the lease is filled or claimed), so that a CAS by a
//              former owner, or by a thief that read a former owner's
//              extent, fails
//   bit 62     splittable: the owner claims before it reads (set by Claim)
//   bit 63     split: at least one tail was split off
// A thief may lower end to a point past claim, only while pending is 0.
struct Extent {
  uint64_t end, claim, pending, tag;
  bool splittable, split;
  static Extent Of(uint64_t w) {
    return {w & 0xfffff,      (w >> 20) & 0xfffff,  (w >> 40) & 0x3fff,
            (w >> 54) & 0xff, ((w >> 62) & 1) != 0, (w >> 63) != 0};
  }
  // A fresh extent of `units` for an owner holding the lease by `word`.
  static Extent Fresh(uint64_t units, uint64_t word) {
    return {units, 0, 0, GenTag(word, 8), false, false};
  }
  uint64_t Word() const {
    return end | (claim << 20) | (pending << 40) | (tag << 54) | (uint64_t{splittable} << 62) |
           (uint64_t{split} << 63);
  }
};
static_assert(kMaxLeases < (uint64_t{1} << 14));
inline constexpr uint64_t kMaxExtentUnits = (uint64_t{1} << 20) - 1;
// Smallest power of two that expresses `length` in 20 bits: 1 (a byte, or a
// sample of an index work) for items under 1 MiB (or 2^20 samples), so that
// a small item splits where its records are, not in 4 KiB steps that put
// items of a few batches (a pool loader's, an index work's 256 samples)
// below any split.
inline uint64_t SplitUnit(uint64_t length) {
  uint64_t unit = 1;
  while (length / unit >= kMaxExtentUnits) unit *= 2;
  return unit;
}
inline uint64_t ExtentUnits(uint64_t length, uint64_t unit) { return (length + unit - 1) / unit; }

// Offset words of a lease (floor and progress): an offset (bits 0-47; files
// are at most kMaxFileBytes), the GenTag(15) of the word its writer held or
// published the lease by (bits 48-62), and in the progress word whether the
// owner committed (bit 63). A reader trusts the offset only when the tag
// matches the lease word it read; otherwise it falls back to something
// earlier (the floor, or the lease's begin), which repeats, never skips.
//
// floor: where the item is handed out again should it leave its owner (the
//   owner dies, gives it back, or loses it to a lease timeout): the lease's
//   begin, raised only by WorkQueue::Commit (what was handed on survives
//   the process). It only grows, by CAS, and moves to each next owner.
// progress: where a checkpoint (SaveState) resumes an open item: the floor,
//   raised by the owner's Progress; once the owner committed (bit 63), its
//   Progress no longer counts (it says what was parsed, not what was used).
inline constexpr uint64_t kCommittedBit = uint64_t{1} << 63;
inline uint64_t ProgressWord(uint64_t offset, uint64_t lease_word, bool committed = false) {
  return (offset & kMaxFileBytes) | (GenTag(lease_word, 15) << 48) |
         (committed ? kCommittedBit : 0);
}
inline bool ProgressOffset(uint64_t progress, uint64_t lease_word, uint64_t* offset) {
  if (((progress >> 48) & 0x7fff) != GenTag(lease_word, 15)) return false;
  *offset = progress & kMaxFileBytes;
  return true;
}
inline bool IsCommitted(uint64_t progress) { return (progress & kCommittedBit) != 0; }

// magic and state are stored with release by the creator (TryCreate) and
// loaded with acquire by attachers (Segment::WaitForMagic, TryAttach): what
// was written before each store is visible after the load that sees it.
struct alignas(kCacheLine) Header {
  SharedAtomic<uint64_t> magic;  // written after the admin mutex exists
  uint32_t layout_version;
  SharedAtomic<uint32_t> state;  // SegmentState; READY is published last
  uint64_t total_size;
  uint32_t creator_uid;
  int32_t creator_pid;
  uint64_t created_unix_ns;

  // Configuration, compared field by field on attach.
  uint64_t fingerprint;
  uint64_t num_files;
  uint64_t num_items;
  uint64_t num_epochs;
  uint64_t total_tickets;
  uint64_t total_bytes;
  uint64_t num_slices;
  uint64_t seed;
  uint32_t seed_explicit;
  uint32_t shuffle;
  uint64_t paths_hash;
  uint64_t sizes_hash;
  uint32_t num_clients;
  uint32_t max_clients;
  uint32_t leases_per_client;
  // 1: tickets come from a feeder (the cross-host tier), not from the
  // cursor alone: see Cursor::limit, FedBlock and the skip bitmap.
  uint32_t fed;
  uint64_t path_bytes;
  char format[kFormatTagBytes];
  // Hash of the checkpoint it started from, or 0. A fed queue: of the run of
  // the tier's job that feeds it (LocalFeed::BindRun, atomic_ref CAS from 0).
  uint64_t restore_hash;
  // The queue's lease timeout (0: never), set by its creator, or by the
  // process that resumes it when all others are gone; every process uses it.
  uint64_t lease_timeout_ms;

  // Serialises joins, leaves, removal and creation. Robust: a holder that
  // dies hands the next locker EOWNERDEAD.
  pthread_mutex_t admin_mutex;
  // Serialises sweeps for lost tickets (I3).
  pthread_mutex_t sweep_mutex;
  // Held by the host's feeder of a fed queue for as long as it feeds
  // (engine/local_feed.h): one feeder per host, the next one takes over
  // (EOWNERDEAD) when it dies.
  pthread_mutex_t feeder_mutex;
};

struct alignas(kCacheLine) Cursor {
  // I1. TakeOnce's acq_rel fetch_add: its release half publishes the TAKING
  // lease reserved before it to the acquire loads in TrySweep and AllDone (I3).
  SharedAtomic<uint64_t> next_ticket;
  // Tickets below it may be handed out: total_tickets in a queue of one
  // host; in a fed queue what its feeder granted so far (it only grows).
  // The feeder's release store (LocalFeed::Grant) pairs with TakeOnce's
  // acquire load: the skip bits it set below the new limit are seen.
  SharedAtomic<uint64_t> limit;
};

// wake_seq, waiters, orphan_seq, split_seq and step_seq are seq_cst on both
// sides (WakeWaiters and Take; MarkOrphan and ClaimOrphan; TrySplit and
// SaveState; AgreeStep). sweeps_pending is counted (acq_rel) before the
// lease that lost a ticket is freed, and loaded with acquire by TrySweep and
// AllDone. The rest are statistics, relaxed: nothing is published through them.
struct alignas(kCacheLine) Counters {
  // Bumped after every change of a lease to ORPHAN. A process scans the
  // leases for orphans only when it moved since its last fruitless scan.
  // Read by every take, written rarely: a cache line of its own, away from
  // the counters below that every ack and recovery writes.
  alignas(kCacheLine) SharedAtomic<uint64_t> orphan_seq;
  alignas(kCacheLine) SharedAtomic<uint32_t> wake_seq;  // futex word: bumped when waiters
                                                        // should look again
  SharedAtomic<uint32_t> waiters;                       // processes sleeping on wake_seq
  SharedAtomic<uint64_t> sweeps_pending;
  SharedAtomic<uint64_t> clients_joined;
  SharedAtomic<uint64_t> recovered_items;
  SharedAtomic<uint64_t> stale_acks;
  SharedAtomic<uint64_t> duplicate_acks;  // must stay 0; counted, never trusted
  SharedAtomic<uint64_t> splits;
  SharedAtomic<uint64_t> split_seq;  // bumped before and after every split CAS (SaveState rescans)
  SharedAtomic<uint32_t> step_seq;   // futex word: bumped when a rank publishes a step
  // Why the segment outlives its last Close while unfinished: KeepReason bits.
  SharedAtomic<uint32_t> keep_reasons;
  // A fed queue: 1 once its feeder learnt that every ticket of the job is
  // done on every host (LocalFeed::End). Release store there, acquire in
  // AllDone: the skip bits set before it are seen. kFedLost | reason once
  // the tier lost the job (LocalFeed::Lose: seq_cst, see there).
  SharedAtomic<uint32_t> fed_end;
  // A fed queue: futex word the leading feeder sleeps on between rounds;
  // bumped (seq_cst) by a taker that found nothing to take, so that the
  // feeder claims more at once rather than at its next round.
  SharedAtomic<uint32_t> feed_wanted;
};
static_assert(offsetof(Counters, orphan_seq) == 0 && offsetof(Counters, wake_seq) == kCacheLine,
              "orphan_seq has a cache line of its own");

// Why an unfinished queue is kept when its last process closes it (else it
// is removed): a process asked (keep_unfinished), or one died (the next run
// resumes what it left).
enum KeepReason : uint32_t { kKeepRequested = 1, kKeepCrashed = 2 };

// state: release stores (Register, Close, RecoverClient) pair with the
// acquire loads of whoever checks a client's life; the life mutex decides.
// The other fields are statistics and time stamps, relaxed.
struct alignas(kCacheLine) ClientEntry {
  pthread_mutex_t life;          // held by the client's holder thread (I5)
  SharedAtomic<uint32_t> state;  // ClientState
  SharedAtomic<int32_t> pid;
  SharedAtomic<uint64_t> joined_ns;
  SharedAtomic<uint64_t> last_progress_ns;
  SharedAtomic<uint64_t> items_taken;
  SharedAtomic<uint64_t> items_acked;
  SharedAtomic<uint64_t> items_given_back;
  SharedAtomic<uint64_t> items_recovered;
  SharedAtomic<uint64_t> bytes_acked;
  SharedAtomic<uint64_t> records;
  SharedAtomic<uint64_t> stale_acks;
  SharedAtomic<uint64_t> splits;
  SharedAtomic<uint64_t> idle_ns;
  SharedAtomic<uint64_t> left_ns;  // when it left (0 while active)
  // WorkQueueOptions::stop_timeout of the client (0: never), and when its
  // holder thread last ran (MonotonicNs): set before the slot is ACTIVE,
  // beaten while it is. Read by ReassignHung.
  SharedAtomic<uint64_t> stop_timeout_ns;
  SharedAtomic<uint64_t> heartbeat_ns;
};
static_assert(sizeof(ClientEntry) == 3 * kCacheLine,
              "ClientEntry grew: bump kLayoutVersion and say why in segment_layout.h");

// Equal steps: rank r publishes ((step + 1) << 1 | has_batch) in `word`,
// and, before it publishes its next step, ((step + 1) << 1 | all_have) in
// `decided`. A rank waits for all at every step, so it is at most one step
// ahead of any other: a laggard reads its decision instead of guessing.
// Both words are seq_cst on every access (AgreeStep).
struct alignas(kCacheLine) StepEntry {
  SharedAtomic<uint64_t> word;
  SharedAtomic<uint64_t> decided;
};

// word: every change is an acq_rel CAS (I4) whose release half publishes the
// fields below, written only by the lease's holder, to whoever acquires the
// word next. ticket: stored last with release by a taker, thief or publisher
// (TakeOnce, TrySplit, PublishOrphan), loaded with acquire by recoverers,
// sweeps and reassigners, which may read a TAKING lease before its word
// changes. extent: changed only by acq_rel CAS (Claim, TrySplit, FinishAck,
// SettleSplit, ClaimOrphan). flags: see ReadTicketAndFlags (lease.h).
// floor and progress: stored by whoever fills the lease (with the fields
// above), then changed only by acq_rel CAS (Progress, Commit, and
// ReturnToOrphan, which retags the floor for the orphan word, so that a late
// Commit of a paused owner either counts or fails); see ProgressWord.
struct alignas(kCacheLine) LeaseEntry {
  SharedAtomic<uint64_t> word;
  SharedAtomic<uint64_t> ticket;
  SharedAtomic<uint64_t> begin;
  SharedAtomic<uint64_t> end;
  SharedAtomic<uint64_t> progress;  // resume offset for checkpoints: ProgressWord
  SharedAtomic<uint64_t> extent;    // Extent word (tail splitting)
  SharedAtomic<uint32_t> anchor;    // pieces: the lease they were split off
  SharedAtomic<uint32_t> flags;
  SharedAtomic<uint64_t> floor;  // resume offset when handed out again: ProgressWord
};
static_assert(sizeof(LeaseEntry) == kCacheLine, "a lease fills one cache line");

// A block of tickets a fed queue's feeder holds from the cross-host tier,
// recorded so that a feeder that takes over after a death can renew and
// ack it at once. Written only by the feeder (under feeder_mutex): the
// fields first, then `first_plus1` with release; a successor acquires
// `first_plus1` and bounds-checks every field before it trusts them.
inline constexpr uint32_t kFedBlocks = 32;
struct FedBlock {
  SharedAtomic<uint64_t> first_plus1;  // first ticket + 1; 0: the entry is free
  SharedAtomic<uint64_t> last;         // tickets [first, last)
  SharedAtomic<uint64_t> generation;   // the tier's fencing token for the block
  // 1 once the block's skip bits are in place: its tickets are then exactly
  // those of [first, last) that are not skipped. A feeder that died before
  // (0) left bits a successor cannot read back; it forgets such a block,
  // which expires in the tier and is handed out again, whole.
  SharedAtomic<uint64_t> applied;
};

struct FileEntry {
  uint64_t path_offset;  // into the path bytes
  uint64_t path_length;
  uint64_t size;
  uint64_t mtime_ns;  // with size, inode and device: the file's FileIdentity
  uint64_t inode;
  uint64_t device;
};

struct ItemEntry {
  uint64_t file;
  uint64_t begin;
  uint64_t end;
};

// Offsets of each region, computed from counts; total == 0 when the counts
// overflow or exceed the limits.
struct Geometry {
  uint64_t num_files = 0, num_items = 0, total_tickets = 0, path_bytes = 0;
  uint32_t max_clients = 0, leases_per_client = 0;
  bool fed = false;
  size_t counters = 0, cursor = 0, clients = 0, steps = 0, leases = 0, files = 0, items = 0,
         paths = 0, bitmap = 0, fed_blocks = 0, skip = 0, total = 0;
  uint64_t num_leases() const { return uint64_t{max_clients} * leases_per_client; }
  uint64_t bitmap_words() const { return (total_tickets + 63) / 64; }
};

// Exported for tests that inspect or damage a segment on purpose.
TAILCUT_EXPORT Geometry ComputeGeometry(uint64_t num_files, uint64_t num_items,
                                        uint64_t total_tickets, uint64_t path_bytes,
                                        uint32_t max_clients, uint32_t leases_per_client,
                                        bool fed = false);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_SEGMENT_LAYOUT_H_
