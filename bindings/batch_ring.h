// batch_ring.cc: the BatchRing, Slot and Batch classes and the functions
// inspect_batch_ring and remove_batch_ring (tailcut/batch_ring.h).
#pragma once

#include <pybind11/pybind11.h>

namespace tailcut::python {

void DefineBatchRing(pybind11::module_& m);

}  // namespace tailcut::python
