// How every call from Python that can block waits: take, agree_step,
// input_producer().get, the record and batch iterators, close.
//
// The C++ call runs in slices of at most kSlice with the GIL released (each
// slice is the C++ call with a deadline at the slice's end). Between slices,
// with the GIL held, a signal handler runs (PyErr_CheckSignals): Ctrl-C
// raises KeyboardInterrupt within kSlice, whatever the C++ call waits for.
// A concurrent close() is noticed by the slice itself: Use refuses a closing
// queue and a closed reader reads kEnd, so a blocked call ends within kSlice
// of close().
//
// A slice returns std::optional<T>: a value ends the wait, nullopt asks for
// another slice. A slice may throw (e.g. tailcut::Error when the queue is
// closed); the GIL is taken back first.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>

#include "queue.h"

namespace tailcut::python {

constexpr std::chrono::milliseconds kSlice{100};
constexpr double kNoDeadlineAfter = 100.0 * 365.25 * 86400.0;  // seconds

// The deadline of one blocking call, from its Python `timeout`.
class Wait {
 public:
  // No deadline: wait until the call has an answer (or Ctrl-C, or close()).
  static Wait Forever() { return Wait(); }
  // timeout: None or +inf: no deadline; a number of seconds >= 0 otherwise.
  // Timeouts of more than kNoDeadlineAfter (100 years) wait without a deadline
  // too: a deadline that far would overflow the clock (its range is 292 years
  // since boot) into one in the past. NaN, negative numbers and non-numbers
  // raise (InvalidArgumentError, TypeError) naming `what`. REQUIRES: the GIL.
  static Wait FromTimeout(const py::handle& timeout, const char* what);

  // Where the next slice ends: kSlice from now, or the deadline if sooner.
  Clock::time_point SliceEnd() const {
    Clock::time_point end = Clock::now() + kSlice;
    return deadline_ && *deadline_ < end ? *deadline_ : end;
  }
  bool Passed() const { return deadline_ && Clock::now() >= *deadline_; }

 private:
  std::optional<Clock::time_point> deadline_;
};

// Runs slice(end) without the GIL until it returns a value, and returns it;
// returns nullopt once the wait's deadline has passed. Raises what a signal
// handler raises (KeyboardInterrupt) between slices. REQUIRES: the GIL.
template <typename Slice>
auto InSlices(const Wait& wait, Slice&& slice) -> decltype(slice(Clock::time_point{})) {
  for (;;) {
    decltype(slice(Clock::time_point{})) result;
    {
      py::gil_scoped_release nogil;
      result = slice(wait.SliceEnd());
    }
    if (result || wait.Passed()) return result;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

}  // namespace tailcut::python
