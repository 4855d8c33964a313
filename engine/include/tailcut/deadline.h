// tailcut/deadline.h: when a blocking call stops waiting.
//
// Every call that may wait (WorkQueue::Take and AgreeStep, the Reader's,
// Batcher's and Shuffler's Next*, BatchRing::AcquireSlot and Pop) takes a
// Deadline as its last argument, after its out-parameters. Deadline::max():
// no limit. A deadline in the past (e.g. steady_clock::now()): do not wait.
#ifndef TAILCUT_DEADLINE_H_
#define TAILCUT_DEADLINE_H_

#include <chrono>

namespace tailcut {

using Deadline = std::chrono::steady_clock::time_point;

}  // namespace tailcut

#endif  // TAILCUT_DEADLINE_H_
