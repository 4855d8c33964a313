// tailcut._core.RecordFiles: the record indexes of a list of files
// (tailcut/record_index.h) numbered as one data set, and batched reads of
// any of their records, for QueueDataset(shuffle="global").
//
// Control path: building indexes and reading records allocate, make system
// calls and raise the exception of the tailcut::Error's kind (a record that
// does not parse: CorruptError naming the file and the offset). The GIL is
// released while indexes are built and records read; notices take it back
// to call on_notice. Progress lines go to stderr, at most one a second, when
// a build scans for longer than a second.
#include "record_files.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "conversions.h"
#include "errors.h"
#include "tailcut/record_index.h"

namespace tailcut::python {
namespace {

using Clock = std::chrono::steady_clock;

struct PyRecordFiles {
  std::shared_ptr<const tc::RecordFiles> files;
  std::vector<std::string> paths;
  std::string format_tag;
};

template <typename T>
py::array OwnedArray(std::vector<T>* v) {
  py::capsule owner(v, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(v->size())}, v->data(), owner);
}

// Record numbers from a 1-d numpy array of (u)int64, copied as one block (a
// batch's numbers: no Python int per record), or from any sequence of ints.
std::vector<uint64_t> Positions(const py::object& numbers) {
  if (py::isinstance<py::array>(numbers)) {
    py::array a = py::reinterpret_borrow<py::array>(numbers);
    const char kind = a.dtype().kind();
    if (a.ndim() == 1 && a.itemsize() == 8 && kind == 'u') {
      auto c = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      return std::vector<uint64_t>(c.data(), c.data() + c.shape(0));
    }
    if (a.ndim() == 1 && a.itemsize() == 8 && kind == 'i') {
      auto c = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      std::vector<uint64_t> out(c.data(), c.data() + c.shape(0));
      for (py::ssize_t k = 0; k < c.shape(0); ++k)
        if (c.data()[k] < 0)
          Raise(g_exc.invalid_argument, "record " + std::to_string(c.data()[k]) +
                                            " is out of range: record numbers are >= 0");
      return out;
    }
  }
  return numbers.cast<std::vector<uint64_t>>();
}

// Prints "tailcut: indexing records: 12 of 40 files, 1.2 GB scanned" at most
// once a second, from the first second on, and a last line when such a build
// ends (a build done within a second prints nothing).
std::function<void(size_t, size_t, uint64_t)> ProgressLines() {
  auto start = Clock::now();
  auto last = std::make_shared<Clock::time_point>(start);
  return [start, last](size_t done, size_t total, uint64_t bytes) {
    auto now = Clock::now();
    const bool end = done == total;
    if (now - start < std::chrono::seconds(1) || (!end && now - *last < std::chrono::seconds(1)))
      return;
    *last = now;
    std::fprintf(stderr, "tailcut: indexing records: %zu of %zu files, %.1f GB scanned%s\n", done,
                 total, static_cast<double>(bytes) / 1e9, end ? " (done)" : "");
    std::fflush(stderr);
  };
}

}  // namespace

void DefineRecordFiles(py::module_& m) {
  py::class_<PyRecordFiles>(m, "RecordFiles",
                            "The record indexes of several files numbered as one data set "
                            "(record r of the set is record r - first of file f), and reads of "
                            "any of their records: what QueueDataset(shuffle='global') reads "
                            "through (building one ahead of a job indexes its files).")
      .def(py::init([](const py::iterable& paths, const std::string& format,
                       const py::object& record_bytes, const py::object& cache_dir, size_t threads,
                       const py::object& on_notice, bool progress) {
             auto self = std::make_unique<PyRecordFiles>();
             for (const py::handle& p : paths) self->paths.push_back(ToPath(p));
             if (self->paths.empty()) Raise(g_exc.invalid_argument, "RecordFiles: no files given");
             tc::RecordFormat f = ParseFormat(format, record_bytes);
             self->format_tag = f.Tag();
             tc::RecordIndexOptions options;
             options.cache_dir =
                 cache_dir.is_none() ? tc::DefaultRecordIndexDir() : ToPath(cache_dir);
             options.threads = threads;
             options.notice = WrapNotice(on_notice);
             if (progress) options.progress = ProgressLines();
             py::gil_scoped_release nogil;
             self->files = tc::RecordFiles::Build(self->paths, f, options);
             return self;
           }),
           py::arg("paths"), py::arg("format"), py::arg("record_bytes") = py::none(),
           py::arg("cache_dir") = py::none(), py::arg("threads") = 0,
           py::arg("on_notice") = py::none(), py::arg("progress") = true,
           "Indexes `paths` in `format` ('fixed' with record_bytes, 'lines', 'tfrecord', 'tar', "
           "'file'), threads files at a time (0: one per core, at most 8), loading each index "
           "from cache_dir (None: $TAILCUT_INDEX_DIR, else ~/.cache/tailcut/index; '': keep "
           "none) when it holds one of the file as it is now (device, inode, size, mtime), "
           "else scanning the file once and storing it there. on_notice(line) hears of an "
           "index rebuilt because its file changed, or one that could not be stored.")
      .def("__len__", [](const PyRecordFiles& self) { return self.files->size(); })
      .def_property_readonly(
          "num_records", [](const PyRecordFiles& self) { return self.files->size(); },
          "Records in all the files.")
      .def_property_readonly(
          "files_scanned", [](const PyRecordFiles& self) { return self.files->files_scanned(); },
          "How many files were scanned when built (the others' indexes were loaded).")
      .def_property_readonly(
          "format", [](const PyRecordFiles& self) { return self.format_tag; },
          "The format's tag, e.g. 'tfrecord' or 'fixed:16'.")
      .def_property_readonly(
          "paths",
          [](const PyRecordFiles& self) {
            py::list out;
            for (const std::string& p : self.paths) out.append(FromPath(p));
            return out;
          },
          "The files, in their numbering order.")
      .def(
          "counts",
          [](const PyRecordFiles& self) {
            std::vector<uint64_t> out;
            for (size_t f = 0; f < self.files->num_files(); ++f)
              out.push_back(self.files->file(f).count);
            return out;
          },
          "Records per file.")
      .def(
          "locate",
          [](const PyRecordFiles& self, uint64_t r) {
            if (r >= self.files->size())
              Raise(g_exc.invalid_argument, "record " + std::to_string(r) +
                                                " is out of range: the files hold " +
                                                std::to_string(self.files->size()) + " records");
            size_t f;
            uint64_t i;
            self.files->Locate(r, &f, &i);
            const tc::RecordIndex& index = self.files->file(f);
            return py::make_tuple(f, i, index.Offset(i), index.Size(i));
          },
          py::arg("record"),
          "(file, record in file, payload offset, payload size) of record `record`.")
      .def(
          "read",
          [](const PyRecordFiles& self, const py::object& numbers, size_t threads,
             uint64_t max_gap) {
            std::vector<uint64_t> positions = Positions(numbers);
            auto data = std::make_unique<std::string>();
            auto offsets = std::make_unique<std::vector<int64_t>>();
            {
              py::gil_scoped_release nogil;
              std::vector<uint64_t> ends;
              tc::ReadRecords(*self.files, positions, data.get(), &ends, threads, max_gap);
              offsets->reserve(ends.size() + 1);
              offsets->push_back(0);
              for (uint64_t e : ends) offsets->push_back(static_cast<int64_t>(e));
            }
            // The arrays own what they view (a capsule each): no copy of the data.
            std::string* bytes = data.release();
            py::capsule data_owner(bytes, [](void* p) { delete static_cast<std::string*>(p); });
            py::array d =
                py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes->size())},
                                     reinterpret_cast<const uint8_t*>(bytes->data()), data_owner);
            py::array o = OwnedArray(offsets.release());
            return py::make_tuple(d, o);
          },
          py::arg("positions"), py::arg("threads") = 1, py::arg("max_gap") = 4096,
          "The records `positions` (numbers in 0..len - 1, any order: a sequence of ints, or "
          "a 1-d numpy array of uint64 or int64, read without a Python int per record), as "
          "(data, offsets): "
          "a uint8 and an int64 array, record k = data[offsets[k]:offsets[k + 1]]. Reads "
          "are sorted and coalesced (records at most max_gap bytes apart share one read); "
          "TFRecord data CRCs are checked again. A file changed since it was indexed "
          "raises the error that names it.");
}

}  // namespace tailcut::python
