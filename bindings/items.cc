#include "items.h"

#include <pybind11/numpy.h>

#include <chrono>
#include <cstdint>

#include "blocking.h"
#include "module.h"
#include "tailcut/sample_order.h"

namespace tailcut::python {

std::optional<tc::WorkItem> TakeBlocking(QueueHandle& h, const py::object& timeout) {
  struct Taken {
    tc::TakeStatus status;
    tc::WorkItem item;
  };
  std::optional<Taken> taken =
      InSlices(Wait::FromTimeout(timeout, "timeout"), [&](Clock::time_point end) {
        Use use(h);
        Taken t;
        t.status = h.queue->Take(&t.item, end);
        return t.status == tc::TakeStatus::kTimeout ? std::nullopt : std::optional<Taken>(t);
      });
  if (!taken)
    Raise(g_exc.empty, "queue '" + h.name +
                           "': no item within the timeout; other processes still hold "
                           "open items, which come back if they die or give them back");
  switch (taken->status) {
    case tc::TakeStatus::kOk:
      return taken->item;
    case tc::TakeStatus::kLimit:
      RaiseLeaseLimit(h);
    case tc::TakeStatus::kJobLost:
      Raise(g_exc.corrupt, h.queue->JobLossMessage());
    case tc::TakeStatus::kClosed:
      throw h.ClosedError();
    case tc::TakeStatus::kForked:
      h.CheckPid();
      break;
    case tc::TakeStatus::kEnd:
    case tc::TakeStatus::kTimeout:
    case tc::TakeStatus::kInvalidArgument:  // never: the item is ours
      break;
  }
  return std::nullopt;
}

void RaiseLeaseLimit(const QueueHandle& h) {
  Raise(g_exc.invalid_argument,
        "queue '" + h.name + "': this process already holds " +
            std::to_string(h.leases_per_client) +
            " open items (leases_per_client); ack or give one back before taking more, "
            "open the queue with auto_ack=True (code written for PAI, which never acks), "
            "or with a larger leases_per_client (in every process)");
}

void AckPrevious(std::weak_ptr<PyWorkItem>& last) {
  ItemPtr previous = last.lock();
  last.reset();
  if (previous && previous->state == ItemState::kOpen) previous->Ack();
}

namespace {

// WorkQueue::AgreeStep in slices (blocking.h); calling it again for the same
// step is harmless (it republishes the same word). REQUIRES: the GIL.
std::string AgreeStepBlocking(QueueHandle& h, const py::object& rank, const py::object& ranks,
                              const py::object& step, const py::object& has_batch_arg,
                              const py::object& timeout) {
  uint64_t r = ToU64(rank, "rank");
  const bool has_batch = ToFlag(has_batch_arg, "has_batch");
  uint64_t n = ToU64(ranks, "ranks", 1);
  uint64_t s = ToU64(step, "step");
  if (r >= n)
    Raise(g_exc.invalid_argument, "agree_step: rank " + std::to_string(r) +
                                      " is not below ranks (" + std::to_string(n) + ")");
  if (n > UINT32_MAX) Raise(g_exc.invalid_argument, "agree_step: ranks is too large");
  if (s >= (uint64_t{1} << 62))
    Raise(g_exc.invalid_argument, "agree_step: step must be below 2**62, got " + std::to_string(s));
  Wait wait = Wait::FromTimeout(timeout, "timeout");
  std::optional<tc::StepStatus> status = InSlices(wait, [&](Clock::time_point end) {
    Use use(h);
    tc::StepStatus st =
        h.queue->AgreeStep(static_cast<uint32_t>(r), static_cast<uint32_t>(n), s, has_batch, end);
    return st == tc::StepStatus::kTimeout ? std::nullopt : std::optional<tc::StepStatus>(st);
  });
  if (!status) return "timeout";
  if (*status == tc::StepStatus::kEndEpoch) return "end_epoch";
  if (*status == tc::StepStatus::kAllHaveBatch) return "all_have_batch";
  Raise(g_exc.invalid_argument,
        "queue '" + h.name + "': agree_step(rank=" + std::to_string(r) +
            ", ranks=" + std::to_string(n) + ", step=" + std::to_string(s) +
            ") refused: either ranks exceeds the queue's max_clients, or rank " +
            std::to_string(r) +
            " already agreed on a later step. Steps must grow over the queue's lifetime "
            "(e.g. (epoch << 32) | step_in_epoch), across runs too: a queue resumed under "
            "the same name keeps the last steps of its previous run; restart under a new "
            "name with restore_state instead");
}

}  // namespace

void DefineWorkItem(py::module_& m) {
  py::class_<PyWorkItem, ItemPtr>(
      m, "WorkItem",
      "One work item (a byte range of one file, or a range of positions of an index work) this "
      "process holds, as handed out by WorkQueue.take(). Ack it when its records are used, "
      "or give it back; `with item:` acks on a clean exit and gives back "
      "on an exception. An item not acked when its process dies goes to "
      "another process.")
      .def_property_readonly(
          "path", [](const PyWorkItem& i) { return FromPath(i.path); },
          "The file (prefix applied), as os.fsdecode gives it: os.fsencode(path) is the "
          "file name's bytes, also when they are not UTF-8.")
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
           "Reports that the item's bytes before `offset` are used by this process (a "
           "checkpoint resumes there, unless this process committed the item: then only "
           "commits count) and `records` more records were read; refreshes the lease timeout. "
           "An offset below an earlier one changes nothing. Raises StaleItemError if the item "
           "was reassigned, InvalidArgumentError for an offset outside the item or inside a "
           "fixed-size record.")
      .def("commit", &PyWorkItem::Commit, py::arg("offset"),
           "For a process that hands on what it reads (a loader publishing batches): the "
           "records before `offset` are delivered, so should it die, give the item back or lose "
           "it to a lease timeout, the item is handed out again from the highest offset "
           "committed, not from its start, and a checkpoint resumes there too (later "
           "progress() calls no longer move it). Call it after each hand-off. Same errors as "
           "progress().")
      .def("claim", &PyWorkItem::Claim, py::arg("up_to"),
           "Tail splitting, owner side: claims the records (positions of an index work) that "
           "start before `up_to` and returns the item's current end: an idle process may split "
           "off what lies past the claims, so stop there. The first claim makes the item "
           "splittable; an item never claimed is never split. Same errors as progress().")
      .def(
          "indices",
          [](const PyWorkItem& i, py::object start, py::object stop, py::object out) -> py::object {
            uint64_t n = i.h->queue->num_samples();
            if (n == 0)
              Raise(g_exc.invalid_argument,
                    "indices() of " + i.Describe() +
                        ": the queue's items are file slices, not samples by index (open it "
                        "with num_samples=N)");
            uint64_t a = start.is_none() ? i.item.begin : ToU64(start, "start");
            uint64_t b = stop.is_none() ? i.item.end : ToU64(stop, "stop");
            if (a > b || b > n)
              Raise(g_exc.invalid_argument, "indices(" + std::to_string(a) + ", " +
                                                std::to_string(b) + ") of " + i.Describe() +
                                                ": positions must satisfy start <= stop <= " +
                                                std::to_string(n) + " (num_samples)");
            tc::SampleOrder order(*i.h->queue, i.item.epoch);
            if (out.is_none()) {
              std::vector<uint64_t> samples(b - a);
              order.Fill(a, b, samples.data());
              py::list list(b - a);
              for (uint64_t k = 0; k < b - a; ++k)
                PyList_SET_ITEM(list.ptr(), k, PyLong_FromUnsignedLongLong(samples[k]));
              return std::move(list);
            }
            // A batch's indices written in place: no Python int per sample.
            auto array = py::array_t<uint64_t>::ensure(out);
            if (!array || !array.is(out) || array.ndim() != 1 || !array.writeable() ||
                array.strides(0) != static_cast<py::ssize_t>(sizeof(uint64_t)) ||
                static_cast<uint64_t>(array.shape(0)) != b - a)
              Raise(g_exc.invalid_argument,
                    "indices(" + std::to_string(a) + ", " + std::to_string(b) +
                        ", out=...): out must be a writable contiguous numpy uint64 array of " +
                        std::to_string(b - a) + " (stop - start) elements");
            order.Fill(a, b, array.mutable_data());
            return out;
          },
          py::arg("start") = py::none(), py::arg("stop") = py::none(), py::kw_only(),
          py::arg("out") = py::none(),
          "Index work (WorkQueue(num_samples=N)): the sample indices at positions [start, stop) "
          "of the item's epoch order, [begin, end) by default, as a list; with out= (a "
          "writable contiguous numpy uint64 array of stop - start elements) written into out, "
          "which is returned. commit() and progress() take positions: after using position p, "
          "commit(p + 1). Raises InvalidArgumentError for a queue of files.")
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
        return "WorkItem(path=" + std::string(py::repr(FromPath(i.path))) +
               ", begin=" + std::to_string(i.item.begin) + ", end=" + std::to_string(i.item.end) +
               ", epoch=" + std::to_string(i.item.epoch) +
               ", index=" + std::to_string(i.item.index) + ", state='" + StateName(i.state) + "')";
      });
}

void DefineTake(QueueClass& queue) {
  queue
      .def(
          "take",
          [](const HandlePtr& h, py::object timeout) -> py::object {
            if (h->auto_ack) AckPrevious(h->last_taken);
            std::optional<tc::WorkItem> item = TakeBlocking(*h, timeout);
            if (!item) return py::none();
            auto taken = std::make_shared<PyWorkItem>(h, *item);
            if (h->auto_ack) h->last_taken = taken;
            return py::cast(taken);
          },
          py::arg("timeout") = py::none(),
          "Takes the next WorkItem. Returns None once every item of every epoch is done. At the "
          "end of the data it waits while other processes still hold open items (they come back "
          "if those die); with `timeout` (seconds) it raises Empty instead of waiting longer. "
          "Raises InvalidArgumentError while this process holds leases_per_client open items, "
          "and CorruptError in every process of a host once the coordinator lost the job "
          "(queues with a coordinator; docs/global.md). "
          "Releases the GIL while it waits. With WorkQueue(..., auto_ack=True) it first acks the "
          "item the previous take() returned, if that is still open (PAI code never acks).")
      .def(
          "take_split",
          [](const HandlePtr& h, py::object below_epoch) -> py::object {
            const uint64_t below = ToU64(below_epoch, "below_epoch");
            tc::WorkItem item;
            tc::TakeStatus status;
            {
              Use use(*h);
              status = h->queue->TakeSplit(&item, below);
            }
            switch (status) {
              case tc::TakeStatus::kOk:
                return py::cast(std::make_shared<PyWorkItem>(h, item));
              case tc::TakeStatus::kClosed:
                throw h->ClosedError();
              case tc::TakeStatus::kForked:
                h->CheckPid();
                break;
              default:  // kTimeout: no tail worth splitting
                break;
            }
            return py::none();
          },
          py::arg("below_epoch"),
          "Tail splitting on demand: splits the unclaimed tail off the open item of an epoch "
          "below `below_epoch` with the most left (items whose owner claims as it reads), as "
          "take() does once it has nothing else to hand out, and returns it as a WorkItem (a "
          "piece); None when no such tail is worth splitting (twice min_split_bytes). For a "
          "process that take() hands the next epoch's items while the last ones of this epoch "
          "are still read elsewhere (take() then never splits). Never waits.")
      .def(
          "agree_step",
          [](const HandlePtr& h, py::object rank, py::object ranks, py::object step,
             py::object has_batch, py::object timeout) {
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
          "on it.");
}

}  // namespace tailcut::python
