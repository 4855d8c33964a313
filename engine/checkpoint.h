// The checkpoint codec: what WorkQueue::SaveState returns and
// WorkQueueOptions::restore_state takes, as bytes.
//
// A checkpoint is a few integers and a short bitmap: the data fingerprint,
// the seed, the lowest ticket not done (low), the cursor, the done bits
// between them, and the open pieces (ticket, resume offset, end). The scan
// that fills it from a live segment is state_scan.h's; this file only
// encodes and decodes, and refuses bytes that are not a checkpoint.
//
// Errors: DeserializeState throws tailcut::Error (kCorrupt) naming the queue
// and what is wrong (truncated, bad magic, version, checksum, counts).
#ifndef TAILCUT_ENGINE_CHECKPOINT_H_
#define TAILCUT_ENGINE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tailcut::detail {

struct Piece {
  uint64_t ticket, begin, end;
};

struct SavedState {
  uint64_t fingerprint = 0, num_items = 0, num_epochs = 0, seed = 0, low = 0, cursor = 0;
  std::vector<uint64_t> words;  // done bits for tickets [low/64*64, cursor)
  std::vector<Piece> pieces;
};

std::string SerializeState(const SavedState& state);
// `name` is the queue's, for the message.
SavedState DeserializeState(const std::string& name, const std::string& bytes);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_CHECKPOINT_H_
