"""tailcut.pool: one pool of loader processes per host, feeding every local rank.

Loader processes (run_loader) take items from a QueueDataset's WorkQueue, read
their records, build batches (collate_fn, then transform) and publish them into
a tailcut BatchRing; every local rank pops the next ready batch (PooledLoader),
whichever loader made it. A slow batch delays one loader, not one rank.

Loaders join and leave while the epoch runs: PooledLoader.add_loaders(n) and
remove_loaders(n) in the job, or `python3 -m tailcut.pool --ring NAME` from
any shell of the host, which reads the pool's description (the queue's
options, the ring's size, how to build a batch) that local rank 0 writes
when it starts its loaders. Loaders run by hand, the description and the
batch layout: tailcut.pool.loader.

Batch layout in a slot: tailcut._batch_layout (encode_batch, decode_batch).
Each batch also carries the (ticket, begin, end) ranges of its records, so
that PooledLoader.state_dict() (tailcut._pool_state) can have the batches
not yet used read again after a restore. See docs/pooled.md.

The package, one job per file (this face and loader.py only re-export; no
module of tailcut.pool imports this face, tests/tools/package_layers_test.py):
  loader.py          the loader side, for loaders run by hand (documented API)
  _recipe.py         records of a slice, and how a loader makes a batch of them
  _loader.py         the loader loop (unit of recovery, epochs) and its processes
  _description.py    the pool's description, for loaders that join from elsewhere
  _pooled_loader.py  PooledLoader, what a rank iterates
  _dataloader_args.py  DataLoader's arguments, honoured or refused by name
  _slots.py          the ring's default size
  _hand_off.py       batches the caller owns (copied, pinned with pin_memory)
  _in_process.py     num_workers=0: a rank loading in its own process
  _autoscale.py      Autoscale, how many loaders a PooledLoader keeps
  _balance.py        per-rank shares of the global batch that follow compute speed
  _cli.py            python3 -m tailcut.pool (__main__.py)
  _lifecycle.py      loaders live, fail and end with their job: attempts, fencing
  _spec.py           a pool description read with every field checked
  _status.py         the pool status `tailcut top` shows
  _map_source.py     PooledLoader(dataset) of a map-style dataset: its index queue
  _map_batch.py      a batch of samples, and its structure through the ring
"""

from tailcut.pool._autoscale import Autoscale
from tailcut.pool._balance import Balance
from tailcut.pool._pooled_loader import PooledLoader

__all__ = ["PooledLoader", "Autoscale", "Balance"]
