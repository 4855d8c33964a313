#include "errors.h"

#include <string_view>

#include "module.h"

namespace tailcut::python {

Exceptions g_exc;

PyObject* ExceptionFor(tc::ErrorKind kind) {
  switch (kind) {
    case tc::ErrorKind::kInvalidArgument:
      return g_exc.invalid_argument;
    case tc::ErrorKind::kNotFound:
      return g_exc.not_found;
    case tc::ErrorKind::kPermission:
      return g_exc.permission;
    case tc::ErrorKind::kNoSpace:
      return g_exc.no_space;
    case tc::ErrorKind::kConfigMismatch:
      return g_exc.config_mismatch;
    case tc::ErrorKind::kCorrupt:
      return g_exc.corrupt;
    case tc::ErrorKind::kTimeout:
      return g_exc.timeout;
    case tc::ErrorKind::kIo:
      return g_exc.io;
  }
  return g_exc.error;
}

namespace {

// One phrase of a library message and its Python wording, long enough that
// a name or path the message quotes would have to hold the whole phrase to be
// reworded by mistake.
struct Wording {
  std::string_view library, python;
};

constexpr Wording kPythonWording[] = {
    // ResolveConfig (engine/config.cc): num_slices is 0.
    {"; leave it unset (one item per file) or give 1 or more",
     "; pass None (one item per file) or >= 1"},
    // CompareConfig (engine/segment_config.cc): "<option> differs: <value> here,
    // <value> in segment", for num_slices, shuffle and seed.
    {"num_slices differs: unset here, ", "num_slices differs: None here, "},
    {" here, unset in segment", " here, None in segment"},  // num_slices
    {"shuffle differs: on here, off in segment", "shuffle differs: True here, False in segment"},
    {"shuffle differs: off here, on in segment", "shuffle differs: False here, True in segment"},
    {"seed differs: unset here, ", "seed differs: None here, "},
    {" here, unset (drawn by the creator: ", " here, None (drawn by the creator: "},
    // Reader::Open (io/reader.cc): io_uring asked for but unavailable.
    {"; use backend 'pread', or leave the backend unset to ",
     "; use backend 'pread', or pass backend=None to "},
    // WorkQueue::Close (engine/work_queue.cc): an unfinished queue removed.
    {"; open it with keep_unfinished to resume it later",
     "; open it with keep_unfinished=True to resume it later"},
};

}  // namespace

std::string PythonWording(std::string text) {
  for (const Wording& w : kPythonWording) {
    for (size_t at = text.find(w.library); at != std::string::npos;
         at = text.find(w.library, at + w.python.size()))
      text.replace(at, w.library.size(), w.python);
  }
  return text;
}

void SetError(PyObject* type, const std::string& library_message) {
  const std::string message = PythonWording(library_message);
  // Bytes of file names that are not UTF-8 come out as \xNN, never as a
  // UnicodeDecodeError in place of the error.
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                        "backslashreplace");
  if (text == nullptr) return;  // MemoryError is set
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

// REQUIRES: the GIL.
[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  SetError(type, message);
  throw py::error_already_set();
}

namespace {

PyObject* NewException(py::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                       const char* doc) {
  py::tuple t(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) t[i++] = py::handle(b);
  std::string full = std::string("tailcut.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(full.c_str(), doc, t.ptr(), nullptr);
  if (e == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(e));  // the module holds a reference; e keeps ours
  return e;
}

}  // namespace

void DefineErrors(py::module_& m) {
  PyObject* queue_empty = py::module_::import("queue").attr("Empty").ptr();
  g_exc.error = NewException(m, "Error", {PyExc_Exception},
                             "Base class of every tailcut error. The message is the C++ library's, "
                             "naming the queue, file, offset or field and what to do.");
  g_exc.invalid_argument =
      NewException(m, "InvalidArgumentError", {g_exc.error, PyExc_ValueError},
                   "A bad option or name, or an operation on a closed object.");
  g_exc.not_found = NewException(m, "NotFoundError", {g_exc.error, PyExc_FileNotFoundError},
                                 "A work file or queue does not exist.");
  g_exc.permission = NewException(m, "PermissionDeniedError", {g_exc.error, PyExc_PermissionError},
                                  "A file or segment this process may not use.");
  g_exc.no_space =
      NewException(m, "NoSpaceError", {g_exc.error, PyExc_OSError}, "/dev/shm or memory is full.");
  g_exc.config_mismatch = NewException(m, "ConfigMismatchError", {g_exc.error},
                                       "An existing queue (or a checkpoint) was made with another "
                                       "configuration; the message names the field.");
  g_exc.corrupt =
      NewException(m, "CorruptError", {g_exc.error},
                   "A segment, checkpoint or record that fails validation (e.g. a TFRecord "
                   "CRC mismatch); the message names the file and offset.");
  g_exc.timeout = NewException(m, "TimeoutError", {g_exc.error, PyExc_TimeoutError},
                               "A bounded wait of the library ran out (e.g. attach_timeout).");
  g_exc.io = NewException(m, "IoError", {g_exc.error, PyExc_OSError},
                          "A read or system call failed (e.g. a file truncated while reading).");
  g_exc.stale =
      NewException(m, "StaleItemError", {g_exc.error},
                   "An ack, give_back or progress refused because the item was reassigned "
                   "to another process after a lease timeout.");
  g_exc.empty =
      NewException(m, "Empty", {g_exc.error, queue_empty},
                   "take(timeout=...) or input_producer().get(timeout=...) found no item in "
                   "time while other processes still hold open items. Not the end of the "
                   "data: that is None.");
  m.def(
      "_python_wording", [](const std::string& text) { return PythonWording(text); },
      py::arg("text"),
      "A library message in Python's words (None, True, False for the library's unset, on, "
      "off), as every exception and notice of tailcut says it. For tests.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tc::Error& e) {
      SetError(ExceptionFor(e.kind()), e.what());
    }
  });
}

}  // namespace tailcut::python
