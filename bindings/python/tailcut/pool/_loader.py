"""The loader loop: one loader process takes items from the queue, reads
their records, publishes batches into the ring and acks each item once the
batch with its last record is published (run_loader); start_loaders forks
such processes for a PooledLoader.

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
ends it in the ring, so trainers see the end of every epoch.
"""

import inspect
import multiprocessing
import os
import signal
import time

import tailcut
from tailcut import _args, _core, _pool_state
from tailcut.pool import _lifecycle
from tailcut._batch_layout import encode_batch
from tailcut.pool._recipe import item_records, recipe_for

RING_MAX_CLIENTS = 64
# A loader with nothing to do looks for a leave request (and a closed ring)
# this often; it bounds how long SIGTERM takes to be noticed.
_WAIT_SLICE = 0.1
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


def load(queue, ring, recipe, leave, poll):
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
                    raise RingClosed() from None

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
                    raise RingClosed()
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
            if queue.num_samples is not None:  # an index work: records are sample indices
                records, ends = item.indices(), range(item.begin + 1, item.end + 1)
            else:
                records, ends = item_records(item.path, item.begin, item.end, fmt,
                                              with_ends=True, item=item)
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
    except RingClosed:
        # The job is over (or stopped early): what this loader holds goes back
        # to the queue when it closes it.
        counts["stopped"] = "ring closed"
    return counts


def run_loader(dataset, ring_name, *, batch_size=None, slot_bytes, num_slots, collate_fn=None,
               transform=None, max_clients=RING_MAX_CLIENTS, poll=0.005, stop=None):
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
    recipe = recipe_for(dataset, batch_size, collate_fn, transform)
    ring = _core.BatchRing(ring_name, slot_bytes, num_slots, "loader", max_clients=max_clients)
    try:
        with _lifecycle.LeaveOnSignals((signal.SIGTERM,)) as signals:
            def leave():
                return signals.signum is not None or (stop is not None and stop())
            counts = load(dataset.queue, ring, recipe, leave, poll)
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
        _lifecycle.linger()  # ended by the parent or, once it is gone, by watch_parent
    close = getattr(dataset, "close", None)
    if close is not None:
        close()  # leaves the queue now rather than at the next death check
    os._exit(0)  # not the parent's atexit handlers

