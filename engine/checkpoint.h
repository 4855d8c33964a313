// The checkpoint codec: what WorkQueue::SaveState returns and
// WorkQueueOptions::restore_state takes, as bytes.
//
// A checkpoint is a few integers and a short bitmap: the data fingerprint,
// the seed, the lowest ticket not done (low), the cursor, the done bits
// between them, and the open pieces (ticket, resume offset, end). The scan
// that fills it from a live segment is state_scan.h's; this file only
// encodes and decodes, and refuses bytes that are not a checkpoint.
//
// ReopenRanges edits a checkpoint's pieces so that records handed out but
// not used (a pooled loader's batches in flight) are read again after a
// restore, and ConsumeRanges so that records used are not; MergeStates
// joins the states of several hosts' queues into one.
//
// Errors: DeserializeState throws tailcut::Error (kCorrupt) naming the queue
// and what is wrong (truncated, bad magic, version, checksum, counts);
// ReopenRanges throws that too, and kInvalidArgument naming a range that is
// empty or whose ticket the checkpoint does not have. Pure functions: safe
// from any thread.
#ifndef TAILCUT_ENGINE_CHECKPOINT_H_
#define TAILCUT_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tailcut/export.h"

namespace tailcut::detail {

struct Piece {
  uint64_t ticket, begin, end;
};

struct SavedState {
  uint64_t fingerprint = 0, num_items = 0, num_epochs = 0, seed = 0, low = 0, cursor = 0;
  std::vector<uint64_t> words;  // done bits for tickets [low/64*64, cursor)
  std::vector<Piece> pieces;
};

// Exported, as the two below, for the Python bindings and the tier's tests.
TAILCUT_EXPORT std::string SerializeState(const SavedState& state);
// `name` is the queue's, for the message.
TAILCUT_EXPORT SavedState DeserializeState(const std::string& name, const std::string& bytes);

struct Reopened {
  std::string state;    // the checkpoint with the new pieces
  uint64_t ranges = 0;  // how many pieces were added
};

// The checkpoint `bytes` with every (ticket, begin, end) range in `ranges`
// open again: a range of a ticket the checkpoint counts as consumed (done,
// or below an open piece's begin) becomes a piece of its own, minus what
// open pieces (and ranges added before it) already cover. Tickets at or past
// the cursor, and tickets neither done nor open (handed out whole after a
// restore), need nothing. Duplicate ranges count once. `name` is the
// queue's, for the messages.
TAILCUT_EXPORT Reopened ReopenRanges(const std::string& name, const std::string& bytes,
                                     const std::vector<Piece>& ranges);

// The checkpoint `bytes` with every (ticket, begin, end) range in `ranges`
// counted as consumed: what open pieces hold of a range is cut out of them
// (a piece may split in two; one cut away entirely is left empty,
// which a restore takes as its ticket done). For a
// pooled loader's batches that ranks used while their loader had published
// but not yet committed them (it commits right after the publish): the
// queue's own state would have them read again. Ranges of tickets done, at
// or past the cursor, or neither done nor open change nothing. Throws as
// ReopenRanges.
TAILCUT_EXPORT std::string ConsumeRanges(const std::string& name, const std::string& bytes,
                                         const std::vector<Piece>& ranges);

// One checkpoint holding what every checkpoint in `states` holds: the host
// states (WorkQueue::SaveHostState) of several hosts of one job fed by a
// coordinator, for one host that resumes them all (a restore on fewer hosts
// than the checkpoint's). A ticket is done where any state has it done (below
// a state's low, every ticket is); the open pieces are those of every state,
// pieces of one ticket that overlap joined into one (two hosts held the same
// ticket only when one was fenced: read once more, never lost); the cursor is
// the highest. One state comes back as it is. Throws kInvalidArgument naming
// the queue `name` when `states` is empty or its states are of different
// jobs (data fingerprint, items, epochs or seed), kCorrupt as
// DeserializeState.
TAILCUT_EXPORT std::string MergeStates(const std::string& name,
                                       const std::vector<std::string>& states);

// The lowest ticket with an open piece of work in `s` (UINT64_MAX if none):
// its done bit is set, and the piece is what is left of it (a range a rank
// never used, reopened). A restore starts no later than that ticket's epoch.
// Pieces at or past the cursor, and empty ones, mean nothing.
TAILCUT_EXPORT uint64_t LowestOpenPiece(const SavedState& s);

// A checkpoint of the job of checkpoint `like` with nothing handed out: what
// a host with no part of an exact checkpoint of a fed job restores from (a
// restore on more hosts than the checkpoint's). The queue it opens is empty,
// and a stale queue of an earlier run there is replaced, as for any restore.
// Throws as DeserializeState.
TAILCUT_EXPORT std::string EmptyState(const std::string& name, const std::string& like);

// A fed queue's restore_state from an exact checkpoint of a job across hosts
// (FedRestoreState, work_queue.h): the restore's token, the tier's state
// (GlobalStateWithHosts) and this host's own (SaveHostState). Laid out as
// "tailcut-fed-restore 1 TOKEN_LEN TIER_LEN HOST_LEN\n" and the three.
struct FedRestore {
  std::string token, tier, host;
};

TAILCUT_EXPORT bool IsFedRestore(const std::string& bytes);
std::string SerializeFedRestore(const FedRestore& restore);
// Throws kCorrupt naming the queue `name`.
TAILCUT_EXPORT FedRestore DeserializeFedRestore(const std::string& name, const std::string& bytes);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_CHECKPOINT_H_
