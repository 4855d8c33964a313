"""Transforms for the pooled-loader tests, in a module so that a loader started with
`python3 -m tailcut.pool` can import them by reference (the job's main script cannot be)."""

import time


class Slow:
    """Sleeps `seconds` per batch, so that a test can act while loaders are mid-epoch."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return batch


def identity(batch):
    return batch
