// A queue's configuration as its segment holds it: written by the creator
// (WriteLayout), compared field by field by every attacher (CompareConfig),
// and read back by tools (ReadItems); and why an unfinished segment is kept
// (KeepReasonText).
//
// Not thread-safe: WriteLayout runs before READY is published (TryCreate
// holds the admin lock), the others read what never changes after it.
#ifndef TAILCUT_ENGINE_SEGMENT_CONFIG_H_
#define TAILCUT_ENGINE_SEGMENT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/segment.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

// Creator side: writes the header, tables and initial state (not READY).
void WriteLayout(Segment* segment, const QueueConfig& config, const Geometry& geometry);
// Attacher side: throws kConfigMismatch naming the first field that differs.
void CompareConfig(const Segment& segment, const QueueConfig& config);
// Reads the item table of a validated segment.
std::vector<WorkQueue::Item> ReadItems(const Segment& segment);
// Why a queue is kept when unfinished, in words ("" when it is not):
// KeepReason bits, and fewer than num_clients processes joined so far.
std::string KeepReasonText(uint32_t reasons, uint64_t joined, uint32_t num_clients);

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_SEGMENT_CONFIG_H_
