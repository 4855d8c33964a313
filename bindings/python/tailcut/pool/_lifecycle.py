"""tailcut.pool._lifecycle: a pool's loaders live, fail and end with their job.

* Attempts. A PooledLoader opens its ring through open_trainer_ring(): under
  a host-wide lock on the ring's name, a ring that no live trainer uses is
  what a dead attempt (a crashed run, or the attempt torchrun restarts) left:
  its loaders still alive are killed, its segment, description, failure
  record and status removed, and a fresh ring is made. So a new attempt never pops a
  batch a dead one published. The lock is an abstract Unix socket: nothing
  in the file system, and the kernel drops it with its process.
* Parents. A loader a rank forked watches that rank (watch_parent): a
  parent-death signal is per thread of the parent, and a SIGKILL on the
  loader would skip the clean-up below, so a thread polls getppid(). When the
  parent is gone the loader waits up to _ORPHAN_GRACE for the ring's
  trainers to be gone too, removes what the job left (remove_pool) if none is
  left, and exits.
* Failures. A loader whose dataset or transform raises records the
  exception (report_failure: type, message, traceback, and the exception
  itself when it pickles) next to the pool's description; every rank looks
  for it at least every POLL seconds while it waits for a batch and raises
  it (raise_if_failed), its cause the loader's traceback. A rank that finds
  no live loader (pop) raises and records that the same way, and a rank
  that raises tells the others it has no batch (leave_step): none waits in
  silence for another. A record is written under the ring's lock and only
  while the ring exists, so none outlives the pool's removal. A forked
  loader that failed stays (linger) until its parent removed the pool and
  killed it, or died: torchrun ends the other ranks as soon as one raises,
  so the parent may be gone before it removed anything, and the loader's
  parent watch then does it.
* The end. end_pool() is PooledLoader.close()'s, also run at exit or when
  the PooledLoader is dropped: the process that started the loaders removes
  the ring's name, description, failure record and status once they are
  gone (after a failure: first, then it kills them). A batch still referenced keeps its
  mapping, never the name.

Every function here may be called from any process of the job; the files
it reads in /dev/shm are checked to be this user's and private first.
"""

import base64
import contextlib
import glob
import json
import logging
import math
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback

import tailcut
from tailcut import _private_files
from tailcut.pool._description import NO_SPACE_FIX, pool_spec_path
from tailcut.pool._stall import timeout_error
from tailcut.pool._status import status_path

log = logging.getLogger("tailcut.pool")

# How often a waiting rank looks for a failed loader, and a loader for its parent.
POLL = 0.25
_PARENT_POLL = 0.1
# How long an orphaned loader waits for the ring's trainers to go before it
# leaves the clean-up to the next attempt (or `tailcut clean`).
_ORPHAN_GRACE = 1.5
# A record holds an exception's message and traceback: small, unless a
# message is huge; more than this is not one a loader wrote.
_MAX_RECORD_BYTES = 64 << 20


def failure_path(ring_name):
    """/dev/shm/tailcut-pool.<euid>.<ring name>.error, beside the description."""
    return pool_spec_path(ring_name)[:-len(".json")] + ".error"


@contextlib.contextmanager
def ring_lock(ring_name, timeout=30.0):
    """Holds the host-wide lock on `ring_name` (this user's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = f"\0tailcut-pool.{os.geteuid()}.{ring_name}".encode()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                sock.bind(address)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise tailcut.TimeoutError(
                        f"batch ring '{ring_name}': another process held its lock for {timeout} s "
                        f"(a process stopped while opening or removing the ring?)") from None
                time.sleep(0.005)
        yield
    finally:
        sock.close()


def _unlink(path):
    # This user's files alone: another user's at one of the pool's names is
    # left to its owner, and refused where the pool writes or reads it.
    _private_files.remove(path)


def _pool_files(ring_name):
    """The files of a pool beside its ring: description, failure record, status."""
    return (pool_spec_path(ring_name), failure_path(ring_name), status_path(ring_name))


def remove_pool(ring_name):
    """Removes the ring's segment, description, failure record and status."""
    tailcut.remove_batch_ring(ring_name)
    for path in _pool_files(ring_name):
        _unlink(path)
        # A process killed while it wrote a record or status leaves its temporary file.
        for tmp in glob.glob(glob.escape(path) + ".*.tmp"):
            _unlink(tmp)


def _live_trainers(ring_name, but_pid=None, roles=("trainer",)):
    """How many clients of `roles` are alive in the ring (other than process
    `but_pid`); None if there is no ring."""
    try:
        stats = tailcut.inspect_batch_ring(ring_name)
    except tailcut.NotFoundError:
        return None
    return sum(c["alive"] and c["role"] in roles and c["pid"] != but_pid
               for c in stats["clients"])


def fence_dead_attempt(ring_name):
    """Under ring_lock: if the ring exists and no trainer is alive in it, kills
    its live loaders and removes it with its description, failure record and
    status. Returns a line saying what was removed, or None."""
    try:
        stats = tailcut.inspect_batch_ring(ring_name)
    except tailcut.NotFoundError:
        for path in _pool_files(ring_name):
            _unlink(path)
        return None
    live = [c for c in stats["clients"] if c["alive"]]
    if any(c["role"] == "trainer" for c in live):
        return None
    for c in live:  # a dead attempt's loaders: their parent is gone
        try:
            os.kill(c["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    remove_pool(ring_name)
    return (f"removed batch ring '{ring_name}' left by an earlier attempt of this job "
            f"({stats['ready']} batches ready, never popped; {len(live)} loaders killed): its "
            f"items go back to the queue")


def open_trainer_ring(ring_name, earlier, open_ring):
    """Fences dead attempts (the ring itself, and the names in `earlier`: the
    rings of this job's earlier attempts), then calls open_ring() under the
    same lock and returns what it returns."""
    for name in earlier:
        with ring_lock(name):
            said = fence_dead_attempt(name)
        if said:
            log.warning("tailcut.pool: %s", said)
    with ring_lock(ring_name):
        said = fence_dead_attempt(ring_name)
        if said:
            log.warning("tailcut.pool: %s", said)
        return open_ring()


def close_pool(ring_name, failed):
    """What the process that started a pool does last (its loaders are gone):
    removes the ring's name, description, failure record and status. After a loader
    failed, it first gives the other ranks up to 2 s to see the record."""
    if failed:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and (_live_trainers(ring_name) or 0) > 1:
            time.sleep(0.05)
    with ring_lock(ring_name):
        remove_pool(ring_name)


def watch_parent(parent_pid, ring_name):
    """In a loader forked by `parent_pid`: a daemon thread that ends this
    process within about _PARENT_POLL + _ORPHAN_GRACE seconds of its parent's
    death, removing the pool of ring `ring_name` when no trainer is left."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL)
        try:
            deadline = time.monotonic() + _ORPHAN_GRACE
            while time.monotonic() < deadline:
                if not _live_trainers(ring_name):
                    with ring_lock(ring_name, timeout=0.5):
                        if not _live_trainers(ring_name):
                            remove_pool(ring_name)
                    break
                time.sleep(0.05)
        finally:
            os._exit(1)

    threading.Thread(target=watch, name="tailcut-parent-watch", daemon=True).start()


def report_failure(ring_name, pid, exc, who="loader"):
    """Records a loader's exception for the ranks (the first one stays); also
    a rank's that found no loader left (`who` "rank"), so that the others
    raise it too instead of taking the ring's end at close for the epoch's."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record = dict(who=who, pid=pid, type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                  message=str(exc), traceback=text)
    try:
        record["pickle"] = base64.b64encode(pickle.dumps(exc)).decode("ascii")
    except Exception:
        pass
    # Under the lock that removing the pool takes: a record written after the
    # removal would be left in /dev/shm with nothing to remove it.
    try:
        with ring_lock(ring_name, timeout=5.0):
            _write_record(ring_name, pid, record)
            return
    except tailcut.TimeoutError:
        pass  # a process stopped while it held the lock: the ranks need the record more
    _write_record(ring_name, pid, record)


def _write_record(ring_name, pid, record):
    if _live_trainers(ring_name) is None:
        return  # the pool is gone: nobody is left to read it
    # Linked, not renamed, into place: the first loader's record stays.
    _private_files.write(failure_path(ring_name), json.dumps(record).encode("utf-8"),
                         "loader failure record", NO_SPACE_FIX, replace=False)


def linger():
    """What a forked loader does once it recorded its failure: waits to be
    ended, by its parent (end_pool kills it once the pool is removed) or by
    its parent watch (watch_parent, when the parent dies first: it removes
    the pool, then ends this process)."""
    while True:
        time.sleep(60)


class LoaderTraceback(Exception):
    """The cause of an exception raised at a rank for a failed loader: its traceback."""

    def __str__(self):
        return self.args[0]


class LoaderError(RuntimeError):
    """A loader failed with an exception that cannot be rebuilt at the rank."""


def failed(ring_name):
    """Whether a loader's failure is recorded (a file planted there is not a record)."""
    return _private_files.exists(failure_path(ring_name))


def raise_if_failed(ring_name):
    """Raises the exception a loader of the ring recorded, if any."""
    path = failure_path(ring_name)
    data = _private_files.read(path, "loader failure record", f"remove it (rm -f {path})",
                               _MAX_RECORD_BYTES)
    if data is None:
        return
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) for k in ("traceback", "type", "message")):
        raise tailcut.CorruptError(
            f"loader failure record {path} is not one that tailcut writes (JSON with "
            f"traceback, type and message); remove it (rm -f {path})")
    who = f"{record.get('who', 'loader')} process {record['pid']} of batch ring '{ring_name}'"
    cause = LoaderTraceback(f"{who} failed:\n{record['traceback']}")
    exc = None
    if "pickle" in record:
        try:
            exc = pickle.loads(base64.b64decode(record["pickle"]))
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = LoaderError(f"{who} failed: {record['type']}: {record['message']}")
    raise exc from cause


def print_failure(exc):
    """A loader's own report on stderr, one write (loaders share a terminal)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"tailcut.pool: loader {os.getpid()} failed; every rank raises this:\n"
                     f"{text}")
    sys.stderr.flush()


def pop(ring, ring_name, epoch, timeout, own_loaders, started, queue=None):
    """A rank's ring.pop(through_epoch=epoch) waiting up to `timeout` s,
    looking every POLL s for a failed loader (raise_if_failed) and for loaders
    at all: when the pool has its own loaders (`own_loaders`) and none is
    alive, it raises once that lasted 1 s, or at once when this process
    started loaders (`started`, multiprocessing.Process) and all exited.
    timeout=None waits for ever; past it, a tailcut.TimeoutError says what
    each loader is doing (_stall; `queue`, the rank's, adds the items each
    holds)."""
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    alone_since = None
    while True:
        raise_if_failed(ring_name)
        try:
            batch = ring.pop(through_epoch=epoch,
                             timeout=min(POLL, max(deadline - time.monotonic(), 0.0)))
        except tailcut.Empty:
            if time.monotonic() >= deadline:
                raise timeout_error(ring, ring_name, epoch, timeout, queue) from None
            if own_loaders:
                # A loader that failed records why before it exits: look again before
                # saying that no loader is left.
                raise_if_failed(ring_name)
                alone_since = _check_loaders(ring, ring_name, started, alone_since)
            continue
        if batch is None:
            raise_if_failed(ring_name)  # a failing loader may have ended the ring
        return batch


def leave_step(queue, rank, ranks, step):
    """A rank whose next batch raised says it has none at `step`, so that the
    others end the epoch there instead of waiting for it (and find a recorded
    failure as they drain the ring), as EqualSteps does."""
    try:
        queue.agree_step(rank, ranks, step, False, timeout=0)
    except Exception:
        pass  # the rank's own exception is the one to raise


def _check_loaders(ring, ring_name, started, since):
    stats = ring.stats()
    if any(c["alive"] and c["role"] == "loader" for c in stats["clients"]):
        return None
    mine_gone = bool(started) and all(p.exitcode is not None for p in started)
    if not mine_gone and stats["published"] == 0:
        return None  # the loaders have not started yet
    now = time.monotonic()
    since = now if since is None else since
    if mine_gone or now - since >= 1.0:
        codes = sorted({p.exitcode for p in started if p.exitcode is not None})
        exc = tailcut.Error(
            f"PooledLoader: batch ring '{ring_name}' has no live loader process and its epoch "
            f"has not ended (exit codes of the loaders this rank started: {codes or 'none'}): "
            f"was a loader killed? Start new ones with add_loaders() or `python3 -m "
            f"tailcut.pool --ring {ring_name}`")
        try:
            raise exc
        except tailcut.Error:
            report_failure(ring_name, os.getpid(), exc, who="rank")
            raise
    return since


def end_pool(ring, ring_name, local_rank0, loaders, spec_removal):
    """PooledLoader.close() after the rank's batches are released, also run
    when the PooledLoader is dropped or at exit: local rank 0 ends the ring
    (not after a loader failed: the other ranks would take the end for the
    epoch's); the process that started loaders (spec_removal[0] is set)
    waits for them, then removes the ring's name, description, failure
    record and status (close_pool); a process that started none removes
    them when no other process uses the ring."""
    failed_now = failed(ring_name)
    if local_rank0 and not failed_now:
        ring.end_epoch(None)
    started = spec_removal[0] is not None
    if started:
        spec_removal[0]()
    ring.close()
    if started and failed_now:
        # Before the loaders go: should this process be killed meanwhile
        # (torchrun ends the other ranks once one raised), the loaders, still
        # alive, remove the pool when they see it gone (watch_parent).
        close_pool(ring_name, failed_now)
    deadline = time.monotonic() + (0.0 if failed_now else 10.0)
    for p in loaders:
        p.join(max(deadline - time.monotonic(), 0.0))
        if p.is_alive():
            p.kill()
            p.join()
    if started and not failed_now:
        close_pool(ring_name, failed_now)
    elif not started:
        # No loader of this process will remove the ring: the last process to use it does,
        # whichever rank that is. Without loaders (closed before the first iteration) the
        # ranks do not meet, so one may remove the ring before another opens it again; and the
        # last to leave a ring never ended leaves it behind. This process's own slot still
        # reads alive after ring.close(): it does not count.
        with ring_lock(ring_name):
            if not _live_trainers(ring_name, but_pid=os.getpid(), roles=("trainer", "loader")):
                remove_pool(ring_name)


class LeaveOnSignals:
    """The first of `signums` asks the loader to leave (it publishes and acks
    what it holds first); the next one acts as it would have without this
    (SIGTERM ends the process, SIGINT raises KeyboardInterrupt). Only in the
    main thread, where Python runs signal handlers."""

    def __init__(self, signums):
        self.signums = signums if threading.current_thread() is threading.main_thread() else ()
        self.signum = None
        self._old = {}

    def __enter__(self):
        for s in self.signums:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                      else signal.SIG_DFL)

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False
