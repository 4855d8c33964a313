// SaveState's scan: reads the state of a live queue (cursor, done bits and
// the open items with their resume points) from its segment, while other
// processes take, ack, split and die.
//
// Thread- and process-safe: reads shared state with atomics only; a scan
// that keeps losing races with tail splits gives up (kTimeout).
#ifndef TAILCUT_ENGINE_STATE_SCAN_H_
#define TAILCUT_ENGINE_STATE_SCAN_H_

#include <string>

#include "engine/checkpoint.h"
#include "engine/lease.h"

namespace tailcut::detail {

// Fills cursor, low, words and pieces of *state; the caller fills the rest
// (fingerprint, num_items, num_epochs, seed). `name` is the queue's, for
// the message. Throws tailcut::Error (kTimeout: tails kept being split).
void ScanState(const LeaseTable& table, const std::string& name, SavedState* state);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_STATE_SCAN_H_
