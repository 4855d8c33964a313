// Python exceptions of tailcut._core and the raise helpers every binding uses.
//
// The exception classes are created once, by DefineErrors at module import,
// and live as long as the module (it holds a reference to each). A C++
// tailcut::Error escaping a binding becomes the exception of its kind with
// the same text, in Python's words (PythonWording).
#pragma once

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "tailcut/error.h"

namespace py = pybind11;
namespace tc = tailcut;

namespace tailcut::python {

struct Exceptions {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* permission = nullptr;
  PyObject* no_space = nullptr;
  PyObject* config_mismatch = nullptr;
  PyObject* corrupt = nullptr;
  PyObject* timeout = nullptr;
  PyObject* io = nullptr;
  PyObject* stale = nullptr;
  PyObject* empty = nullptr;
};
extern Exceptions g_exc;  // module lifetime; references are owned by the module too

PyObject* ExceptionFor(tc::ErrorKind kind);

// `text`, a message of the C++ libraries, in Python's words. The libraries
// speak as a C++ caller writes its options: a value left "unset", a flag
// "on" or "off"; Python says None, True and False. One table in errors.cc,
// of whole phrases of library messages. Any thread; no GIL needed.
std::string PythonWording(std::string text);

// Sets the Python error `type` with `message` in Python's words (UTF-8;
// invalid bytes, e.g. of file names, are shown as \xNN). REQUIRES: the GIL.
void SetError(PyObject* type, const std::string& message);
// SetError, then throws py::error_already_set. REQUIRES: the GIL.
[[noreturn]] void Raise(PyObject* type, const std::string& message);

}  // namespace tailcut::python
