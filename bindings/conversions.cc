#include "conversions.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "errors.h"

namespace tailcut::python {

uint64_t ToU64(const py::handle& value, const char* what, uint64_t min_value) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    throw py::type_error(std::string(what) + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!i) throw py::error_already_set();
  if (py::int_(i) < py::int_(0) ||
      py::int_(i) < py::int_(static_cast<unsigned long long>(min_value))) {
    Raise(g_exc.invalid_argument, std::string(what) + " must be " +
                                      (min_value == 0 ? std::string("a non-negative int")
                                                      : "at least " + std::to_string(min_value)) +
                                      ", got " + std::string(py::str(i)));
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return v;
}

uint32_t ToU32(const py::handle& value, const char* what) {
  uint64_t v = ToU64(value, what);
  if (v > UINT32_MAX)
    Raise(g_exc.invalid_argument,
          std::string(what) + " must be below 2**32, got " + std::to_string(v));
  return static_cast<uint32_t>(v);
}

double ToSeconds(const py::handle& value, const char* what) {
  if (PyBool_Check(value.ptr()))
    throw py::type_error(std::string(what) + " must be a number of seconds");
  double s = PyFloat_AsDouble(value.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + " must be a number of seconds or None");
  }
  if (!(s >= 0) || std::isinf(s))
    Raise(g_exc.invalid_argument, std::string(what) +
                                      " must be a finite number of seconds >= 0, got " +
                                      std::string(py::repr(value)));
  return s;
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
  if (!PyUnicode_Check(value.ptr()))
    throw py::type_error("name must be a str, not " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))));
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
  throw py::type_error(std::string(what) + " must be bytes, not " +
                       std::string(py::str(py::type::handle_of(value).attr("__name__"))));
}

std::function<void(const std::string&)> WrapNotice(const py::object& fn) {
  if (fn.is_none()) return {};
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("on_notice must be callable or None");
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
