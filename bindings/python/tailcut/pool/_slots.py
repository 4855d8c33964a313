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
"""

import tailcut

# The default ring's memory stays within this, apart from the slots the
# ranks hold (docs/pooled.md, "Sizing the ring").
MEMORY_CAP = 1 << 30
MIN_SLOTS = 4


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
