"""tailcut.pool: one pool of loader processes per host, feeding every local rank.

Loader processes (run_loader) take items from a QueueDataset's WorkQueue, read
their records, build batches (collate_fn, then transform) and publish them into
a tailcut BatchRing; every local rank pops the next ready batch (PooledLoader),
whichever loader made it. A slow batch delays one loader, not one rank.

Loaders join and leave while the epoch runs: PooledLoader.add_loaders(n) and
remove_loaders(n) in the job, or `python3 -m tailcut.pool --ring NAME` from
any shell of the host (main() below), which reads the pool's description
(pool_spec_path: the queue's options, the ring's size, how to build a batch)
that local rank 0 writes when it starts its loaders.

Batch layout in a slot: tailcut._batch_layout (encode_batch, decode_batch).
Each batch also carries the (ticket, begin, end) ranges of its records, so
that PooledLoader.state_dict() (tailcut._pool_state) can have the batches
not yet used read again after a restore.

Unit of recovery: the work item. A loader acks an item only after the batch
holding its last record is published. A loader killed while it holds items
(taken, not all records published): the queue hands those items out again
whole, so records of them that were already in published batches come out a
second time (at least once). Its unpublished slot goes back to the ring. No
item is lost and no slot leaks. Records of items it acked come out once. A
loader that leaves (SIGTERM, remove_loaders, Ctrl-C of the command) first
publishes what it holds and acks it: exactly once.

Epochs: a loader never acks an item of epoch e + 1 before every item of epoch
e is acked; the loader whose ack completes epoch e (WorkQueue summary 'done')
ends it in the ring, so trainers see the end of every epoch. See docs/pooled.md.
"""

import argparse
import atexit
import base64
import functools
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import pickle
import re
import signal
import sys
import time
import weakref

import numpy as np

import tailcut
from tailcut import _args, _core, _job, _lifecycle, _pool_spec, _pool_state
from tailcut._batch_layout import HEADER_BYTES, decode_batch, encode_batch
from tailcut._batch_layout import _DTYPES  # noqa: F401 (docs/pooled.md names it here)

__all__ = ["PooledLoader", "run_loader", "start_loaders", "encode_batch", "decode_batch",
           "item_records", "default_collate", "pool_spec_path", "read_pool_spec", "main",
           "HEADER_BYTES"]

_DEFAULT_BATCH_SIZE = 32
_RING_MAX_CLIENTS = 64
# A loader with nothing to do looks for a leave request (and a closed ring)
# this often; it bounds how long SIGTERM takes to be noticed.
_WAIT_SLICE = 0.1
_ACQUIRE_SLICE = 1.0


def _cuda_initialized():
    """True when torch is loaded and has initialized CUDA in this process."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available() and
                    torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


def item_records(path, begin, end, fmt, with_ends=False, item=None):
    """The records that start in [begin, end) of `path`, as bytes, for a
    queue format tag: 'fixed:<n>', 'lines' (also None or ''), 'tfrecord' or
    'file'. Parsed as the queue's reader parses them (tailcut.slice_records):
    lines lose their '\\n' and one trailing '\\r'; TFRecord CRCs are checked.
    with_ends=True: (records, ends), ends[i] the file offset just past record i.
    item: the WorkItem of the slice, to check the file is still the queue's."""
    name, _, size = (fmt or "lines").partition(":")
    return _core.slice_records(path, begin, end, name, int(size) if size else None,
                               with_ends=with_ends, item=item)


def default_collate(records, fmt):
    """Fixed-size records: an (n, record_bytes) uint8 array. Other formats
    (lines, tfrecord, file): (data, offsets), uint8 and int64, record i =
    data[offsets[i]:offsets[i + 1]]."""
    if fmt and fmt.startswith("fixed:"):
        size = int(fmt.split(":", 1)[1])
        return np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), size)
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in records], out=offsets[1:])
    return np.frombuffer(b"".join(records), dtype=np.uint8), offsets


# ---- How a loader builds a batch ---------------------------------------------------------------


class _Recipe:
    """records -> batch: record_transform on each record, collate_fn on the
    list (default: default_collate; torch's default_collate after a
    record_transform, as a DataLoader does), then transform on the batch,
    handed over as torch tensors when `tensors` is set (what a QueueDataset
    with batch_size hands its transform)."""

    def __init__(self, batch_size, collate_fn=None, transform=None, record_transform=None,
                 tensors=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.collate_fn, self.transform = collate_fn, transform
        self.record_transform, self.tensors = record_transform, bool(tensors)

    def build(self, records, fmt):
        if self.record_transform is not None:
            records = [self.record_transform(r) for r in records]
        if self.collate_fn is not None:
            batch = self.collate_fn(records)
        elif self.record_transform is not None:
            from torch.utils.data import default_collate as torch_collate
            batch = torch_collate(records)
        else:
            batch = default_collate(records, fmt)
        if self.tensors:
            batch = _torch_of(batch)
        if self.transform is not None:
            batch = self.transform(batch)
        return batch


def _torch_of(batch):
    from tailcut.torch import _tensor  # read-only collated arrays: torch's warning silenced once
    if isinstance(batch, np.ndarray):
        return _tensor(batch)
    if isinstance(batch, tuple) and all(isinstance(a, np.ndarray) for a in batch):
        return tuple(_tensor(a) for a in batch)
    return batch


def _recipe_for(dataset, batch_size=None, collate_fn=None, transform=None):
    """The recipe of a PooledLoader (or run_loader) over `dataset`: what is
    given, else what the QueueDataset was given (its batch_size; its
    transform, on batches when it batches, else on each record), so that
    replacing a DataLoader over the dataset is a one-line change."""
    ds_batch = getattr(dataset, "batch_size", None)
    ds_transform = getattr(dataset, "transform", None)
    size = batch_size if batch_size is not None else (ds_batch or _DEFAULT_BATCH_SIZE)
    if transform is not None or ds_transform is None:
        return _Recipe(size, collate_fn, transform)
    if ds_batch is not None:
        return _Recipe(size, collate_fn, ds_transform, tensors=True)
    return _Recipe(size, collate_fn, record_transform=ds_transform)


# ---- The loader loop ---------------------------------------------------------------------------


class _EpochGate:
    """Keeps a loader from acking items of epoch e + 1 before every item of
    epoch e is acked, and ends epoch e in the ring once it is."""

    def __init__(self, queue, ring):
        self.queue, self.ring = queue, ring
        self.ended = -1

    def done(self):
        return self.queue.summary()["done"]

    def try_end(self):
        done = self.done()
        n = self.queue.num_items
        while self.ended + 1 < self.queue.num_epochs and done >= (self.ended + 2) * n:
            self.ended += 1
            self.ring.end_epoch(self.ended)
        return self.ended


class _RingClosed(Exception):
    """The job closed its ring (every epoch ended): the loader leaves."""


_LeaveOnSignals = _lifecycle.LeaveOnSignals


def _load(queue, ring, recipe, leave, poll):
    """The loop of one loader: takes items, reads their records, publishes
    batches of recipe.batch_size records (the last one of each of this
    loader's epochs, and the one it leaves with, may be shorter) and acks each
    item once the batch with its last record is published. Runs until the
    queue has no item left, leave() says so, or the ring is closed. Returns
    its counts and why it stopped ('end', 'left' or 'ring closed')."""
    fmt = queue.format
    gate = _EpochGate(queue, ring)
    gate.try_end()  # a loader that joins late starts at the job's epoch
    counts = dict(batches=0, records=0, items=0, stopped="end")
    pending, done_items, spans = [], [], _pool_state.Spans()
    epoch = None

    def acquire():
        while True:
            try:
                return ring.acquire(timeout=_ACQUIRE_SLICE)
            except tailcut.Empty:
                if ring.stats()["closed"]:
                    raise _RingClosed() from None

    def flush(reading=None):
        # reading: (item, offset) of the item whose records are being read,
        # the offset just past its last record in `pending`.
        nonlocal pending, done_items
        if pending:
            batch = recipe.build(pending, fmt)
            slot = acquire()
            try:
                nbytes = encode_batch(batch, slot.data, slot.header, spans.ranges)
            except BaseException:
                ring.abandon(slot)
                raise
            if not ring.publish(slot, epoch, len(pending), nbytes):
                ring.abandon(slot)
                if ring.stats()["closed"]:
                    raise _RingClosed()
                raise tailcut.InvalidArgumentError(
                    f"batch ring '{ring.name}': epoch {epoch} was ended while this loader still "
                    f"had records of it (was the ring ended by hand?)")
            counts["batches"] += 1
            counts["records"] += len(pending)
        for item in done_items:  # every record of these is in a published batch
            item.ack()
        if reading is not None:
            # Its records up to offset are published: should this loader die
            # now, the item is read again from there, not from its start.
            item, offset = reading
            item.commit(min(offset, item.end))
        counts["items"] += len(done_items)
        pending, done_items = [], []
        spans.clear()
        gate.try_end()

    try:
        while True:
            if leave():
                counts["stopped"] = "left"
                break
            try:
                item = queue.take(timeout=0)
            except tailcut.Empty:
                # Nothing to take now: publish and ack what this loader holds
                # first, since a take that waits may be waiting for its items.
                flush()
                try:
                    item = queue.take(timeout=_WAIT_SLICE)
                except tailcut.Empty:
                    continue
            if item is None:
                break
            if epoch is not None and item.epoch != epoch:
                flush()
            if item.epoch > gate.ended + 1:
                # Epoch item.epoch - 1 has items open elsewhere: hand this one
                # back and look again (an item of that epoch may come back from
                # a dead loader, and must be read by someone).
                item.give_back()
                time.sleep(poll)
                gate.try_end()
                continue
            epoch = item.epoch
            records, ends = item_records(item.path, item.begin, item.end, fmt, with_ends=True,
                                          item=item)
            start = item.begin
            for record, end in zip(records, ends):
                pending.append(record)
                spans.add(item.ticket, start, min(end, item.end))
                start = end
                if len(pending) == recipe.batch_size:
                    flush((item, end))
            done_items.append(item)
        flush()  # leaving too: what it holds is published, so nothing comes out twice
        while counts["stopped"] == "end" and gate.try_end() + 1 < queue.num_epochs:
            if leave():  # another loader still holds the last items
                counts["stopped"] = "left"
                break
            time.sleep(poll)
    except _RingClosed:
        # The job is over (or stopped early): what this loader holds goes back
        # to the queue when it closes it.
        counts["stopped"] = "ring closed"
    return counts


def run_loader(dataset, ring_name, *, batch_size=None, slot_bytes, num_slots, collate_fn=None,
               transform=None, max_clients=_RING_MAX_CLIENTS, poll=0.005, stop=None):
    """Runs one loader process's loop until the queue has no item left (or
    it is asked to leave): takes items, reads their records, publishes
    batches of batch_size records (the last of each epoch of this loader may
    be shorter), acks each item after the batch with its last record is
    published. Returns the batches it published.

    `dataset` is a tailcut.torch.QueueDataset; batch_size, collate_fn and
    transform default to its own (see PooledLoader). The loader leaves early,
    after publishing and acking what it holds, on SIGTERM (when run in the
    main thread), when stop() returns true, or when the job closes the ring."""
    _args.count("batch_size", batch_size, minimum=1, allow_none=True)
    _args.seconds("poll", poll)
    for key, fn in (("collate_fn", collate_fn), ("transform", transform), ("stop", stop)):
        _args.callable_or_none(key, fn)
    recipe = _recipe_for(dataset, batch_size, collate_fn, transform)
    ring = _core.BatchRing(ring_name, slot_bytes, num_slots, "loader", max_clients=max_clients)
    try:
        with _LeaveOnSignals((signal.SIGTERM,)) as signals:
            def leave():
                return signals.signum is not None or (stop is not None and stop())
            counts = _load(dataset.queue, ring, recipe, leave, poll)
    finally:
        ring.close()
    return counts["batches"]


def start_loaders(dataset, ring_name, num_workers, **kwargs):
    """Starts num_workers loader processes (forked) running run_loader; returns them."""
    num_workers = _args.count("num_workers", num_workers)
    # What the loaders would refuse, refused here, not in each child.
    inspect.signature(run_loader).bind(dataset, ring_name, **kwargs)
    for key in set(kwargs) & {"slot_bytes", "num_slots", "max_clients", "batch_size"}:
        _args.count(key, kwargs[key], minimum=1, allow_none=key == "batch_size")
    ctx = multiprocessing.get_context("fork")
    procs = []
    for _ in range(num_workers):
        p = ctx.Process(target=_loader_main, args=(dataset, ring_name, kwargs, os.getpid()),
                        daemon=True)
        p.start()
        procs.append(p)
    return procs


def _loader_main(dataset, ring_name, kwargs, parent_pid):
    _lifecycle.watch_parent(parent_pid, ring_name)
    try:
        run_loader(dataset, ring_name, **kwargs)
    except Exception as e:  # the ranks raise it (see _lifecycle)
        _lifecycle.report_failure(ring_name, os.getpid(), e)
        _lifecycle.print_failure(e)
        os._exit(1)
    close = getattr(dataset, "close", None)
    if close is not None:
        close()  # leaves the queue now rather than at the next death check
    os._exit(0)  # not the parent's atexit handlers


def _env_int(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


# ---- The pool's description, for loaders that join from elsewhere ------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


def pool_spec_path(ring_name):
    """Where a pool's description lives while its job runs:
    /dev/shm/tailcut-pool.<euid>.<ring name>.json, beside the ring's segment
    (every process that can open the ring sees the same /dev/shm)."""
    if not isinstance(ring_name, str) or not _NAME_RE.fullmatch(ring_name):
        raise tailcut.InvalidArgumentError(
            f"batch ring name {ring_name!r}: use only A-Z a-z 0-9 . _ -")
    return f"/dev/shm/tailcut-pool.{os.geteuid()}.{ring_name}.json"


def _callable_ref(fn):
    """How another process gets `fn`: a pickle (a module-level function or
    class, or an instance of one) or, when there is none, why not."""
    if fn is None:
        return None
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    ref = dict(describe=f"{module}.{qualname}")
    if module == "__main__":
        ref["error"] = "is defined in the job's main script, which another process cannot import"
        return ref
    try:
        ref["pickle"] = base64.b64encode(pickle.dumps(fn)).decode("ascii")
    except Exception as e:  # lambdas, closures, objects holding them
        ref["error"] = f"cannot be pickled ({type(e).__name__}: {e})"
    return ref


def _write_spec(ring_name, queue, recipe, slot_bytes, num_slots, max_clients, poll):
    """Writes the pool's description (mode 0600, replaced atomically); returns its path."""
    path = pool_spec_path(ring_name)
    args = {k: v for k, v in queue.open_args.items() if k not in ("on_notice", "restore_state")}
    if args.get("prefix") is not None:
        args["prefix"] = os.fsdecode(args["prefix"])
    spec = dict(
        version=_pool_spec.VERSION, ring=ring_name, slot_bytes=slot_bytes, num_slots=num_slots,
        max_clients=max_clients, poll=poll, queue=args, format=queue.format,
        batch_size=recipe.batch_size, tensors=recipe.tensors,
        callables={k: _callable_ref(getattr(recipe, k))
                   for k in ("collate_fn", "transform", "record_transform")},
        cwd=os.getcwd(), sys_path=[p for p in sys.path if isinstance(p, str)],
        pid=os.getpid(), written=time.time())
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f, default=os.fspath)  # a PathLike option; anything else raises
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_pool_spec(ring_name):
    """The description of the pool of ring `ring_name` (a dict), written by
    the job's PooledLoader, every field checked (tailcut/_pool_spec.py).
    Raises NotFoundError when there is none, PermissionDeniedError unless the
    file is this user's and private to it (it may name code to run),
    CorruptError when it is not a pool description."""
    return _pool_spec.read(pool_spec_path(ring_name), ring_name)


def _remove_spec(ring_name, writer_pid):
    """Removes the description, in the process that wrote it only (a forked
    child that exits normally must not remove its parent's)."""
    if os.getpid() != writer_pid:
        return
    try:
        os.unlink(pool_spec_path(ring_name))
    except FileNotFoundError:
        pass


# ---- PooledLoader ------------------------------------------------------------------------------

_Held = _pool_state.Held  # a leftover batch carried into the next epoch


class PooledLoader:
    """Batches from a host-wide pool of loader processes, equal steps per rank.

    PooledLoader(dataset, num_workers=2, batch_size=None, collate_fn=None,
                 transform=None, slot_bytes=4 << 20, num_slots=16, rank=None,
                 world_size=None, local_rank=None, name=None, timeout=1800.0,
                 carry_over=True, on_leftover=None)

    `dataset` is a tailcut.torch.QueueDataset. Local rank 0 ($LOCAL_RANK,
    else local_rank, else rank, else 0) starts num_workers loader processes
    (run_loader) for the whole host on the first iteration; add_loaders(n)
    and remove_loaders(n) change their number at any time, and
    `python3 -m tailcut.pool --ring NAME` adds one from any shell. Every rank
    pops the next ready batch of the host's ring.

    batch_size, collate_fn and transform default to the dataset's: its
    batch_size (else 32), and its transform, which then runs in the loaders
    as it would have in DataLoader workers (on each batch, as torch tensors,
    if the dataset batches; else on each record, before collate_fn or torch's
    default_collate). So DataLoader(ds, ..., num_workers=2) per rank becomes
    PooledLoader(ds, ..., num_workers=8) per host.

    Iterating runs one epoch (set_epoch(e), else 0, 1, ...) and yields each
    batch as torch tensors over the ring's shared memory (no copy), READ-ONLY
    AND VALID UNTIL THE NEXT BATCH IS REQUESTED: the previous batch is
    released then. Every local rank gets the same number of batches per epoch
    (WorkQueue.agree_step over the $LOCAL_WORLD_SIZE ranks, else world_size);
    the batches left when one rank has none are counted in `reports` and,
    with carry_over=True (the default: every record once per epoch), yielded
    first in the next epoch (copied); otherwise, and after the queue's last
    epoch, each is passed to on_leftover(batch) and released, and a warning
    says how many records were dropped, as EqualSteps does. len() is this
    rank's steps per epoch, an estimate (records per epoch / batch_size /
    local ranks). Failures, restarts, what is left: tailcut._lifecycle.
    """

    def __init__(self, dataset, num_workers=2, batch_size=None, collate_fn=None, transform=None,
                 slot_bytes=4 << 20, num_slots=16, rank=None, world_size=None, local_rank=None,
                 name=None, timeout=1800.0, carry_over=True, on_leftover=None):
        self.dataset = dataset
        self.queue = dataset.queue
        self.num_workers = _args.count("num_workers", num_workers)
        _args.count("batch_size", batch_size, minimum=1, allow_none=True)
        for key, fn in (("collate_fn", collate_fn), ("transform", transform),
                        ("on_leftover", on_leftover)):
            _args.callable_or_none(key, fn)
        self._recipe = _recipe_for(dataset, batch_size, collate_fn, transform)
        self.batch_size = self._recipe.batch_size
        self.collate_fn, self.transform = collate_fn, transform
        self.slot_bytes = _args.count("slot_bytes", slot_bytes, minimum=1)
        self.num_slots = _args.count("num_slots", num_slots, minimum=1)
        rank = _args.count("rank", rank, allow_none=True)
        world_size = _args.count("world_size", world_size, minimum=1, allow_none=True)
        local_rank = _args.count("local_rank", local_rank, allow_none=True)
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.local_rank = _env_int("LOCAL_RANK", self.rank) if local_rank is None else local_rank
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", self.world_size)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} is not in "
                             f"[0, {self.local_world_size})")
        self.name = name or f"{self.queue.name}.pool"
        self.timeout = _args.seconds("timeout", timeout, allow_zero=False, allow_none=True)
        self.carry_over = _args.flag("carry_over", carry_over)
        self.on_leftover = on_leftover
        # Pinned for CUDA only where this process already chose its device
        # (torch.cuda.set_device, or any CUDA work): registering first would
        # make a context on device 0 for every rank. See docs/pooled.md.
        # A ring no live trainer uses is a dead attempt's: removed first, never popped.
        self.ring = _lifecycle.open_trainer_ring(
            self.name, _job.earlier_attempts(self.name),
            lambda: _core.BatchRing(self.name, self.slot_bytes, self.num_slots, "trainer",
                                    max_clients=_RING_MAX_CLIENTS,
                                    cuda_register=_cuda_initialized()))
        self.epoch = _pool_state.restored_epoch(dataset)  # a resumed queue's, else 0
        self.reports = []
        self.loaders = []  # the loader processes this process started
        self._leaving = set()  # pids of those asked to leave
        self._started = False
        self._spec_holder = [None]  # removes the description written here
        # close()'s end, also at GC or exit (DataLoader users never close()); registered
        # after multiprocessing's exit handler, so it runs before that one.
        self._end = weakref.finalize(self, _lifecycle.end_pool, self.ring, self.name,
                                     self.local_rank == 0, self.loaders, self._spec_holder)
        self._end.atexit = False
        atexit.register(self._end)
        self._current = None
        self._stash = None
        self._carried = []  # _Held leftovers for the next epoch
        self._carried_now = []  # those not yet yielded in this epoch
        self._position = (self.epoch, 0)  # (epoch, steps done in it), for state_dict()

    def state_dict(self):
        """The pool's data position, the same dict on every local rank: call it
        on every local rank at the same step (after the step: the batch a rank
        holds counts as used) and save rank 0's. Batches published but not
        used (in the ring, held for the next epoch, carried over) and records
        loaders read ahead are read again after a restore; see docs/pooled.md,
        "Restarts and checkpoints". More than one local rank: collective over
        torch.distributed."""
        return _pool_state.state_dict(self)

    def load_state_dict(self, state):
        """Resumes at state['epoch']: the dataset's queue must have been opened
        with restore_state=state['queue'] (InvalidArgumentError otherwise)."""
        _pool_state.load_state_dict(self, state)

    def set_epoch(self, epoch):
        """The epoch the next iteration runs."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < (1 << 30):
            raise ValueError(f"epoch must be an int in [0, 2**30), got {epoch!r}")
        self.epoch = epoch

    def __len__(self):
        counter = getattr(self.dataset, "records_per_epoch", None)
        if counter is not None:
            records, _ = counter()
        else:
            total = sum(os.path.getsize(p) for p in self.queue.paths)
            fmt = self.queue.format or "lines"
            records = total // int(fmt.split(":", 1)[1]) if fmt.startswith("fixed:") else total
        return records // self.batch_size // self.local_world_size

    def _loader_kwargs(self):
        return dict(batch_size=self._recipe.batch_size, slot_bytes=self.slot_bytes,
                    num_slots=self.num_slots, collate_fn=self.collate_fn,
                    transform=self.transform, max_clients=_RING_MAX_CLIENTS)

    def _publish_spec(self):
        if self._spec_holder[0] is None:
            _write_spec(self.name, self.queue, self._recipe, self.slot_bytes, self.num_slots,
                        _RING_MAX_CLIENTS, 0.005)
            self._spec_holder[0] = functools.partial(_remove_spec, self.name, os.getpid())

    def start_loaders(self):
        """Starts this host's num_workers loader processes (done by local rank
        0 on the first iteration) and writes the pool's description, so that
        `python3 -m tailcut.pool --ring NAME` can add loaders; once."""
        if not self._started:
            self._started = True
            self._publish_spec()
            self.loaders += start_loaders(self.dataset, self.name, self.num_workers,
                                          **self._loader_kwargs())
        return self.loaders

    def add_loaders(self, n=1):
        """Starts n more loader processes for the host now, also mid-epoch and
        from any local rank; they take items from the queue like the others.
        Returns them (multiprocessing.Process)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self._publish_spec()
        procs = start_loaders(self.dataset, self.name, n, **self._loader_kwargs())
        self.loaders += procs
        return procs

    def remove_loaders(self, n=1):
        """Asks n of the loader processes this process started (the newest
        first) to leave: each publishes and acks what it holds, then exits
        (SIGTERM). Returns them without waiting: a loader may have to wait for
        a free slot, which this rank frees by iterating."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        live = [p for p in self.loaders if p.exitcode is None and p.pid not in self._leaving]
        chosen = live[len(live) - min(n, len(live)):]
        for p in chosen:
            self._leaving.add(p.pid)
            p.terminate()
        return chosen

    def _release_current(self):
        if self._current is not None:
            batch, self._current = self._current, None
            self.ring.release(batch)

    def _next(self, epoch, report):
        """The next batch of `epoch` (or, with carry_over, a late one of an
        earlier epoch), or None at its end."""
        self._release_current()
        while True:
            if self._stash is not None:
                if self._stash.epoch > epoch:
                    return None
                batch, self._stash = self._stash, None
            else:
                batch = _lifecycle.pop(self.ring, self.name, epoch, self.timeout,
                                       self.num_workers > 0, self.loaders)
                if batch is None:
                    return None
            if batch.epoch == epoch:
                return batch
            if batch.epoch > epoch:
                self._stash = batch  # the next epoch's first
                return None
            # An earlier epoch's, published after the ranks ended it: late.
            report["late_batches"] += 1
            if self.carry_over:
                return batch
            self._drop(batch, report)

    def _tensors(self, batch, copy=False):
        from tailcut.torch import _tensor  # read-only views: torch's warning silenced once
        arrays = decode_batch(batch.data, batch.header)
        if copy:
            arrays = (tuple(a.copy() for a in arrays) if isinstance(arrays, tuple)
                      else arrays.copy())
        if isinstance(arrays, tuple):
            return tuple(_tensor(a) for a in arrays)
        return _tensor(arrays)

    def _drop(self, batch, report):
        """A leftover batch not carried: counted, shown to on_leftover, released."""
        report["leftover_records"] += batch.records
        report["dropped_batches"] += 1
        report["dropped_records"] += batch.records
        if isinstance(batch, _Held):
            if self.on_leftover is not None:
                self.on_leftover(batch.tensors)
            return
        try:
            if self.on_leftover is not None:
                self.on_leftover(self._tensors(batch))
        finally:
            self.ring.release(batch)

    def _leftover(self, batch, report, last_epoch):
        report["leftover_batches"] += 1
        if not self.carry_over or last_epoch:
            self._drop(batch, report)
            return
        report["leftover_records"] += batch.records
        report["carried_out"] += 1
        if isinstance(batch, _Held):
            self._carried.append(batch)
            return
        try:
            self._carried.append(_Held(self._tensors(batch, copy=True), batch.records,
                                       _pool_state.batch_ranges(batch.data, batch.header),
                                       batch.epoch))
        finally:
            self.ring.release(batch)

    def _agree(self, epoch, step, has_batch):
        status = self.queue.agree_step(self.local_rank, self.local_world_size,
                                       (epoch << 32) | step, has_batch, timeout=self.timeout)
        if status == "timeout":
            raise tailcut.TimeoutError(
                f"PooledLoader: local rank {self.local_rank} waited {self.timeout} s at epoch "
                f"{epoch}, step {step} for ranks that did not arrive")
        return status == "all_have_batch"

    def __iter__(self):
        return self._epoch_steps()

    def _epoch_steps(self):
        if self.local_rank == 0:
            self.start_loaders()
        epoch = self.epoch
        self.epoch = epoch + 1
        last_epoch = epoch + 1 >= self.queue.num_epochs
        carried, self._carried = self._carried, []
        self._carried_now = carried
        self._position = (epoch, 0)
        report = dict(epoch=epoch, steps=0, carried_in=len(carried), leftover_batches=0,
                      leftover_records=0, late_batches=0, carried_out=0, dropped_batches=0,
                      dropped_records=0)
        self.reports.append(report)
        step = 0

        def next_batch():
            return carried.pop(0) if carried else self._next(epoch, report)

        try:
            while True:
                try:
                    batch = next_batch()
                except BaseException:
                    _lifecycle.leave_step(self.queue, self.local_rank, self.local_world_size,
                                          (epoch << 32) | step)
                    raise
                if self._agree(epoch, step, batch is not None):
                    step += 1
                    report["steps"] = step
                    self._position = (epoch, step)
                    if isinstance(batch, _Held):
                        yield batch.tensors
                    else:
                        self._current = batch
                        yield self._tensors(batch)
                    continue
                while batch is not None:  # the group ended the epoch: the rest is left over
                    self._leftover(batch, report, last_epoch)
                    batch = next_batch()
                self._position = (epoch + 1, 0)
                break
        finally:
            self._release_current()
        if report["dropped_records"] and self.on_leftover is None:
            why = ("the queue has no later epoch to carry them into" if self.carry_over else
                   "pass carry_over=True to use them in the next epoch")
            _lifecycle.log.warning(
                "tailcut.pool: rank %d dropped %d leftover records (%d batches) at the end of "
                "epoch %d (%s, or on_leftover= to handle them)", self.rank,
                report["dropped_records"], report["dropped_batches"], epoch, why)

    def close(self):
        """Releases what this rank holds and leaves the ring. Local rank 0
        ends the ring (every epoch; loaders still running leave, giving their
        items back to the queue). The process that started loaders waits for
        them (those still running 10 s later are killed: their items go back
        to the queue), then removes the ring's name and the pool's
        description: a batch still referenced keeps its mapping, not the
        name. Done at exit or when the loader is dropped, if not before.
        Idempotent."""
        if self.ring.closed:
            return
        self._release_current()
        if self._stash is not None:
            self.ring.release(self._stash)
            self._stash = None
        self._carried = self._carried_now = []
        self._end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- python3 -m tailcut.pool -------------------------------------------------------------------


class _CliError(Exception):
    pass


def _load_named(text, what):
    """MODULE:NAME or FILE.py:NAME (NAME may be dotted), or 'none'."""
    if text.lower() == "none":
        return None
    where, sep, name = text.rpartition(":")
    if not sep or not where or not name:
        raise _CliError(f"--{what} {text!r}: expected MODULE:NAME, FILE.py:NAME or none")
    try:
        if where.endswith(".py") or os.sep in where:
            path = os.path.abspath(where)
            module_name = "_tailcut_pool_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None:
                raise ImportError(f"not a Python file: {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)  # as a module: its __main__ block does not run
        else:
            module = importlib.import_module(where)
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise _CliError(f"--{what} {text!r}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise _CliError(f"--{what} {text!r} is a {type(obj).__name__}, not a callable")
    return obj


def _job_callable(spec, key, override):
    if override is not None:
        return _load_named(override, key.replace("_", "-"))
    ref = spec["callables"].get(key)
    if ref is None:
        return None
    flag = "--" + key.replace("_", "-")
    if "error" in ref:
        raise _CliError(f"the job's {key} ({ref['describe']}) {ref['error']}: move it to a module "
                        f"the job imports, or pass {flag} MODULE:NAME or FILE.py:NAME")
    try:
        return pickle.loads(base64.b64decode(ref["pickle"]))
    except Exception as e:
        raise _CliError(f"the job's {key} ({ref['describe']}) cannot be loaded here "
                        f"({type(e).__name__}: {e}): pass {flag} MODULE:NAME or "
                        f"FILE.py:NAME") from None


def _live(ring_name):
    """(ring stats, queue summary) of a running job, or raises _CliError."""
    try:
        ring = tailcut.inspect_batch_ring(ring_name)
    except tailcut.NotFoundError:
        raise _CliError(f"batch ring '{ring_name}' does not exist: the job has ended (or "
                        f"never started); nothing to join") from None
    if not any(c["alive"] for c in ring["clients"]):
        raise _CliError(f"batch ring '{ring_name}' has no live process: the job has ended")
    if ring["closed"]:
        raise _CliError(f"batch ring '{ring_name}' is closed: the job is ending")
    return ring


def _list_pools(out):
    prefix = f"tailcut-pool.{os.geteuid()}."
    names = sorted(f[len(prefix):-5] for f in os.listdir("/dev/shm")
                   if f.startswith(prefix) and f.endswith(".json"))
    if not names:
        print("no pools on this host (a PooledLoader's local rank 0 describes its pool when it "
              "starts its loaders)", file=out)
        return
    print(f"{'RING':32s} {'QUEUE':28s} {'EPOCH':>7s} {'LOADERS':>7s} {'TRAINERS':>8s} "
          f"{'READY':>7s}  STATE", file=out)
    for name in names:
        try:
            spec = read_pool_spec(name)
            ring = _live(name)
            q = tailcut.inspect_queue(spec["queue"]["name"])
        except (tailcut.Error, _CliError, ValueError, OSError) as e:
            print(f"{name:32s} stale: {e}", file=out)
            continue
        live = [c for c in ring["clients"] if c["alive"]]
        loaders = sum(c["role"] == "loader" for c in live)
        trainers = sum(c["role"] == "trainer" for c in live)
        ready = f"{ring['ready']}/{ring['num_slots']}"
        print(f"{name:32s} {q['name']:28s} {q['epoch']:>3d}/{q['num_epochs']:<3d} {loaders:>7d} "
              f"{trainers:>8d} {ready:>7s}  {'no batch ready' if ring['ready'] == 0 else 'ok'}",
              file=out)


_EPILOG = """\
The job's local rank 0 describes its pool in /dev/shm/tailcut-pool.<uid>.<ring>.json when it
starts its loaders (PooledLoader: on the first iteration); this command reads it, opens the
job's WorkQueue and BatchRing, and loads batches as the job's own loaders do, the same batch
size and transform, until the queue's last epoch ends. The ring's name is the PooledLoader's
`name`, by default '<queue name>.pool' (--list shows the pools of this host).

The job's collate_fn/transform come with the description when they can be imported from
here (defined in a module, not in the main script, and picklable); otherwise name them with
--transform/--collate-fn/--record-transform MODULE:NAME or FILE.py:NAME (a file is loaded as
a module: its `if __name__ == "__main__":` block does not run).

Leaving: SIGTERM or Ctrl-C makes the loader publish and ack what it holds, then exit 0 (a
second one stops it at once; its items then go back to the queue and records of them may come
out twice). Exit status: 0 when the data ended, the loader left, or the job closed its ring;
1 on an error (the message says what to do); 2 on a bad command line.
"""


def main(argv=None):
    """`python3 -m tailcut.pool`: adds one loader process to a running job's pool."""
    parser = argparse.ArgumentParser(
        prog="python3 -m tailcut.pool",
        description="Add one loader process to the pool of a running job on this host: it takes "
                    "items from the job's work queue and publishes batches into its batch ring.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring", metavar="NAME",
                        help="the job's batch ring (PooledLoader name; default '<queue>.pool')")
    parser.add_argument("--list", action="store_true",
                        help="list the pools of this host that a loader can join, and exit")
    for key, what in (("transform", "the batch transform"),
                      ("collate-fn", "the collate function (records -> batch)"),
                      ("record-transform", "the per-record transform")):
        parser.add_argument(f"--{key}", metavar="REF",
                            help=f"{what} instead of the job's: MODULE:NAME, FILE.py:NAME or none")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not print when the loader joins and leaves")
    args = parser.parse_args(argv)
    if args.list:
        _list_pools(sys.stdout)
        return 0
    if not args.ring:
        parser.error("--ring NAME is required (or --list)")

    def say(text):
        if not args.quiet:
            # One write per line: loaders of one host often share a terminal.
            sys.stderr.write(f"tailcut.pool: loader {os.getpid()} {text}\n")
            sys.stderr.flush()

    queue = ring = None
    try:
        spec = read_pool_spec(args.ring)
        _live(args.ring)
        qname = spec["queue"]["name"]
        try:
            summary = tailcut.inspect_queue(qname)
        except tailcut.NotFoundError:
            raise _CliError(f"the job's queue '{qname}' does not exist: the job has "
                            f"ended") from None
        if summary["done"] >= summary["total"]:
            raise _CliError(f"the job's queue '{qname}' is done: nothing left to load")
        # The job's imports, then its relative paths, as the job sees them.
        sys.path.extend(p for p in spec["sys_path"] if p not in sys.path)
        recipe = _Recipe(spec["batch_size"],
                         collate_fn=_job_callable(spec, "collate_fn", args.collate_fn),
                         transform=_job_callable(spec, "transform", args.transform),
                         record_transform=_job_callable(spec, "record_transform",
                                                        args.record_transform),
                         tensors=spec["tensors"])
        try:
            os.chdir(spec["cwd"])
        except OSError as e:
            raise _CliError(f"the job's working directory {spec['cwd']!r} (from "
                            f"{pool_spec_path(args.ring)}): {e.strerror}; run this where it "
                            f"exists (the same host and mounts as the job)") from None
        queue = tailcut.WorkQueue(**spec["queue"])
        ring = _core.BatchRing(args.ring, spec["slot_bytes"], spec["num_slots"], "loader",
                               max_clients=spec["max_clients"])
        s = queue.summary()
        loaders = sum(c["alive"] and c["role"] == "loader" for c in ring.stats()["clients"])
        say(f"joined ring '{args.ring}' (queue '{qname}', epoch {s['epoch']} of "
            f"{queue.num_epochs}, {s['done']} of {s['total']} items done; {loaders} loaders "
            f"now)")
        with _LeaveOnSignals((signal.SIGTERM, signal.SIGINT)) as signals:
            counts = _load(queue, ring, recipe, lambda: signals.signum is not None,
                           spec["poll"])
        why = {"end": "finished (no item left)", "ring closed": "stopped (the job closed its ring)"}
        if counts["stopped"] == "left":
            why["left"] = f"left on {signal.Signals(signals.signum).name}"
        say(f"{why[counts['stopped']]}: published {counts['batches']} batches, "
            f"{counts['records']} records of {counts['items']} items")
        return 0
    except KeyboardInterrupt:
        print("python3 -m tailcut.pool: interrupted; the items this loader held go back to the "
              "queue", file=sys.stderr)
        return 130
    except _CliError as e:
        print(f"python3 -m tailcut.pool: {e}", file=sys.stderr)
        return 1
    except tailcut.Error as e:
        print(f"python3 -m tailcut.pool: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if ring is not None:
            ring.close()
        if queue is not None:
            queue.close()


if __name__ == "__main__":
    # Run the module's own copy (tailcut.pool), not this __main__ one, so that
    # objects the job pickled by reference to tailcut.pool resolve to it.
    from tailcut.pool import main as _main
    sys.exit(_main())
