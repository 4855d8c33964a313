"""QueueDataset(files, shuffle="global"): the records of all files in one
seeded permutation, as a map-style dataset's samples are ordered.

The records of the files are numbered 0..N-1 (tailcut._record_files, from
record indexes kept in a cache) and the queue is an index work over them
(WorkQueue(num_samples=N), shuffle on): its items are ranges of positions of
the engine's per-epoch permutation of 0..N-1 (O(1) memory, the same on every
process), so tickets, leases, exactly once, tail splitting, checkpoints, the
pool and several hosts are those of a map-style dataset. This module reads
the records of the positions a process takes, a group (a batch, or 64
records) at a time in one batched call, sorted and coalesced underneath."""

import numpy as np

import tailcut
from tailcut._record_files import ReadBatch, samples_difference
from tailcut.torch._tensors import from_numpy

# Records per read when records are yielded one by one (batch_size=None).
RECORD_GROUP = 64


def _take(q, epoch):
    """The items of `epoch` this process takes (earlier ones too: late items);
    ends when the rest is held by others or belongs to a later epoch."""
    while True:
        try:
            item = q.take(timeout=0)
        except tailcut.Empty:
            return  # the rest is held by others (it comes back if they die)
        if item is None:
            return
        if item.epoch > epoch:
            item.give_back()  # the next epoch's: the next iteration reads it
            return
        yield item


def _groups(q, epoch, want, taken):
    """(record numbers, their items' epoch, items finished with this group)
    in groups of `want` records of one epoch (shorter at an epoch's end and
    at the end). The numbers are a uint64 array that the next group
    overwrites: read them before asking for it (one array per iteration, the
    permutation written into it in C++: no Python int per record). Every
    item taken is appended to `taken` (the caller acks or gives it back).
    Each position is claimed before it is read, so an idle process may split
    off the unclaimed tail of an item."""
    numbers = np.empty(want, np.uint64)
    n, held, group_epoch = 0, [], None
    for item in _take(q, epoch):
        taken.append(item)
        if n and item.epoch != group_epoch:  # one epoch per group
            yield numbers[:n], group_epoch, held
            n, held = 0, []
        group_epoch = item.epoch
        held.append(item)
        position, item_end = item.begin, item.end
        while True:
            stop = position + want - n
            end = item.claim(stop if stop < item_end else item_end)
            if end < stop:
                stop = end
            if position >= stop:
                break  # the item is read (or its tail split off by another process)
            item.indices(position, stop, out=numbers[n:n + stop - position])
            n += stop - position
            position = stop
            if n == want:
                done = position >= end
                finished = held if done else held[:-1]
                yield numbers, group_epoch, finished  # the caller acks `finished`
                held = held[len(finished):]
                n = 0
                if done:
                    break
    if n or held:
        yield numbers[:n], group_epoch, held


def generate(ds, q, epoch):
    """What QueueDataset.__iter__ yields in global shuffle: records one by
    one (batch_size=None) or batches as tensors, transform applied. An item is
    acked once the group with its last record was handed on (the consumer
    asked for what comes next); an iteration left early, or an error, gives
    back the items it holds: their records are read again whole."""
    records = ds._records
    want = ds.batch_size or RECORD_GROUP
    transform = ds.transform
    taken = []  # items taken and not yet acked
    try:
        for numbers, ds.batch_epoch, finished in _groups(q, epoch, want, taken):
            late = ds.batch_epoch < epoch
            if ds.batch_size is None:
                for record in records.records(numbers):
                    if late:
                        ds.late_records += 1
                    yield record if transform is None else transform(record)
            elif len(numbers) and not (ds.drop_last and len(numbers) < want):
                if late:
                    ds.late_records += len(numbers)
                piece = records.layout(numbers)
                batch = (from_numpy(piece) if not isinstance(piece, tuple)
                         else tuple(from_numpy(a) for a in piece))
                yield batch if transform is None else transform(batch)
            for item in finished:
                item.ack()
                taken.remove(item)
    finally:
        for item in taken:
            try:
                item.give_back()
            except tailcut.StaleItemError:
                pass  # another process has it now


def check_restore(restore_state, samples_id, who):
    """Refuses, naming what differs, a checkpoint of other record files:
    records are numbered over the files in their order, so a state of other
    files with as many records would silently read other records. The queue
    fingerprints samples_id too (a state without one here is refused by the
    engine); this says what differs before the queue is touched."""
    saved = restore_state.get("samples_id") if isinstance(restore_state, dict) else None
    if saved is None:
        return
    what = samples_difference(saved, samples_id)
    if what is not None:
        raise tailcut.ConfigMismatchError(
            f"{who}: the checkpoint is of other record files than these: {what}. Its positions "
            f"are records numbered over its files in their order, so here it would read other "
            f"records: restore it onto the same files in the same order (they may have moved: "
            f"names count from the files' common directory), or start without the checkpoint")


class GlobalRecipe:
    """A pooled batch of a global-shuffle QueueDataset: the batch's sample
    indices -> ReadBatch (collate_fn) -> tensors (when `tensors`) ->
    transform. Has the fields of tailcut.pool's Recipe, so the pool's
    description rebuilds it as one for a loader that joins from another
    shell."""

    def __init__(self, batch_size, collate_fn, transform=None, tensors=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size, self.collate_fn, self.transform = batch_size, collate_fn, transform
        self.record_transform, self.tensors = None, bool(tensors)

    def build(self, records, fmt):
        batch = self.collate_fn(records)
        if self.tensors:
            batch = (tuple(from_numpy(a) for a in batch) if isinstance(batch, tuple)
                     else from_numpy(batch))
        if self.transform is not None:
            batch = self.transform(batch)
        return batch


def recipe(ds, batch_size, collate_fn, transform, default_batch_size=32):
    """The pool's recipe for a global-shuffle QueueDataset, chosen as
    tailcut.pool._recipe.recipe_for chooses one for any QueueDataset: what is
    given, else the dataset's batch_size; its transform on batches (as
    tensors) when it batches, else on each record."""
    size = batch_size if batch_size is not None else (ds.batch_size or default_batch_size)
    if transform is not None or ds.transform is None:
        return GlobalRecipe(size, ReadBatch(ds._records, collate_fn), transform)
    if ds.batch_size is not None:
        return GlobalRecipe(size, ReadBatch(ds._records, collate_fn), ds.transform, tensors=True)
    return GlobalRecipe(size, ReadBatch(ds._records, collate_fn, record_transform=ds.transform))
