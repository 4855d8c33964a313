"""tailcut._steps: the ranks of a synchronous job agree, step by step, that
every one has a batch; what is left when one has none is counted, carried or
dropped, and reported. EqualSteps and PooledLoader both run on this module.

A step's answer (StepAgreement.agree) is made of two votes:
1. On the host, WorkQueue.agree_step over the local ranks (the host's queue,
   shared memory, bounded by `timeout`).
2. Across hosts, when the process group has more ranks than the host (the
   default process group of torch.distributed, or `group=`): an all_reduce
   (MIN) of each rank's answer, so every rank of every host ends the epoch
   at the same step. A vote is 1 (has a batch), 0 (has none) or -1 - rank
   (this rank raised: see leave()).
Every rank calls agree() once per step, in the same order, with no
collective of its own between agree() and the batch it got from its loader.

Failures: a rank whose loader raised calls leave(): it votes "no batch" on
the host (the others end the epoch there rather than wait), records the
exception where the host's other ranks look for it (the pool's failure
record, `failures`), and votes -1 - rank across hosts; every other rank then
raises instead of going on to a step the failed rank never reaches.

Guards: a step key is (epoch << 32) | step, so epochs stay below 2**30 and
steps below 2**32; agree() refuses others (ValueError).
"""

import logging
import sys
import time

import tailcut

MAX_EPOCH = 1 << 30
MAX_STEP = 1 << 32
# With a watch (StepAgreement.watch), a rank waits for the others in slices
# this long, and between two it looks for what the watch looks for.
WATCH_SLICE = 0.25


class RankFailed(tailcut.Error):
    """Another rank of the group raised at this step (its own error is in its log)."""


def _dist():
    """torch.distributed if torch is loaded and it is initialized; else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


class StepAgreement:
    """The step agreement of one rank. `who` names the caller in messages
    ('EqualSteps', 'PooledLoader'); `failures`, when given, has record(exc)
    and raise_if_failed() for this host's ranks (the pool's failure record).
    Not thread-safe: one per rank's iteration."""

    def __init__(self, queue, local_rank, local_world_size, *, timeout, group=None, who,
                 failures=None):
        self.queue, self.local_rank, self.local_world_size = queue, local_rank, local_world_size
        self.timeout, self.who, self.failures = timeout, who, failures
        self.group = group
        # watch(epoch, step), or None: called while this rank waits at a step
        # for the host's other ranks, every WATCH_SLICE s; it raises to stop
        # waiting (PooledLoader: a rank that called state_dict() instead).
        self.watch = None
        dist = _dist()
        if group is None and dist is not None and dist.get_world_size() > local_world_size:
            self.group = dist.group.WORLD

    def _key(self, epoch, step):
        if not 0 <= epoch < MAX_EPOCH:
            raise ValueError(f"{self.who}: epoch {epoch} is not in [0, 2**30)")
        if not 0 <= step < MAX_STEP:
            raise ValueError(f"{self.who}: more than 2**32 steps in epoch {epoch}")
        return (epoch << 32) | step

    def agree(self, epoch, step, has_batch):
        """True when every rank has a batch for `step` of `epoch`, False when
        the group ends the epoch there. Raises tailcut.TimeoutError when a
        local rank did not arrive within `timeout`, the exception a rank of
        the host recorded (failures), or RankFailed when a rank elsewhere
        raised at this step."""
        key = self._key(epoch, step)
        status = self._wait(epoch, step, key, has_batch)
        if status == "timeout":
            raise tailcut.TimeoutError(
                f"{self.who}: local rank {self.local_rank} of {self.local_world_size} waited "
                f"{self.timeout} s at epoch {epoch}, step {step} of queue '{self.queue.name}' "
                f"for ranks that did not arrive (did one die, stop iterating early, or run a "
                f"different epoch?)")
        vote = 1 if status == "all_have_batch" else 0
        if self.group is not None:
            vote = self._all_min(vote)
        if vote < 0:
            self._raise_recorded()
            raise RankFailed(
                f"{self.who}: rank {-vote - 1} of the process group raised at epoch {epoch}, "
                f"step {step}; this rank stops too (the error is in that rank's log)")
        if vote == 0:
            self._raise_recorded()
        return vote == 1

    def _wait(self, epoch, step, key, has_batch):
        """agree_step within `timeout`; with a watch, in slices (publishing the
        same step again is allowed), the watch called between two. A step
        whose ranks are all there takes one call (arguments by position: a
        step's cost is mostly this call's)."""
        agree, rank, ranks, timeout = (self.queue.agree_step, self.local_rank,
                                       self.local_world_size, self.timeout)
        if self.watch is None or (timeout is not None and timeout <= WATCH_SLICE):
            return agree(rank, ranks, key, has_batch, timeout)
        start = time.monotonic()
        status = agree(rank, ranks, key, has_batch, WATCH_SLICE)
        if status != "timeout":
            return status
        deadline = None if timeout is None else start + timeout
        while True:
            self.watch(epoch, step)
            left = WATCH_SLICE if deadline is None else deadline - time.monotonic()
            status = agree(rank, ranks, key, has_batch, max(0.0, min(WATCH_SLICE, left)))
            # timeout=None waits on: only a deadline's last slice ends the wait.
            if status != "timeout" or (deadline is not None and left <= WATCH_SLICE):
                return status

    def leave(self, epoch, step, exc):
        """This rank's next batch for `step` raised `exc` (which the caller
        raises next): tells the others, so that they raise too instead of
        waiting for this rank. Best effort: what fails here is not raised."""
        if self.failures is not None:
            try:
                self.failures.record(exc)
            except Exception:
                pass
        try:
            key = self._key(epoch, step)
            self.queue.agree_step(self.local_rank, self.local_world_size, key, False, timeout=0)
        except Exception:
            return  # a bad key or a closed queue: the collective below would not match
        if self.group is not None:
            try:
                self._all_min(-1 - _dist().get_rank())
            except Exception:
                logging.getLogger("tailcut").debug("step agreement: leave failed", exc_info=True)

    def _raise_recorded(self):
        if self.failures is not None:
            self.failures.raise_if_failed()

    def _all_min(self, vote):
        import torch
        dist = torch.distributed
        device = "cpu"
        if dist.get_backend(self.group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        flag = torch.tensor([vote], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return int(flag.item())


# ---- Leftovers ----------------------------------------------------------------------------------


def new_report(epoch, carried_in):
    """One epoch's report, the same keys for EqualSteps and PooledLoader:
    steps run; batches carried in from the last epoch; batches (records) left
    when the group ended the epoch, of which carried_out go to the next epoch
    and dropped_* were handed to on_leftover (or only counted); late_batches:
    batches of an earlier epoch that came after the group ended it (the pool
    yields them with carry_over, else drops them); padded_records: records a
    PooledLoader with pad=True repeated to fill the epoch's last steps."""
    return dict(epoch=epoch, steps=0, carried_in=carried_in, leftover_batches=0,
                leftover_records=0, late_batches=0, carried_out=0, dropped_batches=0,
                dropped_records=0, padded_records=0)


class Leftovers:
    """The one leftover policy: with carry_over (and an epoch to carry into)
    a leftover batch is kept for the next epoch, else it is dropped: shown to
    on_leftover and counted. end_epoch() logs what was dropped when no
    on_leftover saw it, so nothing is dropped silently."""

    def __init__(self, carry_over, on_leftover, log_name):
        self.carry_over, self.on_leftover = carry_over, on_leftover
        self.log = logging.getLogger(log_name)
        self.log_name = log_name
        self.short_records = 0  # of the dropped records, those drop_last dropped

    def add(self, report, records, last_epoch, keep, show):
        """A leftover batch of `records` records: keep() stores it for the
        next epoch, or show(on_leftover) passes it to on_leftover (None: not
        shown). Returns True when it was kept."""
        report["leftover_batches"] += 1
        if self.carry_over and not last_epoch:
            report["leftover_records"] += records
            report["carried_out"] += 1
            keep()
            return True
        self.drop(report, records, show)
        return False

    def drop(self, report, records, show, short=False):
        """A batch dropped: a leftover not carried, a late one (of an earlier
        epoch, after the group ended it) without carry_over, or (short=True)
        a short batch that drop_last drops, which carry_over would not keep."""
        report["leftover_records"] += records
        report["dropped_batches"] += 1
        report["dropped_records"] += records
        if short:
            self.short_records += records
        show(self.on_leftover)

    def end_epoch(self, report, rank):
        if report["dropped_records"] and self.on_leftover is None:
            whys = []
            if self.short_records:
                whys.append(f"{self.short_records} in short batches, as drop_last=True asks: "
                            f"pass drop_last=False to use them")
            if report["dropped_records"] > self.short_records:
                whys.append("the queue has no later epoch to carry them into" if self.carry_over
                            else "pass carry_over=True to use them in the next epoch")
            why = "; ".join(whys)
            self.log.warning(
                "%s: rank %d dropped %d leftover records (%d batches) at the end of epoch %d "
                "(%s, or on_leftover= to handle them)", self.log_name, rank,
                report["dropped_records"], report["dropped_batches"], report["epoch"], why)
