// batch_layout.cc: the function _decode_batch, a pooled batch's arrays as
// numpy views (tailcut/batch_layout.h; tailcut._batch_layout.decode_batch).
#pragma once

#include <pybind11/pybind11.h>

namespace tailcut::python {

void DefineBatchLayout(pybind11::module_& m);

}  // namespace tailcut::python
