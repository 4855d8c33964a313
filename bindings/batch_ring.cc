// tailcut._core.BatchRing: the Python face of tailcut/batch_ring.h.
//
// Lifetime: a Python BatchRing owns a RingHandle through a shared_ptr; every
// slot and batch object, and every memoryview over slot memory (through its
// _SlotBuffer exporter), holds the same pointer, so the mapping outlives them
// all. close() stops this object's use of the ring; the process leaves it when
// the last of those references is gone.
//
// Views: a Slot's and a Batch's `data` and `header` are memoryviews made once
// per object. publish/abandon/release release them (memoryview.release()), so
// later use of those views raises ValueError instead of reading memory the
// ring already handed to someone else. Arrays made from a view (numpy,
// torch.frombuffer) keep the view exported; such a view cannot be released
// and the arrays are the caller's to drop before the call (documented).
//
// Blocking: acquire and pop wait in slices (blocking.h): Ctrl-C and close()
// end them within 100 ms. Fork: a ring opened in a parent raises in a child
// and is leaked there (the C++ contract forbids a child to use it).
#include "tailcut/batch_ring.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "blocking.h"
#include "conversions.h"
#include "errors.h"
#include "module.h"

namespace tailcut::python {
namespace {

struct RingHandle {
  std::unique_ptr<tc::BatchRing> ring;
  std::string name;
  tc::RingRole role = tc::RingRole::kLoader;
  int pid = ::getpid();
  // relaxed: the counter changes only in a child's first thread, before fork() returns
  // (g_forks, queue.h: a pop or release tells a child from the opener without getpid()).
  uint64_t forks = g_forks.load(std::memory_order_relaxed);
  std::atomic<bool> closed{false};

  ~RingHandle() {
    if (::getpid() != pid) {
      (void)ring.release();  // a forked child must not leave its parent's ring
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      ring.reset();
    } else {
      ring.reset();
    }
  }
};
using RingPtr = std::shared_ptr<RingHandle>;

// Raises unless this process opened the ring and has not closed it.
// REQUIRES: the GIL.
tc::BatchRing& Usable(const RingHandle& h) {
  (void)g_forks_registered;
  if (g_forks.load(std::memory_order_relaxed) != h.forks)
    Raise(g_exc.invalid_argument, "batch ring '" + h.name + "' was opened by process " +
                                      std::to_string(h.pid) +
                                      "; a forked process must open its own BatchRing");
  if (h.closed.load(std::memory_order_acquire))
    Raise(g_exc.invalid_argument, "batch ring '" + h.name + "' is closed in this process");
  return *h.ring;
}

// The bytes behind a memoryview over slot memory; keeps the ring mapped.
struct SlotBuffer {
  RingPtr h;
  std::byte* ptr = nullptr;
  size_t size = 0;
  bool readonly = true;
};

py::object ViewOf(const RingPtr& h, const std::byte* ptr, size_t size, bool readonly) {
  SlotBuffer b{h, const_cast<std::byte*>(ptr), size, readonly};
  return py::reinterpret_steal<py::object>(PyMemoryView_FromObject(py::cast(std::move(b)).ptr()));
}

// Releases a view; one still exported (an array made from it) stays usable.
void ReleaseView(py::object& view) {
  if (view.is_none()) return;
  PyObject* r = PyObject_CallMethod(view.ptr(), "release", nullptr);
  if (r == nullptr) {
    PyErr_Clear();  // BufferError: exported by an array the caller still holds
  } else {
    Py_DECREF(r);
  }
  view = py::none();
}

struct PySlot {
  RingPtr h;
  tc::WritableBatch slot;
  bool open = true;
  py::object data = py::none(), header = py::none();

  void Close() {
    open = false;
    ReleaseView(data);
    ReleaseView(header);
  }
};

struct PyBatch {
  RingPtr h;
  tc::ReadyBatch batch;
  bool open = true;
  py::object data = py::none(), header = py::none();

  void Close() {
    open = false;
    ReleaseView(data);
    ReleaseView(header);
  }
};

const char* RoleName(tc::RingRole role) {
  return role == tc::RingRole::kLoader ? "loader" : "trainer";
}

// Raises unless this BatchRing was opened in `role`, the role `call` is for.
// The library answers a wrong role with kInvalid, as any bad argument; the
// binding checks the role first so that its message can name it. REQUIRES:
// the GIL.
void CheckRole(const RingHandle& h, const char* call, tc::RingRole role) {
  if (h.role != role)
    Raise(g_exc.invalid_argument, "batch ring '" + h.name + "': " + call + " is for a " +
                                      RoleName(role) + ", and this BatchRing was opened as a " +
                                      RoleName(h.role) + "; open one with role='" + RoleName(role) +
                                      "' for it");
}

// A status other than kOk after CheckRole and the argument checks of the call.
[[noreturn]] void RaiseStatus(const RingHandle& h, const char* call, tc::RingStatus st,
                              const std::string& what) {
  std::string text =
      "batch ring '" + h.name + "': " + call + " " + what + ": " + tc::RingStatusName(st);
  if (st == tc::RingStatus::kStale)
    Raise(g_exc.stale, text +
                           " (the slot has moved on: released twice, or recovered from a "
                           "process taken for dead)");
  if (st == tc::RingStatus::kCorrupt)
    Raise(g_exc.corrupt, text +
                             " (the ring's shared memory holds values no process of it writes: "
                             "stop the job, remove the ring with `tailcut ring " +
                             h.name + " --rm`, and start again)");
  // The binding checked every argument it can name before the call; a
  // kInvalid left over is one it cannot (kept distinct from kCorrupt).
  Raise(g_exc.invalid_argument, text + " (a bad argument for this call)");
}

void CheckOpen(bool open, const RingHandle& h, const char* what) {
  if (!open)
    Raise(g_exc.invalid_argument, "batch ring '" + h.name + "': this " + what +
                                      " was already handed back; its memory is no longer "
                                      "this process's");
}

template <typename T>
T& Owned(const RingHandle& ring, const std::shared_ptr<T>& obj, const char* what) {
  if (obj->h.get() != &ring)
    Raise(g_exc.invalid_argument, std::string("this ") + what + " belongs to another BatchRing");
  CheckOpen(obj->open, ring, what);
  return *obj;
}

py::dict StatsDict(const tc::BatchRingStats& s) {
  py::dict d;
  d["name"] = s.name;
  d["segment_path"] = s.segment_path;
  d["slot_bytes"] = s.slot_bytes;
  d["num_slots"] = s.num_slots;
  d["free"] = s.free;
  d["filling"] = s.filling;
  d["ready"] = s.ready;
  d["popped"] = s.popped;
  d["published"] = s.published;
  d["released"] = s.released;
  d["reclaimed"] = s.reclaimed;
  d["redelivered"] = s.redelivered;
  d["stale_tokens"] = s.stale_tokens;
  d["closed"] = s.closed;
  d["ended_through"] = s.ended_through;
  d["now_ns"] = s.now_ns;
  py::list clients;
  for (const tc::RingClientStats& c : s.clients) {
    py::dict cd;
    cd["slot"] = c.slot;
    cd["pid"] = c.pid;
    cd["alive"] = c.alive;
    cd["role"] = c.role == tc::RingRole::kLoader ? "loader" : "trainer";
    cd["acquired"] = c.acquired;
    cd["published"] = c.published;
    cd["abandoned"] = c.abandoned;
    cd["popped"] = c.popped;
    cd["released"] = c.released;
    cd["wait_seconds"] = c.wait_seconds;
    cd["waiting_seconds"] = c.waiting_seconds;
    cd["joined_ns"] = c.joined_ns;
    clients.append(cd);
  }
  d["clients"] = clients;
  return d;
}

}  // namespace

void DefineBatchRing(py::module_& m) {
  py::class_<SlotBuffer>(m, "_SlotBuffer", py::buffer_protocol(),
                         "Exports the bytes of one ring slot (what Slot and Batch views are "
                         "memoryviews of). Internal.")
      .def_buffer([](SlotBuffer& b) -> py::buffer_info {
        return py::buffer_info(b.ptr, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1}, b.readonly);
      });

  py::class_<PySlot, std::shared_ptr<PySlot>>(
      m, "Slot",
      "A ring slot this loader fills (BatchRing.acquire()). Write the batch into `data` and "
      "your own offsets into `header`, then publish() or abandon() it; both release the views.")
      .def_property_readonly(
          "data",
          [](PySlot& s) {
            CheckOpen(s.open, *s.h, "slot");
            if (s.data.is_none())
              s.data = ViewOf(s.h, s.slot.data.data(), s.slot.data.size(), false);
            return s.data;
          },
          "Writable memoryview of the slot's slot_bytes bytes.")
      .def_property_readonly(
          "header",
          [](PySlot& s) {
            CheckOpen(s.open, *s.h, "slot");
            if (s.header.is_none())
              s.header = ViewOf(s.h, s.slot.user_header.data(), s.slot.user_header.size(), false);
            return s.header;
          },
          "Writable memoryview of the slot's 256-byte user header.")
      .def_property_readonly(
          "index", [](const PySlot& s) { return s.slot.token.slot; }, "The slot's index.")
      .def_property_readonly(
          "open", [](const PySlot& s) { return s.open; }, "False once published or abandoned.");

  py::class_<PyBatch, std::shared_ptr<PyBatch>>(
      m, "Batch",
      "A published batch this trainer popped (BatchRing.pop()). `data` is a read-only "
      "memoryview over the slot, valid until release(): release() releases the views, so later "
      "use raises ValueError. Arrays made from them (numpy.frombuffer, torch.frombuffer) are "
      "not tracked: drop them before release().")
      .def_property_readonly(
          "data",
          [](PyBatch& b) {
            CheckOpen(b.open, *b.h, "batch");
            if (b.data.is_none())
              b.data = ViewOf(b.h, b.batch.data.data(), b.batch.data.size(), true);
            return b.data;
          },
          "Read-only memoryview of the published bytes.")
      .def_property_readonly(
          "header",
          [](PyBatch& b) {
            CheckOpen(b.open, *b.h, "batch");
            if (b.header.is_none())
              b.header = ViewOf(b.h, b.batch.user_header.data(), b.batch.user_header.size(), true);
            return b.header;
          },
          "Read-only memoryview of the 256-byte user header.")
      .def_property_readonly(
          "epoch", [](const PyBatch& b) { return b.batch.epoch; }, "The batch's epoch.")
      .def_property_readonly(
          "records", [](const PyBatch& b) { return b.batch.records; },
          "Records in the batch, as published.")
      .def_property_readonly(
          "loader", [](const PyBatch& b) { return b.batch.loader; },
          "Client slot of the loader that published it.")
      .def_property_readonly(
          "slot", [](const PyBatch& b) { return b.batch.token.slot; }, "The slot's index.")
      .def_property_readonly(
          "open", [](const PyBatch& b) { return b.open; }, "False once released.");

  py::class_<RingHandle, RingPtr>(
      m, "BatchRing",
      "BatchRing(name, slot_bytes, num_slots, role, *, max_clients=64, attach_timeout=10.0, "
      "cuda_register=True)\n\n"
      "A host-wide ring of batch slots in shared memory between loader processes (role "
      "'loader': acquire, publish, abandon) and trainer processes (role 'trainer': pop, "
      "release). See tailcut/batch_ring.h and docs/pooled.md. Every process opens its own; "
      "the first creates the ring, later ones attach with the same slot_bytes, num_slots and "
      "max_clients. A trainer registers the arena with CUDA where a runtime and a device are "
      "found (cuda_pinned, memory_state); choose the device (torch.cuda.set_device) first.")
      .def(py::init([](const py::object& name, py::object slot_bytes, py::object num_slots,
                       const py::object& role_arg, py::object max_clients,
                       const py::object& attach_timeout, const py::object& cuda_register) {
             tc::BatchRingOptions o;
             o.name = ToText(name, "name");
             o.slot_bytes = ToU64(slot_bytes, "slot_bytes", 1);
             o.num_slots = ToU32(num_slots, "num_slots", 1);
             o.max_clients = ToU32(max_clients, "max_clients", 1);
             // At most 7 days, as a WorkQueue's: a longer wait is surely a
             // mistake, and the deadline arithmetic would overflow.
             double wait = ToSeconds(attach_timeout, "attach_timeout");
             if (wait > 7 * 86400.0)
               RaiseValue("attach_timeout", "a number of seconds in [0, 604800] (7 days)",
                          attach_timeout);
             o.attach_timeout = ToMillis(wait);
             o.cuda_register = ToFlag(cuda_register, "cuda_register");
             auto h = std::make_shared<RingHandle>();
             const char* roles = "'loader' or 'trainer'";
             if (!PyUnicode_Check(role_arg.ptr())) RaiseType("role", roles, role_arg);
             const std::string role = py::str(role_arg);
             if (role == "loader") {
               h->role = tc::RingRole::kLoader;
             } else if (role == "trainer") {
               h->role = tc::RingRole::kTrainer;
             } else {
               RaiseValue("role", roles, role_arg);
             }
             h->name = o.name;
             {
               py::gil_scoped_release nogil;
               h->ring = tc::BatchRing::Open(o, h->role);
             }
             return h;
           }),
           py::arg("name"), py::arg("slot_bytes"), py::arg("num_slots"), py::arg("role"),
           py::kw_only(), py::arg("max_clients") = 64, py::arg("attach_timeout") = 10.0,
           py::arg("cuda_register") = true)
      .def(
          "acquire",
          [](const RingPtr& h, py::object timeout) {
            tc::BatchRing& ring = Usable(*h);
            CheckRole(*h, "acquire", tc::RingRole::kLoader);
            tc::WritableBatch slot;
            std::optional<tc::RingStatus> st =
                InSlices(Wait::FromTimeout(timeout, "timeout"), [&](Clock::time_point end) {
                  if (h->closed.load(std::memory_order_acquire))
                    return std::optional<tc::RingStatus>(tc::RingStatus::kInvalid);
                  tc::RingStatus s = ring.AcquireSlot(&slot, end);
                  return s == tc::RingStatus::kTimeout ? std::nullopt
                                                       : std::optional<tc::RingStatus>(s);
                });
            if (!st)
              Raise(g_exc.empty, "batch ring '" + h->name +
                                     "': no free slot within the timeout (trainers hold every "
                                     "slot; they free them with release())");
            if (*st != tc::RingStatus::kOk) {
              Usable(*h);  // closed meanwhile: says so
              RaiseStatus(*h, "acquire", *st, "refused");
            }
            auto s = std::make_shared<PySlot>();
            s->h = h;
            s->slot = slot;
            return s;
          },
          py::arg("timeout") = py::none(),
          "Loader: a free slot to fill, waiting for one (timeout seconds; None: no limit). "
          "Raises tailcut.Empty (a queue.Empty) when the timeout passes.")
      .def(
          "publish",
          [](const RingPtr& h, const std::shared_ptr<PySlot>& slot, py::object epoch,
             py::object records, py::object nbytes) {
            tc::BatchRing& ring = Usable(*h);
            CheckRole(*h, "publish", tc::RingRole::kLoader);
            PySlot& s = Owned(*h, slot, "slot");
            uint64_t e = ToU64(epoch, "epoch"), r = ToU64(records, "records"),
                     n = ToU64(nbytes, "nbytes");
            if (n > ring.slot_bytes())
              Raise(g_exc.invalid_argument,
                    "batch ring '" + h->name + "': publish: nbytes " + std::to_string(n) +
                        " is more than the ring's slot_bytes " + std::to_string(ring.slot_bytes()) +
                        "; make the batch smaller or open the ring with a larger slot_bytes");
            if (e == tc::BatchRing::kAllEpochs)
              Raise(g_exc.invalid_argument, "batch ring '" + h->name +
                                                "': publish: epoch must be below 2**64-1 (that "
                                                "value means every epoch), got " +
                                                std::to_string(e));
            tc::RingStatus st = ring.Publish(s.slot.token, e, r, n);
            if (st == tc::RingStatus::kClosed) return false;
            if (st != tc::RingStatus::kOk)
              RaiseStatus(*h, "publish", st, "of slot " + std::to_string(s.slot.token.slot));
            s.Close();
            return true;
          },
          py::arg("slot"), py::arg("epoch"), py::arg("records"), py::arg("nbytes"),
          "Loader: publishes the first nbytes of the slot as a batch of `epoch` with `records` "
          "records. True; False if that epoch was already ended (the slot is still yours: "
          "abandon it).")
      .def(
          "abandon",
          [](const RingPtr& h, const std::shared_ptr<PySlot>& slot) {
            tc::BatchRing& ring = Usable(*h);
            CheckRole(*h, "abandon", tc::RingRole::kLoader);
            PySlot& s = Owned(*h, slot, "slot");
            tc::RingStatus st = ring.Abandon(s.slot.token);
            s.Close();
            if (st != tc::RingStatus::kOk)
              RaiseStatus(*h, "abandon", st, "of slot " + std::to_string(s.slot.token.slot));
          },
          py::arg("slot"), "Loader: hands the slot back unpublished.")
      .def(
          "pop",
          [](const RingPtr& h, py::object through_epoch, py::object timeout) -> py::object {
            tc::BatchRing& ring = Usable(*h);
            CheckRole(*h, "pop", tc::RingRole::kTrainer);
            uint64_t through = through_epoch.is_none() ? tc::BatchRing::kAllEpochs
                                                       : ToU64(through_epoch, "through_epoch");
            tc::ReadyBatch batch;
            std::optional<tc::RingStatus> st =
                InSlices(Wait::FromTimeout(timeout, "timeout"), [&](Clock::time_point end) {
                  if (h->closed.load(std::memory_order_acquire))
                    return std::optional<tc::RingStatus>(tc::RingStatus::kInvalid);
                  tc::RingStatus s = ring.Pop(through, &batch, end);
                  return s == tc::RingStatus::kTimeout ? std::nullopt
                                                       : std::optional<tc::RingStatus>(s);
                });
            if (!st)
              Raise(g_exc.empty, "batch ring '" + h->name +
                                     "': no batch within the timeout and its epoch has not "
                                     "ended (loaders still at work, or none running)");
            if (*st == tc::RingStatus::kEnd) return py::none();
            if (*st != tc::RingStatus::kOk) {
              Usable(*h);
              RaiseStatus(*h, "pop", *st, "refused");
            }
            auto b = std::make_shared<PyBatch>();
            b->h = h;
            b->batch = batch;
            return py::cast(b);
          },
          py::arg("through_epoch") = py::none(), py::arg("timeout") = py::none(),
          "Trainer: the next ready batch (any epoch, in publish order), waiting for one. None "
          "once no batch is ready and epoch through_epoch (None: every epoch) has ended. Raises "
          "tailcut.Empty when the timeout (seconds; None: no limit) passes.")
      .def(
          "release",
          [](const RingPtr& h, const std::shared_ptr<PyBatch>& batch) {
            tc::BatchRing& ring = Usable(*h);
            CheckRole(*h, "release", tc::RingRole::kTrainer);
            PyBatch& b = Owned(*h, batch, "batch");
            b.Close();  // the views die before the slot can be reused
            tc::RingStatus st = ring.Release(b.batch.token);
            if (st != tc::RingStatus::kOk)
              RaiseStatus(*h, "release", st, "of slot " + std::to_string(b.batch.token.slot));
          },
          py::arg("batch"),
          "Trainer: gives the batch's slot back to the loaders; its views raise from now on.")
      .def(
          "peek_ready",
          [](const RingPtr& h, const py::function& fn) {
            tc::BatchRing& ring = Usable(*h);
            return ring.PeekReady([&](const tc::ReadyBatch& b) {
              py::object header = ViewOf(h, b.user_header.data(), b.user_header.size(), true);
              py::object data = ViewOf(h, b.data.data(), b.data.size(), true);
              try {
                fn(header, data, b.epoch, b.records);
              } catch (...) {
                ReleaseView(header);
                ReleaseView(data);
                throw;
              }
              ReleaseView(header);
              ReleaseView(data);
            });
          },
          py::arg("fn"),
          "Calls fn(header, data, epoch, records) for each batch ready now, without taking it "
          "(read-only memoryviews, released after the call). Call it while no trainer pops: "
          "returns how many batches were popped while fn read them.")
      .def(
          "end_epoch",
          [](const RingPtr& h, py::object epoch) {
            tc::BatchRing& ring = Usable(*h);
            if (epoch.is_none()) {
              ring.Close();
            } else {
              ring.EndEpoch(ToU64(epoch, "epoch"));
            }
          },
          py::arg("epoch"),
          "Declares that no batch of epoch <= `epoch` (None: of any epoch) will be published "
          "any more, for every process of the ring; waiting trainers wake.")
      .def(
          "recover_dead_clients",
          [](const RingPtr& h) {
            tc::BatchRing& ring = Usable(*h);
            py::gil_scoped_release nogil;
            return ring.RecoverDeadClients();
          },
          "Recovers the slots of dead processes now; returns how many.")
      .def(
          "stats", [](const RingPtr& h) { return StatsDict(Usable(*h).Stats()); },
          "Counters and slot states of the ring (a dict; one moment, not atomic).")
      .def(
          "close",
          [](const RingPtr& h) {
            if (::getpid() != h->pid) return;
            h->closed.store(true, std::memory_order_release);
          },
          "Stops this object's use of the ring (a blocked call ends within 100 ms). The process "
          "leaves the ring once its slots, batches and views are gone too. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](const RingPtr& h, py::object, py::object, py::object) {
             if (::getpid() == h->pid) h->closed.store(true, std::memory_order_release);
             return false;
           })
      .def_property_readonly(
          "name", [](const RingHandle& h) { return h.name; }, "The ring's name.")
      .def_property_readonly(
          "role",
          [](const RingHandle& h) {
            return std::string(h.role == tc::RingRole::kLoader ? "loader" : "trainer");
          },
          "'loader' or 'trainer'.")
      .def_property_readonly(
          "slot_bytes", [](const RingHandle& h) { return h.ring->slot_bytes(); },
          "Bytes of one batch slot.")
      .def_property_readonly(
          "num_slots", [](const RingHandle& h) { return h.ring->num_slots(); },
          "Batches in flight at most.")
      .def_property_readonly(
          "client_slot", [](const RingHandle& h) { return h.ring->client_slot(); },
          "This process's client slot in the ring (Batch.loader names a loader's).")
      .def_property_readonly(
          "cuda_pinned", [](const RingHandle& h) { return h.ring->cuda_pinned(); },
          "Whether this process registered the arena with CUDA (trainers, where a CUDA runtime "
          "and a device are found), so .to('cuda', non_blocking=True) of a batch is DMA.")
      .def_property_readonly(
          "memory_state", [](const RingHandle& h) { return h.ring->memory_state(); },
          "One line on the arena, e.g. 'arena: 64 MiB (16 slots of 4 MiB) + CUDA-pinned', or "
          "'...; not CUDA-pinned: <why>' for a trainer.")
      .def_property_readonly(
          "closed", [](const RingHandle& h) { return h.closed.load(); },
          "Whether close() was called.");

  m.def(
      "inspect_batch_ring",
      [](const py::object& name_arg) {
        const std::string name = ToText(name_arg, "name");
        tc::BatchRingStats s;
        {
          py::gil_scoped_release nogil;
          s = tc::InspectBatchRing(name);
        }
        return StatsDict(s);
      },
      py::arg("name"), "Stats of an existing ring without joining it.");
  m.def(
      "remove_batch_ring",
      [](const py::object& name_arg) {
        const std::string name = ToText(name_arg, "name");
        py::gil_scoped_release nogil;
        return tc::RemoveBatchRing(name);
      },
      py::arg("name"), "Removes the ring's segment; False if there was none.");
}

}  // namespace tailcut::python
