// A Reader opened on a WorkQueue from Python, and how records()/batches()
// open one: their format argument and reader options (kReaderOptions).
#pragma once

#include <pybind11/pybind11.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "queue.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"
#include "tailcut/shuffler.h"

namespace tailcut::python {

// A Reader opened on a queue -- or, to shuffle records (shuffle.h), several
// Readers and a Shuffler over them. Its arenas stay mapped as long as this
// object lives; zero-copy views hold it.
class ReaderState : public Child {
 public:
  ReaderState(HandlePtr h, tc::RecordFormat format)
      : h(std::move(h)), format(format), pid(::getpid()) {}
  ~ReaderState() override {
    if (::getpid() != pid) {
      (void)shuffler.release();
      (void)reader.release();
      for (auto& r : more) (void)r.release();
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      Destroy();
    } else {
      Destroy();
    }
  }
  void CloseFromQueue() noexcept override {
    // A reading thread takes mu back at once between its 100 ms slices, and
    // std::mutex is not fair: say we are closing first, so that it yields mu
    // to us (ReadInSlices) instead of starving us.
    closing.store(true, std::memory_order_release);  // pairs with ReadInSlices' acquire load
    std::lock_guard<std::mutex> lock(mu);
    if (!closed) {
      CloseReaders();
      closed = true;
      closed_by_queue = true;
    }
    closed_cv.notify_all();
  }
  // REQUIRES: mu, no GIL.
  void CloseLocked() noexcept {
    if (!closed) {
      CloseReaders();
      closed = true;
    }
  }
  // Every Reader's counters, added up. Any thread (ReaderStats contract).
  tc::ReaderStats Stats() const noexcept {
    tc::ReaderStats s = reader->stats();
    for (const auto& r : more) {
      tc::ReaderStats m = r->stats();
      s.bytes_read += m.bytes_read;
      s.records += m.records;
      s.items_taken += m.items_taken;
      s.items_acked += m.items_acked;
      s.items_given_back += m.items_given_back;
      s.reads += m.reads;
      s.short_reads += m.short_reads;
      s.retries += m.retries;
      s.carried_bytes += m.carried_bytes;
      s.stale_items += m.stale_items;
    }
    return s;
  }

  HandlePtr h;                         // declared first: destroyed after the readers
  std::unique_ptr<tc::Reader> reader;  // the only Reader, or the first of the shuffled ones
  std::vector<std::unique_ptr<tc::Reader>> more;  // the other interleaved Readers
  std::unique_ptr<tc::Shuffler> shuffler;         // over reader and more; null: file order
  tc::RecordFormat format;
  pid_t pid;
  std::mutex mu;                      // one Next* at a time; close waits for it
  std::atomic<bool> closing{false};   // CloseFromQueue is waiting for mu
  std::condition_variable closed_cv;  // with mu: closed became true
  bool closed = false;
  bool closed_by_queue = false;
  bool failed = false;

 private:
  void CloseReaders() noexcept {
    if (shuffler) shuffler->Close();  // gives back its finished items first
    reader->Close();
    for (auto& r : more) r->Close();
  }
  void Destroy() noexcept {
    shuffler.reset();  // it points at the Readers
    reader.reset();
    more.clear();
  }
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

struct ShuffleArgs;  // shuffle.h

// Opens a Reader on h for records()/batches() (`caller`, for messages); with
// `shuffle` asking for it, the interleaved Readers and the Shuffler too.
// REQUIRES: the GIL.
ReaderPtr OpenReader(const HandlePtr& h, const py::object& format, const py::object& record_bytes,
                     const py::kwargs& options, const char* caller,
                     const ShuffleArgs* shuffle = nullptr,
                     std::optional<uint64_t> max_epoch = std::nullopt);

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
