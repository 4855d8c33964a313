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
//    then closes the C++ queue; a blocked take() wakes within kTakeSlice.
//  * Lock order: never wait for a QueueHandle or ReaderState mutex while
//    holding the GIL. Holding such a mutex while taking the GIL back is
//    therefore safe.
//  * Fork: every object remembers the pid that opened it. In a forked child
//    its methods raise and its destructor leaks the C++ object (the C++
//    contract forbids a child to use, close or destroy the parent's queue).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tailcut/crc32c.h"
#include "tailcut/error.h"
#include "tailcut/reader.h"
#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace py = pybind11;
namespace tc = tailcut;

namespace {

using Clock = std::chrono::steady_clock;
// How long one C++ Take may block before the binding checks for signals
// (Ctrl-C) and for a concurrent close().
constexpr std::chrono::milliseconds kTakeSlice{100};

// ---- Exceptions --------------------------------------------------------------

struct Exceptions {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* permission = nullptr;
  PyObject* no_space = nullptr;
  PyObject* config_mismatch = nullptr;
  PyObject* corrupt = nullptr;
  PyObject* timeout = nullptr;
  PyObject* io = nullptr;
  PyObject* stale = nullptr;
  PyObject* empty = nullptr;
};
Exceptions g_exc;  // module lifetime; references are owned by the module too

PyObject* ExceptionFor(tc::ErrorKind kind) {
  switch (kind) {
    case tc::ErrorKind::kInvalidArgument:
      return g_exc.invalid_argument;
    case tc::ErrorKind::kNotFound:
      return g_exc.not_found;
    case tc::ErrorKind::kPermission:
      return g_exc.permission;
    case tc::ErrorKind::kNoSpace:
      return g_exc.no_space;
    case tc::ErrorKind::kConfigMismatch:
      return g_exc.config_mismatch;
    case tc::ErrorKind::kCorrupt:
      return g_exc.corrupt;
    case tc::ErrorKind::kTimeout:
      return g_exc.timeout;
    case tc::ErrorKind::kIo:
      return g_exc.io;
  }
  return g_exc.error;
}

// REQUIRES: the GIL.
[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

// The Reader reports errors as text only. Until it exposes their kind, the
// kind is read off the text's shape: "file '...': cannot open: <strerror>" and
// "file '...' at offset N: read ..." come from the I/O layer, everything else
// that names a format ("tfrecord file '...' at offset N: data CRC mismatch")
// from a parser, i.e. data that fails validation.
[[maybe_unused]] tc::ErrorKind ReaderErrorKind(const std::string& text) {
  auto has = [&](const char* s) { return text.find(s) != std::string::npos; };
  if (text.rfind("file '", 0) == 0) {
    if (has("No such file or directory") || has("Not a directory")) return tc::ErrorKind::kNotFound;
    if (has("Permission denied") || has("Operation not permitted"))
      return tc::ErrorKind::kPermission;
    if (has("max_record_bytes")) return tc::ErrorKind::kCorrupt;
    return tc::ErrorKind::kIo;
  }
  if (text.rfind("reader:", 0) == 0) return tc::ErrorKind::kIo;
  return tc::ErrorKind::kCorrupt;
}

template <typename R>
tc::ErrorKind KindOfReaderError(const R& reader) {
  if constexpr (requires { reader.error_kind(); }) {
    return reader.error_kind();
  } else {
    return ReaderErrorKind(reader.error());
  }
}

// ---- Small conversions -------------------------------------------------------

uint64_t ToU64(const py::handle& value, const char* what, uint64_t min_value = 0) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    throw py::type_error(std::string(what) + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!i) throw py::error_already_set();
  if (py::int_(i) < py::int_(0) ||
      py::int_(i) < py::int_(static_cast<unsigned long long>(min_value))) {
    Raise(g_exc.invalid_argument, std::string(what) + " must be " +
                                      (min_value == 0 ? std::string("a non-negative int")
                                                      : "at least " + std::to_string(min_value)) +
                                      ", got " + std::string(py::str(i)));
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// A count the engine keeps in 32 bits: larger values are refused, not cut.
uint32_t ToU32(const py::handle& value, const char* what) {
  uint64_t v = ToU64(value, what);
  if (v > UINT32_MAX)
    Raise(g_exc.invalid_argument, std::string(what) + " must be below 2**32, got " + std::to_string(v));
  return static_cast<uint32_t>(v);
}

double ToSeconds(const py::handle& value, const char* what) {
  if (PyBool_Check(value.ptr()))
    throw py::type_error(std::string(what) + " must be a number of seconds");
  double s = PyFloat_AsDouble(value.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + " must be a number of seconds or None");
  }
  if (!(s >= 0) || std::isinf(s))
    Raise(g_exc.invalid_argument, std::string(what) +
                                      " must be a finite number of seconds >= 0, got " +
                                      std::string(py::repr(value)));
  return s;
}

std::chrono::milliseconds ToMillis(double seconds) {
  // Capped so the cast is defined; the engine refuses anything this long.
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(std::min(seconds, 1e15) * 1000.0)));
}

std::string ToPath(const py::handle& value) {
  py::object os = py::module_::import("os");
  return py::str(os.attr("fsdecode")(os.attr("fspath")(value)));
}

std::string ToBytes(const py::handle& value, const char* what) {
  if (PyBytes_Check(value.ptr()))
    return std::string(py::bytes(py::reinterpret_borrow<py::bytes>(value)));
  if (PyObject_CheckBuffer(value.ptr())) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(value).request();
    return std::string(static_cast<const char*>(info.ptr),
                       static_cast<size_t>(info.size * info.itemsize));
  }
  throw py::type_error(std::string(what) + " must be bytes, not " +
                       std::string(py::str(py::type::handle_of(value).attr("__name__"))));
}

// on_notice: a Python callable, called with the GIL from whatever thread the
// C++ notice comes from. The callable is released with the GIL held.
std::function<void(const std::string&)> WrapNotice(const py::object& fn) {
  if (fn.is_none()) return {};
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("on_notice must be callable or None");
  std::shared_ptr<py::object> holder(new py::object(fn), [](py::object* o) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete o;
    }  // else: the interpreter is gone; leak rather than touch it
  });
  return [holder](const std::string& line) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    try {
      (*holder)(line);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("tailcut on_notice callback");
    }
  };
}

tc::RecordFormat ParseFormat(const std::string& name, const py::object& record_bytes) {
  uint64_t rb = record_bytes.is_none() ? 0 : ToU64(record_bytes, "record_bytes", 1);
  return tc::RecordFormat::Parse(name, rb);
}

// ---- The queue handle ---------------------------------------------------------

// Something opened on a queue that must be closed before the queue is.
class Child {
 public:
  virtual ~Child() = default;
  // Called without the GIL.
  virtual void CloseFromQueue() noexcept = 0;
};

class QueueHandle {
 public:
  ~QueueHandle() {
    if (::getpid() != pid) {
      (void)queue.release();  // a forked child must not close its parent's queue
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      queue.reset();
    } else {
      queue.reset();
    }
  }

  std::unique_ptr<tc::WorkQueue> queue;
  pid_t pid = 0;
  std::string name;
  std::string restore_state;
  std::optional<tc::RecordFormat> format;  // set when opened with format=
  uint32_t leases_per_client = 8;
  std::function<void(const std::string&)> notice;
  py::dict open_args;

  std::mutex mu;
  std::condition_variable cv;
  int active = 0;  // calls in flight (Use)
  std::atomic<bool> closing{false};
  bool closed = false;
  std::vector<std::weak_ptr<Child>> children;

  void CheckPid() const {
    if (::getpid() != pid)
      throw tc::Error(tc::ErrorKind::kInvalidArgument,
                      "queue '" + name + "' was opened by process " + std::to_string(pid) +
                          "; this is process " + std::to_string(::getpid()) +
                          " (a forked child must open its own WorkQueue)");
  }
  tc::Error ClosedError() const {
    return tc::Error(tc::ErrorKind::kInvalidArgument, "queue '" + name + "' is closed");
  }
  // Registers a child; throws if the queue is closing. REQUIRES: not mu.
  void Adopt(const std::shared_ptr<Child>& child) {
    std::lock_guard<std::mutex> lock(mu);
    if (closing.load() || closed) throw ClosedError();
    children.erase(std::remove_if(children.begin(), children.end(),
                                  [](const std::weak_ptr<Child>& w) { return w.expired(); }),
                   children.end());
    children.push_back(child);
  }

  // Closes children, waits for calls in flight, closes the queue. Idempotent.
  // REQUIRES: no GIL.
  void Close() {
    std::vector<std::shared_ptr<Child>> kids;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (closing.exchange(true)) {
        cv.wait(lock, [&] { return closed; });
        return;
      }
      for (auto& w : children)
        if (auto c = w.lock()) kids.push_back(std::move(c));
      children.clear();
    }
    for (auto& c : kids) c->CloseFromQueue();
    kids.clear();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return active == 0; });
    }
    queue->Close();
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    cv.notify_all();
  }
};

using HandlePtr = std::shared_ptr<QueueHandle>;

// A call in flight on an open queue; close() waits for it.
class Use {
 public:
  explicit Use(QueueHandle& h) : h_(h) {
    h.CheckPid();
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.closing.load() || h.closed) throw h.ClosedError();
    ++h.active;
  }
  ~Use() {
    std::lock_guard<std::mutex> lock(h_.mu);
    if (--h_.active == 0) h_.cv.notify_all();
  }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;

 private:
  QueueHandle& h_;
};

// Every live handle of this process, for the atexit hook.
std::mutex g_handles_mu;
std::vector<std::weak_ptr<QueueHandle>> g_handles;

// ---- Work items -----------------------------------------------------------------

enum class ItemState { kOpen, kAcked, kGivenBack, kStale };

const char* StateName(ItemState s) {
  switch (s) {
    case ItemState::kOpen:
      return "open";
    case ItemState::kAcked:
      return "acked";
    case ItemState::kGivenBack:
      return "given_back";
    case ItemState::kStale:
      return "stale";
  }
  return "?";
}

struct PyWorkItem {
  HandlePtr h;
  tc::WorkItem item;
  std::string path;
  ItemState state = ItemState::kOpen;

  PyWorkItem(HandlePtr handle, const tc::WorkItem& it)
      : h(std::move(handle)), item(it), path(it.path) {
    item.path = {};
  }

  std::string Describe() const {
    return "item " + std::to_string(item.index) + " (epoch " + std::to_string(item.epoch) + ", '" +
           path + "' [" + std::to_string(item.begin) + ", " + std::to_string(item.end) +
           ")) of queue '" + h->name + "'";
  }
  void RequireOpen(const char* action) const {
    if (state != ItemState::kOpen)
      Raise(g_exc.invalid_argument, std::string("cannot ") + action + " " + Describe() +
                                        ": it is already " + StateName(state));
  }
  void Check(tc::AckStatus status, const char* action) {
    if (status == tc::AckStatus::kOk) return;
    if (status == tc::AckStatus::kStale) {
      state = ItemState::kStale;
      Raise(g_exc.stale, std::string(action) + " of " + Describe() +
                             " refused: the item was reassigned to another process after a lease "
                             "timeout (its records may be read twice); stop reading it");
    }
    if (status == tc::AckStatus::kOutOfRange)
      Raise(g_exc.invalid_argument, std::string(action) + " of " + Describe() +
                                        " refused: the offset is outside the item's byte range "
                                        "(begin <= offset <= end); nothing was recorded");
    Raise(g_exc.invalid_argument, std::string(action) + " of " + Describe() +
                                      " refused: not an open item of this queue and process");
  }
  void Ack() {
    RequireOpen("ack");
    tc::AckStatus s;
    {
      Use use(*h);
      s = h->queue->Ack(item);
    }
    Check(s, "ack");
    state = ItemState::kAcked;
  }
  void GiveBack() {
    RequireOpen("give back");
    tc::AckStatus s;
    {
      Use use(*h);
      s = h->queue->GiveBack(item);
    }
    Check(s, "give_back");
    state = ItemState::kGivenBack;
  }
  void Progress(const py::object& offset, const py::object& records) {
    RequireOpen("report progress of");
    uint64_t off = ToU64(offset, "offset");
    uint64_t recs = ToU64(records, "records");
    tc::AckStatus s;
    {
      Use use(*h);
      s = h->queue->Progress(item, off, recs);
    }
    Check(s, "progress");
  }
  // Best effort, for destructors and __exit__ with an exception: no raise.
  void GiveBackQuietly() noexcept {
    if (state != ItemState::kOpen) return;
    try {
      Use use(*h);
      h->queue->GiveBack(item);
    } catch (...) {
    }
    state = ItemState::kGivenBack;
  }
};

using ItemPtr = std::shared_ptr<PyWorkItem>;

// Blocking take in slices; nullopt at the end of the data. REQUIRES: the GIL.
std::optional<tc::WorkItem> TakeBlocking(QueueHandle& h, const py::object& timeout) {
  std::optional<Clock::time_point> deadline;
  if (!timeout.is_none()) {
    double s = ToSeconds(timeout, "timeout");
    deadline = Clock::now() +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  for (;;) {
    tc::WorkItem item;
    tc::TakeStatus status;
    {
      Use use(h);
      py::gil_scoped_release nogil;
      Clock::time_point slice = Clock::now() + kTakeSlice;
      if (deadline && *deadline < slice) slice = *deadline;
      status = h.queue->Take(&item, slice);
    }
    switch (status) {
      case tc::TakeStatus::kOk:
        return item;
      case tc::TakeStatus::kEnd:
        return std::nullopt;
      case tc::TakeStatus::kLimit:
        Raise(g_exc.invalid_argument,
              "queue '" + h.name + "': this process already holds " +
                  std::to_string(h.leases_per_client) +
                  " open items (leases_per_client); ack or give one back before taking more, "
                  "or open the queue with a larger leases_per_client (in every process)");
      case tc::TakeStatus::kEmpty:
        break;
    }
    if (deadline && Clock::now() >= *deadline)
      Raise(g_exc.empty, "queue '" + h.name +
                             "': no item within the timeout; other processes still hold "
                             "open items, which come back if they die or give them back");
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// ---- Equal steps ----------------------------------------------------------------

// WorkQueue::AgreeStep in slices of kTakeSlice, so that Ctrl-C and a
// concurrent close() are noticed; calling it again for the same step is
// harmless (it republishes the same word). REQUIRES: the GIL.
std::string AgreeStepBlocking(QueueHandle& h, const py::object& rank, const py::object& ranks,
                              const py::object& step, bool has_batch, const py::object& timeout) {
  uint64_t r = ToU64(rank, "rank");
  uint64_t n = ToU64(ranks, "ranks", 1);
  uint64_t s = ToU64(step, "step");
  if (r >= n)
    Raise(g_exc.invalid_argument, "agree_step: rank " + std::to_string(r) +
                                      " is not below ranks (" + std::to_string(n) + ")");
  if (n > UINT32_MAX) Raise(g_exc.invalid_argument, "agree_step: ranks is too large");
  if (s >= (uint64_t{1} << 62))
    Raise(g_exc.invalid_argument, "agree_step: step must be below 2**62, got " + std::to_string(s));
  std::optional<Clock::time_point> deadline;
  if (!timeout.is_none()) {
    double secs = ToSeconds(timeout, "timeout");
    deadline = Clock::now() +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs));
  }
  for (;;) {
    tc::StepStatus status;
    {
      Use use(h);
      py::gil_scoped_release nogil;
      Clock::time_point slice = Clock::now() + kTakeSlice;
      if (deadline && *deadline < slice) slice = *deadline;
      status = h.queue->AgreeStep(static_cast<uint32_t>(r), static_cast<uint32_t>(n), s, has_batch,
                                  slice);
    }
    switch (status) {
      case tc::StepStatus::kAllHaveBatch:
        return "all_have_batch";
      case tc::StepStatus::kEndEpoch:
        return "end_epoch";
      case tc::StepStatus::kInvalid:
        Raise(g_exc.invalid_argument,
              "queue '" + h.name + "': agree_step(rank=" + std::to_string(r) +
                  ", ranks=" + std::to_string(n) + ", step=" + std::to_string(s) +
                  ") refused: either ranks exceeds the queue's max_clients, or rank " +
                  std::to_string(r) +
                  " already agreed on a later step. Steps must grow over the queue's lifetime "
                  "(e.g. (epoch << 32) | step_in_epoch), across runs too: a queue resumed under "
                  "the same name keeps the last steps of its previous run; restart under a new "
                  "name with restore_state instead");
      case tc::StepStatus::kTimeout:
        break;
    }
    if (deadline && Clock::now() >= *deadline) return "timeout";
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// ---- input_dataset ------------------------------------------------------------

struct InputDataset {
  HandlePtr h;
  ItemPtr current;
  bool ended = false;

  ~InputDataset() {
    if (current && ::getpid() == h->pid) current->GiveBackQuietly();
  }
  py::object Next() {
    if (current && current->state == ItemState::kOpen) current->Ack();
    current.reset();
    if (ended) throw py::stop_iteration();
    std::optional<tc::WorkItem> item = TakeBlocking(*h, py::none());
    if (!item) {
      ended = true;
      throw py::stop_iteration();
    }
    current = std::make_shared<PyWorkItem>(h, *item);
    return py::cast(current);
  }
  void Close() {
    if (current) current->GiveBackQuietly();
    current.reset();
    ended = true;
  }
};

// ---- input_producer -------------------------------------------------------------

class Producer : public Child, public std::enable_shared_from_this<Producer> {
 public:
  Producer(HandlePtr h, size_t capacity)
      : h_(std::move(h)), capacity_(capacity), pid_(::getpid()) {}
  ~Producer() override {
    if (::getpid() != pid_) {
      (void)thread_.release();  // a forked child: the thread does not exist here
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      Stop();
    } else {
      Stop();
    }
  }

  void Start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;  // the queue closed between Adopt and Start
    thread_ = std::make_unique<std::thread>([this] { Run(); });
  }

  // REQUIRES: the GIL. Returns an item, None at the end, raises Empty.
  py::object Get(const py::object& timeout) {
    if (::getpid() != pid_) h_->CheckPid();
    std::optional<Clock::time_point> deadline;
    if (!timeout.is_none()) {
      double s = ToSeconds(timeout, "timeout");
      deadline = Clock::now() +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    }
    for (;;) {
      std::optional<tc::WorkItem> got;
      bool end = false, stopped = false;
      {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(mu_);
        Clock::time_point until = Clock::now() + kTakeSlice;
        if (deadline && *deadline < until) until = *deadline;
        cv_.wait_until(lock, until, [&] { return !buffer_.empty() || end_ || stop_; });
        if (!buffer_.empty()) {
          got = buffer_.front();
          buffer_.pop_front();
          cv_.notify_all();
        } else {
          end = end_;
          stopped = stop_;
        }
      }
      if (got) return py::cast(std::make_shared<PyWorkItem>(h_, *got));
      if (end) return py::none();
      if (stopped)
        Raise(g_exc.invalid_argument, "input_producer of queue '" + h_->name + "' is closed");
      if (deadline && Clock::now() >= *deadline)
        Raise(g_exc.empty,
              "input_producer of queue '" + h_->name + "': no item within the timeout");
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  size_t qsize() {
    std::lock_guard<std::mutex> lock(mu_);
    return buffer_.size();
  }
  bool ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return end_ && buffer_.empty();
  }
  size_t capacity() const { return capacity_; }

  // Stops the thread and gives back the buffered items. REQUIRES: no GIL.
  void Stop() noexcept {
    std::unique_ptr<std::thread> thread;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      thread = std::move(thread_);
    }
    cv_.notify_all();
    if (thread && thread->joinable()) thread->join();
    std::deque<tc::WorkItem> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(buffer_);
    }
    // The queue is still open here: close() stops children before it.
    for (const tc::WorkItem& item : left) h_->queue->GiveBack(item);
  }
  void CloseFromQueue() noexcept override { Stop(); }

 private:
  void Run() noexcept {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || buffer_.size() < capacity_; });
        if (stop_) return;
      }
      tc::WorkItem item;
      tc::TakeStatus status = h_->queue->Take(&item, Clock::now() + kTakeSlice);
      std::unique_lock<std::mutex> lock(mu_);
      switch (status) {
        case tc::TakeStatus::kOk:
          if (stop_) {
            lock.unlock();
            h_->queue->GiveBack(item);
            return;
          }
          buffer_.push_back(item);
          cv_.notify_all();
          break;
        case tc::TakeStatus::kEnd:
          end_ = true;
          cv_.notify_all();
          return;
        case tc::TakeStatus::kLimit:
          // The consumer holds every lease: wait for it to ack one.
          cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stop_; });
          break;
        case tc::TakeStatus::kEmpty:
          break;
      }
    }
  }

  HandlePtr h_;
  size_t capacity_;
  pid_t pid_;
  std::unique_ptr<std::thread> thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<tc::WorkItem> buffer_;
  bool end_ = false, stop_ = false;
};

// ---- Readers --------------------------------------------------------------------

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

ReaderPtr OpenReader(const HandlePtr& h, const py::object& format, const py::object& record_bytes,
                     const py::kwargs& options, const char* caller) {
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
  for (auto kv : options) {
    std::string key = py::str(kv.first);
    py::handle v = kv.second;
    if (key == "buffer_budget_bytes") {
      ro.buffer_budget_bytes = ToU64(v, "buffer_budget_bytes", 1);
    } else if (key == "chunk_bytes") {
      ro.chunk_bytes = ToU64(v, "chunk_bytes", 1);
    } else if (key == "queue_depth") {
      ro.queue_depth = static_cast<uint32_t>(v.is_none() ? 0 : ToU64(v, "queue_depth"));
    } else if (key == "prefetch_items") {
      ro.prefetch_items = static_cast<uint32_t>(ToU64(v, "prefetch_items"));
    } else if (key == "direct") {
      ro.direct = py::cast<bool>(v);
    } else if (key == "backend") {
      if (v.is_none()) {
        ro.backend = tc::IoBackend::kDefault;
      } else {
        std::string b = py::str(v);
        if (b == "uring" || b == "io_uring") {
          ro.backend = tc::IoBackend::kUring;
        } else if (b == "pread") {
          ro.backend = tc::IoBackend::kPread;
        } else if (b == "default") {
          ro.backend = tc::IoBackend::kDefault;
        } else {
          Raise(g_exc.invalid_argument, "backend '" + b + "' is not 'uring', 'pread' or None");
        }
      }
    } else if (key == "max_record_bytes") {
      ro.format.max_record_bytes = ToU64(v, "max_record_bytes", 1);
    } else if (key == "uring_async_buffered") {
      ro.uring_async_buffered = py::cast<bool>(v);
    } else if (key == "pread_threads") {
      ro.pread_threads = static_cast<uint32_t>(ToU64(v, "pread_threads"));
    } else if (key == "cuda_register") {
      ro.cuda_register = py::cast<bool>(v);
    } else if (key == "on_notice") {
      ro.on_notice = WrapNotice(py::reinterpret_borrow<py::object>(v));
    } else {
      throw py::type_error(std::string(caller) + "() got an unexpected keyword argument '" + key +
                           "'");
    }
  }
  auto rs = std::make_shared<ReaderState>(h, ro.format);
  {
    Use use(*h);
    py::gil_scoped_release nogil;
    rs->reader = tc::Reader::Open(*h->queue, std::move(ro));
  }
  h->Adopt(rs);
  return rs;
}

// REQUIRES: the GIL and rs.mu.
[[noreturn]] void RaiseReaderError(ReaderState& rs) {
  rs.failed = true;
  const std::string& text = rs.reader->error();
  Raise(ExceptionFor(KindOfReaderError(*rs.reader)),
        text.empty() ? std::string("reader failed without a message") : text);
}

py::dict ItemDict(const tc::WorkItem& item) {
  py::dict d;
  d["path"] = std::string(item.path);
  d["begin"] = item.begin;
  d["end"] = item.end;
  d["epoch"] = item.epoch;
  d["index"] = item.index;
  d["ticket"] = item.ticket;
  return d;
}

py::dict ReaderStatsDict(const tc::ReaderStats& s) {
  py::dict d;
  d["bytes_read"] = s.bytes_read;
  d["records"] = s.records;
  d["items_taken"] = s.items_taken;
  d["items_acked"] = s.items_acked;
  d["items_given_back"] = s.items_given_back;
  d["reads"] = s.reads;
  d["short_reads"] = s.short_reads;
  d["retries"] = s.retries;
  d["carried_bytes"] = s.carried_bytes;
  return d;
}

// Takes max_epoch (not a reader option) out of records()/batches() keywords.
std::optional<uint64_t> PopMaxEpoch(py::kwargs& options) {
  if (!options.contains("max_epoch")) return std::nullopt;
  py::object v = options["max_epoch"];
  if (PyDict_DelItemString(options.ptr(), "max_epoch") != 0) throw py::error_already_set();
  if (v.is_none()) return std::nullopt;
  return ToU64(v, "max_epoch");
}

// Shared by the record and the batch iterators.
struct IteratorBase {
  ReaderPtr rs;
  bool done = false;
  // records()/batches(max_epoch=e): stop at the first record of an item of a
  // later epoch. That item has handed out nothing the caller saw, so closing
  // the reader gives it back whole (GiveBack restarts an item at its begin)
  // and whoever reads it next reads each of its records once.
  std::optional<uint64_t> max_epoch;

  // True when the records just read come from an item past max_epoch; closes
  // the reader then. REQUIRES: rs->mu, no GIL.
  bool PastEpochLocked() noexcept {
    if (!max_epoch || rs->reader->current_item().epoch <= *max_epoch) return false;
    rs->CloseLocked();
    return true;
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
  // After Next* said kEnd or the reader was closed. REQUIRES: the GIL, rs->mu.
  [[noreturn]] void Finish() {
    done = true;
    if (rs->closed_by_queue)
      Raise(g_exc.invalid_argument,
            "queue '" + rs->h->name + "' was closed while it was being read");
    throw py::stop_iteration();
  }
  py::object CurrentItem() {
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
    rs->h->CheckPid();
    std::unique_lock<std::mutex> lock(rs->mu, std::defer_lock);
    tc::Record record;
    tc::ReadStatus status;
    {
      py::gil_scoped_release nogil;
      lock.lock();
      status = rs->closed ? tc::ReadStatus::kEnd : rs->reader->NextRecord(&record);
      if (status == tc::ReadStatus::kOk && PastEpochLocked()) status = tc::ReadStatus::kEnd;
    }
    if (status == tc::ReadStatus::kError) {
      done = true;
      RaiseReaderError(*rs);
    }
    if (status == tc::ReadStatus::kEnd) Finish();
    RecordBuffer& buf = exporter.cast<RecordBuffer&>();
    buf.ptr = record.data;
    buf.size = record.size;
    last_offset = record.offset;
    PyObject* view = PyMemoryView_FromObject(exporter.ptr());
    if (view == nullptr) throw py::error_already_set();
    last_view = py::reinterpret_borrow<py::object>(view);
    return py::reinterpret_steal<py::object>(view);
  }
};

struct BatchIterator : IteratorBase {
  size_t batch_size = 0;
  bool copy = false;
  bool drop_last = false;
  // Never keep packed records across a read that may wait at the end of the
  // data: such a read happens only once the reader holds no item beyond the
  // current one (it takes the next item then, and Take waits while others
  // hold items). A caller that gives up on that wait (tailcut.torch) then
  // strands nothing: every record read so far was handed out.
  bool short_at_end = false;

  // Items the reader holds: the current one and those taken ahead.
  // REQUIRES: rs->mu (the reader's counters are written by its caller).
  uint64_t HeldLocked() const noexcept {
    tc::ReaderStats st = rs->reader->stats();
    uint64_t gone = st.items_acked + st.items_given_back;
    return st.items_taken > gone ? st.items_taken - gone : 0;
  }
  std::vector<tc::Record> records;
  // With max_epoch a batch holds records of one epoch only: records of
  // another epoch's item met while packing wait in records[stash_begin,
  // stash_begin + stashed) for the next batches. They stay valid: the reader
  // is not called before they are handed out, and closing gives their item
  // back whole.
  size_t stashed = 0;
  size_t stash_begin = 0;   // where they start: after those handed out last
  uint64_t last_epoch = 0;  // epoch of the items of the last batch
  std::string pending_error;
  tc::ErrorKind pending_kind = tc::ErrorKind::kIo;

  static bool Contiguous(const tc::Record* r, size_t n, uint64_t rb) {
    for (size_t i = 1; i < n; ++i)
      if (r[i].data != r[0].data + i * rb || r[i].size != rb) return false;
    return n > 0 && r[0].size == rb;
  }

  template <typename T>
  static py::array OwnedArray(std::vector<T>* v, std::vector<py::ssize_t> shape) {
    py::capsule owner(v, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>(shape, v->data(), owner);
  }

  py::object Next() { return Read(batch_size); }

  // The next batch, of at most `limit` records (at most batch_size).
  py::object ReadUpTo(const py::object& limit) {
    uint64_t want = ToU64(limit, "max_records", 1);
    return Read(static_cast<size_t>(std::min<uint64_t>(want, batch_size)));
  }

  py::object Read(size_t want) {
    if (!pending_error.empty()) {
      done = true;
      std::string text = std::move(pending_error);
      pending_error.clear();
      Raise(ExceptionFor(pending_kind), text);
    }
    if (done) throw py::stop_iteration();
    rs->h->CheckPid();
    const bool fixed = rs->format.kind == tc::RecordFormatKind::kFixed;
    const uint64_t rb = rs->format.record_bytes;
    std::unique_lock<std::mutex> lock(rs->mu, std::defer_lock);
    size_t n = 0;
    tc::ReadStatus status;
    bool view = false;
    std::unique_ptr<std::vector<uint8_t>> data;
    std::unique_ptr<std::vector<int64_t>> offsets;
    size_t have = 0;
    bool ended = false, error = false;
    {
      py::gil_scoped_release nogil;
      lock.lock();
      if (rs->closed) {
        status = tc::ReadStatus::kEnd;
      } else if (stashed > 0) {
        status = tc::ReadStatus::kOk;
        if (stash_begin > 0) {  // what the last batch left over moves to the front
          std::copy(records.begin() + static_cast<std::ptrdiff_t>(stash_begin),
                    records.begin() + static_cast<std::ptrdiff_t>(stash_begin + stashed),
                    records.begin());
        }
        n = std::min(stashed, want);
        stashed -= n;
        stash_begin = stashed > 0 ? n : 0;
      } else {
        status = rs->reader->NextBatch(records.data(), want, &n);
        if (status == tc::ReadStatus::kOk && PastEpochLocked()) {
          status = tc::ReadStatus::kEnd;
          n = 0;
        }
      }
      if (status == tc::ReadStatus::kOk) last_epoch = rs->reader->current_item().epoch;
      if (status == tc::ReadStatus::kOk && fixed && !copy && n == want &&
          Contiguous(records.data(), n, rb)) {
        view = true;
      } else if (status == tc::ReadStatus::kOk) {
        // Pack into owned arrays, filling the batch across chunk and item ends.
        data = std::make_unique<std::vector<uint8_t>>();
        if (fixed) data->reserve(want * rb);
        offsets = std::make_unique<std::vector<int64_t>>();
        offsets->reserve(want + 1);
        offsets->push_back(0);
        for (;;) {
          for (size_t i = 0; i < n; ++i) {
            const uint8_t* p = reinterpret_cast<const uint8_t*>(records[i].data);
            data->insert(data->end(), p, p + records[i].size);
            offsets->push_back(static_cast<int64_t>(data->size()));
          }
          have += n;
          if (have == want || stashed > 0) break;
          if (short_at_end && HeldLocked() <= 1) break;
          status = rs->reader->NextBatch(records.data(), want - have, &n);
          // A batch never mixes in an item past max_epoch: its records are
          // dropped unseen and the item goes back whole.
          if (status == tc::ReadStatus::kEnd ||
              (status == tc::ReadStatus::kOk && PastEpochLocked())) {
            ended = true;
            break;
          }
          if (status == tc::ReadStatus::kOk && max_epoch &&
              rs->reader->current_item().epoch != last_epoch) {
            stashed = n;  // another epoch's item: they start the next batch
            stash_begin = 0;
            break;
          }
          if (status == tc::ReadStatus::kError) {
            error = true;
            break;
          }
        }
      }
    }
    if (status == tc::ReadStatus::kError && have == 0 && !view) {
      done = true;
      RaiseReaderError(*rs);
    }
    if (status == tc::ReadStatus::kEnd && have == 0 && !view) Finish();
    if (error) {
      // Hand out what was read (its items may already be acked) and raise
      // on the next call.
      pending_error = rs->reader->error();
      pending_kind = KindOfReaderError(*rs->reader);
      rs->failed = true;
    }
    if (ended) done = true;
    if (view) {
      py::object keeper = py::cast(ArenaKeeper{rs});
      py::array arr(
          py::dtype::of<uint8_t>(),
          std::vector<py::ssize_t>{static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(rb)},
          std::vector<py::ssize_t>{static_cast<py::ssize_t>(rb), 1},
          reinterpret_cast<const uint8_t*>(records[0].data), keeper);
      arr.attr("setflags")(py::arg("write") = false);
      return arr;
    }
    if (ended && drop_last && have < want) throw py::stop_iteration();
    if (fixed) {
      auto* d = data.release();
      return OwnedArray<uint8_t>(d, {static_cast<py::ssize_t>(have), static_cast<py::ssize_t>(rb)});
    }
    auto* d = data.release();
    auto* o = offsets.release();
    py::ssize_t bytes = static_cast<py::ssize_t>(d->size());
    py::ssize_t count = static_cast<py::ssize_t>(o->size());
    return py::make_tuple(OwnedArray<uint8_t>(d, {bytes}), OwnedArray<int64_t>(o, {count}));
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
          "epoch, index, ticket), or None before the first record and at the end.")
      .def(
          "stats", [](Iter& self) { return ReaderStatsDict(self.rs->reader->stats()); },
          "Reader counters since it opened: bytes_read, records, items_taken, items_acked, "
          "items_given_back, reads, short_reads, retries, carried_bytes.")
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

// ---- Stats ------------------------------------------------------------------------

py::dict ClientDict(const tc::ClientStats& c) {
  py::dict d;
  d["slot"] = c.slot;
  d["pid"] = c.pid;
  d["alive"] = c.alive;
  d["items_taken"] = c.items_taken;
  d["items_acked"] = c.items_acked;
  d["items_given_back"] = c.items_given_back;
  d["items_recovered"] = c.items_recovered;
  d["bytes_acked"] = c.bytes_acked;
  d["records"] = c.records;
  d["stale_acks"] = c.stale_acks;
  d["splits"] = c.splits;
  d["open_items"] = c.open_items;
  d["busy_ns"] = c.busy_ns;
  d["idle_ns"] = c.idle_ns;
  d["last_progress_ns"] = c.last_progress_ns;
  d["joined_ns"] = c.joined_ns;
  return d;
}

py::dict StatsDict(const tc::QueueStats& s) {
  py::dict d;
  d["name"] = s.name;
  d["segment_path"] = s.segment_path;
  d["num_items"] = s.num_items;
  d["num_epochs"] = s.num_epochs;
  d["total"] = s.total;
  d["done"] = s.done;
  d["in_flight"] = s.in_flight;
  d["handed_out"] = s.handed_out;
  d["epoch"] = s.epoch;
  d["seed"] = s.seed;
  d["shuffle"] = s.shuffle;
  d["num_clients"] = s.num_clients;
  d["clients_joined"] = s.clients_joined;
  d["recovered_items"] = s.recovered_items;
  d["stale_acks"] = s.stale_acks;
  d["splits"] = s.splits;
  d["now_ns"] = s.now_ns;
  py::list clients;
  for (const auto& c : s.clients) clients.append(ClientDict(c));
  d["clients"] = clients;
  return d;
}

tc::QueueStats StatsOf(QueueHandle& h) {
  Use use(h);
  return h.queue->Stats();
}

// ---- WorkQueue construction --------------------------------------------------------

HandlePtr OpenQueue(const py::object& works, const py::object& num_epochs, bool shuffle,
                    const py::object& seed, const py::object& prefix, const py::object& num_slices,
                    const py::object& num_clients, const std::string& name,
                    const py::kwargs& more) {
  tc::WorkQueueOptions o;
  py::dict open_args;
  if (py::isinstance<py::str>(works) || py::isinstance<py::bytes>(works) ||
      py::hasattr(works, "__fspath__")) {
    o.works.push_back(ToPath(works));
  } else {
    for (py::handle w : works) o.works.push_back(ToPath(w));
  }
  open_args["works"] = o.works;
  o.num_epochs = ToU64(num_epochs, "num_epochs");
  o.shuffle = shuffle;
  if (!seed.is_none()) o.seed = ToU64(seed, "seed");
  if (!prefix.is_none()) o.prefix = ToPath(prefix);
  if (!num_slices.is_none()) o.num_slices = ToU64(num_slices, "num_slices");
  o.num_clients = ToU32(num_clients, "num_clients");
  o.name = name;
  o.keep_unfinished = true;  // Python's lifetime until WorkQueue(keep=...) is exposed
  open_args["num_epochs"] = num_epochs;
  open_args["shuffle"] = shuffle;
  open_args["seed"] = seed;
  open_args["prefix"] = prefix;
  open_args["num_slices"] = num_slices;
  open_args["num_clients"] = num_clients;
  open_args["name"] = name;

  auto h = std::make_shared<QueueHandle>();
  h->name = name;
  py::object format = py::none(), record_bytes = py::none();
  for (auto kv : more) {
    std::string key = py::str(kv.first);
    py::object v = py::reinterpret_borrow<py::object>(kv.second);
    if (key == "format") {
      format = v;
    } else if (key == "record_bytes") {
      record_bytes = v;
    } else if (key == "max_clients") {
      o.max_clients = ToU32(v, "max_clients");
    } else if (key == "leases_per_client") {
      o.leases_per_client = ToU32(v, "leases_per_client");
    } else if (key == "attach_timeout") {
      o.attach_timeout = ToMillis(ToSeconds(v, "attach_timeout"));
    } else if (key == "lease_timeout") {
      o.lease_timeout =
          v.is_none() ? std::chrono::milliseconds(0) : ToMillis(ToSeconds(v, "lease_timeout"));
    } else if (key == "restore_state") {
      if (v.is_none()) continue;
      if (py::isinstance<py::dict>(v)) {
        py::dict d = v;
        if (!d.contains("state"))
          Raise(g_exc.invalid_argument,
                "restore_state: a dict must be what state_dict() returned (no 'state' key)");
        o.restore_state = ToBytes(d["state"], "restore_state['state']");
      } else {
        o.restore_state = ToBytes(v, "restore_state");
      }
      continue;  // not part of the arguments that re-open the queue
    } else if (key == "on_notice") {
      o.on_notice = WrapNotice(v);
      continue;
    } else {
      throw py::type_error("WorkQueue() got an unexpected keyword argument '" + key + "'");
    }
    open_args[py::str(key)] = v;
  }
  if (!format.is_none()) {
    h->format = ParseFormat(py::str(format), record_bytes);
    o.format = h->format->Tag();
  } else if (!record_bytes.is_none()) {
    Raise(g_exc.invalid_argument, "record_bytes needs format='fixed'");
  }
  h->restore_state = o.restore_state;
  h->leases_per_client = o.leases_per_client;
  h->notice = o.on_notice;
  h->open_args = open_args;
  h->pid = ::getpid();
  {
    py::gil_scoped_release nogil;
    h->queue = tc::WorkQueue::Open(std::move(o));
  }
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_handles.erase(std::remove_if(g_handles.begin(), g_handles.end(),
                                 [](const std::weak_ptr<QueueHandle>& w) { return w.expired(); }),
                  g_handles.end());
  g_handles.push_back(h);
  return h;
}

void CloseHandle(QueueHandle& h) {
  if (::getpid() != h.pid) return;  // a forked child: not ours to close
  py::gil_scoped_release nogil;
  h.Close();
}

// ---- Summaries --------------------------------------------------------------------

void AddSummary(QueueHandle& h, const py::object& writer, const py::object& step,
                const std::string& prefix) {
  tc::QueueStats s = StatsOf(h);
  py::object add = writer.attr("add_scalar");
  auto put = [&](const std::string& tag, double value) { add(prefix + "/" + tag, value, step); };
  put("done", static_cast<double>(s.done));
  put("total", static_cast<double>(s.total));
  put("progress", s.total ? static_cast<double>(s.done) / static_cast<double>(s.total) : 0.0);
  put("in_flight", static_cast<double>(s.in_flight));
  put("handed_out", static_cast<double>(s.handed_out));
  put("epoch", static_cast<double>(s.epoch));
  put("clients_joined", static_cast<double>(s.clients_joined));
  uint64_t alive = 0;
  for (const auto& c : s.clients) alive += c.alive;
  put("clients_alive", static_cast<double>(alive));
  put("recovered_items", static_cast<double>(s.recovered_items));
  put("stale_acks", static_cast<double>(s.stale_acks));
  put("splits", static_cast<double>(s.splits));
  for (const auto& c : s.clients) {
    std::string p = "client_" + std::to_string(c.slot) + "/";
    put(p + "alive", c.alive ? 1.0 : 0.0);
    put(p + "items_taken", static_cast<double>(c.items_taken));
    put(p + "items_acked", static_cast<double>(c.items_acked));
    put(p + "items_given_back", static_cast<double>(c.items_given_back));
    put(p + "items_recovered", static_cast<double>(c.items_recovered));
    put(p + "bytes_acked", static_cast<double>(c.bytes_acked));
    put(p + "records", static_cast<double>(c.records));
    put(p + "stale_acks", static_cast<double>(c.stale_acks));
    put(p + "splits", static_cast<double>(c.splits));
    put(p + "open_items", static_cast<double>(c.open_items));
    put(p + "busy_seconds", static_cast<double>(c.busy_ns) * 1e-9);
    put(p + "idle_seconds", static_cast<double>(c.idle_ns) * 1e-9);
  }
}

PyObject* NewException(py::module_& m, const char* name, std::initializer_list<PyObject*> bases,
                       const char* doc) {
  py::tuple t(bases.size());
  size_t i = 0;
  for (PyObject* b : bases) t[i++] = py::handle(b);
  std::string full = std::string("tailcut.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(full.c_str(), doc, t.ptr(), nullptr);
  if (e == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(e));  // the module holds a reference; e keeps ours
  return e;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "tailcut._core: the compiled part of the tailcut package (a host-wide work queue in shared "
      "memory and an io_uring reader). Import it through `tailcut`.";
#ifdef TAILCUT_VERSION
  m.attr("__version__") = TAILCUT_VERSION;
#else
  m.attr("__version__") = "0.0.0";
#endif

  // ---- Exceptions
  PyObject* queue_empty = py::module_::import("queue").attr("Empty").ptr();
  g_exc.error = NewException(m, "Error", {PyExc_Exception},
                             "Base class of every tailcut error. The message is the C++ library's, "
                             "naming the queue, file, offset or field and what to do.");
  g_exc.invalid_argument =
      NewException(m, "InvalidArgumentError", {g_exc.error, PyExc_ValueError},
                   "A bad option or name, or an operation on a closed object.");
  g_exc.not_found = NewException(m, "NotFoundError", {g_exc.error, PyExc_FileNotFoundError},
                                 "A work file or queue does not exist.");
  g_exc.permission = NewException(m, "PermissionDeniedError", {g_exc.error, PyExc_PermissionError},
                                  "A file or segment this process may not use.");
  g_exc.no_space =
      NewException(m, "NoSpaceError", {g_exc.error, PyExc_OSError}, "/dev/shm or memory is full.");
  g_exc.config_mismatch = NewException(m, "ConfigMismatchError", {g_exc.error},
                                       "An existing queue (or a checkpoint) was made with another "
                                       "configuration; the message names the field.");
  g_exc.corrupt =
      NewException(m, "CorruptError", {g_exc.error},
                   "A segment, checkpoint or record that fails validation (e.g. a TFRecord "
                   "CRC mismatch); the message names the file and offset.");
  g_exc.timeout = NewException(m, "TimeoutError", {g_exc.error, PyExc_TimeoutError},
                               "A bounded wait of the library ran out (e.g. attach_timeout).");
  g_exc.io = NewException(m, "IoError", {g_exc.error, PyExc_OSError},
                          "A read or system call failed (e.g. a file truncated while reading).");
  g_exc.stale =
      NewException(m, "StaleItemError", {g_exc.error},
                   "An ack, give_back or progress refused because the item was reassigned "
                   "to another process after a lease timeout.");
  g_exc.empty =
      NewException(m, "Empty", {g_exc.error, queue_empty},
                   "take(timeout=...) or input_producer().get(timeout=...) found no item in "
                   "time while other processes still hold open items. Not the end of the "
                   "data: that is None.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tc::Error& e) {
      PyErr_SetString(ExceptionFor(e.kind()), e.what());
    }
  });

  // ---- WorkItem
  py::class_<PyWorkItem, ItemPtr>(
      m, "WorkItem",
      "One work item (a byte range of one file) this process holds, as "
      "handed out by WorkQueue.take(). Ack it when its records are used, "
      "or give it back; `with item:` acks on a clean exit and gives back "
      "on an exception. An item not acked when its process dies goes to "
      "another process.")
      .def_property_readonly(
          "path", [](const PyWorkItem& i) { return i.path; }, "The file (prefix applied).")
      .def_property_readonly(
          "begin", [](const PyWorkItem& i) { return i.item.begin; },
          "First byte of the slice. The slice owns the records that start in [begin, end).")
      .def_property_readonly(
          "end", [](const PyWorkItem& i) { return i.item.end; }, "End of the slice (exclusive).")
      .def_property_readonly(
          "epoch", [](const PyWorkItem& i) { return i.item.epoch; },
          "Epoch of this hand-out (0-based).")
      .def_property_readonly(
          "index", [](const PyWorkItem& i) { return i.item.index; },
          "Which slice: an index in [0, num_items) of WorkQueue.items.")
      .def_property_readonly(
          "ticket", [](const PyWorkItem& i) { return i.item.ticket; },
          "epoch * num_items + position.")
      .def_property_readonly(
          "file", [](const PyWorkItem& i) { return i.item.file; }, "Index of the file in works.")
      .def_property_readonly(
          "state", [](const PyWorkItem& i) { return std::string(StateName(i.state)); },
          "'open', 'acked', 'given_back' or 'stale'.")
      .def("ack", &PyWorkItem::Ack,
           "Marks the item done. Raises StaleItemError if it was reassigned meanwhile (lease "
           "timeout), InvalidArgumentError if it is not open.")
      .def("give_back", &PyWorkItem::GiveBack,
           "Returns the item unfinished; the queue hands it out again (to any process).")
      .def("progress", &PyWorkItem::Progress, py::arg("offset"), py::arg("records") = 0,
           "Reports that the item's bytes before `offset` are consumed (a checkpoint resumes "
           "there) and `records` more records were read; refreshes the lease timeout. Raises "
           "StaleItemError if the item was reassigned.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyWorkItem& self, py::object type, py::object, py::object) {
            if (self.state != ItemState::kOpen) return false;
            if (type.is_none()) {
              self.Ack();
            } else {
              self.GiveBackQuietly();
            }
            return false;
          },
          "Acks the item if the block ended normally, gives it back if it raised; does nothing if "
          "the block already acked or gave it back.")
      .def("__repr__", [](const PyWorkItem& i) {
        return "WorkItem(path=" + std::string(py::repr(py::str(i.path))) +
               ", begin=" + std::to_string(i.item.begin) + ", end=" + std::to_string(i.item.end) +
               ", epoch=" + std::to_string(i.item.epoch) +
               ", index=" + std::to_string(i.item.index) + ", state='" + StateName(i.state) + "')";
      });

  // ---- InputDataset
  py::class_<InputDataset, std::shared_ptr<InputDataset>>(
      m, "InputDataset",
      "Iterator of WorkItems (WorkQueue.input_dataset()). Each item is acked when the next one is "
      "requested, and the last one when the iteration ends; close() (or dropping the iterator) "
      "gives back the current item if it is still open.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &InputDataset::Next)
      .def("close", &InputDataset::Close,
           "Gives back the current item if it is still open and ends.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](InputDataset& self, py::object, py::object, py::object) {
            self.Close();
            return false;
          },
          "Closes the iterator.");

  // ---- InputProducer
  py::class_<Producer, std::shared_ptr<Producer>>(
      m, "InputProducer",
      "A thread-safe local producer of work items (WorkQueue.input_producer()): a background C++ "
      "thread takes up to `capacity` items ahead into a bounded buffer; any Python thread may "
      "get() them. Every item got must be acked or given back (use `with item:`). close() stops "
      "the thread and gives back what is buffered.")
      .def(
          "get", [](Producer& self, py::object timeout) { return self.Get(timeout); },
          py::arg("timeout") = py::none(),
          "The next WorkItem; None once every item of every epoch is done; raises Empty after "
          "`timeout` seconds without an item.")
      .def("__iter__", [](py::object self) { return self; })
      .def(
          "__next__",
          [](Producer& self) {
            py::object item = self.Get(py::none());
            if (item.is_none()) throw py::stop_iteration();
            return item;
          },
          "The next WorkItem (not acked for you).")
      .def("qsize", &Producer::qsize, "Items buffered now.")
      .def_property_readonly("capacity", &Producer::capacity, "Most items buffered ahead.")
      .def_property_readonly("ended", &Producer::ended,
                             "True once the data ended and the buffer is empty.")
      .def(
          "close",
          [](Producer& self) {
            py::gil_scoped_release nogil;
            self.Stop();
          },
          "Stops the thread and gives back the buffered items. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](Producer& self, py::object, py::object, py::object) {
            py::gil_scoped_release nogil;
            self.Stop();
            return false;
          },
          "Closes the producer.");

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
          "File offset where the last record starts (its header, for tfrecord).");

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
           "The next batch, like next(it) but of at most max_records records (capped at "
           "batch_size): lets a caller that joins short batches ask for exactly the rest of one. "
           "Raises StopIteration at the end.")
      .def_property_readonly(
          "batch_size", [](const BatchIterator& it) { return it.batch_size; }, "Records per batch.")
      .def_property_readonly(
          "epoch", [](const BatchIterator& it) { return it.last_epoch; },
          "The epoch of the items the last batch came from (with max_epoch a batch holds one "
          "epoch's records; otherwise its last record's).");

  // ---- WorkQueue
  py::class_<QueueHandle, HandlePtr>(
      m, "WorkQueue",
      "The host-wide work queue (the PAI WorkQueue contract). Every process on the host that "
      "opens a WorkQueue with the same name and configuration shares one queue in POSIX shared "
      "memory, which hands out work items (file slices) so that each is used exactly once per "
      "epoch across all processes. Use from many threads is safe. A forked child must open its "
      "own. Extra keywords: format, record_bytes (part of the configuration: every process must "
      "agree), max_clients, leases_per_client, attach_timeout and lease_timeout (seconds; "
      "lease_timeout None: off), restore_state (bytes from state_dict()['state']), on_notice "
      "(callable taking one str, or None for stderr).")
      .def(py::init(&OpenQueue), py::arg("works"), py::arg("num_epochs") = 1,
           py::arg("shuffle") = true, py::arg("seed") = py::none(), py::arg("prefix") = py::none(),
           py::arg("num_slices") = py::none(), py::arg("num_clients") = 1,
           py::arg("name") = "work_queue",
           "Creates or joins the queue `name`. Raises NotFoundError, PermissionDeniedError, "
           "ConfigMismatchError, NoSpaceError, TimeoutError or InvalidArgumentError with the "
           "library's message; TypeError for an unknown keyword.")
      .def(
          "take",
          [](const HandlePtr& h, py::object timeout) -> py::object {
            std::optional<tc::WorkItem> item = TakeBlocking(*h, timeout);
            if (!item) return py::none();
            return py::cast(std::make_shared<PyWorkItem>(h, *item));
          },
          py::arg("timeout") = py::none(),
          "Takes the next WorkItem. Returns None once every item of every epoch is done. At the "
          "end of the data it waits while other processes still hold open items (they come back "
          "if those die); with `timeout` (seconds) it raises Empty instead of waiting longer. "
          "Raises InvalidArgumentError while this process holds leases_per_client open items. "
          "Releases the GIL while it waits.")
      .def(
          "agree_step",
          [](const HandlePtr& h, py::object rank, py::object ranks, py::object step, bool has_batch,
             py::object timeout) {
            return AgreeStepBlocking(*h, rank, ranks, step, has_batch, timeout);
          },
          py::arg("rank"), py::arg("ranks"), py::arg("step"), py::arg("has_batch"),
          py::arg("timeout") = py::none(),
          "Equal steps for synchronous trainers (PyTorch DDP): ranks 0..ranks-1 of one group each "
          "call this once per step, saying whether they have a batch for it, and all get the same "
          "answer: 'all_have_batch' (run the step) or 'end_epoch' (some rank has none: every rank "
          "ends its epoch before this step). Returns 'timeout' when some rank did not arrive "
          "within `timeout` seconds (None: wait on). Steps must grow over the queue's lifetime, "
          "e.g. (epoch << 32) | step_in_epoch; a step below this rank's last one raises "
          "InvalidArgumentError. Releases the GIL while it waits. tailcut.torch.EqualSteps builds "
          "on it.")
      .def(
          "input_dataset",
          [](const HandlePtr& h) {
            h->CheckPid();
            auto d = std::make_shared<InputDataset>();
            d->h = h;
            return d;
          },
          "An iterator of WorkItems, each acked when the next is requested (and the last one when "
          "the iteration ends).")
      .def(
          "input_producer",
          [](const HandlePtr& h, py::object capacity) {
            h->CheckPid();
            uint64_t cap = ToU64(capacity, "capacity", 1);
            if (cap >= h->leases_per_client)
              Raise(g_exc.invalid_argument, "input_producer capacity (" + std::to_string(cap) +
                                                ") must be below leases_per_client (" +
                                                std::to_string(h->leases_per_client) +
                                                "): the consumer needs leases too");
            auto p = std::make_shared<Producer>(h, static_cast<size_t>(cap));
            h->Adopt(p);
            p->Start();
            return p;
          },
          py::arg("capacity") = 2,
          "A thread-safe producer of WorkItems fed by a background thread that takes up to "
          "`capacity` items ahead (PAI returns a TF FIFOQueue of work strings instead).")
      .def(
          "records",
          [](const HandlePtr& h, py::object format, py::object record_bytes, py::kwargs options) {
            auto it = std::make_shared<RecordIterator>();
            it->max_epoch = PopMaxEpoch(options);
            it->rs = OpenReader(h, format, record_bytes, options, "records");
            RecordBuffer buf;
            buf.rs = it->rs;
            it->exporter = py::cast(std::move(buf));
            return it;
          },
          py::arg("format") = py::none(), py::arg("record_bytes") = py::none(),
          "Reads the queue's items and yields their records as read-only memoryviews, valid only "
          "until the next record is requested. format: 'lines', 'tfrecord', 'fixed' (with "
          "record_bytes) or 'file'; default: the queue's format, else 'lines'. Reader options: "
          "buffer_budget_bytes, chunk_bytes, queue_depth, prefetch_items, direct, backend "
          "('uring', 'pread' or None), max_record_bytes, uring_async_buffered, pread_threads, "
          "cuda_register, on_notice. Items are acked as their last record is passed. "
          "max_epoch=e: stop at the first item of an epoch after e (it goes back to the queue "
          "whole, unread); items of epochs <= e, late ones included, are read.")
      .def(
          "batches",
          [](const HandlePtr& h, py::object batch_size, py::object format, py::object record_bytes,
             bool copy, bool drop_last, py::kwargs options) {
            uint64_t bs = ToU64(batch_size, "batch_size", 1);
            auto it = std::make_shared<BatchIterator>();
            it->max_epoch = PopMaxEpoch(options);
            if (options.contains("short_at_end")) {
              it->short_at_end = py::cast<bool>(options["short_at_end"]);
              if (PyDict_DelItemString(options.ptr(), "short_at_end") != 0)
                throw py::error_already_set();
            }
            it->rs = OpenReader(h, format, record_bytes, options, "batches");
            it->batch_size = static_cast<size_t>(bs);
            it->records.resize(it->batch_size);
            it->copy = copy;
            it->drop_last = drop_last;
            return it;
          },
          py::arg("batch_size"), py::arg("format") = py::none(),
          py::arg("record_bytes") = py::none(), py::kw_only(), py::arg("copy") = false,
          py::arg("drop_last") = false,
          "Like records() but yields batches of batch_size records (the last may be smaller "
          "unless drop_last): for 'fixed' a (n, record_bytes) uint8 array, else a (data, offsets) "
          "pair of numpy arrays. Valid until the next batch unless copy=True. max_epoch=e: as in "
          "records(); a batch never holds records of an epoch after e. short_at_end=True: when "
          "the reader holds no item beyond the current one (near the end of the data), return a "
          "short batch rather than keep its records through a read that may wait for items "
          "other processes hold.")
      .def(
          "summary", [](const HandlePtr& h) { return StatsDict(StatsOf(*h)); },
          "Counters of the queue and of every client, as a dict with the C++ QueueStats field "
          "names; 'clients' is a list of dicts with the ClientStats field names.")
      .def(
          "add_summary",
          [](const HandlePtr& h, py::object writer, py::object step, const std::string& prefix) {
            AddSummary(*h, writer, step, prefix);
          },
          py::arg("writer"), py::arg("step") = py::none(), py::arg("prefix") = "tailcut",
          "Writes the summary as scalars through writer.add_scalar(tag, value, step) (e.g. a "
          "torch.utils.tensorboard.SummaryWriter): <prefix>/done, <prefix>/in_flight, ..., "
          "<prefix>/client_<slot>/items_acked, ...")
      .def(
          "state_dict",
          [](const HandlePtr& h) {
            std::string state;
            tc::QueueStats stats;
            {
              Use use(*h);
              state = h->queue->SaveState();
              stats = h->queue->Stats();
            }
            py::dict d;
            d["state"] = py::bytes(state);
            d["name"] = h->name;
            d["num_items"] = h->queue->num_items();
            d["num_epochs"] = h->queue->num_epochs();
            d["seed"] = h->queue->seed();
            d["done"] = stats.done;
            d["total"] = stats.total;
            return d;
          },
          "A checkpoint of the whole queue: {'state': bytes, 'name', 'num_items', 'num_epochs', "
          "'seed', 'done', 'total'}. Restore it by opening the queue of the restarted job with "
          "restore_state=d (or d['state']) in every process. Items open now are handed out again "
          "after a restore, from their last progress offset.")
      .def(
          "load_state_dict",
          [](const HandlePtr& h, py::object d) {
            std::string state;
            if (py::isinstance<py::dict>(d) && py::dict(d).contains("state")) {
              state = ToBytes(py::dict(d)["state"], "state_dict['state']");
            } else {
              state = ToBytes(d, "state_dict");
            }
            if (!h->restore_state.empty() && state == h->restore_state) return;
            Raise(
                g_exc.invalid_argument,
                "queue '" + h->name +
                    "': an open WorkQueue cannot jump to a checkpoint (other processes "
                    "may be taking from it); open the restarted job's queue with it instead: "
                    "tailcut.WorkQueue(..., restore_state=state_dict) in every process. "
                    "load_state_dict() only accepts the state the queue was opened with (a no-op)");
          },
          py::arg("state_dict"),
          "Accepts only the state this queue was opened with (restore_state=...), as a no-op, so "
          "that code written for torch-style checkpointing runs; any other state raises "
          "InvalidArgumentError: restoring means opening the queue with restore_state.")
      .def(
          "close", [](const HandlePtr& h) { CloseHandle(*h); },
          "Closes readers and producers opened on the queue, gives back this process's open items, "
          "leaves the queue, and removes it if this was the last process and every epoch is done. "
          "Idempotent. Waits for calls in flight in other threads.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](const HandlePtr& h, py::object, py::object, py::object) {
            CloseHandle(*h);
            return false;
          },
          "Closes the queue.")
      .def_property_readonly(
          "closed",
          [](const HandlePtr& h) {
            std::lock_guard<std::mutex> lock(h->mu);
            return h->closed || h->closing.load();
          },
          "True once close() started.")
      .def_property_readonly(
          "name", [](const HandlePtr& h) { return h->name; }, "The queue name.")
      .def_property_readonly(
          "num_items", [](const HandlePtr& h) { return h->queue->num_items(); }, "Items per epoch.")
      .def_property_readonly(
          "num_epochs", [](const HandlePtr& h) { return h->queue->num_epochs(); }, "Epochs.")
      .def_property_readonly(
          "seed", [](const HandlePtr& h) { return h->queue->seed(); },
          "The shuffle seed every process uses (drawn by the creator when seed=None).")
      .def_property_readonly(
          "paths", [](const HandlePtr& h) { return h->queue->paths(); },
          "The work files, prefix applied.")
      .def_property_readonly(
          "items",
          [](const HandlePtr& h) {
            py::list out;
            for (const auto& it : h->queue->items())
              out.append(py::make_tuple(it.file, it.begin, it.end));
            return out;
          },
          "The item table: a list of (file, begin, end); item i covers [begin, end) of "
          "paths[file].")
      .def_property_readonly(
          "format",
          [](const HandlePtr& h) -> py::object {
            if (!h->format) return py::none();
            return py::str(h->format->Tag());
          },
          "The format tag the queue was opened with ('tfrecord', 'fixed:128', ...), or None.")
      .def_property_readonly(
          "segment_path", [](const HandlePtr& h) { return tc::SegmentPath(h->name); },
          "The shared-memory object of the queue, e.g. /dev/shm/tailcut.1000.work_queue.")
      .def_property_readonly(
          "open_args", [](const HandlePtr& h) { return h->open_args.attr("copy")(); },
          "The keyword arguments that open this same queue in another process (without "
          "restore_state and on_notice): tailcut.WorkQueue(**q.open_args).")
      .def(
          "item_at",
          [](const HandlePtr& h, py::object epoch, py::object position) {
            uint64_t e = ToU64(epoch, "epoch"), p = ToU64(position, "position");
            if (e >= h->queue->num_epochs() || p >= h->queue->num_items())
              Raise(g_exc.invalid_argument, "item_at: epoch or position out of range");
            return h->queue->ItemAt(e, p);
          },
          py::arg("epoch"), py::arg("position"),
          "The item index handed out at `position` of `epoch` (the seeded shuffle).")
      .def("__repr__", [](const HandlePtr& h) {
        return "WorkQueue(name=" + std::string(py::repr(py::str(h->name))) +
               ", num_items=" + std::to_string(h->queue->num_items()) +
               ", num_epochs=" + std::to_string(h->queue->num_epochs()) + ")";
      });

  // ---- Module functions
  m.def(
      "list_queues",
      []() {
        py::list out;
        for (const auto& q : tc::ListQueues()) {
          py::dict d;
          d["name"] = q.name;
          d["segment_path"] = q.segment_path;
          d["valid"] = q.valid;
          d["problem"] = q.problem;
          out.append(d);
        }
        return out;
      },
      "Queues of this user: a list of dicts (name, segment_path, valid, problem).");
  m.def(
      "inspect_queue",
      [](const std::string& name) {
        tc::QueueStats s;
        {
          py::gil_scoped_release nogil;
          s = tc::InspectQueue(name);
        }
        return StatsDict(s);
      },
      py::arg("name"),
      "The summary of an existing queue without joining it (dead clients found on the way are "
      "recovered). Raises NotFoundError, CorruptError, PermissionDeniedError.");
  m.def(
      "remove_queue",
      [](const std::string& name, bool force) {
        py::gil_scoped_release nogil;
        tc::RemoveQueue(name, force);
      },
      py::arg("name"), py::arg("force") = false,
      "Removes a queue's segment. Refuses (InvalidArgumentError naming the pids) while live "
      "processes use it, unless force. Raises NotFoundError.");
  m.def("segment_path", &tc::SegmentPath, py::arg("name"),
        "The shared-memory object path of a queue name for this user.");
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
  m.def(
      "_close_all",
      []() {
        std::vector<HandlePtr> live;
        {
          std::lock_guard<std::mutex> lock(g_handles_mu);
          for (auto& w : g_handles)
            if (auto h = w.lock()) live.push_back(std::move(h));
        }
        for (auto& h : live) CloseHandle(*h);
      },
      "Closes every queue this process opened (registered with atexit by tailcut).");
}
