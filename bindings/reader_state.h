// A Reader opened on a WorkQueue from Python, and how records()/batches()
// open one: their format argument and reader options (kReaderOptions).
#pragma once

#include <pybind11/pybind11.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "queue.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"

namespace tailcut::python {

// A Reader opened on a queue. Its arena stays mapped as long as this object
// lives; zero-copy views hold it.
class ReaderState : public Child {
 public:
  ReaderState(HandlePtr h, tc::RecordFormat format)
      : h(std::move(h)), format(format), pid(::getpid()) {}
  ~ReaderState() override {
    if (::getpid() != pid) {
      (void)reader.release();
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      reader.reset();
    } else {
      reader.reset();
    }
  }
  void CloseFromQueue() noexcept override {
    std::lock_guard<std::mutex> lock(mu);
    if (!closed) {
      reader->Close();
      closed = true;
      closed_by_queue = true;
    }
  }
  // REQUIRES: mu, no GIL.
  void CloseLocked() noexcept {
    if (!closed) {
      reader->Close();
      closed = true;
    }
  }

  HandlePtr h;  // declared first: destroyed after reader
  std::unique_ptr<tc::Reader> reader;
  tc::RecordFormat format;
  pid_t pid;
  std::mutex mu;  // one Next* at a time; close waits for it
  bool closed = false;
  bool closed_by_queue = false;
  bool failed = false;
};

using ReaderPtr = std::shared_ptr<ReaderState>;

// Keeps a ReaderState (and so its arena) alive as the base of numpy views.
struct ArenaKeeper {
  ReaderPtr rs;
};

// The object a record memoryview is taken from: exports [ptr, ptr + size).
struct RecordBuffer {
  ReaderPtr rs;  // keeps the arena mapped while any view of it lives
  const std::byte* ptr = nullptr;
  size_t size = 0;
};

// One keyword option of records()/batches() that sets a field of
// ReaderOptions. apply converts the value (raising with `name` in the message).
struct ReaderOption {
  const char* name;
  void (*apply)(tc::ReaderOptions& ro, py::handle value, const char* name);
};
// Every reader option, in the order the docstrings list them.
std::span<const ReaderOption> ReaderOptionTable();
// "buffer_budget_bytes, chunk_bytes, ...": the table's names, for docstrings.
std::string ReaderOptionNames();

// Opens a Reader on h for records()/batches() (`caller`, for messages).
// REQUIRES: the GIL.
ReaderPtr OpenReader(const HandlePtr& h, const py::object& format, const py::object& record_bytes,
                     const py::kwargs& options, const char* caller);

// A reader's (or batcher's) error, copied under the ReaderState's mu so that
// it can be raised after the lock is let go.
struct ReadFailure {
  std::string text;
  tc::ErrorKind kind = tc::ErrorKind::kIo;

  static ReadFailure Of(const std::string& text, tc::ErrorKind kind);
  // Raises it as the exception of its kind. REQUIRES: the GIL.
  [[noreturn]] void Raise() const;
};

py::dict ItemDict(const tc::WorkItem& item);

// Takes max_epoch (not a reader option) out of records()/batches() keywords.
std::optional<uint64_t> PopMaxEpoch(py::kwargs& options);

}  // namespace tailcut::python
