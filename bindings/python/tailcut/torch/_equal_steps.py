"""EqualSteps: equal steps per epoch for the ranks of a synchronous trainer (docs/pytorch.md)."""

import numpy as np
import torch

import tailcut
from tailcut import _args, _pool_state, _steps
from tailcut._job import env_int
from tailcut.torch._queue_dataset import QueueDataset, current_epoch

_END = object()


def _count_records(batch):
    """Records in a batch: its length, found through the first tensor or array."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    # QueueDataset's (data, offsets). A DataLoader worker's collation hands the
    # pair on as a list (torch 1.13 default_convert), so both are recognized.
    if (isinstance(batch, (tuple, list)) and len(batch) == 2
            and isinstance(batch[1], torch.Tensor) and batch[1].dtype == torch.int64
            and batch[1].ndim == 1 and isinstance(batch[0], torch.Tensor)
            and batch[0].dtype == torch.uint8 and batch[0].ndim == 1):
        return int(batch[1].shape[0]) - 1
    if isinstance(batch, dict) and batch:
        return _count_records(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return _count_records(batch[0])
    if isinstance(batch, (list, tuple, bytes)):
        return len(batch)
    return 1


def _clone(batch):
    """An owned copy of a batch (it may be a zero-copy view)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, memoryview):
        return bytes(batch)
    if isinstance(batch, dict):
        return type(batch)((k, _clone(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_clone(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_clone(v) for v in batch)
    return batch


class EqualSteps:
    """Equal steps per epoch for the ranks of a synchronous trainer (DDP).

    EqualSteps(loader, queue=None, *, local_rank=None, local_world_size=None,
               carry_over=True, timeout=1800.0, on_leftover=None,
               count=None, group=None)

    Iterating it runs one epoch of `loader` (a DataLoader over a QueueDataset,
    the QueueDataset itself, or any iterable whose data come from `queue`).
    Before each step the ranks 0..local_world_size-1 of the host agree
    through the queue (WorkQueue.agree_step) that each has a batch; when one
    has none, every rank ends the epoch at that same step, so DDP's
    collectives never wait for a rank that stopped. local_rank and
    local_world_size (the host's, as torchrun's $LOCAL_RANK and
    $LOCAL_WORLD_SIZE, which they default to, else 0 and 1; rank and
    world_size are the job's global ones everywhere in tailcut); queue
    defaults to the loader's QueueDataset's queue. A new EqualSteps(loader)
    per epoch runs the epoch the job is in (or the dataset's set_epoch()).

    Leftovers: the batches a rank still had when the group ended the epoch
    (and what its loader still had for this epoch, which is read to its end)
    are counted in `reports`. With carry_over=True (the default: every record
    once per epoch) they are yielded first in the next epoch (copied:
    zero-copy views would not survive), and state_dict() keeps them; with
    carry_over=False, and after the queue's last epoch, each is passed to
    on_leftover(batch) and logged. None is silently dropped.

    Each wait is bounded by `timeout` seconds (tailcut.TimeoutError names the
    step), so a rank that died or stopped iterating early makes the others
    fail, not hang. Every rank must run every epoch to its end: leaving the
    loop early (break) on one rank desynchronizes the group.

    Across hosts: the queue is per host. When torch.distributed is initialized
    with more ranks than local_world_size (or `group` is given), each step's answer
    is also combined over that group with an all_reduce, so every rank of
    every host runs the same steps, and a rank whose loader raises makes the
    ranks of other hosts raise (tailcut._steps, which PooledLoader shares).

    count(batch) -> records in a batch, for the reports (default: the first
    dimension of the first tensor found).
    """

    def __init__(self, loader, queue=None, *, local_rank=None, local_world_size=None,
                 carry_over=True,
                 timeout=1800.0, on_leftover=None, count=None, group=None):
        self.loader = loader
        dataset = getattr(loader, "dataset", loader)
        if queue is None:
            if not isinstance(dataset, QueueDataset):
                raise TypeError("EqualSteps needs queue= unless the loader reads a QueueDataset")
            queue = dataset.queue
        self.queue = queue
        local_rank = _args.count("local_rank", local_rank, allow_none=True)
        local_world_size = _args.count("local_world_size", local_world_size, minimum=1,
                                       allow_none=True)
        self.local_rank = env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        self.local_world_size = (env_int("LOCAL_WORLD_SIZE", 1) if local_world_size is None
                                 else local_world_size)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"EqualSteps: local_rank {self.local_rank} is not in "
                             f"[0, local_world_size={self.local_world_size})")
        self.timeout = _args.seconds("timeout", timeout, allow_zero=False, allow_none=True)
        self.carry_over = _args.flag("carry_over", carry_over)
        self.on_leftover = _args.callable_or_none("on_leftover", on_leftover)
        _args.callable_or_none("count", count)
        self._count = count or _count_records
        self._group = group
        self._steps = None  # the _steps.StepAgreement, made at the first iteration
        # A resumed queue's epoch, else the one the job is in: a new EqualSteps(loader) per
        # epoch (the documented IndexDataset loop) runs the next epoch, not epoch 0 again,
        # whose steps the queue already agreed on. The dataset's set_epoch() sets it too.
        self.epoch = max(_pool_state.restored_epoch(dataset), current_epoch(queue),
                         getattr(dataset, "_epoch", None) or 0)
        self.reports = []
        self._carried = []
        self._epoch_end_state = None
        # {rank: its carried batches} when the last epoch ended (see state_dict()).
        self._epoch_end_carried = None

    def set_epoch(self, epoch):
        """The epoch the next iteration runs (first a restored queue's, else 0; then one more)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < (1 << 30):
            raise ValueError(f"epoch must be an int in [0, 2**30), got {epoch!r}")
        self.epoch = epoch

    def __len__(self):
        """Steps per epoch on every rank, as an estimate for LR schedulers and
        progress bars: floor(records per epoch / (world_size * batch size)), the
        steps every rank can run when the host's ranks split the epoch evenly.
        The group ends the epoch when the first rank runs out (fewer steps)
        and DataLoader workers each end on a short batch (more): the real
        count is within a few steps of it. The batch size is the QueueDataset's, else
        the DataLoader's; records come from QueueDataset.records_per_epoch()."""
        dataset = getattr(self.loader, "dataset", self.loader)
        if not isinstance(dataset, QueueDataset):
            raise TypeError("len(EqualSteps) needs a loader over a QueueDataset")
        batch = dataset.batch_size or getattr(self.loader, "batch_size", None) or 1
        records, _ = dataset.records_per_epoch()
        return records // (self.local_world_size * batch)

    def state_dict(self):
        """What a checkpoint needs to resume this trainer's data at the start of
        the next epoch: {'epoch': the next epoch, 'queue': the queue's state
        taken when every rank of the host had finished the last epoch (None
        before the first epoch ends), 'carried': {rank: the batches that rank
        carries into the next epoch}}. The queue counts carried records as
        done, so they live on in 'carried', copies of the batches themselves
        (pickled with the checkpoint). With torch.distributed initialized
        every rank's carried batches are gathered at the epoch's end, so any
        one rank's state restores them all (rank = the global rank);
        otherwise it holds this rank's alone (rank = the local rank) and each
        rank saves and loads its own. Restore it by passing 'queue' to the
        restarted job's QueueDataset(restore_state=...) and this dict to
        load_state_dict()."""
        return {"epoch": self.epoch, "queue": self._epoch_end_state,
                "carried": self._epoch_end_carried}

    def load_state_dict(self, state):
        """Resumes at state['epoch'] (see state_dict()), the batches this rank
        carried yielded first. Raises tailcut.InvalidArgumentError when the
        state holds other ranks' carried batches but not this rank's."""
        carried = state.get("carried")
        mine = []
        if carried is not None:
            rank = self._rank_key()
            if rank not in carried:
                raise tailcut.InvalidArgumentError(
                    f"EqualSteps.load_state_dict(): the state holds the carried batches of "
                    f"rank(s) {sorted(carried)}, not of rank {rank}: without torch.distributed "
                    f"each rank saves and loads its own state_dict() (or initialize the process "
                    f"group before the first epoch ends, which gathers them all)")
            mine = list(carried[rank])
        dataset = getattr(self.loader, "dataset", self.loader)
        restore = getattr(dataset, "restore", None)
        if state.get("queue") is not None and restore is not None:
            # One call: the dataset's queue, untouched yet, reopened from the epoch-end state
            # on every rank of the host (DataLoader workers open it from the same state).
            barrier = _pool_state.host_barrier(self.local_world_size, self._group, "EqualSteps")
            if restore(state["queue"], barrier, "EqualSteps"):
                self.queue = dataset.queue
        self.set_epoch(int(state["epoch"]))
        self._epoch_end_state = state.get("queue")
        self._epoch_end_carried = carried
        self._carried = mine

    def _rank_key(self):
        """This rank's key in state_dict()['carried']: the global rank, else the local one."""
        dist = _steps._dist()
        return dist.get_rank() if dist is not None else self.local_rank

    def _gather_carried(self):
        """{rank: carried batches} of every rank of the process group (or of
        `group`), else of this rank alone. Every rank calls it at every epoch
        end, when torch.distributed is initialized: it is a collective."""
        dist = _steps._dist()
        mine = (self._rank_key(), list(self._carried))  # the next epoch pops self._carried
        if dist is None:
            return dict([mine])
        every = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(every, mine, group=self._group)
        return dict(every)

    @property
    def leftover(self):
        """Records left over and not carried into a later epoch, over all epochs so far."""
        return sum(r["dropped_records"] for r in self.reports)

    def __iter__(self):
        return self._epoch_steps()

    def _agreement(self):
        if self._steps is None:  # made here: torch.distributed may start after __init__
            self._steps = _steps.StepAgreement(self.queue, self.local_rank, self.local_world_size,
                                               timeout=self.timeout, group=self._group,
                                               who="EqualSteps")
        return self._steps

    def _agree(self, epoch, step, has_batch):
        return self._agreement().agree(epoch, step, has_batch)

    def _epoch_steps(self):
        epoch = self.epoch
        if epoch >= _steps.MAX_EPOCH:
            raise ValueError("EqualSteps: epoch must be below 2**30")
        self._agreement()
        self.epoch = epoch + 1
        last_epoch = epoch + 1 >= self.queue.num_epochs
        dataset = getattr(self.loader, "dataset", self.loader)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        carried, self._carried = self._carried, []
        report = _steps.new_report(epoch, len(carried))
        self.reports.append(report)
        leftovers = _steps.Leftovers(self.carry_over, self.on_leftover, "tailcut.torch")

        def leftover(batch):
            leftovers.add(report, self._count(batch), last_epoch,
                          keep=lambda: self._carried.append(_clone(batch)),
                          show=lambda on_leftover: on_leftover and on_leftover(batch))

        it = iter(self.loader)
        exhausted = False
        step = 0
        while True:
            if carried:
                batch = carried.pop(0)
            elif exhausted:
                batch = _END
            else:
                try:
                    batch = next(it, _END)
                except BaseException as e:
                    # Tell the others this rank has no batch, so that they
                    # raise or end the epoch here instead of waiting for it.
                    self._agreement().leave(epoch, step, e)
                    raise
                exhausted = batch is _END
            has_batch = batch is not _END
            if self._agree(epoch, step, has_batch):
                step += 1
                report["steps"] = step
                yield batch  # a zero-copy batch dies at the next next(it)
                continue
            # The group ends the epoch here: whatever this rank still has is left over.
            if has_batch:
                leftover(batch)
            for batch in carried:
                leftover(batch)
            if not exhausted:
                for batch in it:
                    leftover(batch)
            break
        # Once every rank read its loader to the end, no item of this epoch is
        # open, and until every rank took the state no item of the next one
        # is taken: the state resumes the job at the start of the next epoch.
        self._agree(epoch, step + 1, False)
        self._epoch_end_state = self.queue.state_dict()
        self._agree(epoch, step + 2, False)
        self._epoch_end_carried = self._gather_carried()
        leftovers.end_epoch(report, self.local_rank)

    def __repr__(self):
        return (f"EqualSteps(local_rank={self.local_rank}, local_world_size="
                f"{self.local_world_size}, epoch={self.epoch}, "
                f"carry_over={self.carry_over})")
