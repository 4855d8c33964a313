"""PooledLoader(num_workers=0): each rank loads in its own process, as
DataLoader does with num_workers=0 (the usual setting for debugging: a
breakpoint in dataset[i] stops the rank, no process is forked).

The rank runs the loader loop (tailcut.pool._loader.load) in a thread of
its own process, which publishes into the host's ring like a
loader process: the ring's protocol is unchanged, so every record once per
epoch and equal steps hold as with loader processes. The thread shares the
rank's WorkQueue (thread-safe, engine/include/tailcut/work_queue.h); an
exception in it is recorded as a loader's failure, which the host's ranks
raise at their next batch.
"""

import atexit
import os
import threading

from tailcut import _core
import tailcut.pool._lifecycle as _lifecycle
from tailcut.pool._loader import load
from tailcut.pool._recipe import recipe_for

# How long stop_and_join() waits for the thread: it leaves at its next item, or within a
# wait slice for a free slot (_loader._ACQUIRE_SLICE); a daemon, it never holds the exit.
_JOIN_SECONDS = 5.0


class _StoppableRing:
    """The thread's ring, which reads as closed once the rank stops it: the
    loader loop then leaves as it does when the job closes the ring, also
    from a wait for a free slot, where a leave request is not looked at. What
    it holds and has not published goes back to the queue (not acked), as a
    loader's does when the ring closes."""

    def __init__(self, ring, stopped):
        self._ring, self._stopped = ring, stopped

    def stats(self):
        stats = self._ring.stats()
        if self._stopped.is_set():
            stats = dict(stats, closed=True)
        return stats

    def __getattr__(self, name):
        return getattr(self._ring, name)


class InProcessLoader:
    """The loader thread of one rank: start() once; stop_and_join() asks it
    to leave and waits for it (also at exit: DataLoader users never close(),
    and a thread left inside the ring or the queue at exit would abort the
    process)."""

    def __init__(self, dataset, ring_name, loader_kwargs):
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(dataset, ring_name, loader_kwargs),
            name=f"tailcut loader of {ring_name}", daemon=True)

    def _run(self, dataset, ring_name, kw):
        try:
            recipe = recipe_for(dataset, kw["batch_size"], kw["collate_fn"], kw["transform"])
            ring = _core.BatchRing(ring_name, kw["slot_bytes"], kw["num_slots"], "loader",
                                   max_clients=kw["max_clients"])
            try:
                load(dataset.queue, _StoppableRing(ring, self._stop), recipe, self._stop.is_set,
                     0.005)
            finally:
                ring.close()
        except Exception as e:  # the host's ranks raise it (see _lifecycle)
            _lifecycle.report_failure(ring_name, os.getpid(), e)

    def start(self):
        self._thread.start()
        atexit.register(self.stop_and_join)  # runs before the pool's end (registered earlier)

    def stop_and_join(self):
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_SECONDS)
        atexit.unregister(self.stop_and_join)
