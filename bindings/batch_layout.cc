// _decode_batch: the arrays of a pooled batch as numpy views over its slot,
// read by tailcut/batch_layout.h. It is on a rank's path for every batch,
// so it makes the views itself (numpy's C API through pybind11) instead of
// reading the table in Python: a table is read and checked per batch.
//
// Lifetime: every view's base is one memoryview over `data`, which holds
// `data`'s buffer exported (a ring slot's mapping stays mapped) until the
// last view is gone, as numpy.frombuffer's views do.
#include "batch_layout.h"

#include <pybind11/numpy.h>

#include <array>
#include <cstring>
#include <span>

#include "errors.h"
#include "tailcut/batch_layout.h"

namespace tailcut::python {
namespace {

// numpy's dtype of each code, in tailcut::BatchDtype's order. Made once and
// kept for the process's life (never freed: the interpreter may be gone by
// static destruction).
PyObject* DtypeOf(tc::BatchDtype dtype) {
  static const std::array<PyObject*, tc::kBatchDtypes> kDtypes = [] {
    static const char* const kNames[tc::kBatchDtypes] = {
        "uint8",   "int8", "int16",  "int32",  "int64",  "float16",   "float32",
        "float64", "bool", "uint16", "uint32", "uint64", "complex64", "complex128"};
    std::array<PyObject*, tc::kBatchDtypes> out{};
    for (uint8_t i = 0; i < tc::kBatchDtypes; ++i) {
      py::dtype dtype(kNames[i]);
      if (dtype.itemsize() !=
          static_cast<py::ssize_t>(tc::BatchDtypeBytes(static_cast<tc::BatchDtype>(i))))
        throw std::logic_error(std::string("numpy's ") + kNames[i] + " has another item size");
      out[i] = dtype.release().ptr();
    }
    return out;
  }();
  return kDtypes[static_cast<uint8_t>(dtype)];
}

// A contiguous buffer of `obj`, released on destruction.
struct Buffer {
  Py_buffer view{};
  bool held = false;
  Buffer(PyObject* obj, const char* what) {
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      Raise(PyExc_TypeError, std::string("decode_batch: ") + what +
                                 " must be a C-contiguous buffer (a slot's memoryview, bytes)");
    }
    held = true;
  }
  ~Buffer() {
    if (held) PyBuffer_Release(&view);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(view.buf), static_cast<size_t>(view.len)};
  }
};

py::object DecodeBatch(const py::object& data, const py::object& header) {
  // The views' base: a memoryview holding data's buffer for as long as they live.
  py::object base = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(data.ptr()));
  if (!base) throw py::error_already_set();
  const Py_buffer* mv = PyMemoryView_GET_BUFFER(base.ptr());
  if (!PyBuffer_IsContiguous(mv, 'C'))
    Raise(PyExc_TypeError,
          "decode_batch: data must be a C-contiguous buffer (a slot's memoryview)");
  const std::span<const std::byte> bytes{static_cast<const std::byte*>(mv->buf),
                                         static_cast<size_t>(mv->len)};
  const int writeable = mv->readonly ? 0 : py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  auto& api = py::detail::npy_api::get();
  uint32_t count = 0;
  py::object one;
  py::tuple many;
  std::string problem;
  {
    Buffer head(header.ptr(), "header");
    problem =
        tc::ReadBatchArrays(head.bytes(), bytes, &count, [&](uint32_t i, const tc::BatchArray& a) {
          Py_intptr_t shape[tc::kBatchMaxDims], strides[tc::kBatchMaxDims];
          Py_intptr_t step = static_cast<Py_intptr_t>(tc::BatchDtypeBytes(a.dtype));
          for (uint32_t d = a.ndim; d-- > 0;) {  // C order; ReadBatchArrays bounded the sizes
            shape[d] = static_cast<Py_intptr_t>(a.dims[d]);
            strides[d] = step;
            step *= shape[d] == 0 ? 1 : shape[d];
          }
          PyObject* dtype = DtypeOf(a.dtype);
          Py_INCREF(dtype);  // PyArray_NewFromDescr steals it
          py::object array = py::reinterpret_steal<py::object>(api.PyArray_NewFromDescr_(
              api.PyArray_Type_, dtype, static_cast<int>(a.ndim), shape, strides,
              const_cast<std::byte*>(bytes.data() + a.offset), writeable, nullptr));
          if (!array) throw py::error_already_set();
          if (api.PyArray_SetBaseObject_(array.ptr(), base.inc_ref().ptr()) != 0)
            throw py::error_already_set();
          if (count == 1) {
            one = std::move(array);
          } else {
            if (i == 0) many = py::tuple(count);
            PyTuple_SET_ITEM(many.ptr(), i, array.release().ptr());
          }
        });
  }
  if (!problem.empty()) Raise(g_exc.corrupt, problem);
  if (count == 1) return one;
  return count == 0 ? py::tuple(0) : many;
}

}  // namespace

void DefineBatchLayout(py::module_& m) {
  m.def("_decode_batch", &DecodeBatch, py::arg("data"), py::arg("header"),
        "The arrays of a pooled batch, numpy views over `data` (no copy; read-only over a "
        "read-only buffer): one array, or a tuple if the batch was a tuple or list. Every field "
        "of the header (a slot's 256-byte user header) is checked against the bytes that hold "
        "it; a batch that does not parse raises CorruptError naming the field "
        "(tailcut/batch_layout.h).");
}

}  // namespace tailcut::python
