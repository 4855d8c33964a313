// tailcut._core: the Python bindings of the work queue and the reader.
//
// Contract (what the Python layer adds to the C++ one)
//  * GIL: released around every call that can block (open, take, the record
//    and batch iterators, input_producer().get, close) and nowhere inside the
//    C++ classes. Notices (on_notice) take the GIL back to call Python.
//  * Lifetime: a Python WorkQueue owns a QueueHandle through a shared_ptr;
//    work items, iterators, producers and zero-copy views hold the same
//    handle (and views the reader state), so no C++ object a Python object
//    points into is freed under it. close() first closes the readers and the
//    producer threads opened on the queue, then waits for calls in flight,
//    then closes the C++ queue. Every blocking call waits in slices
//    (blocking.h): Ctrl-C and a concurrent close() end it within 100 ms.
//  * Lock order: never wait for a QueueHandle or ReaderState mutex while
//    holding the GIL. Holding such a mutex while taking the GIL back is
//    therefore safe.
//  * Fork: every object remembers the pid that opened it. In a forked child
//    its methods raise and its destructor leaks the C++ object (the C++
//    contract forbids a child to use, close or destroy the parent's queue).
//
// One file per concept: errors, conversions, queue (the handle, WorkQueue),
// stats, items (WorkItem, take, agree_step), producer (input_dataset,
// input_producer), reader_state and readers (records, batches), batch_ring
// (BatchRing), batch_layout (a pooled batch's arrays), slice_records (the records of one item),
// tar_sample (a tar record's members), record_files (record indexes and reads in any order). This
// file only registers them.
#include "module.h"

#include <pybind11/pybind11.h>

#include "batch_layout.h"
#include "batch_ring.h"
#include "record_files.h"
#include "slice_records.h"
#include "tar_sample.h"

namespace py = pybind11;
namespace tp = tailcut::python;

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "tailcut._core: the compiled part of the tailcut package (a host-wide work queue in shared "
      "memory and an io_uring reader). Import it through `tailcut`.";
#ifdef TAILCUT_VERSION
  m.attr("__version__") = TAILCUT_VERSION;
#else
  m.attr("__version__") = "0.0.0";
#endif

  tp::DefineErrors(m);
  tp::DefineWorkItem(m);
  tp::DefineProducers(m);
  tp::DefineReaders(m);
  tp::QueueClass queue = tp::DefineWorkQueue(m);
  tp::DefineTake(queue);
  tp::DefineProducerMethods(queue);
  tp::DefineReaderMethods(queue);
  tp::DefineQueueFunctions(m);
  tp::DefineBatchRing(m);
  tp::DefineBatchLayout(m);
  tp::DefineSliceRecords(m);
  tp::DefineTarSample(m);
  tp::DefineRecordFiles(m);
}
