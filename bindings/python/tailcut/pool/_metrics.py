"""PooledLoader.metrics(): the numbers of the input pipeline as a flat dict of floats, for the
user's own logging (TensorBoard's add_scalars, W&B, a log line), cheap enough to call every
step.

A rank's data wait is the time from asking for its next batch to having it: the ring's pop,
the step agreement, the hand-off (and, under balance, the wait for the other ranks' shares).
Each step costs a clock read and an append here (timed()); metrics() reads the ring's shared
counters once.

Keys (rates and shares over the window: since the last metrics() call, or the last `window`
seconds):
  steps, window_s
  data_wait_mean_s, data_wait_p99_s, data_wait_max_s, data_wait_share (of the window)
  batches_per_s, samples_per_s (the batches' first dimension)
  loaders (live loader processes of the host), ring_ready, ring_slots, ring_fill
  loader_wait_share: the loaders' mean share of the interval since the last call spent
    waiting for a free slot (high: the ranks are the bottleneck, fewer loaders would do)
  weight (the loss factor of the last batch under balance, else 1.0)
  leftover_records, carried_out, dropped_records (this epoch's report so far)
"""

import collections
import math
import time

# Steps kept for metrics(window=...): enough for minutes of short steps.
_KEPT = 1 << 16


def batch_samples(batch):
    """Samples in a batch as DataLoader gives it: the first dimension of its first tensor."""
    while isinstance(batch, (list, tuple, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 1


class StepClock:
    """Times each step's wait for its batch (timed()) and reports over a window (report())."""

    def __init__(self):
        self._steps = collections.deque(maxlen=_KEPT)  # (end, wait seconds, samples)
        self._since = time.monotonic()
        self._loader_waits = {}  # pid: wait seconds at the last report

    def timed(self, steps):
        """Yields what the generator `steps` yields, timing each next(); closing it closes
        `steps` (a loop left early keeps its batch, as the generator decides)."""
        clock, kept = time.monotonic, self._steps
        try:
            while True:
                t0 = clock()
                try:
                    batch = next(steps)
                except StopIteration:
                    return
                t1 = clock()
                kept.append((t1, t1 - t0, batch_samples(batch)))
                yield batch
        finally:
            steps.close()

    def report(self, loader, window=None):
        now = time.monotonic()
        start = self._since if window is None else now - window
        if window is None:
            self._since = now
        waits, samples = [], 0
        for end, wait, n in reversed(self._steps):
            if end < start:
                break
            waits.append(wait)
            samples += n
        span = max(now - start, 1e-9)
        waits.sort()
        out = dict(steps=float(len(waits)), window_s=span,
                   data_wait_mean_s=sum(waits) / len(waits) if waits else 0.0,
                   data_wait_p99_s=waits[min(len(waits) - 1, math.ceil(0.99 * len(waits)) - 1)]
                   if waits else 0.0,
                   data_wait_max_s=waits[-1] if waits else 0.0,
                   data_wait_share=min(sum(waits) / span, 1.0),
                   batches_per_s=len(waits) / span, samples_per_s=samples / span)
        out.update(self._ring(loader, now))
        out["weight"] = float(loader.weight)
        report = loader.reports[-1] if loader.reports else {}
        for key in ("leftover_records", "carried_out", "dropped_records"):
            out[key] = float(report.get(key, 0))
        return out

    def _ring(self, loader, now):
        ring = getattr(loader, "ring", None)
        if ring is None:
            return dict(loaders=0.0, ring_ready=0.0, ring_slots=0.0, ring_fill=0.0,
                        loader_wait_share=0.0)
        stats = ring.stats()
        waits, shares = {}, []
        for c in stats["clients"]:
            if c["role"] != "loader" or not c["alive"]:
                continue
            waited = c["wait_seconds"] + c["waiting_seconds"]
            waits[c["pid"]] = (waited, now)
            before, at = self._loader_waits.get(c["pid"], (0.0, c["joined_ns"] / 1e9))
            if now > at and waited >= before:
                shares.append(min((waited - before) / (now - at), 1.0))
        self._loader_waits = waits
        slots = stats["num_slots"]
        return dict(loaders=float(len(waits)), ring_ready=float(stats["ready"]),
                    ring_slots=float(slots), ring_fill=stats["ready"] / slots if slots else 0.0,
                    loader_wait_share=sum(shares) / len(shares) if shares else 0.0)
