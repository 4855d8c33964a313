"""tailcut: one work queue per host for data-parallel training.

Every process on a host that opens a :class:`WorkQueue` with the same name and
configuration shares one queue in POSIX shared memory. The queue hands out work
items (file slices) so that each item is used exactly once per epoch across all
processes: fast processes take more, slow ones fewer, and the items of a
process that dies go to the others.

    import tailcut

    with tailcut.WorkQueue(["a.tfrecord", "b.tfrecord"], num_epochs=2,
                           num_clients=8, name="my_job") as q:
        for record in q.records(format="tfrecord"):
            train_on(bytes(record))   # a memoryview, valid until the next record

See docs/python.md for the whole API and the differences from PAI's WorkQueue.
PyTorch: `import tailcut.torch` (QueueDataset, EqualSteps; docs/pytorch.md). This
package itself never imports torch.
"""

import atexit as _atexit

from tailcut._core import (
    ArenaKeeper,
    BatchIterator,
    ConfigMismatchError,
    CorruptError,
    Empty,
    Error,
    InputDataset,
    InputProducer,
    InvalidArgumentError,
    IoError,
    NoSpaceError,
    NotFoundError,
    PermissionDeniedError,
    RecordBuffer,
    RecordFiles,
    RecordIterator,
    StaleItemError,
    TimeoutError,
    WorkItem,
    WorkQueue,
    __version__,
    crc32c,
    encode_tfrecord,
    inspect_queue,
    list_queues,
    masked_crc32c,
    remove_queue,
    segment_path,
    slice_records,
    tar_members,
)
from tailcut._core import _close_all

__all__ = [
    "WorkQueue",
    "WorkItem",
    "InputDataset",
    "InputProducer",
    "RecordIterator",
    "BatchIterator",
    "RecordBuffer",
    "ArenaKeeper",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "NoSpaceError",
    "ConfigMismatchError",
    "CorruptError",
    "IoError",
    "StaleItemError",
    "Empty",
    "list_queues",
    "inspect_queue",
    "remove_queue",
    "segment_path",
    "crc32c",
    "masked_crc32c",
    "encode_tfrecord",
    "slice_records",
    "tar_members",
    "RecordFiles",
    "__version__",
]

# tailcut.TimeoutError is left out of __all__ on purpose: `from tailcut import *`
# would shadow the built-in TimeoutError, and `except TimeoutError` would then
# stop catching everyone else's timeouts. It subclasses the built-in, so an
# `except TimeoutError` catches the library's too.
_NOT_STARRED = ("TimeoutError",)

from tailcut._core import Batch, BatchRing, Slot, inspect_batch_ring, remove_batch_ring  # noqa: E402
__all__ += ["BatchRing", "Slot", "Batch", "inspect_batch_ring", "remove_batch_ring"]

# Queues still open at exit are closed (their open items given back, the
# segment removed when the job is done) rather than left to the destructor
# order of interpreter shutdown. A forked child skips its parent's queues.
_atexit.register(_close_all)
