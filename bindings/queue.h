// The Python WorkQueue's handle on a C++ WorkQueue, and what it shares with
// the objects opened on it (work items, producers, readers).
//
// A Python WorkQueue owns a QueueHandle through a shared_ptr; every object
// opened on the queue holds the same pointer, so the C++ queue outlives them.
// close() closes the children first (Child), then waits for calls in flight
// (Use), then closes the C++ queue. Lock order: never wait for mu while
// holding the GIL.
#pragma once

#include <pthread.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tailcut/record_format.h"
#include "tailcut/work_queue.h"

namespace py = pybind11;
namespace tc = tailcut;

namespace tailcut::python {

using Clock = std::chrono::steady_clock;

struct PyWorkItem;

// Something opened on a queue that must be closed before the queue is.
class Child {
 public:
  virtual ~Child() = default;
  // Called without the GIL.
  virtual void CloseFromQueue() noexcept = 0;
};

// Bumped in every forked child (pthread_atfork, registered as the module
// loads), so that a handle (WorkQueue, BatchRing) tells a child from the
// process that opened it with one load: a getpid() would be a system call on
// every call (each take, step agreement, pop and release).
inline std::atomic<uint64_t> g_forks{0};
inline const int g_forks_registered = pthread_atfork(nullptr, nullptr, [] {
  g_forks.fetch_add(1, std::memory_order_relaxed);  // the child's only thread
});

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
  uint64_t forks = 0;  // g_forks when opened
  std::string name;
  std::string restore_state;
  std::string samples_id;                  // WorkQueueOptions::samples_id; state_dict() carries it
  std::optional<tc::RecordFormat> format;  // set when opened with format=
  uint32_t leases_per_client = 8;
  // auto_ack=True (PAI compatibility): each take() or input_producer get()
  // acks the item the previous one handed out (the queue's last_taken), and
  // close() acks the last. For one consumer thread, as PAI code has.
  bool auto_ack = false;
  std::weak_ptr<PyWorkItem> last_taken;  // with auto_ack; guarded by the GIL
  std::function<void(const std::string&)> notice;
  py::dict open_args;

  std::mutex mu;
  std::condition_variable cv;
  int active = 0;  // calls in flight (Use)
  std::atomic<bool> closing{false};
  bool children_closed = false;  // by the close() that set closing
  bool closing_queue = false;    // a close() is in queue->Close()
  bool closed = false;
  std::vector<std::weak_ptr<Child>> children;

  void CheckPid() const {
    (void)g_forks_registered;
    // relaxed: the counter changes only in a child's first thread, before fork() returns.
    if (g_forks.load(std::memory_order_relaxed) != forks && ::getpid() != pid)
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

  // Closes children, waits for calls in flight, closes the queue. Returns
  // false if `end` passed first: close is under way then (closing is set),
  // and calling again goes on where it stopped. Idempotent; any thread.
  // REQUIRES: no GIL.
  bool CloseUntil(Clock::time_point end) {
    std::unique_lock<std::mutex> lock(mu);
    if (!closing.exchange(true)) {
      std::vector<std::shared_ptr<Child>> kids;
      for (auto& w : children)
        if (auto c = w.lock()) kids.push_back(std::move(c));
      children.clear();
      lock.unlock();
      for (auto& c : kids) c->CloseFromQueue();
      kids.clear();
      lock.lock();
      children_closed = true;
      cv.notify_all();
    }
    if (!cv.wait_until(lock, end, [&] {
          return closed || (children_closed && active == 0 && !closing_queue);
        }))
      return false;
    if (closed) return true;
    closing_queue = true;  // one thread closes the C++ queue; the others wait for it
    lock.unlock();
    queue->Close();
    lock.lock();
    closed = true;
    cv.notify_all();
    return true;
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

using QueueClass = py::class_<QueueHandle, HandlePtr>;

}  // namespace tailcut::python
