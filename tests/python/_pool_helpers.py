"""What the pooled-loader tests share: their data (16-byte records that carry their ids) and
transforms, in a module so that a loader started with `python3 -m tailcut.pool` can import them
by reference (the job's main script cannot be)."""

import time

import numpy as np

RECORD = 16


def write_ids(path, n, first=0):
    """A fixed-format file of n RECORD-byte records; record i starts with first + i (u64)."""
    a = np.zeros((n, RECORD), np.uint8)
    a[:, :8] = np.arange(first, first + n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    a.tofile(path)
    return str(path)


def ids_of(batch):
    """The ids of a batch of such records (a numpy array of rows)."""
    return np.ascontiguousarray(batch[:, :8]).view(np.uint64).ravel().tolist()


class Slow:
    """Sleeps `seconds` per batch, so that a test can act while loaders are mid-epoch."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return batch


def identity(batch):
    return batch
