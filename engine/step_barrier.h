// The step barrier in the segment: WorkQueue::AgreeStep.
//
// Each rank publishes (step + 1) << 1 | has_batch in its own step word, then
// waits until every rank of `ranks` has published `step` (or gone past it).
// The answer is "every rank has a batch" or "end of the epoch" (some rank has
// none), the same for every rank: a rank already past `step` kept its
// decision for it in its `decided` word. All words are seq_cst: each rank's
// publish and its reads of the others form a Dekker pattern with theirs, so
// at least the last to arrive sees everyone.
//
// Thread- and process-safe. Waits on the segment's step_seq futex in slices
// of at most slice_ns (a rank that dies wakes nobody), until `deadline`.
#ifndef TAILCUT_ENGINE_STEP_BARRIER_H_
#define TAILCUT_ENGINE_STEP_BARRIER_H_

#include <chrono>
#include <cstdint>

#include "engine/segment.h"
#include "tailcut/work_queue.h"

namespace tailcut::detail {

// kInvalid for a rank, rank count or step out of range, or a step lower
// than one this rank already published.
StepStatus AgreeStep(Segment& segment, uint32_t rank, uint32_t ranks, uint64_t step, bool has_batch,
                     std::chrono::steady_clock::time_point deadline, uint64_t slice_ns) noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_STEP_BARRIER_H_
