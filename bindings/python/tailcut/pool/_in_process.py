"""PooledLoader(num_workers=0): each rank loads in its own process, as
DataLoader does with num_workers=0 (the usual setting for debugging: a
breakpoint in dataset[i] stops the rank, no process is forked).

The rank runs the loader loop (tailcut.pool._loader.run_loader) in a
thread of its own process, which publishes into the host's ring like a
loader process: the ring's protocol is unchanged, so every record once per
epoch and equal steps hold as with loader processes. The thread shares the
rank's WorkQueue (thread-safe, engine/include/tailcut/work_queue.h); an
exception in it is recorded as a loader's failure, which the host's ranks
raise at their next batch.
"""

import os
import threading

from tailcut.pool import _lifecycle
from tailcut.pool._loader import run_loader

# How long close() waits for the thread once the ring is ended; a thread of a
# rank other than local rank 0 may wait for a free slot until local rank 0
# ends the ring, and is a daemon: it never holds the process at exit.
_JOIN_SECONDS = 5.0


class InProcessLoader:
    """The loader thread of one rank. start() once; stop() asks it to leave
    (it publishes and acks what it holds first), join() waits for it."""

    def __init__(self, dataset, ring_name, loader_kwargs):
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(dataset, ring_name, loader_kwargs),
            name=f"tailcut loader of {ring_name}", daemon=True)
        self.ring_name = ring_name

    def _run(self, dataset, ring_name, loader_kwargs):
        try:
            run_loader(dataset, ring_name, stop=self._stop.is_set, **loader_kwargs)
        except Exception as e:  # the host's ranks raise it (see _lifecycle)
            _lifecycle.report_failure(ring_name, os.getpid(), e)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()

    def join(self):
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_SECONDS)
