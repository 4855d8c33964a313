"""How many slots a PooledLoader's ring has when num_slots is not given.

A slot holds one published batch (or one unit of a batch, under balance).
The ring needs room for what the ranks hold and what the loaders make
ahead:

* every rank of the host holds the batch it was handed and may hold one of
  the next epoch (its stash): 2 x local ranks; under balance the sum of the
  ranks' shares plus one unit each instead (_balance.held_units), since a
  rank pops all of its step's units before it releases one;
* every loader makes prefetch_factor batches ahead (DataLoader's meaning),
  for the most loaders the pool may run (autoscaling's max).

The ring's memory, num_slots x slot_bytes, is reserved in /dev/shm when it
is made. The room for prefetching is cut to stay within MEMORY_CAP; the
room the ranks hold never is (with less the job could not run).

A slot's size (slot_bytes=None): for a map-style dataset, what a batch of
copies of dataset[0] takes as the loaders collate and lay it out, a quarter
more for samples that vary, rounded up to a power of two, and at least
DEFAULT_SLOT_BYTES; for record files, DEFAULT_SLOT_BYTES. A batch that
still does not fit is refused by the loader that made it, with its size and
the fix (slot_bytes=).
"""

import tailcut
from tailcut._batch_layout import HEADER_BYTES, encode_batch

# The default ring's memory stays within this, apart from the slots the
# ranks hold (docs/pooled.md, "Sizing the ring").
MEMORY_CAP = 1 << 30
MIN_SLOTS = 4
DEFAULT_SLOT_BYTES = 4 << 20


def slot_bytes(given, map_source, recipe):
    """`given`, else a slot's size as above. Every local rank of a host
    computes the same (the ring's configuration must match on each): the
    same sample, and a power of two absorbs what little varies."""
    if given is not None:
        return given
    if map_source is None or len(map_source.dataset) == 0:
        return DEFAULT_SLOT_BYTES
    # As a loader makes a batch (tailcut.pool._map_batch): dataset[0] once,
    # collated batch_size times.
    batch = recipe.collate_fn([recipe.record_transform(0)] * recipe.batch_size)
    need = _laid_out_bytes(batch) * 5 // 4
    return max(DEFAULT_SLOT_BYTES, 1 << (need - 1).bit_length())


def _laid_out_bytes(arrays):
    """The bytes a batch takes in a slot (encode_batch's count), measured by
    laying it out in memory of its own."""
    room = (sum(a.element_size() * a.numel() if hasattr(a, "numel") else a.nbytes
                for a in arrays) + 64 * (len(arrays) + 1) + (64 << 10))
    return encode_batch(arrays, memoryview(bytearray(room)), memoryview(bytearray(HEADER_BYTES)),
                        [(0, 0, 1)])


def num_slots(given, loaders, prefetch_factor, local_world_size, slot_bytes, held_units=None):
    """The ring's slots: `given` (checked against what balance needs), else
    computed as above."""
    held = 2 * local_world_size if held_units is None else held_units
    if given is not None:
        if held_units is not None and given < held_units:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=...): the {local_world_size} ranks of this host may hold "
                f"{held_units} units at once while they gather their shares, and num_slots is "
                f"{given}: pass num_slots={held_units} or more, or leave num_slots=None (the "
                f"default sizes the ring for the shares)")
        return given
    ahead = max(loaders, 1) * prefetch_factor
    ahead = max(min(ahead, MEMORY_CAP // slot_bytes - held), 1)
    return max(held + ahead, MIN_SLOTS)
