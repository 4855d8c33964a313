"""The loader loop: one loader process takes items from the queue, reads
their records, publishes batches into the ring and acks each item once the
batch with its last record is published (run_loader); start_loaders forks
such processes for a PooledLoader.

Unit of recovery: the work item and its commits. A loader acks an item only
after the batch holding its last record is published, and commits the item
up to the batch's last record after each publish. A loader killed while it
holds items: the queue hands them out again from their last commit, so only
a batch published and not yet committed comes out a second time; its
unpublished slot goes back to the ring. No item is lost and no slot leaks. A
loader that leaves (SIGTERM, remove_loaders, Ctrl-C of the command) first
publishes what it holds and acks it: exactly once.

A stopped loader (SIGSTOP, a debugger, a frozen container) loses its items
to the others once it has not run for stop_timeout (the queue's
stop_timeout, beaten by a thread of the process apart from its work, so a
loader that is only slow keeps them). Back, it checks that the items of a
batch are still its own right before it publishes the batch (the fence):
a batch with records of an item it lost is abandoned, and what it read of
the items it still holds goes back to the queue. A stop that lands between
that check and the publish (microseconds) repeats at most that one batch,
as a kill between a publish and its commit does.

Epochs: a loader never acks an item of epoch e + 1 before every item of epoch
e is acked; the loader whose ack completes epoch e (WorkQueue summary 'done')
ends it in the ring, so trainers see the end of every epoch.

Sharing: a loader claims an item's records a batch at a time
(_claimed_records.py), so a loader with nothing to take splits the
unclaimed tail off the open item with the most left: one file is read by
every loader, and an epoch's last items by all of them. At an epoch's end
take() hands out the next epoch's items, which a loader may not use yet, so
there it asks for a tail of the open epoch (take_split) instead.
"""

import inspect
import multiprocessing
import os
import signal
import time

import tailcut
from tailcut import _args, _core, _pool_state
import tailcut.pool._lifecycle as _lifecycle
from tailcut._batch_layout import encode_batch
from tailcut.pool._claimed_records import ClaimedRecords
from tailcut.pool._recipe import recipe_for

RING_MAX_CLIENTS = 64
# A loader that has not run for this long (stopped) loses its items to the
# other loaders (WorkQueue stop_timeout). Long enough for a short debugger
# stop or a swap storm, short against a job's timeout.
STOP_TIMEOUT = 10.0
# A loader with nothing to do looks for a leave request (and a closed ring)
# this often; it bounds how long SIGTERM takes to be noticed.
_WAIT_SLICE = 0.1
# The smallest tail a loader splits off another's item, in bytes, where a
# batch's bytes are not known before reading (records of varying size).
MIN_SPLIT_BYTES = 4096
_ACQUIRE_SLICE = 1.0


class _EpochGate:
    """Keeps a loader from acking items of epoch e + 1 before every item of
    epoch e is settled, and ends epoch e in the ring once it is. Settled: the
    host's queue says so (WorkQueue.settled_tickets): acked here, or, in a
    queue fed by a coordinator, another host's."""

    def __init__(self, queue, ring):
        self.queue, self.ring = queue, ring
        self.ended = -1

    def try_end(self):
        n = self.queue.num_items
        settled = self.queue.settled_tickets((self.ended + 1) * n)
        while self.ended + 1 < self.queue.num_epochs and settled >= (self.ended + 2) * n:
            self.ended += 1
            self.ring.end_epoch(self.ended)
        return self.ended


class RingClosed(Exception):
    """The job closed its ring (every epoch ended): the loader leaves."""


class _Fenced(Exception):
    """A batch held records of an item that went to another loader while this
    one was stopped: it was not published, and its items were let go."""


def _lost(items):
    """The items of `items` that are no longer this loader's (reassigned
    while it was stopped), found by a no-op progress report on each."""
    lost = []
    for item in items:
        try:
            item.progress(item.begin)
        except tailcut.StaleItemError:
            lost.append(item)
    return lost


def _let_go(items, lost):
    """Gives back the items of a fenced batch that are still this loader's:
    they are read again from their last commit, by whoever takes them."""
    for item in items:
        if item not in lost:
            try:
                item.give_back()
            except tailcut.StaleItemError:
                pass  # lost meanwhile: another loader reads it


def load(queue, ring, recipe, leave, poll):
    """The loop of one loader: takes items, reads their records, publishes
    batches of recipe.batch_size records (the last one of each of this
    loader's epochs, and the one it leaves with, may be shorter) and acks each
    item once the batch with its last record is published. Runs until the
    queue has no item left, leave() says so, or the ring is closed. Returns
    its counts and why it stopped ('end', 'left' or 'ring closed')."""
    fmt = queue.format
    index_work = queue.num_samples is not None  # records are sample indices
    gate = _EpochGate(queue, ring)
    gate.try_end()  # a loader that joins late starts at the job's epoch
    counts = dict(batches=0, records=0, items=0, stopped="end", fenced=0, stale=0)
    pending, done_items, spans = [], [], _pool_state.Spans()
    epoch = None

    next_look = [0.0]

    def ring_closed():
        # Whether the job closed the ring (close(), or its ranks' exit), looked at every
        # _WAIT_SLICE at most. A loader waiting at the epoch gate, for an item or for the
        # other loaders acquires no slot, where it would find out otherwise: it would wait
        # on for an epoch that no rank runs, until its parent kills it, and a killed
        # loader leaves the job's queue behind as a crashed run's.
        now = time.monotonic()
        if now < next_look[0]:
            return False
        next_look[0] = now + _WAIT_SLICE
        return ring.stats()["closed"]

    def acquire():
        while True:
            try:
                return ring.acquire(timeout=_ACQUIRE_SLICE)
            except tailcut.Empty:
                if ring.stats()["closed"]:
                    raise RingClosed() from None

    def stale(item, call):
        # The item went to another loader between the fence and this call
        # (this loader stopped there past its stop_timeout): the batch is out,
        # so its records from the item's last commit may come out twice.
        counts["stale"] += 1
        _lifecycle.log.warning(
            "loader %d: %s of item %d (epoch %d) refused: it went to another loader while this "
            "one was stopped past its stop_timeout; up to one batch of it may be used twice",
            os.getpid(), call, item.index, item.epoch)

    def fence(held, lost=None):
        # Some of `held` went to other loaders: drop what this loader read of them
        # (nothing of it is published) and give back those still its own.
        nonlocal pending, done_items
        _let_go(held, _lost(held) if lost is None else lost)
        counts["fenced"] += 1
        pending, done_items = [], []
        spans.clear()
        raise _Fenced()

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
            # The fence: publish only records of items still this loader's.
            held = done_items + ([reading[0]] if reading is not None else [])
            lost = _lost(held)
            if lost:
                ring.abandon(slot)
                fence(held, lost)
            if not ring.publish(slot, epoch, len(pending), nbytes):
                ring.abandon(slot)
                if ring.stats()["closed"]:
                    raise RingClosed()
                raise tailcut.InvalidArgumentError(
                    f"batch ring '{ring.name}': epoch {epoch} was ended while this loader still "
                    f"had records of it (was the ring ended by hand?)")
            counts["batches"] += 1
            counts["records"] += len(pending)
        reading_lost = False
        if reading is not None:
            # Its records up to offset are published: should this loader die (or
            # stop past its stop_timeout) now, the item is read again from there,
            # not from its start. First, right after the publish: a death between
            # the two repeats the batch (docs/reliability.md), so the gap is kept short.
            item, offset = reading
            try:
                item.commit(min(offset, item.end))
            except tailcut.StaleItemError:
                stale(item, "commit")
                reading_lost = True  # the rest of it is another loader's
        for item in done_items:  # every record of these is in a published batch
            try:
                item.ack()
            except tailcut.StaleItemError:
                stale(item, "ack")
        counts["items"] += len(done_items)
        pending, done_items = [], []
        spans.clear()
        gate.try_end()
        if reading_lost:
            raise _Fenced()

    try:
        while True:
            if leave():
                counts["stopped"] = "left"
                break
            if ring_closed():
                raise RingClosed()
            if len(done_items) + 1 >= queue.leases_per_client:
                # Its batch holds as many items (pieces split off others') as this
                # loader may hold open: hand it on short, so that take() may take another.
                try:
                    flush()
                except _Fenced:
                    pass
            try:
                item = queue.take(timeout=0)
            except tailcut.Empty:
                # Nothing to take now: publish and ack what this loader holds
                # first, since a take that waits may be waiting for its items.
                try:
                    flush()
                except _Fenced:
                    pass
                try:
                    item = queue.take(timeout=_WAIT_SLICE)
                except tailcut.Empty:
                    continue
            if item is None:
                break
            if item.epoch > gate.ended + 1:
                # Epoch item.epoch - 1 has items open elsewhere: hand this one
                # back (an item of that epoch may come back from a dead loader,
                # and must be read by someone), and help with the open ones: take
                # the unclaimed tail off the one with the most left, which take()
                # would not split while it has later epochs' items to hand out.
                _let_go([item], [])
                item = queue.take_split(gate.ended + 2)
                if item is None:
                    try:
                        flush()  # what it holds of the open epoch, which waits for it
                    except _Fenced:
                        pass
                    time.sleep(poll)
                    gate.try_end()
                    continue
            if epoch is not None and item.epoch != epoch:
                try:
                    flush()
                except _Fenced:
                    pass
            epoch = item.epoch
            source = ClaimedRecords(item, fmt, index_work)
            start = item.begin
            try:
                # A batch's worth at a time, claimed first: another loader with
                # nothing to take may split off what this one has not claimed.
                while True:
                    try:
                        records, end = source.take(recipe.batch_size - len(pending))
                    except tailcut.StaleItemError:
                        fence(done_items + [item])  # stopped past stop_timeout: it is another's
                    if not records:
                        break
                    pending.extend(records)
                    spans.add(item.ticket, start, min(end, item.end))
                    start = end
                    if len(pending) == recipe.batch_size:
                        flush((item, end))
            except _Fenced:
                continue  # the item is another loader's now, or given back
            done_items.append(item)
        try:
            flush()  # leaving too: what it holds is published, so nothing comes out twice
        except _Fenced:
            pass
        while counts["stopped"] == "end" and gate.try_end() + 1 < queue.num_epochs:
            if leave():  # another loader still holds the last items
                counts["stopped"] = "left"
                break
            if ring_closed():
                raise RingClosed()
            time.sleep(poll)
    except RingClosed:
        # The job is over (or stopped early): what this loader holds goes back
        # to the queue when it closes it.
        counts["stopped"] = "ring closed"
    return counts


def run_loader(dataset, ring_name, *, batch_size=None, slot_bytes, num_slots, collate_fn=None,
               transform=None, max_clients=RING_MAX_CLIENTS, poll=0.005, stop=None,
               stop_timeout=STOP_TIMEOUT):
    """Runs one loader process's loop until the queue has no item left (or
    it is asked to leave): takes items, reads their records, publishes
    batches of batch_size records (the last of each epoch of this loader may
    be shorter), acks each item after the batch with its last record is
    published. Returns the batches it published.

    `dataset` is a tailcut.torch.QueueDataset; batch_size, collate_fn and
    transform default to its own (see PooledLoader). The loader leaves early,
    after publishing and acking what it holds, on SIGTERM (when run in the
    main thread), when stop() returns true, or when the job closes the ring.
    Stopped (SIGSTOP, a debugger) for stop_timeout s (None: never), it loses
    its items to the other loaders, and fences its late batches (above)."""
    _args.count("batch_size", batch_size, minimum=1, allow_none=True)
    _args.seconds("poll", poll)
    for key, fn in (("collate_fn", collate_fn), ("transform", transform), ("stop", stop)):
        _args.callable_or_none(key, fn)
    _args.seconds("stop_timeout", stop_timeout, allow_none=True)
    recipe = recipe_for(dataset, batch_size, collate_fn, transform)
    _open_as_loader(dataset, stop_timeout, recipe.batch_size)
    ring = _core.BatchRing(ring_name, slot_bytes, num_slots, "loader", max_clients=max_clients)
    try:
        with _lifecycle.LeaveOnSignals((signal.SIGTERM,)) as signals:
            def leave():
                return signals.signum is not None or (stop is not None and stop())
            counts = load(dataset.queue, ring, recipe, leave, poll)
    finally:
        ring.close()
    return counts["batches"]


def _open_as_loader(dataset, stop_timeout, batch_size):
    """Opens this process's queue of `dataset` (a QueueDataset) as a loader's:
    with its stop_timeout and split_options. A queue this process opened
    before keeps its own."""
    args = getattr(dataset, "_queue_args", None)
    if args is not None and getattr(dataset, "_queue_pid", None) != os.getpid():
        args["stop_timeout"] = stop_timeout
        split_options(dataset, batch_size)
    return dataset.queue


def split_options(dataset, batch_size):
    """Sets how this process splits tails off other loaders' items, where it
    has not opened the dataset's queue yet: in whole batches where a batch's
    size is known (split_multiple and min_split_bytes: a batch's samples for
    an index work, its bytes for fixed-size records), so that an item of
    whole batches never leaves a short one; else in parts of 4 KiB at least
    (the queue's own 64 KiB would leave an item of a few batches whole to one
    loader). A PooledLoader sets them for its rank too, which loads in its own
    process with num_workers=0."""
    args = getattr(dataset, "_queue_args", None)
    if args is None or getattr(dataset, "_queue_pid", None) == os.getpid():
        return
    batch = None
    if args.get("num_samples") is not None or args.get("works") is None:
        batch = batch_size
    elif (args.get("format") or "") == "fixed" and args.get("record_bytes"):
        batch = batch_size * args["record_bytes"]
    if batch is not None:
        args.setdefault("split_multiple", batch)
    args.setdefault("min_split_bytes", batch or MIN_SPLIT_BYTES)


def start_loaders(dataset, ring_name, num_workers, worker_init_fn=None, first_id=0, **kwargs):
    """Starts num_workers loader processes (forked) running run_loader; returns them.
    worker_init_fn(worker_id) runs first in each, as in a DataLoader worker;
    worker ids count from first_id (the loaders a PooledLoader started before)."""
    num_workers = _args.count("num_workers", num_workers)
    # What the loaders would refuse, refused here, not in each child.
    inspect.signature(run_loader).bind(dataset, ring_name, **kwargs)
    for key in set(kwargs) & {"slot_bytes", "num_slots", "max_clients", "batch_size"}:
        _args.count(key, kwargs[key], minimum=1, allow_none=key == "batch_size")
    ctx = multiprocessing.get_context("fork")
    procs = []
    for i in range(num_workers):
        p = ctx.Process(target=_loader_main, args=(dataset, ring_name, kwargs, os.getpid(),
                                                   worker_init_fn, first_id + i), daemon=True)
        p.start()
        procs.append(p)
    return procs


def _loader_main(dataset, ring_name, kwargs, parent_pid, worker_init_fn=None, worker_id=0):
    _lifecycle.watch_parent(parent_pid, ring_name)
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        run_loader(dataset, ring_name, **kwargs)
    except Exception as e:  # the ranks raise it (see _lifecycle)
        _lifecycle.report_failure(ring_name, os.getpid(), e)
        _lifecycle.print_failure(e)
        _lifecycle.linger()  # ended by the parent or, once it is gone, by watch_parent
    close = getattr(dataset, "close", None)
    if close is not None:
        close()  # leaves the queue now rather than at the next death check
    os._exit(0)  # not the parent's atexit handlers

