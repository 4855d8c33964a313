// The queue's and the reader's counters as Python dicts and TensorBoard
// scalars. REQUIRES: the GIL, for every function here.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "queue.h"
#include "tailcut/reader.h"
#include "tailcut/work_queue.h"

namespace tailcut::python {

py::dict StatsDict(const tc::QueueStats& s);
py::dict ReaderStatsDict(const tc::ReaderStats& s);
// {'queue': fields, 'client': fields}, each field a (name, series, doc) tuple
// of tailcut/stats_fields.h, in order; series is 'value', 'seconds' or 'none'.
// summary() holds the queue fields (plus 'clients'), each client dict the
// client fields.
py::dict StatsFields();
// The queue's stats, as a call in flight on h (raises if h is closed).
tc::QueueStats StatsOf(QueueHandle& h);
// Writes the stats through writer.add_scalar(prefix + "/" + tag, value, step).
void AddSummary(QueueHandle& h, const py::object& writer, const py::object& step,
                const std::string& prefix);

}  // namespace tailcut::python
