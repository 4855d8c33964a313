// WorkQueue.input_dataset() and WorkQueue.input_producer(): the PAI ways of
// getting work items one after another.
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "blocking.h"
#include "conversions.h"
#include "errors.h"
#include "items.h"
#include "module.h"
#include "queue.h"

namespace tailcut::python {

namespace {

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

  // REQUIRES: the GIL. Returns an item, None at the end, raises Empty, or
  // InvalidArgumentError when this process holds every lease (as take()).
  py::object Get(const py::object& timeout) {
    if (::getpid() != pid_) h_->CheckPid();
    if (h_->auto_ack) AckPrevious(h_->last_taken);
    Wait wait = Wait::FromTimeout(timeout, "timeout");
    enum class Got { kItem, kEnd, kStopped, kLimit, kJobLost };
    tc::WorkItem item;
    uint64_t me;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      me = ++gets_;  // a take the thread starts from now on sees our acks
    }
    cv_.notify_all();  // a thread waiting at the lease limit tries again now
    std::optional<Got> got = InSlices(wait, [&](Clock::time_point end) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, end, [&] {
        return !buffer_.empty() || end_ || stop_ || limit_after_ >= me || job_lost_;
      });
      // Nothing more can complete the job: say so rather than hand out what is buffered.
      if (job_lost_) return std::optional<Got>(Got::kJobLost);
      if (!buffer_.empty()) {
        item = buffer_.front();
        buffer_.pop_front();
        cv_.notify_all();
        return std::optional<Got>(Got::kItem);
      }
      if (end_) return std::optional<Got>(Got::kEnd);
      if (stop_) return std::optional<Got>(Got::kStopped);
      if (limit_after_ >= me) return std::optional<Got>(Got::kLimit);
      return std::optional<Got>();
    });
    if (!got)
      Raise(g_exc.empty, "input_producer of queue '" + h_->name + "': no item within the timeout");
    if (*got == Got::kEnd) return py::none();
    if (*got == Got::kStopped)
      Raise(g_exc.invalid_argument, "input_producer of queue '" + h_->name + "' is closed");
    // Nothing buffered, and a take begun after this get() was called found
    // every lease held by items handed out and not acked: only the consumer
    // can free one, and it is waiting here.
    if (*got == Got::kLimit) RaiseLeaseLimit(*h_);
    if (*got == Got::kJobLost) Raise(g_exc.corrupt, h_->queue->JobLossMessage());
    auto got_item = std::make_shared<PyWorkItem>(h_, item);
    if (h_->auto_ack) h_->last_taken = got_item;
    return py::cast(got_item);
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
      uint64_t asked;  // gets_ before this take: get() calls it answers
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || buffer_.size() < capacity_; });
        if (stop_) return;
        asked = gets_;
      }
      tc::WorkItem item;
      tc::TakeStatus status = h_->queue->Take(&item, Clock::now() + kSlice);
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
        case tc::TakeStatus::kClosed:  // get() raises the queue's closed error
        case tc::TakeStatus::kForked:  // never: the thread is the opener's
        case tc::TakeStatus::kInvalidArgument:
          end_ = true;
          cv_.notify_all();
          return;
        case tc::TakeStatus::kJobLost:
          job_lost_ = true;
          cv_.notify_all();
          return;
        case tc::TakeStatus::kLimit:
          // The consumer holds every lease. A get() waiting for this take
          // raises (it cannot ack while it waits); others, or the next get()
          // after an ack, have the thread try again.
          limit_after_ = asked;
          cv_.notify_all();
          cv_.wait_for(lock, std::chrono::milliseconds(20),
                       [&] { return stop_ || gets_ != asked; });
          break;
        case tc::TakeStatus::kTimeout:
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
  bool job_lost_ = false;  // the coordinator lost the job (TakeStatus::kJobLost)
  // get() calls so far; a get() numbered n raises the lease-limit error once
  // a take begun after it (limit_after_ >= n) met the limit. Under mu_.
  uint64_t gets_ = 0;
  uint64_t limit_after_ = 0;
};

}  // namespace

void DefineProducers(py::module_& m) {
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
          "`timeout` seconds without an item, and InvalidArgumentError (as take()) when nothing "
          "is buffered and this process holds leases_per_client items: ack them, or open the "
          "queue with auto_ack=True.")
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
}

void DefineProducerMethods(QueueClass& queue) {
  queue
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
          "`capacity` items ahead (PAI returns a TF FIFOQueue of work strings instead).");
}

}  // namespace tailcut::python
