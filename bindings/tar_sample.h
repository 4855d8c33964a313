// tar_sample.cc: the function tar_members (the members of one WebDataset
// sample, a record of the "tar" format).
#pragma once

#include <pybind11/pybind11.h>

namespace tailcut::python {

void DefineTarSample(pybind11::module_& m);

}  // namespace tailcut::python
