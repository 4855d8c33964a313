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

The queue checkpoint's byte layout is the engine's (engine/checkpoint.cc,
TCSTATE1): read and written here to edit its pieces; the engine checks it
again (checksum, counts, pieces inside their items) when it restores.
"""

import struct

import tailcut
from tailcut._batch_layout import batch_ranges

STATE_VERSION = 1
_STATE_MAGIC = 0x3145544154534354  # "TCSTATE1"
_MASK64 = (1 << 64) - 1


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


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _hash(data):
    h = 0xCBF29CE484222325  # FNV-1a, finished with SplitMix64 (engine HashBytes)
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & _MASK64
    return _splitmix64(h)


def _decode(state):
    n = len(state) // 8
    if len(state) < 88 or len(state) % 8:
        raise tailcut.CorruptError(f"queue state: {len(state)} bytes is not a tailcut checkpoint")
    v = struct.unpack(f"<{n}Q", state)
    if v[0] != _STATE_MAGIC or v[1] != 1 or _hash(state[:-8]) != v[-1]:
        raise tailcut.CorruptError("queue state: bad magic, version or checksum (pass what "
                                   "WorkQueue.state_dict() returned)")
    head = list(v[2:8])  # fingerprint, items, epochs, seed, low, cursor
    nwords = v[8]
    words = list(v[9:9 + nwords])
    npieces = v[9 + nwords]
    flat = v[10 + nwords:10 + nwords + 3 * npieces]
    pieces = [list(flat[i:i + 3]) for i in range(0, len(flat), 3)]
    return head, words, pieces


def _encode(head, words, pieces):
    values = [_STATE_MAGIC, 1, *head, len(words), *words, len(pieces)]
    for p in pieces:
        values += p
    body = struct.pack(f"<{len(values)}Q", *values)
    return body + struct.pack("<Q", _hash(body))


def reopen(state, ranges):
    """The queue state `state` (bytes) with every record range in `ranges`
    open again: a range of a ticket the state counts as consumed (done, or
    below an open piece's begin) becomes a piece of its own, minus what open
    pieces already cover. Tickets at or past the state's cursor, and tickets
    neither done nor open (handed out whole after a restore), need nothing.
    Returns (bytes, ranges reopened)."""
    head, words, pieces = _decode(state)
    low, cursor = head[4], head[5]
    first = low // 64 * 64
    covered = {}
    for t, b, e in pieces:
        covered.setdefault(t, []).append((b, e))
    added = []
    for t, b, e in sorted(set(tuple(r) for r in ranges)):
        if t >= cursor or b >= e:
            continue
        done = t < first or (words[(t - first) // 64] >> ((t - first) % 64)) & 1
        if not done and t not in covered:
            continue
        for lo, hi in sorted(covered.get(t, [])):  # what open pieces of t re-read anyway
            if lo <= b < hi:
                b = hi
            elif b < lo < e:
                e = lo
        if b < e:
            covered.setdefault(t, []).append((b, e))
            added.append([t, b, e])
    return _encode(head, words, pieces + added), len(added)


def restored_epoch(dataset):
    """The epoch a QueueDataset's queue opened with restore_state (a
    checkpoint, or a resumed queue's state) starts in: that of its lowest
    ticket not done then; else 0. Where a loop over epochs starts. From the
    state, not the live queue, which other ranks' loaders may have moved on."""
    state = getattr(dataset, "_queue_args", {}).get("restore_state")
    if not state:
        return 0
    head, _, _ = _decode(state["state"] if isinstance(state, dict) else bytes(state))
    return head[4] // head[1]  # low // num_items


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
    state, reopened = reopen(queue["state"], [r for g in every for r in g["ranges"]])
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
