// tailcut._core.slice_records: the records one work item owns, read with
// plain pread and parsed by the same RecordParser the Reader uses
// (tailcut/record_format.h), so a pooled loader process (tailcut.pool) that
// reads items one at a time splits every format exactly as records() does:
// the records that start in [begin, end), TFRecord resynchronisation and both
// CRCs included.
//
// The file is opened as the Reader opens it (tailcut/work_file.h): a FIFO or
// another non-regular file in its place is refused at once, and, given the
// WorkItem, so is another file renamed over it or the file truncated.
//
// Control path: it allocates, makes system calls and raises rich errors
// (tailcut::Error becomes the exception of its kind; a parse error is a
// CorruptError naming the file and the offset). The GIL is released while it
// reads and parses, and taken back to build the list of bytes.
#include "slice_records.h"

#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conversions.h"
#include "errors.h"
#include "items.h"
#include "tailcut/record_format.h"
#include "tailcut/work_file.h"

namespace tailcut::python {
namespace {

constexpr size_t kReadBytes = 1 << 20;  // bytes per read, at least

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void ThrowIo(const std::string& path, const char* call, int err) {
  throw tc::Error(err == ENOENT                   ? tc::ErrorKind::kNotFound
                  : err == EACCES || err == EPERM ? tc::ErrorKind::kPermission
                                                  : tc::ErrorKind::kIo,
                  std::string(call) + " of '" + path + "' failed: " + std::strerror(err));
}

// The records are copied out (each a std::string) so the window can move on;
// one item is small next to a process's memory, and the caller wants bytes.
struct Parsed {
  std::vector<std::string> records;
  std::vector<uint64_t> ends;  // the file offset just past each record
  std::string error;           // the parser's kError text
};

// `expected`: the queue's identity of the file, or null (then its size now
// is its size). REQUIRES: the GIL is not held (it reads the file).
Parsed ReadSlice(const std::string& path, const tc::FileIdentity* expected,
                 const tc::RecordFormat& format, uint64_t begin, uint64_t end) {
  tc::WorkFile file = tc::OpenWorkFile(path, expected);
  if (file.fd < 0) throw tc::Error(file.kind, file.error);
  Fd fd(file.fd);
  // Bytes appended since the queue was created belong to no item (as for the Reader).
  const uint64_t file_size = expected ? expected->size : static_cast<uint64_t>(file.st.st_size);
  std::unique_ptr<tc::RecordParser> parser = tc::RecordParser::Create(format);
  uint64_t pos = parser->Begin(path, file_size, begin, end);

  Parsed out;
  std::string window;  // the file bytes [pos, pos + window.size())
  size_t used = 0;     // bytes at the front of `window` already consumed
  bool eof = false;
  auto read_more = [&](size_t at_least) {
    if (used > 0) {
      window.erase(0, used);
      used = 0;
    }
    size_t want = std::max(kReadBytes, at_least);
    uint64_t at = pos + window.size();
    size_t have = window.size();
    window.resize(have + want);
    size_t got = 0;
    while (got < want) {
      ssize_t n =
          ::pread(fd.get(), window.data() + have + got, want - got, static_cast<off_t>(at + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        ThrowIo(path, "pread", errno);
      }
      if (n == 0) break;  // the end of the file (short reads before it are retried)
      got += static_cast<size_t>(n);
    }
    window.resize(have + got);
    eof = got < want || at + got >= file_size;
  };

  read_more(0);
  for (;;) {
    tc::Record record;
    size_t consumed = 0;
    const std::byte* data = reinterpret_cast<const std::byte*>(window.data()) + used;
    tc::ParseStatus status = parser->Next(data, window.size() - used, eof, &record, &consumed);
    used += consumed;
    pos += consumed;
    if (status == tc::ParseStatus::kRecord) {
      out.records.emplace_back(reinterpret_cast<const char*>(record.data), record.size);
      out.ends.push_back(pos);
    } else if (status == tc::ParseStatus::kNeedMore) {
      if (eof) {  // the protocol never asks for more past the end; refuse to spin
        out.error = "file '" + path + "' at offset " + std::to_string(pos) +
                    ": the parser asked for bytes past the end of the file";
        break;
      }
      read_more(window.size() - used);  // at least doubles what is unconsumed: a long record
    } else if (status == tc::ParseStatus::kDone) {
      break;
    } else {
      out.error = parser->error();
      break;
    }
  }
  return out;
}

}  // namespace

void DefineSliceRecords(py::module_& m) {
  m.def(
      "slice_records",
      [](py::object path, uint64_t begin, uint64_t end, const std::string& format,
         py::object record_bytes, uint64_t max_record_bytes, bool with_ends,
         py::object item) -> py::object {
        std::string p = ToPath(path);
        std::optional<tc::FileIdentity> expected;
        if (!item.is_none()) {
          if (!py::isinstance<PyWorkItem>(item))
            throw py::type_error("slice_records: item must be a WorkItem, not " +
                                 std::string(py::str(item.get_type().attr("__name__"))));
          const PyWorkItem& w = item.cast<const PyWorkItem&>();
          if (w.path != p)
            Raise(g_exc.invalid_argument,
                  "slice_records: path '" + p + "' is not the item's ('" + w.path + "')");
          Use use(*w.h);
          const auto& files = w.h->queue->files();
          if (w.item.file < files.size()) expected = files[w.item.file];
        }
        tc::RecordFormat f = ParseFormat(format, record_bytes);
        if (max_record_bytes == 0)
          Raise(g_exc.invalid_argument, "max_record_bytes must be at least 1");
        f.max_record_bytes = max_record_bytes;
        if (end < begin)
          Raise(g_exc.invalid_argument, "slice of '" + p + "': end " + std::to_string(end) +
                                            " is before begin " + std::to_string(begin));
        Parsed parsed;
        {
          py::gil_scoped_release nogil;
          parsed = ReadSlice(p, expected ? &*expected : nullptr, f, begin, end);
        }
        if (!parsed.error.empty()) Raise(g_exc.corrupt, parsed.error);
        py::list out;
        for (const std::string& r : parsed.records) out.append(py::bytes(r));
        if (!with_ends) return out;
        return py::make_tuple(out, py::cast(parsed.ends));
      },
      py::arg("path"), py::arg("begin"), py::arg("end"), py::arg("format"),
      py::arg("record_bytes") = py::none(), py::arg("max_record_bytes") = 64ull << 20,
      py::arg("with_ends") = false, py::arg("item") = py::none(),
      "The records that start in [begin, end) of the file `path`, as a list of bytes, parsed "
      "as the reader parses them: format 'lines' (a trailing '\\r' stripped), 'tfrecord' (both "
      "CRCs checked; a slice starting mid-file resynchronises), 'fixed' (with record_bytes) or "
      "'file'. A malformed record raises CorruptError naming the file and the offset. With "
      "with_ends=True, (records, ends): ends[i] is the file offset just past record i, where "
      "a reader of the rest starts (WorkItem.commit). The file is opened as the queue's reader "
      "opens it: anything but a regular file (a FIFO put in its place) raises "
      "InvalidArgumentError at once; with item= (the WorkItem the slice belongs to) another "
      "file renamed over it raises ConfigMismatchError and a truncated one IoError, naming the "
      "file and the change, and bytes appended since the queue was created are not read.");
}

}  // namespace tailcut::python
