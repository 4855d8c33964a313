// The tier's checkpoint codec: what GlobalTier::SaveState returns and
// GlobalTierOptions::restore_state takes. GlobalStateWithHosts (global_tier.h)
// edits it with the states of the hosts' queues.
//
// A state is one text line and two blobs:
//   "tailcut-global-state 1 ITEMS EPOCHS BLOCK SEED CURSOR FILES_LEN BITMAP_LEN\n"
//   + the files fingerprint + the done bitmap as Redis keeps it (ticket t is
//   bit 7 - t % 8 of byte t / 8; trailing zero bytes cut).
// Pure functions: safe from any thread. ParseTierState throws kCorrupt
// naming what is wrong.
#ifndef TAILCUT_GLOBAL_TIER_STATE_H_
#define TAILCUT_GLOBAL_TIER_STATE_H_

#include <cstdint>
#include <string>

namespace tailcut::detail {

struct TierState {
  uint64_t items = 0, epochs = 0, block = 0, seed = 0, cursor = 0;
  std::string files, bitmap;
};

TierState ParseTierState(const std::string& state);
std::string SerializeTierState(TierState state);

}  // namespace tailcut::detail

#endif  // TAILCUT_GLOBAL_TIER_STATE_H_
