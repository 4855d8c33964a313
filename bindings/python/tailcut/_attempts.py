"""tailcut._attempts: what a torchrun job does, before it opens its queue,
with the queues its earlier runs and attempts left (names: tailcut._job).

Local rank 0 prepares the queue's name (before_open): after an elastic
restart it removes the queues of the job's earlier attempts; in a new run it
removes what a crashed run left under later attempts' names; and a queue an
earlier run left unfinished is resumed (resume=True) or discarded, in one
line: a checkpoint (restore_state) decides where the job goes on, and without
one a fresh model is trained. The other local ranks open the queue after it
(at a barrier when torch.distributed is up).
"""

import logging
import os
import sys
import time
import warnings

import tailcut
from tailcut import _job

_log = logging.getLogger("tailcut.torch")


def resume_default(resume):
    """resume, else $TAILCUT_RESUME (off by default), as a bool."""
    value = os.environ.get("TAILCUT_RESUME", "0") if resume is None else str(bool(resume))
    return value.strip().lower() in ("1", "true", "yes", "on")


def before_open(queue_args, resume):
    """What every process of the job does before it opens the queue named
    queue_args['name'] (QueueDataset, in a rank, not in its DataLoader
    workers): local rank 0 prepares the name (see the module's comment), the
    others wait until it has. May set queue_args['restore_state']. Returns
    what local rank 0 resumed without a checkpoint (resume=True), else None."""
    name = queue_args["name"]
    torchrun_default = name == _job.default_name() and _job.torchrun_job() is not None
    restarted = torchrun_default and _job.restart_count() > 0
    if queue_args.get("restore_state") is None:
        queue_args.pop("restore_state", None)
    first = _job.env_int("LOCAL_RANK", 0) == 0
    resumed = _prepare(queue_args, resume, restarted, torchrun_default) if first else None
    if _job.env_int("LOCAL_WORLD_SIZE", 1) <= 1:
        return resumed
    # The other ranks of the host open the queue after local rank 0
    # prepared it (it may remove or replace a queue of that name): at a
    # barrier when the process group is up, else once the name holds no
    # stale queue (local rank 0 resumes or removes it).
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
    elif not first:
        deadline = time.monotonic() + 120
        while left_unfinished(name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    return resumed


def _remove_earlier_attempts(name):
    """After an elastic restart, removes the queues of the job's earlier
    attempts: torchrun stopped all their processes (DataLoader workers of a
    killed rank may linger a few seconds; they only hold a mapping)."""
    head, _, count = name.rpartition("-")
    for attempt in range(int(count)):
        try:
            tailcut.remove_queue(f"{head}-{attempt}", force=True)
        except tailcut.NotFoundError:
            pass


def _remove_stale_later_attempts(name):
    """A new run (attempt 0) of a job whose last run crashed after elastic
    restarts finds that run's queue under a later attempt's name, which no
    attempt of this run uses: removes it (the progress it had is in the job's
    checkpoint, if it keeps one) and says so."""
    head = name.rpartition("-")[0]
    for listing in tailcut.list_queues():
        other = listing["name"]
        attempt = other[len(head) + 1:]
        if other.startswith(head + "-") and attempt.isdigit() and int(attempt) > 0:
            stale = left_unfinished(other)
            if stale is not None:
                tailcut.remove_queue(other, force=True)
                _log.warning("tailcut.torch: removed %s: only a run's first attempt is resumed by "
                             "a rerun; resume from the job's checkpoint (restore_state=)",
                             _describe(other, stale))


def left_unfinished(name):
    """inspect_queue() of a queue left by an earlier run: unfinished, no
    process alive; else None."""
    try:
        summary = tailcut.inspect_queue(name)
    except tailcut.NotFoundError:
        return None
    except (tailcut.TimeoutError, tailcut.CorruptError):
        # Not set up yet (another rank is creating it: a tool's look does not
        # wait), or its creator died half-way, or it is damaged: none holds an
        # earlier run's work. Opening the queue waits for its creator, removes
        # what a dead one left, and names a damaged segment with the fix.
        return None
    if any(c["alive"] for c in summary["clients"]) or summary["done"] >= summary["total"]:
        return None
    return summary


def _describe(name, stale):
    return (f"queue '{name}', left unfinished by an earlier run (epoch {stale['epoch']}, "
            f"{stale['done']} of {stale['total']} items done)")


def _carry_over(queue_args):
    """The state of a stale queue (finished items, progress within open ones),
    after which it is removed, quietly (a notice would belie the resume); None
    if another process joined it meanwhile (it is then resumed as it is)."""
    args = {k: v for k, v in queue_args.items() if k not in ("restore_state", "on_notice")}
    q = tailcut.WorkQueue(**args, on_notice=lambda line: None)
    try:
        state = q.state_dict()
    finally:
        q.close()
    try:
        tailcut.remove_queue(args["name"])
    except tailcut.NotFoundError:
        pass  # its close removed it
    except tailcut.InvalidArgumentError:
        return None  # a live process uses it
    return state


def _prepare(queue_args, resume, restarted, torchrun_default):
    """What local rank 0 does before a job opens its queue: remove the queues of
    earlier attempts (or, in a new run, those a crashed run left under later
    attempts' names), and, in one line, resume a queue an earlier run left
    unfinished (resume=True) or discard it: a checkpoint (restore_state)
    decides where the job goes on, and without one a fresh model is trained.

    A queue is resumed in a fresh queue of the same name created from its
    state (as restore_state would), not joined as it is: the steps EqualSteps
    agreed on in the crashed run stay with the old queue, and agree_step
    refuses steps below them."""
    name = queue_args["name"]
    if restarted:
        _remove_earlier_attempts(name)
    elif torchrun_default:
        _remove_stale_later_attempts(name)
    stale = left_unfinished(name)
    if stale is None:
        return
    what = _describe(name, stale)
    if "restore_state" in queue_args:
        tailcut.remove_queue(name, force=True)
        _log.warning("tailcut.torch: discarded %s: restore_state (a checkpoint) was given", what)
    elif resume:
        state = _carry_over(queue_args)
        if state is not None:
            queue_args["restore_state"] = state
        warnings.warn(f"tailcut.torch: resuming {what}; its finished items are not read again "
                      f"and the job goes on at epoch {stale['done'] // stale['num_items']} "
                      f"(EqualSteps starts there: loop from its .epoch)",
                      RuntimeWarning, 4)
        return what  # PooledLoader refuses it: see there
    else:
        tailcut.remove_queue(name, force=True)
        _log.warning("tailcut.torch: starting over: discarded %s, as no checkpoint was given "
                     "(restore_state=); resume=True or TAILCUT_RESUME=1 resumes its data", what)
