// record_files.cc: the class RecordFiles (the record indexes of several files,
// and reads of their records in any order: global shuffle).
#pragma once

#include <pybind11/pybind11.h>

namespace tailcut::python {

void DefineRecordFiles(pybind11::module_& m);

}  // namespace tailcut::python
