"""Speed-aware shares of the global batch (load-balanced BSP) for PooledLoader.

Under synchronous data parallelism every step lasts as long as the slowest
rank's compute. With balance on, the global batch of B = batch_size x W
records per step is cut into units of `unit` records: the loaders publish one
unit per ring slot, and rank r pops n_r units for a step, joins them into one
batch (a copy) and releases their slots. The n_r follow each rank's measured
compute speed; their sum is always B / unit, so the global batch is fixed.
A slot is still the ring's unit of exactly-once: a unit reaches one rank.

Timing (Clock): a rank's compute for a step starts when PooledLoader hands
the batch out and ends when the rank asks for the next one (balance=True),
or, given the DDP model, when its last gradient bucket is ready (a
communication hook stamps the time, then runs DDP's own all-reduce). Under
DDP the time between two batches is the slowest rank's for every rank (the
wait inside the gradient all-reduce), so it says nothing of a rank's own
speed: pass the model there. The wait in PooledLoader's own step agreement
and in the ring is never counted (it is inside next(), before the hand-out).

Decision (Shares): a rank's speed is records per second of compute, smoothed
over steps (an exponential moving average). Every `every` steps the ranks
exchange their speeds (one all_gather over torch.distributed) and each runs
allocate() on the same numbers, so all agree on every share without another
exchange. Steps are counted alike on every rank (the step agreement keeps
them equal), so every rank reaches each exchange.

Slots: while the ranks of a host pop a step's units, they hold up to the sum
of their shares, plus one unit each of the next epoch; a ring with fewer
slots could be full of units held by ranks waiting for more. Shares are
capped at twice the equal share (2 x batch_size / unit units) to bound it.
"""

import heapq
import statistics
import time

import tailcut
from tailcut import _args, _steps

# The equal batch is cut into at most this many units by default: shares move
# in steps of 1/4 of a batch or finer. Each unit costs a loader a batch's work
# and a rank a pop and a release; with 8, the pool's own cost per step doubled
# (docs/pooled.md, "Ranks of unequal speed").
DEFAULT_UNITS_PER_BATCH = 4
# How often a rank waiting for the others' speeds looks again (and sees Ctrl-C).
_GATHER_POLL = 0.0002
# A rank takes at most this many times its equal share of units.
MAX_SHARE_FACTOR = 2


class Balance:
    """The settings of PooledLoader(balance=Balance(...)). balance=True is
    Balance(); balance=ddp_model is Balance(model=ddp_model).

    model: the DistributedDataParallel model the rank trains, whose gradient
      all-reduce waits for the slowest rank: a communication hook times the
      rank's compute up to its last gradient bucket (DDP allows one hook per
      model). None: compute is the time between two batches.
    unit: records per unit, the granularity of shares; it must divide
      batch_size. None: batch_size / d, d the largest divisor of batch_size
      up to 4.
    smoothing: the weight of a new measurement in a rank's speed, in (0, 1].
    every: steps between two decisions of the shares (one all_gather each).
    """

    def __init__(self, model=None, unit=None, smoothing=0.3, every=8):
        if model is not None and not callable(getattr(model, "register_comm_hook", None)):
            raise tailcut.InvalidArgumentError(
                f"Balance(model=...) takes the torch DistributedDataParallel model the rank "
                f"trains (its gradient all-reduce is timed through register_comm_hook), got "
                f"{type(model).__name__}; pass balance=True to time the rank between batches")
        self.model = model
        self.unit = _args.count("unit", unit, minimum=1, allow_none=True)
        self.smoothing = _args.seconds("smoothing", smoothing, allow_zero=False)
        if self.smoothing > 1:
            raise tailcut.InvalidArgumentError(
                f"smoothing must be a number in (0, 1], got {smoothing!r}")
        self.every = _args.count("every", every, minimum=1)


def settings(balance):
    """The Balance of PooledLoader's `balance` argument, or None when it is False."""
    if balance is False:
        return None
    if balance is True:
        return Balance()
    if isinstance(balance, Balance):
        return balance
    if callable(getattr(balance, "register_comm_hook", None)):
        return Balance(model=balance)
    raise tailcut.InvalidArgumentError(
        f"PooledLoader: balance must be False, True, a DistributedDataParallel model or a "
        f"tailcut.pool.Balance, got {balance!r} ({type(balance).__name__})")


def allocate(speeds, total, cap):
    """Units per rank for ranks of `speeds` (records per second; 0: not known,
    taken as the median of those known): each at least 1 and at most `cap`,
    the sum exactly `total`, and the longest time (units / speed) as short as
    whole units allow. The same list on every rank for the same speeds."""
    n = len(speeds)
    if not n <= total <= n * cap:
        raise ValueError(f"{total} units cannot be shared by {n} ranks with 1 to {cap} each")
    known = [s for s in speeds if s > 0]
    fill = statistics.median(known) if known else 1.0
    speeds = [s if s > 0 else fill for s in speeds]
    shares = [1] * n
    # Each unit goes to the rank that would finish it first: optimal for equal
    # units on ranks of fixed speeds. Ties go to the lower rank.
    heap = [(2 / speeds[r], r) for r in range(n)]
    heapq.heapify(heap)
    for _ in range(total - n):
        _, r = heapq.heappop(heap)
        shares[r] += 1
        if shares[r] < cap:
            heapq.heappush(heap, ((shares[r] + 1) / speeds[r], r))
    return shares


def held_units(spec, batch_size, world_size, local_world_size):
    """The most units the ranks of a host hold at once while they gather
    their shares: the sum of their shares (each capped at MAX_SHARE_FACTOR x
    the equal share), plus one unit each of the next epoch. The ring needs
    that many slots at least (PooledLoader's default num_slots has them)."""
    unit = spec.unit
    if unit is None or batch_size % unit:
        per = max(d for d in range(1, DEFAULT_UNITS_PER_BATCH + 1) if batch_size % d == 0)
    else:
        per = batch_size // unit
    cap = MAX_SHARE_FACTOR * per
    return min(world_size * per, local_world_size * cap) + local_world_size


class _GradientClock:
    """The communication hook's state: when this rank's last gradient bucket
    of the step was ready (its compute was done; what follows is waiting for
    the others in the all-reduce)."""

    def __init__(self, model):
        self.process_group = getattr(model, "process_group", None)
        self.ready = None
        try:
            model.register_comm_hook(self, _timed_allreduce)
        except RuntimeError as e:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=model): the model's communication hook could not be "
                f"set ({e}); DDP takes one hook per model: pass balance=True instead, which "
                f"times the rank between batches (under DDP that is the slowest rank's time)"
            ) from None


def _timed_allreduce(clock, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    clock.ready = time.perf_counter()
    return allreduce_hook(clock.process_group, bucket)


class Shares:
    """One rank's share of the global batch: what it measures and what the
    ranks decided. Not thread-safe: the rank's iteration alone uses it."""

    def __init__(self, spec, batch_size, world_size, local_world_size, num_slots):
        self.spec = spec
        unit = spec.unit
        if unit is None:
            per_batch = max(d for d in range(1, DEFAULT_UNITS_PER_BATCH + 1) if batch_size % d == 0)
            unit = batch_size // per_batch
        elif batch_size % unit:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=Balance(unit={unit})): a unit must divide batch_size "
                f"({batch_size}), so that the global batch is a whole number of units")
        self.unit, self.batch_size = unit, batch_size
        self.per_batch = batch_size // unit  # units of an equal share
        self.cap = MAX_SHARE_FACTOR * self.per_batch
        self.world_size = world_size
        held = held_units(spec, batch_size, world_size, local_world_size)
        if num_slots < held:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=...): the {local_world_size} ranks of this host may hold "
                f"{held} units of {unit} records at once while they gather their shares, and "
                f"num_slots is {num_slots}: pass num_slots={held} or more (a slot then holds "
                f"one unit, so slot_bytes can be about 1/{self.per_batch} of a whole batch's), "
                f"or a larger unit (tailcut.pool.Balance(unit=...))")
        self.clock = _GradientClock(spec.model) if spec.model is not None else None
        self.group = None
        self.rank_index = 0
        self.shares = [self.per_batch] * world_size
        self.speed = 0.0  # records per second of compute, smoothed; 0: not measured yet
        self.speeds = [0.0] * world_size  # every rank's speed at the last decision
        self.steps = 0  # steps done under balance, alike on every rank
        self.decided_at = 0
        self._handed_out = None  # (time, records) of the batch the rank holds

    @property
    def units(self):
        """This rank's units for the next step."""
        return self.shares[self.rank_index]

    def begin(self, group):
        """At the first iteration: the process group that exchanges speeds
        (`group`, else the default one)."""
        if self.group is not None or self.world_size == 1:
            return
        dist = _steps._dist()
        if dist is None:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=...): the {self.world_size} ranks exchange their speeds "
                f"through torch.distributed: call init_process_group() before iterating")
        self.group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(self.group)
        if size != self.world_size:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader(balance=...): world_size is {self.world_size} but the process "
                f"group that exchanges speeds has {size} ranks: the global batch is shared by "
                f"the ranks of that group (pass world_size={size})")
        self.rank_index = dist.get_rank(self.group)

    def before_step(self):
        """Before a step's units are popped: every `every` steps, the ranks
        exchange speeds and decide the shares (collective)."""
        if self.steps == self.decided_at or self.steps % self.spec.every:
            return
        self.decided_at = self.steps
        if self.group is not None:
            self.speeds = self._gather_speeds()
            self.shares = allocate(self.speeds, self.world_size * self.per_batch, self.cap)

    def handed_out(self, records):
        """The rank got a batch of `records` records: its compute starts."""
        self._handed_out = (time.perf_counter(), records)

    def step_done(self):
        """The rank asks for its next batch: the last one's compute is over
        (with a model: it was over when its last gradient bucket was ready)."""
        if self._handed_out is None:
            return
        (start, records), self._handed_out = self._handed_out, None
        self.steps += 1  # counted whether measured or not: every rank must count alike
        end = time.perf_counter()
        if self.clock is not None:
            if self.clock.ready is None or self.clock.ready < start:
                return  # no backward in this step (evaluation): nothing measured
            end = self.clock.ready
        if end <= start:
            return
        sample = records / (end - start)
        a = self.spec.smoothing
        self.speed = sample if self.speed == 0.0 else self.speed + a * (sample - self.speed)

    def _gather_speeds(self):
        import torch
        dist = torch.distributed
        device = "cpu"
        if dist.get_backend(self.group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor([self.speed], dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        work = dist.all_gather(every, mine, group=self.group, async_op=True)
        while not work.is_completed():  # not one blocking call: Ctrl-C is seen between polls
            time.sleep(_GATHER_POLL)
        work.wait()
        return [float(t.item()) for t in every]


def join(batches, records):
    """One batch of a rank's units: `batches` (each a tensor, or a tuple,
    list or dict of them as the recipe made it) of `records` records each,
    every tensor joined along its first dimension (a copy). A list of plain
    values (strs of a map-style batch) is one value per record and is joined
    too."""
    import torch

    def rows(x, n, path):
        if isinstance(x, torch.Tensor):
            if x.dim() > 0 and x.shape[0] == n:
                return
            what = f"a tensor of shape {tuple(x.shape)}"
        elif isinstance(x, (list, tuple)) and not _is_tree(x):
            if len(x) == n:
                return
            what = f"a list of {len(x)} values"
        else:
            what = f"a {type(x).__name__}"
        raise tailcut.InvalidArgumentError(
            f"PooledLoader(balance=...): a rank's batch is its units joined along their first "
            f"dimension, and {path or 'the batch'} of a unit of {n} records is {what}, not one "
            f"row per record: use fixed-size records, a map-style dataset, or a collate_fn "
            f"that makes one row per record (the (data, offsets) of lines, tfrecord or file "
            f"records cannot be joined)")

    def walk(parts, path):
        first = parts[0]
        if isinstance(first, dict):
            return type(first)((k, walk([p[k] for p in parts], f"{path}[{k!r}]"))
                               for k in first)
        if isinstance(first, (list, tuple)) and _is_tree(first):
            joined = [walk([p[i] for p in parts], f"{path}[{i}]") for i in range(len(first))]
            return first._make(joined) if hasattr(first, "_make") else type(first)(joined)
        for part, n in zip(parts, records):
            rows(part, n, path)
        if isinstance(first, torch.Tensor):
            return torch.cat(parts)
        return type(first)(v for part in parts for v in part)

    return walk(list(batches), "")


def _is_tree(seq):
    """A tuple or list of fields (tensors or containers), not of per-record values."""
    import torch
    return len(seq) > 0 and all(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in seq)
