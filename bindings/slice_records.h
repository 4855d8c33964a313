// slice_records.cc: the function slice_records (the records of one work item,
// parsed as the Reader parses them).
#pragma once

#include <pybind11/pybind11.h>

namespace tailcut::python {

void DefineSliceRecords(pybind11::module_& m);

}  // namespace tailcut::python
