"""PooledLoader over a map-style dataset (dataset[i], len(dataset)): the
pool's loaders take items of an index work (WorkQueue(num_samples=N)),
load dataset[i] for the samples of each and collate them as a DataLoader
would (the user's collate_fn, else torch's default_collate), so labels and
any structure (tuples, dicts, nested) reach the ranks as they were.

A collated batch travels through the ring as flat arrays (tailcut.
_batch_layout) plus a description of its structure (a JSON tree, the last
array of the batch); the rank puts the structure back (rebuild_batch).
Leaves are tensors or arrays (of the layout's dtypes), or plain values
(str, int, float, bool, None), which travel in the tree.

The loaders are forked from the job, so a dataset that cannot be pickled
(lambda transforms, closures) works; a loader joining from another shell
(python3 -m tailcut.pool) unpickles the dataset from the pool's
description, and one that cannot be pickled or imported there is named in
the error."""

import inspect
import json
import sys

import tailcut
from tailcut import _args, _map_style
from tailcut.pool._map_batch import Collate, LoadSample, unflatten
from tailcut.pool._recipe import Recipe
from tailcut.torch import IndexDataset, QueueDataset


class MapSource(IndexDataset):
    """The index queue of a map-style dataset, and how the pool's loaders
    make batches of it."""

    def __init__(self, dataset, batch_size, *, drop_last=False, resume=None, **queue_options):
        # queue_options: those of PooledLoader that wrap() passes (shuffle, seed, name, ...).
        self.notices = QuietWhenFinished()
        # Tails are split in whole batches, by the loaders and by a rank that loads in its
        # own process (num_workers=0), which opens the queue here (pool/_loader.py).
        self._split_options = dict(split_multiple=batch_size, min_split_bytes=batch_size)
        super().__init__(dataset, resume=resume, on_notice=self.notices, **queue_options)
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)

    def recipe(self, batch_size, collate_fn, transform):
        """The loaders' recipe (tailcut.pool._recipe.recipe_for)."""
        return Recipe(batch_size or self.batch_size, collate_fn=Collate(collate_fn, transform),
                      record_transform=LoadSample(self.dataset))

    @staticmethod
    def rebuild_batch(arrays):
        """The batch as it was collated, from the tensors the rank decoded."""
        *leaves, tree = arrays
        return unflatten(json.loads(bytes(tree.numpy()).decode("utf-8")), leaves)


class QuietWhenFinished:
    """The index queue's notices, printed as the engine prints them, but for
    the one that its queue was "removed unfinished" once the job's loop ran
    its epochs to their end: a map-style queue has num_epochs=100 by default
    and the loaders read ahead into the next epoch, so every job that ends
    its loop would be told its queue was left unfinished. A loop left early
    (break, an exception) still hears it."""

    def __init__(self):
        self.finished = False

    def __call__(self, line):
        if self.finished and " removed unfinished (" in line:
            return
        sys.stderr.write(f"tailcut: {line}\n")
        sys.stderr.flush()


def wrap(dataset, batch_size, options, queue_options=None):
    """The MapSource of a map-style dataset, or None for a QueueDataset (an
    IndexDataset too), which takes its queue's options itself. options:
    PooledLoader's shuffle, seed, drop_last, name (the job's: its queue's),
    num_epochs, num_slices, restore_state and resume, None where not given;
    queue_options, a dict of the index queue's other tailcut.WorkQueue
    options (those IndexDataset lists: coordinator, global_block_size,
    lease_timeout, ...)."""
    given = {k: v for k, v in options.items() if v is not None}
    more = _queue_options(queue_options, given)
    if more:
        given["queue_options"] = True  # for the QueueDataset refusal below
    if isinstance(dataset, QueueDataset):
        # shuffle=False and drop_last=False are DataLoader's defaults: nothing given.
        given = sorted(k for k, v in given.items() if v is not False)
        if given:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader: {', '.join(f'{k}=' for k in given)} are for a map-style "
                f"dataset; a QueueDataset takes its queue's options itself (pass them to "
                f"QueueDataset or IndexDataset)")
        return None
    if batch_size is None:
        raise tailcut.InvalidArgumentError(
            "PooledLoader: batch_size=None (no batching) is refused for a map-style dataset: "
            "the loaders publish batches; give batch_size=")
    _map_style.sample_count(dataset, "PooledLoader")
    if given.get("name") is not None:
        _args.text("name", given["name"])
    drop_last = given.pop("drop_last", False)
    given.pop("queue_options", None)
    return MapSource(dataset, batch_size, drop_last=drop_last, **given, **more)


def _queue_options(queue_options, given):
    """PooledLoader's queue_options, checked: a dict of IndexDataset's
    keywords other than those PooledLoader takes itself."""
    if queue_options is None:
        return {}
    if not isinstance(queue_options, dict):
        raise TypeError(f"PooledLoader: queue_options must be a dict or None, got "
                        f"{queue_options!r} ({type(queue_options).__name__})")
    allowed = set(inspect.signature(IndexDataset).parameters) - {"dataset"}
    for key in queue_options:
        if key in ("shuffle", "seed", "name", "num_epochs", "num_slices", "restore_state",
                   "resume", "on_notice"):
            raise tailcut.InvalidArgumentError(
                f"PooledLoader: queue_options={{{key!r}: ...}}: pass {key}= to PooledLoader"
                if key != "on_notice" else
                "PooledLoader: queue_options={'on_notice': ...}: the pool prints the queue's "
                "notices itself")
        if key not in allowed:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader: queue_options={{{key!r}: ...}} is not an option of the index "
                f"queue; those it takes: {', '.join(sorted(allowed))}")
    return dict(queue_options)
