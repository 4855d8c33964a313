"""Loader autoscaling: how many loader processes a PooledLoader keeps.

PooledLoader(ds, loaders_per_host=(min, max)), or loaders_per_host=Autoscale(min, max,
...) for the knobs: local rank 0 starts `min` loaders and, while it
iterates, reads the ring's counters (BatchRing.stats(): what `tailcut ring
NAME` shows) at most every `interval` seconds, between two of its batches:
no thread (nothing runs beside a fork, and a read never blocks, so Ctrl-C
lands where it did), and no work on the other ranks. Over a window of at
least `window` seconds it measures

* starve: the share of the window the live trainers spent waiting for a
  batch (wait_seconds plus the wait in progress), averaged over trainers;
* idle: loader-seconds per second spent waiting for a free slot (the ring
  was full), over the live loaders not asked to leave;
* the loader rate: batches a loader publishes per second it is not waiting;
* the ranks' demand: batches per second the trainers would take if a batch
  were always ready, from their compute per step (need(), below).

and decides, once per window:

* add, when starve >= `starve` and idle < 0.5 (every loader busy): in one
  step to the count that feeds the demand (need()), up to `max` and to the
  CPUs (cpu_limit()); one more at least when starve >= 2 x `starve`;
* remove, when for `full_for` seconds every window saw idle >= 1.5 and
  starve below starve / 2: idle - 1 of them (at least one, down to `min`),
  so about one loader's worth of spare time stays, and never below the
  count that feeds the demand measured;
* nothing otherwise. A window says nothing about the loaders, and is
  dropped, when an epoch ended in it (the ranks wait for the last batches,
  the loaders for the next epoch's items), when rank 0 stopped iterating
  for a while (an evaluation, a checkpoint: a gap), before the first batch
  is published, and after an add until every added loader has joined the
  ring (at most `cooldown` s).

need(): under synchronous data parallelism the ranks of a host ask for
their batches together at the start of a step; a starving pool makes them
at an even pace, those made during the last step's compute c are ready at
once, and rank k (k = 1..W, in the order its batch comes) waits
max(0, k T / W - c) in a step of T seconds. Their waits' sum A and T are
measured, c solves that sum, and the host's W trainers take W / c batches
per second when fed. One trainer (W = 1) gives c = T - A, exact. Waits of
T (W + 1) / 2 or more (the first steps, when no batch was made ahead; ranks
that do not step together) mean a compute too small to tell: the count
goes to `max` (and the CPU limit), and the remove rule gives back what the
ring then shows spare.

Each decision is logged once on the "tailcut.pool" logger (INFO) with what
the window showed, and appended to Autoscale.decisions; being starved at
`max` or at the CPU limit is logged (WARNING) once until it ends. Removing a
loader is PooledLoader.remove_loaders(): it publishes and acks what it holds
first, so every record still comes once per epoch. Loaders that joined from
elsewhere (python3 -m tailcut.pool) count in the measures but are never
removed here.
"""

import collections
import logging
import math
import os
import time
import weakref

import tailcut
from tailcut import _args

log = logging.getLogger("tailcut.pool")

# Waited loader-seconds per second below which every loader counts as busy,
# and above which the pool has a loader to spare (with one to keep).
_BUSY_IDLE = 0.5
_SPARE_IDLE = 1.5
# Loaders added for a demand of D batches/s at a rate of R per loader, measured from n
# batches: HEADROOM x (1 + 1 / sqrt(n)) x D / R (need()). A loader too many costs a
# process, which the remove rule takes back; one too few costs a second decision.
HEADROOM = 1.1
# The weight the loader rate keeps of the windows before (per window): the rate is
# measured over about the last 1 / (1 - _RATE_MEMORY) windows.
_RATE_MEMORY = 0.75
# Rank 0 away from the ring (its time between two reads outside the ring's wait) for
# longer than this and 4 x its usual step: a gap (evaluation, checkpoint), not a step.
_GAP_SECONDS = 1.0
# The environment's way to set cpus= for every pool of a job.
CPUS_ENV = "TAILCUT_LOADER_CPUS"

Window = collections.namedtuple(
    "Window", "span trainers steps wait published loader_busy idle ready num_slots")
Window.__doc__ = """What the ring's counters say over a window of `span` s:
`trainers` live trainers took `steps` batches each on average (their pops over
them) and waited `wait` s in all; the loaders published `published` batches in
`loader_busy` loader-seconds not spent waiting, and waited `idle` loader-s per
second for free slots; `ready` of `num_slots` batches were ready at its end."""


def compute_seconds(step, wait, ranks):
    """c, the compute of a step of `step` s in which `ranks` trainers waited
    `wait` s in all (the module's docstring, need())."""
    if step <= 0 or wait >= step * (ranks + 1) / 2:
        return 0.0  # more waiting than ranks in step can do with any compute
    lo, hi = 0.0, step  # sum_k max(0, k T / W - c) falls from T (W + 1) / 2 to 0 on [0, T]
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(max(0.0, k * step / ranks - mid) for k in range(1, ranks + 1)) > wait:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def need(window, published=None, busy=None):
    """(loaders that feed the trainers, loader rate, demand) from a Window:
    demand in batches per second when fed, rate per loader; the loaders
    are None where the window cannot tell (nothing published, no step).
    The rate is published / busy (the window's own unless given: the policy
    gives its recent windows' sums), and the loaders HEADROOM x (1 +
    1 / sqrt(published)) x demand / rate: a rate measured from n batches of
    a heavy-tailed transform is off by about 1 / sqrt(n) of itself, mostly
    too high (the rare slow batch is missing from a short window), and a
    loader too many costs less than a second decision."""
    published = window.published if published is None else published
    busy = window.loader_busy if busy is None else busy
    if published <= 0 or busy <= 0 or window.steps <= 0:
        return None, 0.0, 0.0
    rate = published / busy
    step = window.span / window.steps
    c = compute_seconds(step, window.wait / window.steps, window.trainers)
    if c <= 1e-3 * step:
        return math.inf, rate, math.inf  # trainers that never compute take any count
    demand = window.trainers / c
    return math.ceil(HEADROOM * (1 + published ** -0.5) * demand / rate), rate, demand


class Autoscale:
    """Keeps between `minimum` and `maximum` loader processes for one
    PooledLoader (see the module's docstring for the policy and its knobs).
    Used by one PooledLoader, from its local rank 0 only.

    cpus: the most loaders the host's CPUs allow. None: $TAILCUT_LOADER_CPUS
    if set, else the CPUs this process may run on less the host's local
    ranks (each rank keeps one busy), at least `minimum`. Give more for
    loaders that mostly wait (on storage, the network, a sleep) rather than
    compute."""

    def __init__(self, minimum, maximum, *, interval=0.1, window=0.5, starve=0.05,
                 full_for=2.0, cooldown=1.0, cpus=None):
        what = "loaders_per_host=(min, max)"
        self.minimum = _args.count(f"{what}: min", minimum, minimum=1)
        self.maximum = _args.count(f"{what}: max", maximum, minimum=1)
        if self.minimum > self.maximum:
            raise tailcut.InvalidArgumentError(
                f"{what}: min {self.minimum} is above max {self.maximum}: give 1 <= min <= max "
                f"(or an int for a fixed pool)")
        self.interval = _args.seconds("interval", interval, allow_zero=False)
        self.window = _args.seconds("window", window, allow_zero=False)
        self.starve = _args.seconds("starve", starve, allow_zero=False)
        if self.starve >= 1.0:
            raise tailcut.InvalidArgumentError(
                f"starve must be a share of time in (0, 1), got {starve!r}")
        self.full_for = _args.seconds("full_for", full_for)
        self.cooldown = _args.seconds("cooldown", cooldown)
        self.cpus = _args.count("cpus", cpus, minimum=1, allow_none=True)
        self._cpus_told = "cpus="
        if self.cpus is None and os.environ.get(CPUS_ENV, "") != "":
            text = os.environ[CPUS_ENV]
            if not text.isdigit() or int(text) < 1:
                raise tailcut.InvalidArgumentError(
                    f"${CPUS_ENV} must be an int >= 1 (the loaders the CPUs allow), got "
                    f"{text!r}: set it to a count or unset it")
            self.cpus, self._cpus_told = int(text), f"${CPUS_ENV}"
        # dicts: at (s since the first look), time (Unix s), action, n, loaders, why
        self.decisions = []
        self._owner = None  # a weak reference: the PooledLoader holds this, and its end runs
        self._t0 = None     # when it is dropped
        self._read_at = None  # monotonic s of the last read of the ring
        self._last = None  # the ring's counters at the last read (_counters())
        self._start = None  # ... at the window's start
        self._step_busy = None  # rank 0's usual time per batch outside the ring's wait
        self._joining = None  # (loader clients expected, give up at) after an add
        self._quiet_until = 0.0
        self._full_since = None
        self._at_limit = False
        self._published = self._busy = 0.0  # the loaders' recent windows (_RATE_MEMORY)

    def __repr__(self):
        return (f"Autoscale({self.minimum}, {self.maximum}, interval={self.interval}, "
                f"window={self.window}, starve={self.starve}, full_for={self.full_for}, "
                f"cooldown={self.cooldown}, cpus={self.cpus})")

    def cpu_limit(self, local_ranks):
        """(the most loaders the policy runs, why): max, cut to the CPUs, at
        least min."""
        if self.cpus is not None:
            cpus, why = self.cpus, f"the CPU limit of {self.cpus} ({self._cpus_told})"
        else:
            have = len(os.sched_getaffinity(0))
            cpus = have - local_ranks
            why = (f"the CPU limit of {max(cpus, self.minimum)} loader"
                   f"{'' if max(cpus, self.minimum) == 1 else 's'} ({have} CPUs less "
                   f"{local_ranks} local rank{'' if local_ranks == 1 else 's'})")
        if cpus >= self.maximum:
            return self.maximum, f"the maximum of {self.maximum} loaders"
        return max(cpus, self.minimum), why

    def look(self, pool):
        """Called by `pool`'s local rank 0 before each batch it pops; reads
        the ring when `interval` has passed since the last read."""
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self.interval:
            return
        self._read_at = now
        if self._owner is None:
            self._owner, self._t0 = weakref.ref(pool), now
        elif self._owner() is not pool:
            raise tailcut.InvalidArgumentError(
                "an Autoscale drives one PooledLoader: give each its own")
        self.observe(pool, pool.ring.stats(), now)

    def observe(self, pool, stats, now):
        """One read of the ring's counters `stats` at monotonic time `now`:
        extends the window, and decides once it is long enough."""
        last, counters = self._last, _counters(stats, pool._leaving)
        self._last = counters
        if last is None or self._gap(last, counters) or not stats["published"]:
            self._start = None  # nothing to compare with, or a window that says nothing
        elif last["ended"] != counters["ended"]:
            self._start = None  # an epoch ended: its wait for the last batches is no demand
        if self._joining is not None:
            expected, until = self._joining
            if counters["joined"] < expected and now < until:
                self._start = None  # the loaders just added are still starting
                return
            self._joining = None
        if self._start is None:
            self._start = counters
            return
        if counters["at"] - self._start["at"] < self.window:
            return
        window, self._start = _window(self._start, counters, stats), counters
        if window.trainers:
            self._scale(pool, now, window)

    def _gap(self, last, counters):
        """Rank 0 spent more time away from the ring than steps take: an
        evaluation or a checkpoint between two batches."""
        mine_last, mine = last["me"], counters["me"]
        if mine_last is None or mine is None or mine["key"] != mine_last["key"]:
            return False
        busy = counters["at"] - last["at"] - max(mine["wait"] - mine_last["wait"], 0.0)
        per = busy / max(mine["popped"] - mine_last["popped"], 1)
        usual = self._step_busy
        if usual is not None and per > max(_GAP_SECONDS, 4 * usual):
            return True
        self._step_busy = per if usual is None else usual + 0.2 * (per - usual)
        return False

    def _scale(self, pool, now, w):
        starve = min(w.wait / (w.span * w.trainers), 1.0)
        self._published = _RATE_MEMORY * self._published + w.published
        self._busy = _RATE_MEMORY * self._busy + w.loader_busy
        idle = w.idle
        alive = len(pool.live_loaders())
        seen = (f"trainers waited {starve:.0%} of the last {w.span:.2f} s, loaders waited "
                f"{idle:.1f} loader-s/s for free slots, {w.ready}/{w.num_slots} batches ready")
        starving = starve >= self.starve and idle < _BUSY_IDLE
        if log.isEnabledFor(logging.DEBUG):  # every window, to see what the policy saw
            log.debug("tailcut.pool: autoscale of ring '%s': window %s; %d loaders; need %s",
                      pool.name, w, alive, need(w, self._published, self._busy))
        full = idle >= _SPARE_IDLE and starve < self.starve / 2
        self._full_since = (self._full_since or now) if full else None
        if not starving:
            self._at_limit = False
        if now < self._quiet_until:
            return
        if starving:
            limit, why_limit = self.cpu_limit(pool.local_world_size)
            wanted, rate, demand = need(w, self._published, self._busy)
            if wanted is not None and math.isfinite(wanted):
                seen += (f"; a loader makes {rate:.1f} batches/s, the trainers take "
                         f"{demand:.1f}/s when fed: {wanted} loaders feed them")
            elif wanted is not None:
                seen += "; the trainers do not compute between batches: any count starves"
            if alive >= limit:
                if not self._at_limit:
                    self._at_limit = True
                    more = ("a larger max would help" if limit == self.maximum else
                            f"loaders past it would take CPUs the ranks need; if the loaders "
                            f"mostly wait (storage, network, sleeps) allow more with "
                            f"Autoscale(min, max, cpus=N) or ${CPUS_ENV}=N")
                    log.warning("tailcut.pool: autoscale of ring '%s': starving at %s (%s): "
                                "%s", pool.name, why_limit, seen, more)
                return
            # The model's count; one more at least when the trainers clearly starve.
            target = alive + 1 if wanted is None else wanted
            if starve >= 2 * self.starve:
                target = max(target, alive + 1)
            if min(target, limit) > alive:
                self._decide(pool, now, "add", min(target, limit) - alive, alive, seen)
        elif (self._full_since is not None and now - self._full_since >= self.full_for
              and alive > self.minimum):
            n = min(max(1, math.floor(idle - 1.0)), alive - self.minimum)
            wanted = need(w, self._published, self._busy)[0]
            if wanted is not None and math.isfinite(wanted):
                n = min(n, alive - wanted)  # never below what feeds the demand measured
            if n > 0:
                self._decide(pool, now, "remove", n, alive,
                             f"the ring stayed full for {now - self._full_since:.1f} s: {seen}")

    def _decide(self, pool, now, action, n, alive, why):
        if action == "add":
            pool.add_loaders(n)
            after = alive + n
            # The next window starts once they joined: a starting loader publishes nothing.
            self._joining = (self._last["joined"] + n, now + self.cooldown)
            self._start = None
        else:
            pool.remove_loaders(n)
            after = alive - n
            self._quiet_until = now + self.cooldown
        self._full_since = None
        self.decisions.append(dict(at=now - (self._t0 or now), time=time.time(),
                                   action=action, n=n, loaders=after, why=why))
        bound = f"at most {self.maximum}" if action == "add" else f"at least {self.minimum}"
        log.info("tailcut.pool: autoscale of ring '%s': %s; %s %d loader%s (%d now, %s)",
                 pool.name, why, "adding" if action == "add" else "removing", n,
                 "" if n == 1 else "s", after, bound)


def _counters(stats, leaving):
    """What a window needs of one read of the ring: per live client (by slot
    and join time) its counters, the loaders that joined, rank 0's own row."""
    at = stats["now_ns"] / 1e9
    clients, me, joined = {}, None, 0
    for c in stats["clients"]:
        if not c["alive"]:
            continue
        key = (c["slot"], c["joined_ns"])
        row = dict(key=key, role=c["role"], pid=c["pid"], joined=c["joined_ns"] / 1e9,
                   wait=c["wait_seconds"] + c["waiting_seconds"], popped=c["popped"],
                   published=c["published"], leaving=c["pid"] in leaving)
        clients[key] = row
        if c["role"] == "loader":
            joined += 1
        elif c["pid"] == os.getpid():
            me = row
    return dict(at=at, clients=clients, me=me, joined=joined, ended=stats["ended_through"])


def _window(start, end, stats):
    """The Window between two _counters() of the same ring."""
    span = end["at"] - start["at"]
    trainers = pops = wait = published = busy = idle = 0
    for key, c in end["clients"].items():
        before = start["clients"].get(key)
        since = start["at"] if before is not None else max(c["joined"], start["at"])
        waited = max(c["wait"] - (before["wait"] if before else 0.0), 0.0)
        if c["role"] == "trainer":
            if before is None:
                continue  # a trainer that joined in the window: its waits are partial
            trainers += 1
            pops += c["popped"] - before["popped"]
            wait += waited
        elif not c["leaving"]:
            published += c["published"] - (before["published"] if before else 0)
            busy += max(end["at"] - since - waited, 0.0)
            idle += waited
    return Window(span=span, trainers=trainers, steps=pops / trainers if trainers else 0.0,
                  wait=wait, published=published, loader_busy=busy,
                  idle=idle / span if span > 0 else 0.0, ready=stats["ready"],
                  num_slots=stats["num_slots"])


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
