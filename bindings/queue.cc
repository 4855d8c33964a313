#include "queue.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>

#include "blocking.h"
#include "conversions.h"
#include "engine/checkpoint.h"
#include "engine/feeder.h"
#include "errors.h"
#include "items.h"
#include "module.h"
#include "stats.h"

namespace tailcut::python {

namespace {

// Every live handle of this process, for the atexit hook.
std::mutex g_handles_mu;
std::vector<std::weak_ptr<QueueHandle>> g_handles;

// The fewest samples a tail split of an index work takes.
constexpr uint64_t kIndexMinSplitSamples = 8;

// The engine's longest wait (WorkQueueOptions durations are at most 7 days).
constexpr std::chrono::milliseconds kLongestAttach{7LL * 24 * 3600 * 1000};

// attach_timeout: seconds >= 0, or None / +inf for no limit (nullopt).
std::optional<std::chrono::milliseconds> ToAttachTimeout(const py::handle& v) {
  if (v.is_none()) return std::nullopt;
  const char* rule = "a number of seconds >= 0, or None (or float('inf')) to wait without a limit";
  if (PyBool_Check(v.ptr()) || PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()))
    RaiseType("attach_timeout", rule, v);
  double s = PyFloat_AsDouble(v.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    RaiseType("attach_timeout", rule, v);
  }
  if (std::isinf(s) && s > 0) return std::nullopt;
  if (!(s >= 0)) RaiseValue("attach_timeout", rule, v);
  return ToMillis(s);
}

// WorkQueue::Open, which may wait up to attach_timeout for a creator to set
// the queue up, run on a thread of its own and waited for in slices
// (blocking.h), so that Ctrl-C is answered within a slice. Without a limit
// (`forever`), an attach that times out is tried again. On KeyboardInterrupt
// the thread is left to finish on its own: a queue it opens after that is
// closed at once, cleanly, as if this process had never joined. The thread
// holds no Python object but the notice callback, which takes the GIL.
// REQUIRES: the GIL.
std::unique_ptr<tc::WorkQueue> OpenInSlices(tc::WorkQueueOptions o, bool forever) {
  struct Job {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;  // the caller stopped waiting
    std::unique_ptr<tc::WorkQueue> queue;
    std::exception_ptr error;
  };
  auto job = std::make_shared<Job>();
  std::thread thread([job, o = std::move(o), forever]() mutable {
    std::unique_ptr<tc::WorkQueue> queue;
    std::exception_ptr error;
    for (;;) {
      try {
        queue = tc::WorkQueue::Open(o);
      } catch (const tc::Error& e) {
        error = std::current_exception();
        if (forever && e.kind() == tc::ErrorKind::kTimeout) {
          std::lock_guard<std::mutex> lock(job->mu);
          if (!job->abandoned) {
            error = nullptr;
            continue;
          }
        }
      } catch (...) {
        error = std::current_exception();
      }
      break;
    }
    std::unique_lock<std::mutex> lock(job->mu);
    if (job->abandoned) {
      lock.unlock();
      queue.reset();  // nobody will use it: a clean close
      return;
    }
    job->queue = std::move(queue);
    job->error = error;
    job->done = true;
    job->cv.notify_all();
  });
  try {
    InSlices(Wait::Forever(), [&](Clock::time_point end) {
      std::unique_lock<std::mutex> lock(job->mu);
      return job->cv.wait_until(lock, end, [&] { return job->done; }) ? std::optional<bool>(true)
                                                                      : std::nullopt;
    });
  } catch (...) {  // KeyboardInterrupt (or another exception of a signal handler)
    std::unique_ptr<tc::WorkQueue> opened;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->abandoned = true;
      opened = std::move(job->queue);  // set if it finished just now
    }
    thread.detach();
    {
      py::gil_scoped_release nogil;
      opened.reset();
    }
    throw;
  }
  {
    py::gil_scoped_release nogil;  // the thread's last steps may need the GIL
    thread.join();
  }
  if (job->error) std::rethrow_exception(job->error);
  return std::move(job->queue);
}

HandlePtr OpenQueue(const py::object& works, const py::object& num_epochs,
                    const py::object& shuffle, const py::object& seed, const py::object& prefix,
                    const py::object& num_slices, const py::object& num_clients,
                    const py::object& queue_name, const py::kwargs& more) {
  const std::string name = ToQueueName(queue_name);
  tc::WorkQueueOptions o;
  py::dict open_args;
  if (works.is_none()) {
    open_args["works"] = py::none();  // an index work (num_samples)
  } else {
    if (py::isinstance<py::str>(works) || py::isinstance<py::bytes>(works) ||
        py::hasattr(works, "__fspath__")) {
      o.works.push_back(ToPath(works));
    } else {
      for (py::handle w : works) o.works.push_back(ToPath(w));
    }
    py::list works_list;
    for (const std::string& w : o.works) works_list.append(FromPath(w));
    open_args["works"] = works_list;
  }
  o.num_epochs = ToU64(num_epochs, "num_epochs");
  o.shuffle = ToFlag(shuffle, "shuffle");
  if (auto v = ToU64OrNone(seed, "seed")) o.seed = *v;
  if (!prefix.is_none()) o.prefix = ToPath(prefix);
  if (auto v = ToU64OrNone(num_slices, "num_slices")) o.num_slices = *v;
  o.num_clients = ToU32(num_clients, "num_clients");
  o.name = name;
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
  bool attach_forever = false;
  std::optional<uint64_t> min_split_bytes;
  for (auto kv : more) {
    std::string key = py::str(kv.first);
    py::object v = py::reinterpret_borrow<py::object>(kv.second);
    if (key == "format") {
      format = v;
    } else if (key == "record_bytes") {
      record_bytes = v;
    } else if (key == "num_samples") {
      o.num_samples = ToU64(v, "num_samples", 1);
    } else if (key == "samples_id") {
      o.samples_id = v.is_none() ? "" : ToText(v, "samples_id");
      h->samples_id = o.samples_id;
    } else if (key == "max_clients") {
      o.max_clients = ToU32(v, "max_clients");
    } else if (key == "keep_unfinished") {
      o.keep_unfinished = ToFlag(v, "keep_unfinished");
    } else if (key == "auto_ack") {
      h->auto_ack = ToFlag(v, "auto_ack");
    } else if (key == "min_split_bytes") {
      min_split_bytes = ToU64(v, "min_split_bytes", 1);
    } else if (key == "split_multiple") {
      o.split_multiple = ToU64(v, "split_multiple", 1);
    } else if (key == "leases_per_client") {
      o.leases_per_client = ToU32(v, "leases_per_client");
    } else if (key == "attach_timeout") {
      std::optional<std::chrono::milliseconds> t = ToAttachTimeout(v);
      attach_forever = !t;
      o.attach_timeout = t ? *t : kLongestAttach;
    } else if (key == "lease_timeout") {
      o.lease_timeout = ToMillis(ToSecondsOrNone(v, "lease_timeout").value_or(0));
    } else if (key == "stop_timeout") {
      o.stop_timeout = ToMillis(ToSecondsOrNone(v, "stop_timeout").value_or(0));
    } else if (key == "coordinator") {
      o.coordinator = v.is_none() ? "" : ToText(v, "coordinator");
    } else if (key == "host_id") {
      o.host_id = v.is_none() ? "" : ToText(v, "host_id");
      // '' is how the engine spells "not set": an explicit empty id would
      // silently become the hostname.
      if (!v.is_none() && o.host_id.empty())
        Raise(g_exc.invalid_argument,
              "host_id='' is empty: pass a name such as 'node-0', or None for TAILCUT_HOST_ID "
              "or the hostname");
    } else if (key == "global_ttl") {
      o.global_ttl = ToMillis(ToSeconds(v, "global_ttl"));
    } else if (key == "global_block_size") {
      o.global_block_size = ToU64(v, "global_block_size");
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
  // An index work splits in samples, not bytes: a tail of 8 samples is worth
  // another process's time (WorkQueueOptions::min_split_bytes).
  if (min_split_bytes) {
    o.min_split_bytes = *min_split_bytes;
  } else if (o.num_samples != 0) {
    o.min_split_bytes = kIndexMinSplitSamples;
  }
  if (!format.is_none()) {
    h->format = ParseFormat(ToText(format, "format"), record_bytes);
    o.format = h->format->Tag();
  } else if (!record_bytes.is_none()) {
    Raise(g_exc.invalid_argument, "record_bytes needs format='fixed'");
  }
  h->restore_state = o.restore_state;
  h->leases_per_client = o.leases_per_client;
  h->notice = o.on_notice;  // empty (on_notice=None): a Reader prints its own
  if (!o.on_notice) {
    // The library's default (engine/work_queue.cc), in Python's words.
    o.on_notice = [](const std::string& line) {
      std::fprintf(stderr, "tailcut: %s\n", PythonWording(line).c_str());
    };
  }
  h->open_args = open_args;
  h->pid = ::getpid();
  h->forks = g_forks.load(std::memory_order_relaxed);
  h->queue = OpenInSlices(std::move(o), attach_forever);
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_handles.erase(std::remove_if(g_handles.begin(), g_handles.end(),
                                 [](const std::weak_ptr<QueueHandle>& w) { return w.expired(); }),
                  g_handles.end());
  g_handles.push_back(h);
  return h;
}

// (ticket, begin, end) ranges from a Python iterable of 3-sequences, for the
// checkpoint edits named by `fn` (in the messages).
std::vector<tc::detail::Piece> ToPieces(const py::iterable& ranges, const std::string& fn) {
  const std::string range = fn + ": a range", ticket = range + "'s ticket",
                    begin = range + "'s begin", end = range + "'s end";
  std::vector<tc::detail::Piece> pieces;
  for (const py::handle& r : ranges) {
    if (!py::isinstance<py::sequence>(r) || py::len(r) != 3)
      RaiseType(range.c_str(), "a (ticket, begin, end) sequence", r);
    py::sequence t = py::reinterpret_borrow<py::sequence>(r);
    pieces.push_back(
        {ToU64(t[0], ticket.c_str()), ToU64(t[1], begin.c_str()), ToU64(t[2], end.c_str())});
  }
  return pieces;
}

void CloseHandle(QueueHandle& h) {
  if (::getpid() != h.pid) return;                             // a forked child: not ours to close
  if (ItemPtr last = h.last_taken.lock()) last->AckQuietly();  // auto_ack: the last is done
  InSlices(Wait::Forever(), [&](Clock::time_point end) {
    return h.CloseUntil(end) ? std::optional<bool>(true) : std::nullopt;
  });
}

}  // namespace

QueueClass DefineWorkQueue(py::module_& m) {
  QueueClass cls(
      m, "WorkQueue",
      "The host-wide work queue (the PAI WorkQueue contract). Every process on the host that "
      "opens a WorkQueue with the same name and configuration shares one queue in POSIX shared "
      "memory, which hands out work items (file slices) so that each is used exactly once per "
      "epoch across all processes. Use from many threads is safe. A forked child must open its "
      "own. Extra keywords: format, record_bytes (part of the configuration: every process must "
      "agree), max_clients, leases_per_client, attach_timeout and lease_timeout (seconds; "
      "attach_timeout None: no limit; lease_timeout None: off), stop_timeout (seconds, None: "
      "off; this process's items go to the others once it has not run at all, e.g. SIGSTOP, "
      "for that long), restore_state (bytes from "
      "state_dict()['state']), on_notice "
      "(callable taking one str, or None for stderr), num_samples (an index work, with "
      "works=None), samples_id (str, with num_samples: what the samples are, part of the "
      "configuration, so that a queue or checkpoint of another data set of as many samples is "
      "refused), auto_ack (PAI compatibility: each take() or "
      "input_producer get() acks the item handed out before it, close() the last; "
      "at-most-once, see docs/python.md); across hosts (docs/global.md): coordinator "
      "('redis://[user[:password]@]HOST:PORT/DB', default TAILCUT_COORDINATOR), host_id (default "
      "TAILCUT_HOST_ID or the hostname), global_ttl (seconds, default 8) and global_block_size "
      "(tickets per block, 0: automatic).");
  cls.def(py::init(&OpenQueue), py::arg("works") = py::none(), py::arg("num_epochs") = 1,
          py::arg("shuffle") = true, py::arg("seed") = py::none(), py::arg("prefix") = py::none(),
          py::arg("num_slices") = py::none(), py::arg("num_clients") = 1,
          py::arg("name") = "work_queue",
          "Creates or joins the queue `name`: of `works` (file paths), or with works=None and "
          "num_samples=N of N samples by index (no file; items are ranges of positions in each "
          "epoch's seeded permutation of 0..N-1, WorkItem.indices() gives their samples). Raises "
          "NotFoundError, PermissionDeniedError, "
          "ConfigMismatchError, NoSpaceError, TimeoutError or InvalidArgumentError with the "
          "library's message; TypeError for an unknown keyword.")
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
            if (!h->samples_id.empty()) d["samples_id"] = h->samples_id;
            return d;
          },
          "A checkpoint of the whole queue: {'state': bytes, 'name', 'num_items', 'num_epochs', "
          "'seed', 'done', 'total'}, and 'samples_id' when the queue has one (an index work's "
          "data set, whose restore names what differs). Restore it by opening the queue of the "
          "restarted job with "
          "restore_state=d (or d['state']) in every process. Items open now are handed out again "
          "after a restore, from their last progress offset.")
      .def(
          "_host_state",
          [](const HandlePtr& h) {
            std::string state;
            {
              Use use(*h);
              state = h->queue->SaveHostState();
            }
            return py::bytes(state);
          },
          "This host's part of an exact checkpoint of a queue fed by a coordinator "
          "(WorkQueue::SaveHostState): what this host finished, its open items and their resume "
          "points. On one host: state_dict()['state'].")
      .def(
          "_state_with_hosts",
          [](const HandlePtr& h, const py::iterable& host_states) {
            std::vector<std::string> states;
            for (const py::handle& s : host_states)
              states.push_back(ToBytes(py::reinterpret_borrow<py::object>(s),
                                       "_state_with_hosts: a host state"));
            std::string state;
            {
              Use use(*h);
              state = h->queue->SaveStateWithHosts(states);
            }
            return py::bytes(state);
          },
          py::arg("host_states"),
          "The coordinator's state of a fed queue's job, saved now, with the done marks of "
          "`host_states` (every host's _host_state(), each saved before): "
          "WorkQueue::SaveStateWithHosts.")
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
          "leases_per_client", [](const HandlePtr& h) { return h->leases_per_client; },
          "Open items this process may hold at once (take() refuses one more).")
      .def_property_readonly(
          "num_samples",
          [](const HandlePtr& h) -> py::object {
            if (h->queue->num_samples() == 0) return py::none();
            return py::int_(h->queue->num_samples());
          },
          "N of an index work (WorkQueue(num_samples=N)); None for a queue of files.")
      .def_property_readonly(
          "seed", [](const HandlePtr& h) { return h->queue->seed(); },
          "The shuffle seed every process uses (drawn by the creator when seed=None).")
      .def_property_readonly(
          "paths",
          [](const HandlePtr& h) {
            py::list out;
            for (const std::string& p : h->queue->paths()) out.append(FromPath(p));
            return out;
          },
          "The work files, prefix applied (str as os.fsdecode gives them, like WorkItem.path).")
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
          "settled_tickets",
          [](const HandlePtr& h, py::object start) {
            uint64_t from = ToU64(start, "start");
            Use use(*h);
            return h->queue->SettledTickets(from);
          },
          py::arg("start") = 0,
          "How far this host's queue is settled: the first ticket (epoch * num_items + position) "
          "at or above `start` that is neither done nor, fed by a coordinator, another host's, "
          "and below the tickets granted so far. Epoch e is over on this host once it reaches "
          "(e + 1) * num_items; fed, that is once the host finished what it took of the epoch "
          "and took a ticket beyond it, or the coordinator has handed out every block. Raises "
          "InvalidArgumentError once closed.")
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
  return cls;
}

void DefineQueueFunctions(py::module_& m) {
  // The stats fields summary() returns, for tests and tools.
  m.attr("_stats_fields") = StatsFields();
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
          d["created_unix_ns"] = q.created_unix_ns;
          d["finished"] = q.finished;
          d["live_clients"] = q.live_clients;
          d["lease_timeout"] = q.lease_timeout_ms == 0 ? py::object(py::none())
                                                       : py::float_(q.lease_timeout_ms / 1e3);
          d["kept_reason"] = q.kept_reason;
          out.append(d);
        }
        return out;
      },
      "Queues of this user: a list of dicts (name, segment_path, valid, problem; of a valid "
      "queue also created_unix_ns, finished, live_clients, lease_timeout in seconds or None, and "
      "kept_reason: why it stays when its last process closes it unfinished, '' if it would be "
      "removed).");
  m.def(
      "inspect_queue",
      [](const py::object& queue_name) {
        std::string name = ToQueueName(queue_name);
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
      [](const py::object& queue_name, const py::object& force_arg) {
        std::string name = ToQueueName(queue_name);
        bool force = ToFlag(force_arg, "force");
        py::gil_scoped_release nogil;
        tc::RemoveQueue(name, force);
      },
      py::arg("name"), py::arg("force") = false,
      "Removes a queue's segment. Refuses (InvalidArgumentError naming the pids) while live "
      "processes use it, unless force. Raises NotFoundError.");
  m.def(
      "segment_path", [](const py::object& name) { return tc::SegmentPath(ToQueueName(name)); },
      py::arg("name"), "The shared-memory object path of a queue name for this user.");
  m.def(
      "_reopen_state",
      [](const py::object& state, const py::iterable& ranges, const py::object& queue_name) {
        tc::detail::Reopened out = tc::detail::ReopenRanges(ToQueueName(queue_name),
                                                            ToBytes(state, "_reopen_state: state"),
                                                            ToPieces(ranges, "_reopen_state"));
        return py::make_tuple(py::bytes(out.state), out.ranges);
      },
      py::arg("state"), py::arg("ranges"), py::arg("queue"),
      "(state, reopened): the queue checkpoint `state` (WorkQueue.state_dict()['state']) with "
      "every (ticket, begin, end) record range in `ranges` open again, and how many ranges were "
      "added as pieces. A range of a ticket the checkpoint counts as consumed (done, or below an "
      "open piece's begin) becomes a piece, minus what open pieces already cover; tickets at or "
      "past the cursor, and tickets neither done nor open (handed out whole after a restore), "
      "need nothing. `queue` names the queue in errors. Raises CorruptError (state is not a "
      "checkpoint) and InvalidArgumentError (a range with begin >= end or a ticket the checkpoint "
      "does not have).");
  m.def(
      "_consume_state",
      [](const py::object& state, const py::iterable& ranges, const py::object& queue_name) {
        return py::bytes(tc::detail::ConsumeRanges(ToQueueName(queue_name),
                                                   ToBytes(state, "_consume_state: state"),
                                                   ToPieces(ranges, "_consume_state")));
      },
      py::arg("state"), py::arg("ranges"), py::arg("queue"),
      "The queue checkpoint `state` with every (ticket, begin, end) record range in `ranges` "
      "counted as consumed: what open pieces hold of a range is cut out of them (a piece cut "
      "away entirely stays, empty, and its ticket is done). For batches ranks used before their "
      "loader committed them. `queue` names the queue in errors. Raises as _reopen_state.");
  m.def(
      "_host_id",
      [](const py::object& queue_name, const std::string& host_id) {
        tc::WorkQueueOptions o;
        o.name = ToQueueName(queue_name);
        o.host_id = host_id;
        return tc::detail::ResolveHostId(o);
      },
      py::arg("queue"), py::arg("host_id") = "",
      "The host id a queue fed by a coordinator uses (host_id, else TAILCUT_HOST_ID, else the "
      "hostname): its shared-memory queue is '<queue>.<host id>'. Raises InvalidArgumentError.");
  m.def(
      "_fed_restore_state",
      [](const py::object& tier, const py::object& host, const std::string& token) {
        return py::bytes(tc::FedRestoreState(ToBytes(tier, "_fed_restore_state: tier"),
                                             ToBytes(host, "_fed_restore_state: host"), token));
      },
      py::arg("tier"), py::arg("host"), py::arg("token"),
      "The restore_state of one host of a fed job from an exact checkpoint "
      "(tailcut::FedRestoreState): the coordinator's state with every host's, this host's own, "
      "and the token the hosts restoring together share.");
  m.def(
      "_merge_states",
      [](const py::iterable& states, const py::object& queue_name) {
        std::vector<std::string> parts;
        for (const py::handle& state : states)
          parts.push_back(
              ToBytes(py::reinterpret_borrow<py::object>(state), "_merge_states: a state"));
        return py::bytes(tc::detail::MergeStates(ToQueueName(queue_name), parts));
      },
      py::arg("states"), py::arg("queue"),
      "One queue checkpoint holding what every host state in `states` holds "
      "(engine/checkpoint.h MergeStates): the states of several hosts of a fed job for one host "
      "that resumes them all. `queue` names the queue in errors. Raises InvalidArgumentError "
      "(no state, or states of different jobs) and CorruptError.");
  m.def(
      "_empty_state",
      [](const py::object& like, const py::object& queue_name) {
        return py::bytes(
            tc::detail::EmptyState(ToQueueName(queue_name), ToBytes(like, "_empty_state: like")));
      },
      py::arg("like"), py::arg("queue"),
      "A queue checkpoint of the job of `like` with nothing handed out (engine/checkpoint.h "
      "EmptyState): what a host with no part of a fed job's checkpoint restores from. Raises "
      "CorruptError.");
  m.def(
      "_states_epoch",
      [](const py::iterable& states, const py::object& queue_name) {
        const std::string name = ToQueueName(queue_name);
        uint64_t low = UINT64_MAX, num_items = 1;
        std::vector<tc::detail::SavedState> saved;
        for (const py::handle& state : states) {
          saved.push_back(tc::detail::DeserializeState(
              name, ToBytes(py::reinterpret_borrow<py::object>(state), "_states_epoch: a state")));
          num_items = saved.back().num_items;
        }
        // The lowest ticket that no state has done: below each state's low
        // every ticket is done there, so it is one of the lows, or above.
        auto done = [&](uint64_t t) {
          for (const tc::detail::SavedState& s : saved) {
            if (t < s.low) return true;
            const uint64_t i = t / 64 - s.low / 64;
            if (t < s.cursor && i < s.words.size() && ((s.words[i] >> (t % 64)) & 1)) return true;
          }
          return false;
        };
        for (const tc::detail::SavedState& s : saved) {
          uint64_t t = s.low;
          while (done(t)) ++t;
          low = std::min({low, t, tc::detail::LowestOpenPiece(s)});
        }
        return saved.empty() ? 0 : low / num_items;
      },
      py::arg("states"), py::arg("queue"),
      "The epoch a job restored from the hosts' checkpoints `states` (WorkQueue._host_state()) "
      "starts in: that of the lowest ticket none of them has done, or with an open piece. `queue` "
      "names the queue in "
      "errors. Raises CorruptError.");
  m.def(
      "_state_epoch",
      [](const py::object& state, const py::object& queue_name) {
        tc::detail::SavedState s = tc::detail::DeserializeState(
            ToQueueName(queue_name), ToBytes(state, "_state_epoch: state"));
        return std::min(s.low, tc::detail::LowestOpenPiece(s)) / s.num_items;
      },
      py::arg("state"), py::arg("queue"),
      "The epoch a queue restored from checkpoint `state` starts in: that of its lowest ticket "
      "with work left (not done, or with an open piece). `queue` names the queue in errors. Raises "
      "CorruptError.");
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

}  // namespace tailcut::python
