"""Loader autoscaling: how many loader processes a PooledLoader keeps.

PooledLoader(ds, loaders_per_host=(min, max)), or loaders_per_host=Autoscale(min, max,
...) for the knobs: local rank 0 starts `min` loaders and, while it
iterates, looks at the ring's counters (BatchRing.stats(): what `tailcut
ring NAME` shows) at most every `interval` seconds, between two of its
batches: no thread (nothing runs beside a fork, and a look never blocks, so
Ctrl-C lands where it did), and no work on the other ranks. Over the window
since the last look it measures

* starve: the share of the window the live trainers spent waiting for a
  batch (wait_seconds plus the wait in progress), averaged over trainers;
* idle: loader-seconds per second spent waiting for a free slot (the ring
  was full), over the live loaders not asked to leave.

and decides:

* add, when two looks in a row saw starve >= `starve` and idle < 0.5
  (every loader busy: more of them make more batches; one look could be
  the wait at an epoch's end), no earlier than `cooldown` seconds after the
  last decision: as many as would have fed the trainers, L / (1 - starve)
  for L loaders (1 - starve taken as 0.1 at least), up to `max`;
* remove, when for `full_for` seconds every look saw idle >= 1.5 and starve
  below starve / 2: idle - 1 of them (at least one, down to `min`), so about
  one loader's worth of spare time stays;
* nothing otherwise, and nothing at all after a gap in the looks (the rank
  stopped iterating: an evaluation, a checkpoint), whose window says nothing
  about the loaders.

Each decision is logged once on the "tailcut.pool" logger (INFO) with what
the window showed, and appended to Autoscale.decisions; being starved at
`max` is logged (WARNING) once until it ends. Removing a loader is
PooledLoader.remove_loaders(): it publishes and acks what it holds first,
so every record still comes once per epoch. Loaders that joined from
elsewhere (python3 -m tailcut.pool) count in idle and starve but are never
removed here.
"""

import logging
import math
import time
import weakref

import tailcut
from tailcut import _args

log = logging.getLogger("tailcut.pool")

# Waited loader-seconds per second below which every loader counts as busy,
# and above which the pool has a loader to spare (with one to keep).
_BUSY_IDLE = 0.5
_SPARE_IDLE = 1.5


class Autoscale:
    """Keeps between `minimum` and `maximum` loader processes for one
    PooledLoader (see the module's docstring for the policy and its knobs).
    Used by one PooledLoader, from its local rank 0 only."""

    def __init__(self, minimum, maximum, *, interval=0.25, starve=0.1, full_for=2.0,
                 cooldown=1.0):
        what = "loaders_per_host=(min, max)"
        self.minimum = _args.count(f"{what}: min", minimum, minimum=1)
        self.maximum = _args.count(f"{what}: max", maximum, minimum=1)
        if self.minimum > self.maximum:
            raise tailcut.InvalidArgumentError(
                f"{what}: min {self.minimum} is above max {self.maximum}: give 1 <= min <= max "
                f"(or an int for a fixed pool)")
        self.interval = _args.seconds("interval", interval, allow_zero=False)
        self.starve = _args.seconds("starve", starve, allow_zero=False)
        if self.starve >= 1.0:
            raise tailcut.InvalidArgumentError(
                f"starve must be a share of time in (0, 1), got {starve!r}")
        self.full_for = _args.seconds("full_for", full_for)
        self.cooldown = _args.seconds("cooldown", cooldown)
        # dicts: at (s since the first look), time (Unix s), action, n, loaders, why
        self.decisions = []
        self._owner = None  # a weak reference: the PooledLoader holds this, and its end runs
        self._t0 = None     # when it is dropped
        self._last = None  # (monotonic time, {(slot, joined_ns): wait seconds}) of the last look
        self._quiet_until = 0.0
        self._full_since = None
        self._starved_looks = 0
        self._at_max = False

    def __repr__(self):
        return (f"Autoscale({self.minimum}, {self.maximum}, interval={self.interval}, "
                f"starve={self.starve}, full_for={self.full_for}, cooldown={self.cooldown})")

    def look(self, pool):
        """Called by `pool`'s local rank 0 before each batch it pops; looks at
        the ring when `interval` has passed since the last look."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.interval:
            return
        if self._owner is None:
            self._owner, self._t0 = weakref.ref(pool), now
        elif self._owner() is not pool:
            raise tailcut.InvalidArgumentError(
                "an Autoscale drives one PooledLoader: give each its own")
        stats = pool.ring.stats()
        waits = {(c["slot"], c["joined_ns"]): c["wait_seconds"] + c["waiting_seconds"]
                 for c in stats["clients"] if c["alive"]}
        last, self._last = self._last, (now, waits)
        if last is None or now - last[0] > 3 * self.interval:
            self._full_since, self._starved_looks = None, 0  # a gap: the window says nothing
            return
        span = now - last[0]

        def waited(role, skip=()):
            total, n = 0.0, 0
            for c in stats["clients"]:
                key = (c["slot"], c["joined_ns"])
                if c["alive"] and c["role"] == role and c["pid"] not in skip and key in last[1]:
                    total += max(waits[key] - last[1][key], 0.0)
                    n += 1
            return total, n

        trainer_wait, trainers = waited("trainer")
        if not trainers:
            return
        starve = min(trainer_wait / (span * trainers), 1.0)
        idle = waited("loader", pool._leaving)[0] / span
        seen = (f"trainers waited {starve:.0%} of the last {span:.2f} s, loaders waited "
                f"{idle:.1f} loader-s/s for free slots, {stats['ready']}/{stats['num_slots']} "
                f"batches ready")
        self._scale(pool, now, starve, idle, len(pool.live_loaders()), seen)

    def _scale(self, pool, now, starve, idle, alive, seen):
        starving = starve >= self.starve and idle < _BUSY_IDLE
        self._starved_looks = self._starved_looks + 1 if starving else 0
        starved = self._starved_looks >= 2
        if not starving:
            self._at_max = False
        elif starved and alive >= self.maximum:
            if not self._at_max:
                self._at_max = True
                log.warning("tailcut.pool: autoscale of ring '%s': starving at the maximum of "
                            "%d loaders (%s): a larger max would help", pool.name,
                            self.maximum, seen)
            return
        full = idle >= _SPARE_IDLE and starve < self.starve / 2
        self._full_since = (self._full_since or now) if full else None
        if now < self._quiet_until:
            return
        if starved:
            wanted = math.ceil(max(alive, 1) / max(1.0 - starve, 0.1))
            n = max(1, min(wanted, self.maximum) - alive)
            self._decide(pool, now, "add", n, alive, seen)
        elif (self._full_since is not None and now - self._full_since >= self.full_for
              and alive > self.minimum):
            n = min(max(1, math.floor(idle - 1.0)), alive - self.minimum)
            self._decide(pool, now, "remove", n, alive,
                         f"the ring stayed full for {now - self._full_since:.1f} s: {seen}")

    def _decide(self, pool, now, action, n, alive, why):
        if action == "add":
            pool.add_loaders(n)
            after = alive + n
        else:
            pool.remove_loaders(n)
            after = alive - n
        self._quiet_until = now + self.cooldown
        self._full_since, self._starved_looks = None, 0
        self.decisions.append(dict(at=now - self._t0, time=time.time(), action=action, n=n,
                                   loaders=after, why=why))
        bound = f"at most {self.maximum}" if action == "add" else f"at least {self.minimum}"
        log.info("tailcut.pool: autoscale of ring '%s': %s; %s %d loader%s (%d now, %s)",
                 pool.name, why, "adding" if action == "add" else "removing", n,
                 "" if n == 1 else "s", after, bound)


def workers(num_workers, max_loaders):
    """(loaders to start, Autoscale or None) of PooledLoader's host-wide
    loader count (loaders_per_host, else num_workers x local ranks): an
    int (a fixed pool), (min, max), or an Autoscale; max at most max_loaders
    (the ring's client slots less one for a trainer)."""
    if isinstance(num_workers, (tuple, list)):
        if len(num_workers) != 2:
            raise TypeError(f"loaders_per_host must be an int or (min, max), got "
                            f"{num_workers!r}")
        num_workers = Autoscale(*num_workers)
    if not isinstance(num_workers, Autoscale):
        return _args.count("loaders_per_host", num_workers), None
    if num_workers.maximum > max_loaders:
        raise tailcut.InvalidArgumentError(
            f"loaders_per_host=(min, max): max {num_workers.maximum} is more loaders than the ring "
            f"holds: give max <= {max_loaders} (its {max_loaders + 1} client slots, one at "
            f"least for a trainer)")
    return num_workers.minimum, num_workers
