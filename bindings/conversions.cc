#include "conversions.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "errors.h"

namespace tailcut::python {

namespace {

std::string Got(const py::handle& value) {
  return "got " + std::string(py::repr(value)) + " (" +
         std::string(py::str(py::type::handle_of(value).attr("__name__"))) + ")";
}

bool IsBool(const py::handle& value) {
  if (PyBool_Check(value.ptr())) return true;
  // numpy.bool_ has no __index__ either; name it a bool all the same.
  return std::string(py::str(py::type::handle_of(value).attr("__name__"))) == "bool_";
}

// The int of ToU64 and friends; `rule` for their messages.
uint64_t CheckedU64(const py::handle& value, const char* what, uint64_t min_value,
                    uint64_t max_value, const std::string& rule) {
  if (IsBool(value) || !PyIndex_Check(value.ptr())) RaiseType(what, rule, value);
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!i) throw py::error_already_set();
  if (i < py::int_(static_cast<unsigned long long>(min_value)) ||
      i > py::int_(static_cast<unsigned long long>(max_value)))
    RaiseValue(what, rule, value);
  unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::string IntRule(uint64_t min_value, uint64_t max_value) {
  if (max_value == UINT64_MAX) return "an int >= " + std::to_string(min_value);
  return "an int in [" + std::to_string(min_value) + ", " + std::to_string(max_value) + "]";
}

double CheckedSeconds(const py::handle& value, const char* what, const char* rule) {
  if (IsBool(value) || PyUnicode_Check(value.ptr()) || PyBytes_Check(value.ptr()))
    RaiseType(what, rule, value);
  double s = PyFloat_AsDouble(value.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    RaiseType(what, rule, value);
  }
  if (!(s >= 0) || std::isinf(s)) RaiseValue(what, rule, value);
  return s;
}

}  // namespace

void RaiseType(const char* what, const std::string& rule, const py::handle& value) {
  throw py::type_error(std::string(what) + " must be " + rule + ", " + Got(value));
}

void RaiseValue(const char* what, const std::string& rule, const py::handle& value) {
  Raise(g_exc.invalid_argument, std::string(what) + " must be " + rule + ", " + Got(value));
}

uint64_t ToU64(const py::handle& value, const char* what, uint64_t min_value, uint64_t max_value) {
  return CheckedU64(value, what, min_value, max_value, IntRule(min_value, max_value));
}

std::optional<uint64_t> ToU64OrNone(const py::handle& value, const char* what, uint64_t min_value,
                                    uint64_t max_value) {
  if (value.is_none()) return std::nullopt;
  return CheckedU64(value, what, min_value, max_value, IntRule(min_value, max_value) + " or None");
}

uint32_t ToU32(const py::handle& value, const char* what, uint32_t min_value) {
  return static_cast<uint32_t>(ToU64(value, what, min_value, UINT32_MAX));
}

double ToSeconds(const py::handle& value, const char* what) {
  return CheckedSeconds(value, what, "a number of seconds >= 0");
}

std::optional<double> ToSecondsOrNone(const py::handle& value, const char* what) {
  if (value.is_none()) return std::nullopt;
  return CheckedSeconds(value, what, "a number of seconds >= 0 or None");
}

bool ToFlag(const py::handle& value, const char* what) {
  if (!IsBool(value)) RaiseType(what, "True or False", value);
  return PyObject_IsTrue(value.ptr()) == 1;
}

std::string ToText(const py::handle& value, const char* what) {
  if (!PyUnicode_Check(value.ptr())) RaiseType(what, "a str", value);
  return std::string(py::str(value));
}

std::chrono::milliseconds ToMillis(double seconds) {
  // Capped so that the cast is defined (1e15 s is beyond any deadline).
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(std::min(seconds, 1e15) * 1000.0)));
}

std::string ToPath(const py::handle& value) {
  py::object os = py::module_::import("os");
  return std::string(py::bytes(os.attr("fsencode")(value)));
}

std::string ToQueueName(const py::handle& value) {
  if (!PyUnicode_Check(value.ptr())) RaiseType("name", "a str", value);
  py::str name = py::reinterpret_borrow<py::str>(value);
  for (py::handle ch : name) {
    Py_UCS4 c = PyUnicode_READ_CHAR(ch.ptr(), 0);
    if (c == 0 || c > 0x7f)
      Raise(g_exc.invalid_argument, "queue name " + std::string(py::repr(name)) + " contains " +
                                        std::string(py::repr(ch)) +
                                        "; use only ASCII letters, digits, '.', '_' and '-'");
  }
  return std::string(name);
}

py::str FromPath(const std::string& path) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

std::string ToBytes(const py::handle& value, const char* what) {
  if (PyBytes_Check(value.ptr()))
    return std::string(py::bytes(py::reinterpret_borrow<py::bytes>(value)));
  if (PyObject_CheckBuffer(value.ptr())) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(value).request();
    return std::string(static_cast<const char*>(info.ptr),
                       static_cast<size_t>(info.size * info.itemsize));
  }
  RaiseType(what, "bytes", value);
}

std::function<void(const std::string&)> WrapNotice(const py::object& fn) {
  if (fn.is_none()) return {};
  if (!PyCallable_Check(fn.ptr())) RaiseType("on_notice", "callable or None", fn);
  std::shared_ptr<py::object> holder(new py::object(fn), [](py::object* o) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete o;
    }  // else: the interpreter is gone; leak rather than touch it
  });
  return [holder](const std::string& line) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    try {
      (*holder)(PythonWording(line));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("tailcut on_notice callback");
    }
  };
}

tc::RecordFormat ParseFormat(const std::string& name, const py::object& record_bytes) {
  uint64_t rb = record_bytes.is_none() ? 0 : ToU64(record_bytes, "record_bytes", 1);
  return tc::RecordFormat::Parse(name, rb);
}

}  // namespace tailcut::python
