"""PooledLoader: what a rank iterates. It pops the next ready batch of the
host's ring, whichever loader made it, and agrees with the other ranks on
equal steps; local rank 0 starts the host's loaders (tailcut.pool._loader)."""

import atexit
import collections
import functools
import os
import sys
import time
import weakref

import tailcut
from tailcut import _args, _core, _job, _pool_state, _steps
from tailcut._batch_layout import decode_batch, ranges_mark
import tailcut.pool._autoscale as _autoscale
import tailcut.pool._balance as _balance
import tailcut.pool._dataloader_args as _dataloader_args
import tailcut.pool._description as _description
import tailcut.pool._lifecycle as _lifecycle
import tailcut.pool._slots as _slots
import tailcut.pool._status as _status
from tailcut.pool._in_process import InProcessLoader
from tailcut.pool._loader import RING_MAX_CLIENTS, split_options, start_loaders
from tailcut.pool._metrics import StepClock
from tailcut.pool._recipe import recipe_for

# A rank takes a ready batch without a look at the loaders' failure record (a
# file: a system call); it looks whenever it has to wait, at an epoch's end,
# and at least this often (seconds) while batches keep coming.
FAILURE_CHECK_S = 0.1

# torch's side of the hand-off (tailcut.torch._tensors.from_numpy and
# tailcut.pool._hand_off), imported on the first batch: importing this module
# does not import torch. Set once, then read per batch without an import.
_torch_side = None


def _torch_helpers():
    global _torch_side
    if _torch_side is None:
        import tailcut.pool._hand_off as _hand_off
        from tailcut.torch._tensors import from_numpy  # read-only views: torch's warning once
        _torch_side = (from_numpy, _hand_off)
    return _torch_side


def _cuda_initialized():
    """True when torch is loaded and has initialized CUDA in this process."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available() and
                    torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


class _RankFailures:
    """Where a rank's exception is recorded for the host's other ranks: the
    pool's failure record (tailcut.pool._lifecycle), which they raise."""

    def __init__(self, ring_name):
        self.ring_name = ring_name

    def record(self, exc):
        _lifecycle.report_failure(self.ring_name, os.getpid(), exc, who="rank")

    def raise_if_failed(self):
        _lifecycle.raise_if_failed(self.ring_name)


_Held = _pool_state.Held  # a leftover batch carried into the next epoch


def _map_source(dataset, batch_size, options, queue_options):
    """The MapSource of a map-style dataset (given with PooledLoader's options
    of its queue: shuffle, seed, drop_last, name, ..., and queue_options),
    else None."""
    from tailcut.pool._map_source import wrap  # imports torch
    return wrap(dataset, batch_size, options, queue_options)


def _pads(pad, sampler, shares):
    """pad= as a bool. None: True under a DistributedSampler with
    drop_last=False (it pads the ranks' shares with repeats), unless the
    loader balances (its steps are units of the global batch)."""
    if pad is None:
        return (shares is None and sampler is not None
                and not getattr(sampler, "drop_last", True))
    pad = _args.flag("pad", pad)
    if pad and shares is not None:
        raise tailcut.InvalidArgumentError(
            "PooledLoader: pad=True with balance= is refused: a balanced step is a share of "
            "the global batch, not a batch to repeat; leave pad= unset (the last partial "
            "global batch is carried over)")
    return pad


class _Carried:
    """The leftovers a rank carries (_Held copies): `next`, for the next
    epoch, and `now`, those not yet yielded in this one. Held apart from the
    PooledLoader, so that its finalizer settles them when the loader is
    dropped without close(), as DataLoader users drop theirs."""

    def __init__(self):
        self.next, self.now = [], []


def _settle(carry, reports, on_leftover, rank, queue_args):
    """Drops what `carry` holds, each shown to on_leftover, counted in the
    last report's dropped_* and, without on_leftover, warned about with the
    count: the job ended its loop before the queue's last epoch (close(),
    the loader dropped, exit), so the epoch they were carried into never
    ran. Never lost silently."""
    held = list(carry.now) + list(carry.next)
    carry.now, carry.next = [], []
    if not held or not reports:
        return
    report = reports[-1]
    leftovers = _steps.Leftovers(False, on_leftover, "tailcut.pool")
    for batch in held:
        leftovers.drop(report, batch.records,
                       lambda fn, b=batch: fn is not None and fn(b.tensors))
    if on_leftover is None:
        leftovers.log.warning(
            "tailcut.pool: rank %d dropped %d leftover records (%d batches) of epoch %d "
            "carried into an epoch that never ran (the loop ended before the queue's "
            "num_epochs=%d; counted in reports[-1]['dropped_records']): run that epoch, or "
            "pass on_leftover= to use them, or carry_over=False to have them reported in "
            "their own epoch", rank, sum(b.records for b in held), len(held), held[0].epoch,
            queue_args.get("num_epochs", 1))


def _settle_then_end(settle, end):
    """The PooledLoader's end (close(), dropped, exit): its carried leftovers
    settled, then the pool ended (_lifecycle.end_pool)."""
    try:
        settle()
    finally:
        end()


class _DataLoaderDefault(int):
    """batch_size's default, 1 as in DataLoader, told apart from a 1 given: a
    QueueDataset that batches itself keeps its own batch_size then."""

    def __repr__(self):
        return "1"


_DEFAULT_BATCH_SIZE = _DataLoaderDefault(1)


class PooledLoader:
    """Batches from a host-wide pool of loader processes, equal steps per rank.

    PooledLoader(dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=None,
                 persistent_workers=False, pin_memory_device='',
                 ...tailcut's keywords)

    DataLoader's signature: each of its arguments means what it means there,
    or is refused with a line naming PooledLoader and the argument
    (_dataloader_args.py; the table in docs/pooled.md, "DataLoader's
    arguments"). num_workers is per rank: local rank 0 ($LOCAL_RANK, else
    local_rank, else rank, else 0) starts num_workers x $LOCAL_WORLD_SIZE
    loader processes (run_loader) for the whole host on the first iteration,
    or loaders_per_host= of them (an int, (min, max) or a
    tailcut.pool.Autoscale: autoscaled, see docs/pooled.md, "Autoscaling";
    loader.autoscale is that policy, else None; 0: loaders come from
    elsewhere). num_workers=0 loads in each rank's own process
    (_in_process.py). add_loaders(n) and remove_loaders(n) change their
    number at any time, and `python3 -m tailcut.pool --ring NAME` adds one
    from any shell. Every rank pops the next ready batch of the host's ring.
    A DistributedSampler given as sampler= is read for its shuffle, seed,
    drop_last and the epoch its set_epoch() sets.

    `dataset` is a tailcut.torch.QueueDataset, or any map-style dataset
    (dataset[i], len(dataset)), which the loaders read by index through the
    job's queue (name, seed, num_epochs=100, num_slices, restore_state,
    resume: see tailcut.pool._map_source and docs/pytorch.md). batch_size,
    collate_fn and transform default to a QueueDataset's own: its batch_size,
    and its transform, which then runs in the loaders as it would have in
    DataLoader workers (on each batch, as torch tensors, if the dataset
    batches; else on each record, before collate_fn or torch's
    default_collate).

    Iterating runs one epoch (set_epoch(e), else 0, 1, ...) and yields each
    batch as tensors the caller owns (copied out of the ring, into pinned
    memory with pin_memory); zero_copy=True yields the ring's memory itself,
    READ-ONLY AND VALID UNTIL THE NEXT BATCH IS REQUESTED. The ring has
    num_slots slots (None: sized for the ranks' shares and prefetch_factor
    batches per loader, _slots.py) of slot_bytes each (None: room for a batch
    of the first sample of a map-style dataset, else 4 MiB). timeout=0 waits for
    ever for a batch. Every rank gets the same number of batches per epoch
    (tailcut._steps: WorkQueue.agree_step over the local_world_size ranks of
    the host, combined over the torch.distributed default group, or `group`,
    when it has more ranks than the host: every rank of every host ends the
    epoch at the same step). A rank whose next batch raises tells the others,
    which raise too rather than wait for it. The batches left when one rank
    has none are counted in `reports` and, with carry_over=True (the default:
    every record once per epoch), yielded first in the next epoch (copied);
    otherwise, and after the queue's last epoch, each is passed to
    on_leftover(batch) and released, and a warning says how many records were
    dropped, as EqualSteps does. pad=True (None: True under a
    DistributedSampler with drop_last=False, as it pads) trains them in the
    same epoch instead: while any rank holds one, every rank steps, those
    without one on a repeat of their first batch of the epoch (counted in
    reports[e]['padded_records']). len() is this rank's steps per epoch, an
    estimate (records per epoch / batch_size / local ranks). Failures,
    restarts, what is left: tailcut.pool._lifecycle. A loop that ran its
    epochs to their end closes without a notice.

    Several hosts: a pool per host, named after the host's queue; with a
    coordinator (TAILCUT_COORDINATOR, TAILCUT_HOST_ID) that queue is fed its
    share of the job, and an epoch ends on the host once its share of it is
    settled (WorkQueue.settled_tickets). See docs/pooled.md, "Several hosts".

    balance=True, a DistributedDataParallel model, or a tailcut.pool.Balance:
    each rank's share of the global batch (batch_size x world_size records)
    follows its measured compute speed (tailcut.pool._balance); the loaders
    publish units of the batch, a rank's batch is its units joined (a copy),
    and after each batch `weight` is the factor (world_size x records /
    global batch) by which the rank scales its mean loss so that DDP's
    average gradient is the global batch's mean. balance=False: every rank
    takes batch_size records per step, weight stays 1.0.
    """

    def __init__(self, dataset, batch_size=_DEFAULT_BATCH_SIZE, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 loaders_per_host=None, zero_copy=False, name=None, seed=None, num_epochs=None,
                 num_slices=None, restore_state=None, resume=None, queue_options=None,
                 transform=None,
                 num_slots=None, slot_bytes=None, balance=False, carry_over=True,
                 pad=None, on_leftover=None, rank=None, world_size=None, local_rank=None,
                 local_world_size=None, group=None):
        arguments = dict(locals())
        del arguments["self"]
        try:
            self._init(**arguments)
        except (TypeError, ValueError) as e:
            # An argument's check names the argument; the error names the class too.
            if str(e).startswith("PooledLoader"):
                raise
            raise type(e)(f"PooledLoader: {e}") from None

    def _init(self, dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
              collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
              multiprocessing_context, generator, prefetch_factor, persistent_workers,
              pin_memory_device, loaders_per_host, zero_copy, name, seed, num_epochs, num_slices,
              restore_state, resume, queue_options, transform, num_slots, slot_bytes, balance,
              carry_over, pad,
              on_leftover, rank, world_size, local_rank, local_world_size, group):
        rank = _args.count("rank", rank, allow_none=True)
        world_size = _args.count("world_size", world_size, minimum=1, allow_none=True)
        local_rank = _args.count("local_rank", local_rank, allow_none=True)
        local_world_size = _args.count("local_world_size", local_world_size, minimum=1,
                                       allow_none=True)
        self.rank = _job.env_int("RANK", 0) if rank is None else rank
        self.world_size = _job.env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.local_rank = _job.env_int("LOCAL_RANK", self.rank) if local_rank is None else local_rank
        self.local_world_size = (_job.env_int("LOCAL_WORLD_SIZE", self.world_size)
                                 if local_world_size is None else local_world_size)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"PooledLoader: local_rank {self.local_rank} is not in "
                             f"[0, local_world_size={self.local_world_size})")
        # DataLoader's arguments, each honoured or refused by name (_dataloader_args.py).
        _dataloader_args.context(multiprocessing_context)
        shuffle, seed, drop_last = _dataloader_args.order(
            dataset, sampler, batch_sampler, shuffle, seed, generator, drop_last,
            self.world_size, self.rank)
        self._sampler = sampler
        self._sampler_epoch = getattr(sampler, "epoch", None)  # a change is a set_epoch()
        self.pin_memory = _dataloader_args.pinning(pin_memory, pin_memory_device)
        self.zero_copy = _args.flag("zero_copy", zero_copy)
        if self.zero_copy and pin_memory:
            raise tailcut.InvalidArgumentError(
                "PooledLoader: zero_copy=True hands out views of the ring, pin_memory=True "
                "pinned copies: give one of them")
        self.prefetch_factor = _dataloader_args.prefetch(prefetch_factor, persistent_workers)
        self.persistent_workers = persistent_workers
        self.worker_init_fn = _args.callable_or_none("worker_init_fn", worker_init_fn)
        _args.count("batch_size", batch_size, minimum=1, allow_none=True)
        # A map-style dataset is read through an index queue (_map_source.py).
        self._map_source = _map_source(dataset, batch_size, dict(
            shuffle=shuffle, seed=seed, drop_last=drop_last, name=name, num_epochs=num_epochs,
            num_slices=num_slices, restore_state=restore_state, resume=resume),
            queue_options)
        dataset = self._map_source or dataset
        self.dataset = dataset
        self._check_resumed()  # a dataset whose queue is open already
        loaders, self._in_process = _dataloader_args.workers(num_workers, loaders_per_host,
                                                             self.local_world_size)
        self.num_workers = num_workers
        # An int: a fixed pool; (min, max) or an Autoscale: min loaders to start, then
        # autoscaled. In process (num_workers=0): one loader thread per rank.
        self.loaders_per_host, self.autoscale = _autoscale.workers(loaders,
                                                                   RING_MAX_CLIENTS - 1)
        for key, fn in (("collate_fn", collate_fn), ("transform", transform),
                        ("on_leftover", on_leftover)):
            _args.callable_or_none(key, fn)
        if batch_size is _DEFAULT_BATCH_SIZE and getattr(dataset, "batch_size", None):
            batch_size = None  # a QueueDataset's own (a MapSource's is batch_size)
        self._recipe = recipe_for(dataset, batch_size, collate_fn, transform)
        self.batch_size = self._recipe.batch_size
        self.drop_last = drop_last
        self.collate_fn, self.transform = collate_fn, transform
        # None: sized from the dataset's first sample (map-style), else 4 MiB (_slots.py).
        self.slot_bytes = _slots.slot_bytes(
            _args.count("slot_bytes", slot_bytes, minimum=1, allow_none=True),
            self._map_source, self._recipe)
        balance = _balance.settings(balance)
        self.num_slots = _slots.num_slots(
            _args.count("num_slots", num_slots, minimum=1, allow_none=True),
            self.autoscale.maximum if self.autoscale else self.loaders_per_host,
            self.prefetch_factor, self.local_world_size, self.slot_bytes,
            _balance.held_units(balance, self.batch_size, self.world_size,
                                self.local_world_size) if balance is not None else None)
        # Named after the host's queue: '<name>.<host id>' where a coordinator feeds it, so
        # that the pools of hosts sharing a machine (or a test's simulated hosts) never meet.
        self.name = f"{_pool_state.host_queue_name(dataset._queue_args)}.pool"
        self._shares = None  # _balance.Shares: this rank's share of the global batch
        if balance is not None:  # the loaders publish units of a batch
            self._shares = _balance.Shares(balance, self.batch_size, self.world_size,
                                           self.local_world_size, self.num_slots)
            self._recipe = recipe_for(dataset, self._shares.unit, collate_fn, transform)
        self.weight = 1.0  # the loss factor of the last batch (balance)
        if self._in_process:  # this rank loads: it splits as the loaders do
            split_options(dataset, self._recipe.batch_size)
        # The epoch the samples of the last batch belong to: the iteration's, or an
        # earlier one for a batch carried over (or late), so a per-epoch count adds up.
        self.batch_epoch = None
        # What `tailcut top` shows of autoscaling and shares, written by local rank 0.
        self._status = None
        if self.local_rank == 0 and (self.autoscale is not None or self._shares is not None):
            self._status = _status.PoolStatus(self.name, self.autoscale, self._shares)
        self.timeout = _dataloader_args.timeout(timeout)  # None: wait for ever
        self.carry_over = _args.flag("carry_over", carry_over)
        self.pad = _pads(pad, sampler, self._shares)
        self.on_leftover = on_leftover
        # Pinned for CUDA only where this process already chose its device
        # (torch.cuda.set_device, or any CUDA work): registering first would
        # make a context on device 0 for every rank. See docs/pooled.md.
        # A ring no live trainer uses is a dead attempt's: removed first, never popped.
        self.ring = _lifecycle.open_trainer_ring(
            self.name, _job.earlier_attempts(self.name),
            lambda: _core.BatchRing(self.name, self.slot_bytes, self.num_slots, "trainer",
                                    max_clients=RING_MAX_CLIENTS,
                                    cuda_register=_cuda_initialized()))
        self.epoch = _pool_state.restored_epoch(dataset)  # a resumed queue's, else 0
        self.reports = []
        self._clock = StepClock()  # each step's wait for its batch: metrics()
        self.loaders = []  # the loader processes this process started
        self._leaving = set()  # pids of those asked to leave
        self._started = False
        self._own_loader = None  # num_workers=0: this rank's InProcessLoader
        self._spec_holder = [None]  # removes the description written here
        # close()'s end, also at GC or exit (DataLoader users never close()); registered
        # after multiprocessing's exit handler, so it runs before that one.
        # Leftovers still carried are settled first (counted, warned about): a loader
        # dropped without close() loses none silently.
        self._carry = _Carried()
        self._end = weakref.finalize(self, _settle_then_end, functools.partial(
            _settle, self._carry, self.reports, on_leftover, self.rank,
            self.dataset._queue_args), functools.partial(
            _lifecycle.end_pool, self.ring, self.name, self.local_rank == 0, self.loaders,
            self._spec_holder))
        self._end.atexit = False
        atexit.register(self._end)
        self._group = group  # torch.distributed group of the step agreement (tailcut._steps)
        self._steps = None  # its StepAgreement, made at the first iteration
        self._leftovers = None  # this epoch's _steps.Leftovers
        self._current = []  # the slots of the batch this rank holds
        self._pad_rest = []  # pad: the epoch's batches its padded steps have still to yield
        # Under balance, the record ranges of the units of the last step (their
        # slots are released within the step): what state_dict() counts as used.
        self._balanced_ranges = []
        # Ranges marks of this rank's last used batches (_pool_state.RECENT_USED): what
        # state_dict() counts as used, with the batch it holds.
        self._recent_used = collections.deque(maxlen=_pool_state.RECENT_USED)
        self._stash = None
        self._failure_check_at = 0.0  # monotonic time of the next look at failures (_pop)
        self._position = (self.epoch, 0)  # (epoch, steps done in it), for state_dict()
        self._state_calls = 0  # state_dict() calls so far (they meet by number)
        self._call_index = _pool_state.call_index()  # names them across ranks

    @property
    def queue(self):
        """The dataset's queue (this process's)."""
        queue = self.dataset.queue
        self._check_resumed()
        return queue

    def _check_resumed(self):
        resumed = getattr(self.dataset, "_resumed", None)
        if resumed is not None:
            # Loaders ack what they publish: the dead run's batches that no rank used are
            # done in the queue's state, and with its ring gone nothing says which they were.
            raise tailcut.InvalidArgumentError(
                f"PooledLoader: {resumed} was resumed without a checkpoint (resume=True), "
                f"which would lose the batches its loaders had published and no rank had used "
                f"(up to num_slots): resume from a checkpoint (PooledLoader.state_dict(), then "
                f"load_state_dict(state) before the first iteration; docs/pooled.md), or start "
                f"over (resume=False, the default)")

    @property
    def shares(self):
        """Under balance, the records per step of every rank of the group, as
        last decided (the same list on every rank); else None."""
        if self._shares is None:
            return None
        return [units * self._shares.unit for units in self._shares.shares]

    def state_dict(self):
        """The pool's data position, the same dict on every rank: call it on
        every rank at the same step (after the step: the batch a rank holds
        counts as used) and save rank 0's. Batches published but not used (in
        the ring, held for the next epoch, carried over) and records loaders
        read ahead are read again after a restore; see docs/pooled.md,
        "Restarts and checkpoints". Several hosts: it holds every host's part,
        each under its queue's name; fed by a coordinator, also the
        coordinator's state with the hosts' done marks, and opening the queue
        with restore_state=state['queue'] is then collective too (rank 0 draws
        the restore's token, the ranks tell each other their hosts), on any
        number of hosts (docs/checkpoints.md). More than one rank: collective
        over torch.distributed (`group`, else the default group)."""
        return _pool_state.state_dict(self)

    def load_state_dict(self, state):
        """Resumes at state['epoch'], from the dataset's queue opened with
        restore_state=state['queue'], or reopened from it here before the
        first iteration (InvalidArgumentError otherwise, and when a state of
        a queue per host covers another number of hosts: a pool fed by a
        coordinator restores on any number)."""
        _pool_state.load_state_dict(self, state)

    def set_epoch(self, epoch):
        """The epoch the next iteration runs."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < (1 << 30):
            raise ValueError(f"epoch must be an int in [0, 2**30), got {epoch!r}")
        self.epoch = epoch

    def __len__(self):
        counter = getattr(self.dataset, "records_per_epoch", None)
        if counter is not None:
            records, _ = counter()
        else:
            total = sum(os.path.getsize(p) for p in self.queue.paths)
            fmt = self.queue.format or "lines"
            records = total // int(fmt.split(":", 1)[1]) if fmt.startswith("fixed:") else total
        return records // self.batch_size // self.local_world_size

    def _loader_kwargs(self):
        return dict(batch_size=self._recipe.batch_size, slot_bytes=self.slot_bytes,
                    num_slots=self.num_slots, collate_fn=self.collate_fn,
                    transform=self.transform, max_clients=RING_MAX_CLIENTS)

    def _publish_spec(self):
        if self._spec_holder[0] is None:
            _description.write(self.name, self.queue, self._recipe, self.slot_bytes, self.num_slots,
                        RING_MAX_CLIENTS, 0.005)
            self._spec_holder[0] = functools.partial(_description.remove, self.name, os.getpid())

    def start_loaders(self):
        """Starts this host's num_workers loader processes (done by local rank
        0 on the first iteration) and writes the pool's description, so that
        `python3 -m tailcut.pool --ring NAME` can add loaders; once."""
        if not self._started:
            self._started = True
            self._publish_spec()
            self.loaders += start_loaders(self.dataset, self.name, self.loaders_per_host,
                                          worker_init_fn=self.worker_init_fn,
                                          **self._loader_kwargs())
            if self._status is not None:
                self._status.started(len(self.live_loaders()))
        return self.loaders

    def add_loaders(self, n=1):
        """Starts n more loader processes for the host now, also mid-epoch and
        from any local rank; they take items from the queue like the others.
        Returns them (multiprocessing.Process)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self._publish_spec()
        procs = start_loaders(self.dataset, self.name, n, worker_init_fn=self.worker_init_fn,
                              first_id=len(self.loaders), **self._loader_kwargs())
        self.loaders += procs
        return procs

    def remove_loaders(self, n=1):
        """Asks n of the loader processes this process started (the newest
        first) to leave: each publishes and acks what it holds, then exits
        (SIGTERM). Returns them without waiting: a loader may have to wait for
        a free slot, which this rank frees by iterating."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        live = self.live_loaders()
        chosen = live[len(live) - min(n, len(live)):]
        for p in chosen:
            self._leaving.add(p.pid)
            p.terminate()
        return chosen

    def live_loaders(self):
        """The loader processes this process started that are running and
        were not asked to leave."""
        return [p for p in self.loaders if p.exitcode is None and p.pid not in self._leaving]

    def _release_current(self):
        held = self._current
        if held:
            self._current = ()
            for batch in held:
                self.ring.release(batch)

    def _next(self, epoch, report):
        """The next batch of `epoch` (or, with carry_over, a late one of an
        earlier epoch), or None at its end."""
        for batch in self._current:  # asking for the next: the batch held was used
            self._recent_used.append(ranges_mark(batch.data, batch.header))
        self._release_current()
        while True:
            if self._stash is not None:
                if self._stash.epoch > epoch:
                    return None
                batch, self._stash = self._stash, None
            else:
                batch = self._pop(epoch)
                if batch is None:
                    return None
            if (self._map_source is not None and self._map_source.drop_last
                    and batch.records < self._recipe.batch_size):
                self._leftovers.drop(report, batch.records, self._shower(batch), short=True)
                continue
            if batch.epoch == epoch:
                return batch
            if batch.epoch > epoch:
                self._stash = batch  # the next epoch's first
                return None
            # An earlier epoch's, published after the ranks ended it: late.
            report["late_batches"] += 1
            if self.carry_over:
                return batch
            self._leftovers.drop(report, batch.records, self._shower(batch))

    def _pop(self, epoch):
        """The ring's next batch through `epoch`, None at its end. A ready batch
        is taken at once; otherwise, and every FAILURE_CHECK_S s, the waiting
        pop of _lifecycle, which looks for failed and missing loaders."""
        now = time.monotonic()
        if now < self._failure_check_at:
            try:
                batch = self.ring.pop(epoch, 0.0)
            except tailcut.Empty:  # none ready: wait below, with the checks
                pass
            else:
                if batch is None:  # the epoch's end: did a loader fail before it?
                    _lifecycle.raise_if_failed(self.name)
                return batch
        self._failure_check_at = now + FAILURE_CHECK_S
        return _lifecycle.pop(self.ring, self.name, epoch, self.timeout,
                              self.loaders_per_host > 0 or self._in_process, self.loaders,
                              self.queue)

    def _balanced(self, parts):
        """This rank's batch of a step under balance: its units joined (a
        copy), their slots released (the records count as used, as those of
        the batch a rank holds do); sets weight."""
        self._recent_used.append(self._balanced_ranges)  # the last step's: used
        self._current = [p for p in parts if not isinstance(p, _Held)]
        self._balanced_ranges = [r for p in self._current
                                 for r in _pool_state.batch_ranges(p.data, p.header)]
        try:
            records = [p.records for p in parts]
            batch = _balance.join([p.tensors if isinstance(p, _Held) else self._tensors(p)
                                   for p in parts], records)
        finally:
            self._release_current()
        # DDP averages the ranks' gradients: world_size x n / global batch makes each
        # record weigh 1 / global batch in that average, whatever this rank's share.
        self.weight = sum(records) / self.batch_size
        self._shares.handed_out(sum(records))
        return batch

    def _tensors(self, batch, copy=False):
        """The batch in a slot as tensors: views of the ring's memory, or with
        `copy` over arrays of their own (one copy, numpy's, then no other)."""
        from_numpy = (_torch_side or _torch_helpers())[0]
        arrays = decode_batch(batch.data, batch.header)
        if copy:
            arrays = (tuple(a.copy() for a in arrays) if isinstance(arrays, tuple)
                      else arrays.copy())
        if self._map_source is not None:  # the batch as the dataset's samples collated
            arrays = arrays if isinstance(arrays, tuple) else (arrays,)  # the tree alone
            return self._map_source.rebuild_batch(tuple(from_numpy(a) for a in arrays))
        if isinstance(arrays, tuple):
            return tuple(from_numpy(a) for a in arrays)
        return from_numpy(arrays)

    def _owned(self, batch, copied=False):
        """The batch handed to the caller: its own copy (pinned with
        pin_memory), or with zero_copy the ring's view, valid until the next
        batch. `copied`: the batch owns its memory already."""
        if self.zero_copy:
            return batch
        _hand_off = (_torch_side or _torch_helpers())[1]
        if copied:
            return _hand_off.pinned(batch) if self.pin_memory else batch
        return _hand_off.owned(batch, self.pin_memory)

    def _shower(self, batch):
        """show(on_leftover) of a dropped batch: passes its tensors to
        on_leftover (if any), then releases its slot."""
        def show(on_leftover):
            if isinstance(batch, _Held):
                if on_leftover is not None:
                    on_leftover(batch.tensors)
                return
            try:
                if on_leftover is not None:
                    on_leftover(self._tensors(batch))
            finally:
                self.ring.release(batch)
        return show

    def _leftover(self, batch, report, last_epoch):
        def keep():
            if isinstance(batch, _Held):
                self._carried.append(batch)
                return
            try:
                self._carried.append(_Held(self._tensors(batch, copy=True), batch.records,
                                           _pool_state.batch_ranges(batch.data, batch.header),
                                           batch.epoch))
            finally:
                self.ring.release(batch)
        self._leftovers.add(report, batch.records, last_epoch, keep, self._shower(batch))

    def _agreement(self):
        if self._steps is None:  # made here: torch.distributed may start after __init__
            self._steps = _steps.StepAgreement(
                self.queue, self.local_rank, self.local_world_size, timeout=self.timeout,
                group=self._group, who="PooledLoader", failures=_RankFailures(self.name))
            # A rank that called state_dict() while this one waits for the next step.
            # (Through a weak reference: the loader holds its agreement.)
            me = weakref.ref(self)
            self._steps.watch = lambda epoch, step: _pool_state.watch_calls(me(), epoch, step)
        return self._steps

    def __iter__(self):
        return self._clock.timed(self._epoch_steps())

    def metrics(self, window=None):
        """The input pipeline's numbers as a flat dict of floats, over the steps since the
        last call (window=None) or the last `window` seconds: this rank's data wait (mean,
        p99, max, share of the window), batches and samples per second, live loaders, ring
        fill, the loaders' wait for free slots, weight, this epoch's leftovers
        (tailcut/pool/_metrics.py lists the keys). Cheap enough to call every step."""
        return self._clock.report(self, _args.seconds("window", window, allow_zero=False,
                                                      allow_none=True))

    def _epoch_steps(self):
        self._release_current()  # the last batch of a loop left early (below)
        if self.local_rank == 0:
            self.start_loaders()
        steps = self._agreement()
        if self._in_process and self._own_loader is None:
            # num_workers=0: this rank loads in its own process (_in_process.py).
            self._own_loader = InProcessLoader(self.dataset, self.name, self._loader_kwargs())
            self._own_loader.start()
        sampler_epoch = getattr(self._sampler, "epoch", None)
        if sampler_epoch != self._sampler_epoch:  # the DistributedSampler's set_epoch()
            self._sampler_epoch = sampler_epoch
            self.set_epoch(sampler_epoch)
        epoch = self.epoch
        if epoch >= _steps.MAX_EPOCH:
            raise ValueError("PooledLoader: epoch must be below 2**30")
        self.epoch = epoch + 1
        last_epoch = epoch + 1 >= self.queue.num_epochs
        carried, self._carried = self._carried, []
        self._carried_now = carried
        self._position = (epoch, 0)
        if self._map_source is not None:
            self._map_source.notices.finished = False  # until this epoch's loop ends
        report = _steps.new_report(epoch, len(carried))
        self.reports.append(report)
        self._leftovers = _steps.Leftovers(self.carry_over, self.on_leftover, "tailcut.pool")
        step = 0
        autoscaled = self.autoscale is not None and self.local_rank == 0
        # The caller's own copy is made as the slot's arrays are read (one copy);
        # with pin_memory, _owned pins a view's copy instead.
        copy_out = not self.zero_copy and not self.pin_memory
        self._failure_check_at = 0.0  # the epoch's first pop looks

        def next_batch():
            if autoscaled:
                self.autoscale.look(self)  # at most every autoscale.interval s: cheap
                self._status.after_look()
            return carried.pop(0) if carried else self._next(epoch, report)

        shares = self._shares
        if shares is not None:
            shares.begin(self._group)
        left_early = False
        first = None  # pad: (a copy of this rank's first batch of the epoch, its records)
        try:
            while True:
                parts = []  # this rank's batch: one, or its share of units (balance)
                try:
                    if shares is not None:
                        shares.before_step()  # every rank reaches it: steps are equal
                        if self._status is not None:
                            self._status.after_decision()
                    want = 1 if shares is None else shares.units
                    while len(parts) < want:
                        batch = next_batch()
                        if batch is None:
                            break
                        parts.append(batch)
                except BaseException as e:
                    self._current = [p for p in parts if not isinstance(p, _Held)]
                    steps.leave(epoch, step, e)  # the others raise too, rather than wait
                    raise
                # Fewer units than its share: this rank's ring has no more of the epoch,
                # and the step runs with what is left (a short last batch).
                complete = len(parts) == want
                if steps.agree(epoch, step, bool(parts)):
                    step += 1
                    report["steps"] = step
                    self._position = (epoch, step)
                    # A carried or late batch holds an earlier epoch's samples.
                    self.batch_epoch = (parts[0].epoch if want == 1
                                        else min(p.epoch for p in parts))
                    if self.pad and first is None:  # what padded steps repeat
                        first = (parts[0].tensors if isinstance(parts[0], _Held)
                                 else self._tensors(parts[0], copy=True), parts[0].records)
                    if shares is not None:
                        yield self._owned(self._balanced(parts), copied=True)
                        shares.step_done()
                    elif isinstance(parts[0], _Held):
                        yield self._owned(parts[0].tensors, copied=True)
                    else:
                        self._current = parts
                        yield self._owned(self._tensors(parts[0], copy=copy_out),
                                          copied=copy_out)
                    continue
                # The group ended the epoch: the rest is left over, or with pad
                # trained in padded steps.
                keep = (self._pad_rest.append if self.pad
                        else lambda b: self._leftover(b, report, last_epoch))
                for batch in parts:
                    keep(batch)
                batch = next_batch() if complete else None
                while batch is not None:
                    keep(batch)
                    batch = next_batch()
                if self.pad:
                    yield from self._padded_steps(epoch, step, steps, report, first, copy_out,
                                                  last_epoch)
                self._position = (epoch + 1, 0)
                break
        except GeneratorExit:
            # The loop was left mid-epoch (a break, next(iter(loader))): the batch it handed
            # out stays valid, its slot held until the next iteration or close().
            left_early = True
            raise
        finally:
            if not left_early:
                self._release_current()
        self._leftovers.end_epoch(report, self.rank)
        if self._map_source is not None:  # the loop ran its epoch to the end: quiet close
            self._map_source.notices.finished = True

    def _padded_steps(self, epoch, step, steps, report, first, copy_out, last_epoch):
        """pad=True, once the group ended the epoch: while any rank still holds
        a batch of it (self._pad_rest), every rank steps, those without one on a
        repeat of their first batch of the epoch, as DistributedSampler pads
        each rank's share with the epoch's first samples; counted in
        report["padded_records"]. Every sample of the epoch is trained in it,
        with equal steps. A loop left here carries what it had not trained."""
        rest = self._pad_rest
        key = step  # agreement keys only grow: `step` ended the epoch
        try:
            while True:
                key += 1
                self._release_current()
                if steps.agree(epoch, key, not rest):  # no rank holds one
                    return
                step += 1
                report["steps"] = step
                self._position = (epoch, step)
                self.batch_epoch = epoch
                if not rest:
                    if first is None:
                        raise tailcut.InvalidArgumentError(
                            f"PooledLoader: pad=True: rank {self.rank} trained no batch in "
                            f"epoch {epoch} to repeat (fewer batches than ranks); use a "
                            f"smaller batch_size, or pad=False")
                    report["padded_records"] += first[1]
                    yield self._owned(first[0], copied=True)
                    continue
                batch = rest.pop(0)
                if isinstance(batch, _Held):
                    yield self._owned(batch.tensors, copied=True)
                else:
                    self._current = [batch]
                    yield self._owned(self._tensors(batch, copy=copy_out), copied=copy_out)
        finally:
            self._pad_rest = []
            for batch in rest:  # a loop left early, or a raise: never lost
                self._leftover(batch, report, last_epoch)

    @property
    def _carried(self):
        """_Held leftovers for the next epoch."""
        return self._carry.next

    @_carried.setter
    def _carried(self, held):
        self._carry.next = held

    @property
    def _carried_now(self):
        """Carried leftovers not yet yielded in this epoch."""
        return self._carry.now

    @_carried_now.setter
    def _carried_now(self, held):
        self._carry.now = held

    def _settle_carried(self):
        """Leftovers carried into an epoch that never ran, or not yet yielded
        in an epoch left early: dropped and counted (_settle)."""
        _settle(self._carry, self.reports, self.on_leftover, self.rank,
                self.dataset._queue_args)

    def close(self):
        """Releases what this rank holds and leaves the ring. Local rank 0
        ends the ring (every epoch; loaders still running leave, giving their
        items back to the queue). The process that started loaders waits for
        them (those still running 10 s later are killed: their items go back
        to the queue), then removes the ring's name and the pool's
        description: a batch still referenced keeps its mapping, not the
        name. Done at exit or when the loader is dropped, if not before.
        Idempotent."""
        if self.ring.closed:
            return
        self._release_current()
        if self._stash is not None:
            self.ring.release(self._stash)
            self._stash = None
        self._settle_carried()
        if self._own_loader is not None:
            self._own_loader.stop_and_join()  # what it has not published goes back
        self._end()
        if self._map_source is not None:
            self._map_source.close()  # leaves its index queue

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

