// What each file of the bindings adds to the module tailcut._core. module.cc
// calls them in this order: classes before the WorkQueue methods that return
// them, so that generated signatures name the Python types.
#pragma once

#include <pybind11/pybind11.h>

#include "queue.h"

namespace tailcut::python {

// errors.cc: the exception classes and the translator of tailcut::Error.
void DefineErrors(py::module_& m);
// items.cc: the WorkItem class.
void DefineWorkItem(py::module_& m);
// producer.cc: the InputDataset and InputProducer classes.
void DefineProducers(py::module_& m);
// readers.cc: RecordBuffer, ArenaKeeper, RecordIterator, BatchIterator, the
// record-format functions (crc32c, masked_crc32c, encode_tfrecord) and
// _reader_options (the names of kReaderOptions).
void DefineReaders(py::module_& m);
// queue.cc: the WorkQueue class with its constructor, properties, summaries,
// checkpoints and close().
QueueClass DefineWorkQueue(py::module_& m);
// items.cc: WorkQueue.take and WorkQueue.agree_step.
void DefineTake(QueueClass& queue);
// producer.cc: WorkQueue.input_dataset and WorkQueue.input_producer.
void DefineProducerMethods(QueueClass& queue);
// readers.cc: WorkQueue.records and WorkQueue.batches.
void DefineReaderMethods(QueueClass& queue);
// queue.cc: list_queues, inspect_queue, remove_queue, segment_path, _close_all,
// _stats_fields (tailcut/stats_fields.h).
void DefineQueueFunctions(py::module_& m);

}  // namespace tailcut::python
