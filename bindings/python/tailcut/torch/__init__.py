"""tailcut.torch: PyTorch input pipelines over a tailcut work queue.

* :class:`QueueDataset` is an ``IterableDataset``. Every process that
  iterates it -- each ``DataLoader`` worker of each rank on the host, or the
  rank itself with ``num_workers=0`` -- opens the same :class:`tailcut.WorkQueue`
  and pulls items from it, so each record is read once per epoch across all of
  them and fast processes read more. Batches of fixed-size records come out as
  tensors over the reader's pinned buffers, without a copy.
* :class:`EqualSteps` wraps the loader of a synchronous data-parallel trainer
  (DDP). The ranks of a host agree through the queue, step by step, that each
  has a batch; when one has none, every rank ends the epoch at the same step.
  What the others still had is counted, reported and (``carry_over=True``,
  the default) used first in the next epoch.

Importing this module imports torch; ``import tailcut`` does not.
See docs/pytorch.md.

This package only re-exports; one job per module, and none of them imports
this face or tailcut.pool (tests/tools/package_layers_test.py):
  _queue_dataset.py  QueueDataset: records of a work queue, per process
  _index_dataset.py  IndexDataset: a map-style dataset through an index queue
  _equal_steps.py    EqualSteps: the ranks of a host agree on every step
  _tensors.py        tensors over (read-only) numpy arrays
PooledLoader lives in tailcut.pool, a layer above, which imports this package
and is never imported by it: ``from tailcut.pool import PooledLoader``.
"""


from tailcut.torch._equal_steps import EqualSteps
from tailcut.torch._index_dataset import IndexDataset
from tailcut.torch._queue_dataset import QueueDataset
from tailcut.torch._queue_dataset import INTERLEAVE, SHUFFLE_BUFFER, SHUFFLE_LEASES  # noqa: F401 (docs/pytorch.md)

__all__ = ["QueueDataset", "IndexDataset", "EqualSteps"]
