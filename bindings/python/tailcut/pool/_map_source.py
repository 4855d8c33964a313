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

import json

from tailcut import _map_style
from tailcut.pool._map_batch import Collate, LoadSample, unflatten
from tailcut.pool._recipe import DEFAULT_BATCH_SIZE, Recipe
from tailcut.torch import IndexDataset, QueueDataset


class MapSource(IndexDataset):
    """The index queue of a map-style dataset, and how the pool's loaders
    make batches of it."""

    def __init__(self, dataset, batch_size, *, drop_last=False, resume=None, **queue_options):
        super().__init__(dataset, resume=resume, **queue_options)
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


def wrap(dataset, batch_size, options):
    """The MapSource of a map-style dataset. options: drop_last, queue_name
    (its queue's name) and the queue's options (shuffle, seed, num_epochs,
    num_slices, restore_state, resume, ...). A QueueDataset (an IndexDataset
    too) gives None, and takes no options here."""
    if isinstance(dataset, QueueDataset):
        if options:
            raise TypeError(f"PooledLoader: {', '.join(sorted(options))} are for a map-style "
                            f"dataset; a QueueDataset takes its queue's options itself")
        return None
    _map_style.sample_count(dataset, "PooledLoader")
    if "queue_name" in options:
        options["name"] = options.pop("queue_name")
    return MapSource(dataset, batch_size or DEFAULT_BATCH_SIZE, **options)
