#include "reader_state.h"

#include <algorithm>

#include "conversions.h"
#include "errors.h"
#include "shuffle.h"

namespace tailcut::python {

namespace {

tc::IoBackend ToBackend(py::handle v) {
  if (v.is_none()) return tc::IoBackend::kDefault;
  std::string b = py::str(v);
  if (b == "uring" || b == "io_uring") return tc::IoBackend::kUring;
  if (b == "pread") return tc::IoBackend::kPread;
  if (b == "default") return tc::IoBackend::kDefault;
  Raise(g_exc.invalid_argument, "backend '" + b + "' is not 'uring', 'pread' or None");
}

const ReaderOption kReaderOptions[] = {
    {"buffer_budget_bytes", [](tc::ReaderOptions& ro, py::handle v,
                               const char* name) { ro.buffer_budget_bytes = ToU64(v, name, 1); }},
    {"chunk_bytes", [](tc::ReaderOptions& ro, py::handle v,
                       const char* name) { ro.chunk_bytes = ToU64(v, name, 1); }},
    {"queue_depth",
     [](tc::ReaderOptions& ro, py::handle v, const char* name) {
       // None (and 0): the Reader picks the depth.
       ro.queue_depth = static_cast<uint32_t>(ToU64OrNone(v, name, 0, UINT32_MAX).value_or(0));
     }},
    {"prefetch_items", [](tc::ReaderOptions& ro, py::handle v,
                          const char* name) { ro.prefetch_items = ToU32(v, name); }},
    {"direct",
     [](tc::ReaderOptions& ro, py::handle v, const char* name) { ro.direct = ToFlag(v, name); }},
    {"backend",
     [](tc::ReaderOptions& ro, py::handle v, const char*) { ro.backend = ToBackend(v); }},
    {"max_record_bytes", [](tc::ReaderOptions& ro, py::handle v,
                            const char* name) { ro.format.max_record_bytes = ToU64(v, name, 1); }},
    {"uring_async_buffered", [](tc::ReaderOptions& ro, py::handle v,
                                const char* name) { ro.uring_async_buffered = ToFlag(v, name); }},
    {"pread_threads", [](tc::ReaderOptions& ro, py::handle v,
                         const char* name) { ro.pread_threads = ToU32(v, name); }},
    {"cuda_register", [](tc::ReaderOptions& ro, py::handle v,
                         const char* name) { ro.cuda_register = ToFlag(v, name); }},
    {"on_notice",
     [](tc::ReaderOptions& ro, py::handle v, const char*) {
       ro.on_notice = WrapNotice(py::reinterpret_borrow<py::object>(v));
     }},
};

const ReaderOption* FindReaderOption(const std::string& key) {
  for (const ReaderOption& o : kReaderOptions)
    if (key == o.name) return &o;
  return nullptr;
}

}  // namespace

std::span<const ReaderOption> ReaderOptionTable() { return kReaderOptions; }

std::string ReaderOptionNames() {
  std::string names;
  for (const ReaderOption& o : kReaderOptions) {
    if (!names.empty()) names += ", ";
    names += o.name;
  }
  return names;
}

ReaderPtr OpenReader(const HandlePtr& h, const py::object& format, const py::object& record_bytes,
                     const py::kwargs& options, const char* caller, const ShuffleArgs* shuffle,
                     std::optional<uint64_t> max_epoch) {
  h->CheckPid();
  tc::RecordFormat fmt;
  if (format.is_none()) {
    if (h->format) {
      fmt = *h->format;
      if (!record_bytes.is_none() && ToU64(record_bytes, "record_bytes", 1) != fmt.record_bytes)
        Raise(g_exc.invalid_argument, "queue '" + h->name + "' was opened with format '" +
                                          fmt.Tag() +
                                          "'; record_bytes must match it or be left out");
    } else {
      fmt = ParseFormat("lines", record_bytes);
    }
  } else {
    fmt = ParseFormat(py::str(format), record_bytes);
    if (h->format && h->format->Tag() != fmt.Tag())
      Raise(g_exc.invalid_argument,
            "queue '" + h->name + "' was opened with format '" + h->format->Tag() + "', not '" +
                fmt.Tag() +
                "': every process must read a queue's items the same way; "
                "leave format out or open the queue with the format you read");
  }
  tc::ReaderOptions ro;
  ro.format = fmt;
  ro.on_notice = h->notice;
  GivenReaderOptions given;
  for (auto kv : options) {
    std::string key = py::str(kv.first);
    const ReaderOption* opt = FindReaderOption(key);
    if (opt == nullptr)
      throw py::type_error(std::string(caller) + "() got an unexpected keyword argument '" + key +
                           "'");
    opt->apply(ro, kv.second, opt->name);
    given.chunk_bytes |= key == "chunk_bytes";
    given.prefetch_items |= key == "prefetch_items";
  }
  const bool shuffled = shuffle != nullptr && shuffle->on();
  const uint32_t readers = shuffled ? shuffle->interleave : 1;
  if (shuffled) {
    ShareReaderOptions(*h, *shuffle, caller, given, &ro);
    // The Shuffler acks an item once its records have left its buffer and
    // were used (exactly once when the process dies).
    ro.defer_acks = true;
    if (readers > 1) ro.on_notice = OncePerLine(std::move(ro.on_notice));
  }
  auto rs = std::make_shared<ReaderState>(h, ro.format);
  {
    Use use(*h);
    py::gil_scoped_release nogil;
    rs->reader = tc::Reader::Open(*h->queue, ro);
    for (uint32_t i = 1; i < readers; ++i) rs->more.push_back(tc::Reader::Open(*h->queue, ro));
    if (shuffled) {
      std::vector<tc::Reader*> all{rs->reader.get()};
      for (auto& r : rs->more) all.push_back(r.get());
      tc::ShufflerOptions so;
      so.buffer_records = std::max<uint64_t>(shuffle->buffer, 1);
      so.seed = shuffle->seed.value_or(h->queue->seed());
      so.max_epoch = max_epoch;
      so.ack_on_next = !shuffle->batched;
      rs->shuffler = std::make_unique<tc::Shuffler>(std::move(all), so);
    }
  }
  h->Adopt(rs);
  return rs;
}

ReadFailure ReadFailure::Of(const std::string& text, tc::ErrorKind kind) {
  return {text.empty() ? std::string("reader failed without a message") : text, kind};
}

void ReadFailure::Raise() const { python::Raise(ExceptionFor(kind), text); }

py::dict ItemDict(const tc::WorkItem& item) {
  py::dict d;
  d["path"] = FromPath(std::string(item.path));
  d["begin"] = item.begin;
  d["end"] = item.end;
  d["epoch"] = item.epoch;
  d["index"] = item.index;
  d["ticket"] = item.ticket;
  return d;
}

std::optional<uint64_t> PopMaxEpoch(py::kwargs& options) {
  if (!options.contains("max_epoch")) return std::nullopt;
  py::object v = options["max_epoch"];
  if (PyDict_DelItemString(options.ptr(), "max_epoch") != 0) throw py::error_already_set();
  if (v.is_none()) return std::nullopt;
  return ToU64(v, "max_epoch");
}

// Shared by the record and the batch iterators.

}  // namespace tailcut::python
