// The clocks of the engine, in one place.
//
// Stamps in the segment that other processes compare (lease progress, join
// and leave times) are CLOCK_MONOTONIC nanoseconds: one clock for every
// process of the host, never stepped. Wall-clock time appears only where a
// person reads it (when a queue was created). Under the deterministic
// scheduler (TAILCUT_DETERMINISTIC_SCHEDULE) the monotonic clocks are the
// schedule's logical clock, so timeouts fire at reproducible points.
#ifndef TAILCUT_ENGINE_CLOCK_H_
#define TAILCUT_ENGINE_CLOCK_H_

#include <cstdint>

namespace tailcut::detail {

// CLOCK_MONOTONIC in nanoseconds (vDSO: no system call).
uint64_t MonotonicNs() noexcept;
// CLOCK_MONOTONIC_COARSE: the same clock at tick resolution (a few ms), at a
// fraction of the cost. For progress stamps and timeouts on the hot path.
uint64_t CoarseNs() noexcept;
// CLOCK_REALTIME in nanoseconds since the Unix epoch: for people, never for
// timeouts.
uint64_t RealtimeNs() noexcept;

}  // namespace tailcut::detail

#endif  // TAILCUT_ENGINE_CLOCK_H_
