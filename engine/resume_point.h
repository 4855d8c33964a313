// Resume points of a lease: where its item is handed out again should it
// leave its owner unfinished, and where a checkpoint resumes it.
//
// Two offset words of the lease hold them (ProgressWord, segment_layout.h):
//   floor     where the item is handed out again (its owner dies, gives it
//             back, or loses it to a lease timeout): where it was handed
//             out, raised only by Commit.
//   progress  where a checkpoint (SaveState) resumes it while it is open:
//             the floor, raised by the owner's Progress until the owner
//             commits (from then on it holds the highest commit, and the
//             checkpoint takes the floor alone: a commit counts once its
//             floor CAS landed, for a checkpoint as for a crash).
// Both only move forward (but the first commit replaces what Progress said
// in the progress word), by CAS, and carry the generation tag of the lease
// word their writer held the lease by: a former owner's late write is told
// apart, and a reader that finds a foreign tag falls back to something
// earlier, which repeats bytes, never skips them. docs/reliability.md has
// the table of what each call means for a crash, a give-back, a lease
// timeout and a checkpoint.
//
// Thread- and process-safe: every function works on the lease's atomics.
// Hot path: noexcept, no allocation, no system call.
#ifndef TAILCUT_ENGINE_RESUME_POINT_H_
#define TAILCUT_ENGINE_RESUME_POINT_H_

#include <cstdint>
#include <string_view>

#include "engine/segment_layout.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

// The record size of a "fixed:N" format tag (RecordFormat::Tag), 0 for any
// other tag: the one format whose record boundaries the queue knows.
uint64_t FixedRecordBytes(std::string_view format_tag) noexcept;

// WorkQueue::Progress and WorkQueue::Commit on lease `ls`, which its caller
// holds by the OPEN word `ours`; record_bytes as FixedRecordBytes. kStale
// when the lease moved on (or is being handed on), kOutOfRange when offset
// lies outside the lease's [begin, end] or inside a fixed-size record, or
// (RecordCommit) below the floor: before an earlier commit, or before where
// the item was handed out again.
ItemStatus RecordProgress(LeaseEntry& ls, uint64_t ours, uint64_t offset,
                          uint64_t record_bytes) noexcept;
ItemStatus RecordCommit(LeaseEntry& ls, uint64_t ours, uint64_t offset,
                        uint64_t record_bytes) noexcept;

// Retags the floor of the lease held by `expected` for `orphan`, the word
// it is about to be handed back by (ReturnToOrphan), so that a late Commit
// of a paused owner either landed before and counts, or fails. A floor of
// another tag resumes at `begin`. False if the lease moved on meanwhile.
bool RetagFloor(LeaseEntry& ls, uint64_t expected, uint64_t orphan, uint64_t begin) noexcept;

// Where SaveState resumes a lease it read as (word, begin, floor, progress):
// the floor, raised by an OPEN lease's progress until its owner commits.
uint64_t CheckpointResume(uint64_t word, uint64_t begin, uint64_t floor,
                          uint64_t progress) noexcept;

// Whether a checkpoint may resume an item that begins at item_begin at
// `offset`: for fixed-size records a record boundary, the item's begin or a
// split point (a multiple of 4 KiB from it, where a piece begins).
bool IsResumableOffset(uint64_t offset, uint64_t item_begin, uint64_t record_bytes) noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_RESUME_POINT_H_
