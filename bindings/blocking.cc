#include "blocking.h"

#include <cmath>
#include <string>

#include "conversions.h"
#include "errors.h"

namespace tailcut::python {

Wait Wait::FromTimeout(const py::handle& timeout, const char* what) {
  Wait wait;
  if (timeout.is_none()) return wait;
  const char* rule = "a number of seconds >= 0, or None (or float('inf')) to wait without a limit";
  if (PyBool_Check(timeout.ptr()) || PyUnicode_Check(timeout.ptr()) || PyBytes_Check(timeout.ptr()))
    RaiseType(what, rule, timeout);
  double s = PyFloat_AsDouble(timeout.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      RaiseType(what, rule, timeout);
    }
    PyErr_Clear();  // an int beyond a double: as good as forever if positive
    s = py::int_(py::reinterpret_borrow<py::object>(timeout)) > py::int_(0) ? INFINITY : -1.0;
  }
  if (std::isnan(s) || s < 0) RaiseValue(what, rule, timeout);
  if (s > kNoDeadlineAfter) return wait;
  wait.deadline_ =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  return wait;
}

}  // namespace tailcut::python
