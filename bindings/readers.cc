// WorkQueue.records() and WorkQueue.batches(): iterators over a Reader that
// hand out records and batches zero-copy where they can.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "blocking.h"
#include "conversions.h"
#include "errors.h"
#include "module.h"
#include "reader_state.h"
#include "shuffle.h"
#include "stats.h"
#include "tailcut/batcher.h"
#include "tailcut/crc32c.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"

namespace tailcut::python {

namespace {

// What one slice of a read ended with, copied under rs->mu.
struct ReadOutcome {
  tc::ReadStatus status = tc::ReadStatus::kEnd;
  bool closed_by_queue = false;
  ReadFailure failure;  // when status is kError
};

struct IteratorBase {
  ReaderPtr rs;
  bool done = false;
  // records()/batches(max_epoch=e): stop at the first record of an item of a
  // later epoch. That item has handed out nothing the caller saw, so closing
  // the reader gives it back whole (GiveBack restarts an item at its begin)
  // and whoever reads it next reads each of its records once.
  std::optional<uint64_t> max_epoch;
  uint64_t stale_warned = 0;  // stats().stale_items already warned about

  // True when the records just read come from an item past max_epoch; closes
  // the reader then. REQUIRES: rs->mu, no GIL.
  bool PastEpochLocked() noexcept {
    if (!max_epoch || rs->reader->current_item().epoch <= *max_epoch) return false;
    rs->CloseLocked();
    return true;
  }

  // Reads in slices (blocking.h): read(end, &failure) is a Reader or Batcher
  // call with that deadline, made under rs->mu, that fills `failure` when it
  // returns kError; kEmpty asks for another slice.
  // nullopt: the wait's deadline passed with the reader waiting for items
  // other processes hold. REQUIRES: the GIL.
  template <typename Read>
  std::optional<ReadOutcome> ReadInSlices(const Wait& wait, Read&& read) {
    rs->h->CheckPid();
    std::optional<ReadOutcome> got = InSlices(wait, [&](Clock::time_point end) {
      std::unique_lock<std::mutex> lock(rs->mu);
      // The queue is closing us from another thread: let it have mu.
      if (rs->closing.load(std::memory_order_acquire))
        rs->closed_cv.wait_until(lock, end, [&] { return rs->closed; });
      ReadOutcome o;
      if (rs->closed) {
        o.closed_by_queue = rs->closed_by_queue;
        return std::optional<ReadOutcome>(o);
      }
      o.status = read(end, &o.failure);
      if (o.status == tc::ReadStatus::kEmpty) return std::optional<ReadOutcome>();
      return std::optional<ReadOutcome>(o);
    });
    WarnIfStale();
    if (got && got->status == tc::ReadStatus::kError) {
      done = true;
      got->failure.Raise();
    }
    if (got && got->status == tc::ReadStatus::kEnd) Finish(got->closed_by_queue);
    return got;
  }

  // A lease timeout reassigned an item this reader held (it looked hung):
  // the reader stopped reading it, and the process that has it now may hand
  // out again records this one already handed out. Counted in
  // stats()['stale_items']; said once per item as a RuntimeWarning.
  void WarnIfStale() {
    uint64_t stale = rs->Stats().stale_items;
    if (stale <= stale_warned) return;
    std::string text = "queue '" + rs->h->name + "': " + std::to_string(stale - stale_warned) +
                       " item(s) this reader held were reassigned to another process after "
                       "the lease timeout (this process made no progress for lease_timeout); "
                       "the reader stopped reading them, and records of them it already handed "
                       "out may be read again there. Raise lease_timeout, or report progress "
                       "more often";
    stale_warned = stale;
    if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) != 0) {
      done = true;
      throw py::error_already_set();  // warnings turned into errors
    }
  }

  // Dropping an iterator (a `break` out of its loop) gives back its items at
  // once, even while zero-copy views keep its buffers mapped.
  ~IteratorBase() {
    if (!rs || ::getpid() != rs->pid) return;
    auto close = [this] {
      std::lock_guard<std::mutex> lock(rs->mu);
      rs->CloseLocked();
    };
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      close();
    } else {
      close();
    }
  }

  // REQUIRES: the GIL.
  void Close() {
    done = true;
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(rs->mu);
    rs->CloseLocked();
  }
  // After a read said kEnd or found the reader closed. REQUIRES: the GIL.
  [[noreturn]] void Finish(bool closed_by_queue) {
    done = true;
    if (closed_by_queue)
      Raise(g_exc.invalid_argument,
            "queue '" + rs->h->name + "' was closed while it was being read");
    throw py::stop_iteration();
  }
  py::object CurrentItem() {
    if (rs->shuffler) return py::none();  // records of several items, mixed
    tc::WorkItem item;
    std::unique_lock<std::mutex> lock(rs->mu, std::defer_lock);
    {
      py::gil_scoped_release nogil;  // lock order: mu only without the GIL
      lock.lock();
      item = rs->reader->current_item();
    }
    if (item.path.empty()) return py::none();
    return ItemDict(item);
  }
};

struct RecordIterator : IteratorBase {
  py::object exporter;  // a RecordBuffer, reused for every record
  py::object last_view;
  uint64_t last_offset = 0;
  uint64_t last_end = 0;

  void ReleaseLast() {
    if (!last_view) return;
    py::object view = std::move(last_view);
    last_view = py::object();
    PyObject* r = PyObject_CallMethod(view.ptr(), "release", nullptr);
    if (r == nullptr) {
      // BufferError: someone exported the view (np.frombuffer, ...). Their
      // object keeps the arena mapped; its bytes may change from now on.
      PyErr_Clear();
    } else {
      Py_DECREF(r);
    }
  }

  py::object Next() {
    ReleaseLast();
    if (done) throw py::stop_iteration();
    tc::Record record;
    ReadInSlices(Wait::Forever(), [&](Clock::time_point end, ReadFailure* failure) {
      if (rs->shuffler) {  // max_epoch is the Shuffler's option then
        tc::ReadStatus status = rs->shuffler->Next(&record, end);
        if (status == tc::ReadStatus::kError) {
          rs->failed = true;
          *failure = ReadFailure::Of(rs->shuffler->error(), rs->shuffler->error_kind());
        }
        return status;
      }
      tc::ReadStatus status = rs->reader->NextRecord(&record, end);
      if (status == tc::ReadStatus::kOk && PastEpochLocked()) return tc::ReadStatus::kEnd;
      if (status == tc::ReadStatus::kError) {
        rs->failed = true;
        *failure = ReadFailure::Of(rs->reader->error(), rs->reader->error_kind());
      }
      return status;
    });
    RecordBuffer& buf = exporter.cast<RecordBuffer&>();
    buf.ptr = record.data;
    buf.size = record.size;
    last_offset = record.offset;
    last_end = record.end;
    PyObject* view = PyMemoryView_FromObject(exporter.ptr());
    if (view == nullptr) throw py::error_already_set();
    last_view = py::reinterpret_borrow<py::object>(view);
    return py::reinterpret_steal<py::object>(view);
  }
};

struct BatchIterator : IteratorBase {
  size_t batch_size = 0;
  bool copy = false;
  std::unique_ptr<tc::Batcher> batcher;       // over rs->reader; used under rs->mu
  std::unique_ptr<ShuffledBatches> shuffled;  // instead, over rs->shuffler; under rs->mu
  tc::Batch batch;
  uint64_t last_epoch = 0;             // epoch of the items of the last batch
  bool record_files = false;           // format 'file': each batch says which file each record is
  py::object last_files = py::none();  // the last batch's files (uint32 array), or None

  template <typename T>
  static py::array OwnedArray(std::vector<T>* v, std::vector<py::ssize_t> shape) {
    py::capsule owner(v, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>(shape, v->data(), owner);
  }

  py::object Next() { return Read(batch_size, Wait::Forever()); }

  // The next batch, of at most `limit` records (at most batch_size).
  py::object ReadUpTo(const py::object& limit, const py::object& timeout) {
    uint64_t want = ToU64(limit, "max_records", 1);
    Wait wait = Wait::FromTimeout(timeout, "timeout");
    return Read(static_cast<size_t>(std::min<uint64_t>(want, batch_size)), wait);
  }

  py::object Read(size_t want, const Wait& wait) {
    if (done) throw py::stop_iteration();
    std::optional<ReadOutcome> got =
        ReadInSlices(wait, [&](Clock::time_point end, ReadFailure* failure) {
          tc::ReadStatus status =
              shuffled ? shuffled->Next(&batch, want, end) : batcher->Next(&batch, want, end);
          if (status == tc::ReadStatus::kOk) last_epoch = batch.epoch;
          if (status == tc::ReadStatus::kError) {
            rs->failed = true;
            *failure = shuffled ? ReadFailure::Of(shuffled->error(), shuffled->error_kind())
                                : ReadFailure::Of(batcher->error(), batcher->error_kind());
          }
          return status;
        });
    if (!got)
      Raise(g_exc.empty, "queue '" + rs->h->name +
                             "': no records within the timeout; other processes hold the last "
                             "items, which come back if they die or give them back");
    last_files = py::none();
    if (record_files) {
      auto* files = new std::vector<uint32_t>(std::move(batch.files));
      last_files = OwnedArray<uint32_t>(files, {static_cast<py::ssize_t>(files->size())});
    }
    const bool fixed = rs->format.kind == tc::RecordFormatKind::kFixed;
    const uint64_t rb = rs->format.record_bytes;
    const auto n = static_cast<py::ssize_t>(batch.count);
    if (batch.in_place && batch.count == want) {  // zero-copy: a full batch in place
      py::object keeper = py::cast(ArenaKeeper{rs});
      py::array arr(py::dtype::of<uint8_t>(),
                    std::vector<py::ssize_t>{n, static_cast<py::ssize_t>(rb)},
                    std::vector<py::ssize_t>{static_cast<py::ssize_t>(rb), 1}, batch.data, keeper);
      arr.attr("setflags")(py::arg("write") = false);
      return arr;
    }
    auto* data = new std::vector<uint8_t>();
    if (batch.in_place) {
      data->assign(batch.data, batch.data + batch.bytes());  // short: owned, like every other
    } else {
      *data = std::move(batch.storage);
    }
    if (fixed) return OwnedArray<uint8_t>(data, {n, static_cast<py::ssize_t>(rb)});
    auto* offsets = new std::vector<int64_t>(std::move(batch.offsets));
    py::ssize_t bytes = static_cast<py::ssize_t>(data->size());
    py::ssize_t count = static_cast<py::ssize_t>(offsets->size());
    py::array d = OwnedArray<uint8_t>(data, {bytes});
    return py::make_tuple(d, OwnedArray<int64_t>(offsets, {count}));
  }
};

template <typename Iter, typename Class>
void DefineIteratorCommon(Class& cls) {
  cls.def("__iter__", [](py::object self) { return self; })
      .def("close", &Iter::Close,
           "Stops reading: gives back every item not finished (the current one from its last "
           "progress offset) so another process or reader gets it. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](Iter& self, py::object, py::object, py::object) {
            self.Close();
            return false;
          },
          "Closes the iterator.")
      .def_property_readonly(
          "item", &Iter::CurrentItem,
          "The item the last record came from, as a dict (path, begin, end, "
          "epoch, index, ticket), or None before the first record, at the end, and when "
          "records are shuffled (shuffle_buffer, interleave: they come from several items).")
      .def(
          "stats", [](Iter& self) { return ReaderStatsDict(self.rs->Stats()); },
          "Reader counters since it opened (summed over the interleaved readers): bytes_read, "
          "records, items_taken, items_acked, items_given_back, reads, short_reads, retries, "
          "carried_bytes, stale_items (items reassigned by the lease timeout while this reader "
          "held them).")
      .def_property_readonly(
          "memory_state", [](Iter& self) { return self.rs->reader->memory_state(); },
          "One line on the reader's buffers (locked, io_uring-registered, CUDA-pinned).")
      .def_property_readonly(
          "backend", [](Iter& self) { return std::string(self.rs->reader->backend_name()); },
          "'io_uring' or 'pread'.")
      .def_property_readonly(
          "chunk_bytes", [](Iter& self) { return self.rs->reader->chunk_bytes(); },
          "Bytes per read and per buffer, after validation.")
      .def_property_readonly(
          "num_chunks", [](Iter& self) { return self.rs->reader->num_chunks(); },
          "Number of chunk buffers in the reader's arena.")
      .def_property_readonly(
          "queue_depth", [](Iter& self) { return self.rs->reader->queue_depth(); },
          "Reads kept in flight at once.")
      .def_property_readonly(
          "format", [](Iter& self) { return self.rs->format.Tag(); },
          "The record format tag, e.g. 'lines', 'tfrecord', 'fixed:128', 'file'.");
}

}  // namespace

void DefineReaders(py::module_& m) {
  // The reader options records() and batches() accept, for tests and tools.
  py::tuple option_names(ReaderOptionTable().size());
  size_t i = 0;
  for (const ReaderOption& o : ReaderOptionTable()) option_names[i++] = py::str(o.name);
  m.attr("_reader_options") = option_names;

  // ---- Buffers behind zero-copy views
  py::class_<RecordBuffer>(m, "RecordBuffer", py::buffer_protocol(),
                           "Exports the bytes of the current record (what records() yields "
                           "memoryviews of). Internal.")
      .def_buffer([](RecordBuffer& b) -> py::buffer_info {
        return py::buffer_info(const_cast<std::byte*>(b.ptr), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1}, /*readonly=*/true);
      });
  py::class_<ArenaKeeper>(
      m, "ArenaKeeper",
      "Keeps a reader's buffers mapped while a zero-copy batch array lives. Internal.");

  // ---- Iterators
  py::class_<RecordIterator, std::shared_ptr<RecordIterator>> rec_cls(
      m, "RecordIterator",
      "Iterator of records (WorkQueue.records()). Each record is a read-only memoryview into the "
      "reader's buffers, VALID ONLY UNTIL THE NEXT RECORD IS REQUESTED: the view is released then "
      "(using it raises ValueError). Copy what you keep: bytes(view).");
  DefineIteratorCommon<RecordIterator>(rec_cls);
  rec_cls.def("__next__", &RecordIterator::Next)
      .def_property_readonly(
          "offset", [](const RecordIterator& it) { return it.last_offset; },
          "File offset where the last record starts (its header, for tfrecord).")
      .def_property_readonly(
          "end", [](const RecordIterator& it) { return it.last_end; },
          "File offset just past the last record (its newline or CRC included): where the next "
          "record of its file starts, the offset to commit once it is handed on.");

  py::class_<BatchIterator, std::shared_ptr<BatchIterator>> batch_cls(
      m, "BatchIterator",
      "Iterator of batches (WorkQueue.batches()). Fixed-size records: a (n, record_bytes) uint8 "
      "array; other formats: (data uint8 array, offsets int64 array of n + 1) with record i = "
      "data[offsets[i]:offsets[i+1]]. A batch is VALID ONLY UNTIL THE NEXT BATCH IS REQUESTED "
      "(full fixed-size batches are read-only views of the reader's buffers); pass copy=True to "
      "own them.");
  DefineIteratorCommon<BatchIterator>(batch_cls);
  batch_cls.def("__next__", &BatchIterator::Next)
      .def("read", &BatchIterator::ReadUpTo, py::arg("max_records"),
           py::arg("timeout") = py::none(),
           "The next batch, like next(it) but of at most max_records records (capped at "
           "batch_size): lets a caller that joins short batches ask for exactly the rest of one. "
           "Raises StopIteration at the end. At the end of the data, while other processes hold "
           "the last items, it waits; with `timeout` (seconds) it raises Empty after that long "
           "instead, holding no item and no record back (timeout=0: do not wait for them).")
      .def_property_readonly(
          "batch_size", [](const BatchIterator& it) { return it.batch_size; }, "Records per batch.")
      .def_property_readonly(
          "epoch", [](const BatchIterator& it) { return it.last_epoch; },
          "The epoch of the items the last batch came from (with max_epoch a batch holds one "
          "epoch's records; otherwise its last record's).")
      .def_property_readonly(
          "files", [](const BatchIterator& it) { return it.last_files; },
          "format 'file' only: the work file of each record of the last batch, as a uint32 "
          "array of indices into the queue's works (a batch may mix files of several items; "
          "4294967295 for a record restored from an old shuffle state); None for other formats "
          "and before the first batch.");

  m.def(
      "crc32c",
      [](py::buffer data, uint32_t crc) {
        py::buffer_info info = data.request();
        return tc::Crc32c(info.ptr, static_cast<size_t>(info.size * info.itemsize), crc);
      },
      py::arg("data"), py::arg("crc") = 0, "CRC32C (Castagnoli) of data, continuing from crc.");
  m.def("masked_crc32c", &tc::MaskCrc32c, py::arg("crc"),
        "TFRecord's mask of a CRC32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8.");
  m.def(
      "encode_tfrecord",
      [](py::buffer data) {
        py::buffer_info info = data.request();
        std::string out;
        tc::AppendTfrecord(&out, std::string_view(static_cast<const char*>(info.ptr),
                                                  static_cast<size_t>(info.size * info.itemsize)));
        return py::bytes(out);
      },
      py::arg("data"),
      "One TFRecord (length, masked CRC of the length, data, masked CRC of the data) as bytes; "
      "concatenate them to write a .tfrecord file.");
}

constexpr const char* kShuffleDoc =
    "Record-level shuffle: shuffle_buffer=n (records, <= 2**24; default 0) and interleave=k "
    "(1..64 items read at once; default 1) read k items at a time with k readers (sharing "
    "buffer_budget_bytes and the process's leases_per_client) and hand out their records in a "
    "random order through a buffer of n records, seeded by shuffle_seed (default: the queue's "
    "seed), so one process with the same seeds gets the same order. Records are then copied "
    "(never zero-copy). An item is acked once all its records have left the buffer and were "
    "used (the next record or batch was asked for), so a process that dies or an iterator "
    "closed early loses nothing: its unacked items are read again whole. See docs/python.md.";

void DefineReaderMethods(QueueClass& queue) {
  // pybind11 copies docstrings; these need only live through the calls.
  const std::string records_doc =
      "Reads the queue's items and yields their records as read-only memoryviews, valid only "
      "until the next record is requested. format: 'lines', 'tfrecord', 'fixed' (with "
      "record_bytes) or 'file'; default: the queue's format, else 'lines'. Reader options: " +
      ReaderOptionNames() +
      " (backend: 'uring', 'pread' or None). Items are acked as their last record is passed. "
      "max_epoch=e: stop at the first item of an epoch after e (it goes back to the queue "
      "whole, unread); items of epochs <= e, late ones included, are read. " +
      std::string(kShuffleDoc);
  queue
      .def(
          "records",
          [](const HandlePtr& h, py::object format, py::object record_bytes, py::kwargs options) {
            auto it = std::make_shared<RecordIterator>();
            it->max_epoch = PopMaxEpoch(options);
            ShuffleArgs shuffle = PopShuffleArgs(options);
            it->rs =
                OpenReader(h, format, record_bytes, options, "records", &shuffle, it->max_epoch);
            RecordBuffer buf;
            buf.rs = it->rs;
            it->exporter = py::cast(std::move(buf));
            return it;
          },
          py::arg("format") = py::none(), py::arg("record_bytes") = py::none(), records_doc.c_str())
      .def(
          "batches",
          [](const HandlePtr& h, py::object batch_size, py::object format, py::object record_bytes,
             const py::object& copy_arg, const py::object& drop_last_arg, py::kwargs options) {
            uint64_t bs = ToU64(batch_size, "batch_size", 1);
            const bool copy = ToFlag(copy_arg, "copy");
            const bool drop_last = ToFlag(drop_last_arg, "drop_last");
            auto it = std::make_shared<BatchIterator>();
            it->max_epoch = PopMaxEpoch(options);
            tc::BatcherOptions bo;
            bo.max_records = static_cast<size_t>(bs);
            bo.max_epoch = it->max_epoch;
            bo.split_epochs = it->max_epoch.has_value();
            bo.drop_last = drop_last;
            if (options.contains("short_at_end")) {
              bo.short_at_end = ToFlag(options["short_at_end"], "short_at_end");
              if (PyDict_DelItemString(options.ptr(), "short_at_end") != 0)
                throw py::error_already_set();
            }
            ShuffleArgs shuffle = PopShuffleArgs(options);
            shuffle.batched = true;
            it->rs =
                OpenReader(h, format, record_bytes, options, "batches", &shuffle, it->max_epoch);
            // Whole files: a transform wants each one's path (a label in a folder name).
            it->record_files = bo.record_files = it->rs->format.kind == tc::RecordFormatKind::kFile;
            if (it->rs->shuffler) {
              it->shuffled = std::make_unique<ShuffledBatches>(*it->rs->shuffler, bo.short_at_end,
                                                               drop_last, bo.record_files);
            } else {
              bo.zero_copy = it->rs->format.kind == tc::RecordFormatKind::kFixed && !copy;
              it->batcher = std::make_unique<tc::Batcher>(*it->rs->reader, bo);
            }
            it->batch_size = bo.max_records;
            it->copy = copy;
            return it;
          },
          py::arg("batch_size"), py::arg("format") = py::none(),
          py::arg("record_bytes") = py::none(), py::kw_only(), py::arg("copy") = py::bool_(false),
          py::arg("drop_last") = py::bool_(false),
          "Like records() but yields batches of batch_size records (the last may be smaller "
          "unless drop_last): for 'fixed' a (n, record_bytes) uint8 array, else a (data, offsets) "
          "pair of numpy arrays. Valid until the next batch unless copy=True. max_epoch=e: as in "
          "records(); a batch never holds records of an epoch after e, nor of two epochs. "
          "short_at_end=True: once a batch holds a record, return it short rather than wait for "
          "items other processes hold to fill it. shuffle_buffer, interleave, shuffle_seed: as in "
          "records(); shuffled batches are always owned copies, and a batch still holds one "
          "epoch's records.");
}

}  // namespace tailcut::python
