"""The checkpoint of a PooledLoader: which records of the pool are used.

A record is used when the rank that popped its batch asks for the next one
(or releases it). Records that loaders read ahead, and batches published but
not yet used (ready in the ring, popped early for the next epoch, carried
over), are not: a checkpoint must have them read again after a restore, or
they are lost.

Every batch a loader publishes carries the (ticket, begin, end) ranges of
the records it holds (Spans; tailcut._batch_layout says where in the slot).
The pool's state is the queue's state (WorkQueue.state_dict()) with each
range of an unused batch that the queue counts as consumed turned back into
an open piece, which a restored queue hands out again from its begin.
Loaders commit and ack when a batch is published, so the queue's own state
alone would skip those records.

Gathering (state_dict): every local rank calls it at the same step. After a
barrier no rank pops; local rank 0 saves the queue's state, then reads the
ranges of every batch ready in the ring in place (BatchRing.peek_ready), so
each batch published before that save is known; the ranks exchange their
unused ranges (torch.distributed all_gather_object) and each computes the
same state. The queue's state comes first: a batch published after it holds
records the saved state does not count as consumed anyway, and a batch that
is ready then stays ready until every rank has left state_dict().

The queue checkpoint is edited by the engine (_core._reopen_state,
engine/checkpoint.h ReopenRanges), which owns its byte layout: this module
never reads it. The engine checks the edited state again (checksum, counts,
pieces inside their items) when it restores.
"""

import tailcut
from tailcut import _core
from tailcut._batch_layout import batch_ranges

STATE_VERSION = 1


class Spans:
    """The (ticket, begin, end) ranges of the records a loader puts in one
    batch: consecutive records of one item extend its range."""

    def __init__(self):
        self.ranges = []

    def add(self, ticket, begin, end):
        last = self.ranges[-1] if self.ranges else None
        if last is not None and last[0] == ticket and last[2] == begin:
            last[2] = end
        else:
            self.ranges.append([ticket, begin, end])

    def clear(self):
        self.ranges = []


# ---- The queue checkpoint's pieces ---------------------------------------------------------


def reopen(state, ranges, queue):
    """The queue state `state` (bytes) of queue `queue` with every record
    range in `ranges` open again (see _core._reopen_state). Returns (bytes,
    ranges reopened)."""
    return _core._reopen_state(state, ranges, queue)


def restored_epoch(dataset):
    """The epoch a QueueDataset's queue opened with restore_state (a
    checkpoint, or a resumed queue's state) starts in: that of its lowest
    ticket not done then; else 0. Where a loop over epochs starts. From the
    state, not the live queue, which other ranks' loaders may have moved on."""
    args = getattr(dataset, "_queue_args", {})
    state = args.get("restore_state")
    if not state:
        return 0
    return _core._state_epoch(state["state"] if isinstance(state, dict) else bytes(state),
                              str(args.get("name", "")))


# ---- Gathering the pool's state -----------------------------------------------------------


def _group(loader):
    """torch.distributed when the local ranks must exchange, else None."""
    if loader.world_size != loader.local_world_size:
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.state_dict(): the job spans hosts ({loader.world_size} ranks, "
            f"{loader.local_world_size} on this host); a pool's checkpoint covers one host's "
            f"queue and ring only")
    if loader.local_world_size == 1:
        return None
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.state_dict(): {loader.local_world_size} local ranks exchange what "
            f"they hold through torch.distributed: call init_process_group() first")
    return dist


def _ring_ranges(loader):
    """Local rank 0: the ranges and records of the batches ready in the ring,
    read in place (BatchRing.peek_ready) while no rank pops."""
    ranges, count = [], [0, 0]

    def read(header, data, epoch, records):
        ranges.extend(batch_ranges(data, header))
        count[0] += 1
        count[1] += records

    if loader.ring.peek_ready(read):
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.state_dict(): a rank popped a batch of ring '{loader.name}' while "
            f"the state was taken: every local rank must call state_dict() at the same step")
    return ranges, count[0], count[1]


class Held:
    """A leftover batch a rank carries into the next epoch: owned tensors,
    its record count, ranges and epoch."""

    def __init__(self, tensors, records, ranges, epoch):
        self.tensors, self.records, self.ranges, self.epoch = tensors, records, ranges, epoch


def _unused(loader):
    """(ranges, batches, records) of what this rank holds and has not used."""
    held = list(loader._carried_now) + list(loader._carried)
    ranges, records = [], 0
    for h in held:
        ranges += h.ranges
        records += h.records
    if loader._stash is not None:
        ranges += batch_ranges(loader._stash.data, loader._stash.header)
        records += loader._stash.records
        held.append(loader._stash)
    return ranges, len(held), records


def state_dict(loader):
    """See PooledLoader.state_dict()."""
    dist = _group(loader)
    if dist is not None:
        dist.barrier()  # every rank is here: nobody pops until the exchange below
    mine = dict(ranges=[], batches=0, records=0)
    if loader.local_rank == 0:
        mine["queue"] = loader.queue.state_dict()  # first: see the module's comment
        mine["ranges"], mine["batches"], mine["records"] = _ring_ranges(loader)
    ranges, batches, records = _unused(loader)
    mine["ranges"] += ranges
    mine["batches"] += batches
    mine["records"] += records
    if dist is None:
        every = [mine]
    else:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    queue = next(g["queue"] for g in every if "queue" in g)
    state, reopened = reopen(queue["state"], [r for g in every for r in g["ranges"]],
                             queue["name"])
    epoch, step = loader._position
    return dict(version=STATE_VERSION, ring=loader.name, epoch=epoch, step=step,
                queue=dict(queue, state=state),
                unused_batches=sum(g["batches"] for g in every),
                unused_records=sum(g["records"] for g in every), reopened_ranges=reopened)


def load_state_dict(loader, state):
    """See PooledLoader.load_state_dict()."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.load_state_dict(): not a PooledLoader state of version "
            f"{STATE_VERSION} (got {type(state).__name__} with version "
            f"{state.get('version') if isinstance(state, dict) else None!r})")
    # Raises, saying how, unless the queue was opened from this state.
    loader.queue.load_state_dict(state["queue"])
    loader.set_epoch(state["epoch"])
    loader._position = (state["epoch"], 0)
