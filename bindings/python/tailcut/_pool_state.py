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

Gathering (state_dict): every rank of the job calls it at the same step.
After a barrier no rank pops; each host's local rank 0 saves its queue's
state, then reads the ranges of every batch ready in its ring in place
(BatchRing.peek_ready), so each batch published before that save is known;
the ranks exchange their unused ranges (torch.distributed all_gather_object,
each tagged with its host's queue name) and each computes the same state, of
every host: any one rank's restores them all. The queue's state comes first:
a batch published after it holds records the saved state does not count as
consumed anyway, and a batch that is ready then stays ready until every rank
has left state_dict().

Several hosts: the state holds each host's queue state under its queue's
name (state['queue']['hosts']); QueueDataset(restore_state=state['queue'])
opens each host's queue with its own entry (host_queue_state), so the two
lines of a restore are the same on every host.

A queue fed by a coordinator: the coordinator's own state marks whole items
done (a loader acks an item when it publishes the item's last batch), so
each host's part is its queue's own state (WorkQueue._host_state(), what it
finished and holds, with its unused ranges reopened as above), and after the
exchange -- every host's part saved -- group rank 0 saves the coordinator's
state with those parts' done marks (_state_with_hosts): a ticket is done
where a host finished or holds part of it, and every other ticket is handed
out again. A restore opens each host's queue from the coordinator's state,
its own part and a token that rank 0 draws and broadcasts, so that the
first host creates the job anew, replacing the run the checkpoint came
from, and the others join (tailcut::FedRestoreState).

The queue checkpoint is edited by the engine (_core._reopen_state,
engine/checkpoint.h ReopenRanges), which owns its byte layout: this module
never reads it. The engine checks the edited state again (checksum, counts,
pieces inside their items) when it restores.
"""

import os
import sys
import uuid

import tailcut
from tailcut import _core
from tailcut._batch_layout import batch_ranges

# Version 2: a pool that spans hosts has a state too (every host's queue under its name); a
# one-host state is laid out as in version 1, which is still read.
STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)


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
    if isinstance(state, dict) and "tier" in state:  # fed: host_queue_state()
        return state["epoch"]
    return _core._state_epoch(state["state"] if isinstance(state, dict) else bytes(state),
                              str(args.get("name", "")))


# ---- Gathering the pool's state -----------------------------------------------------------


def _fed(queue):
    """True when a coordinator feeds `queue` (its coordinator= option, else
    $TAILCUT_COORDINATOR, as the engine resolves it)."""
    return bool(queue.open_args.get("coordinator") or os.environ.get("TAILCUT_COORDINATOR"))


def _group(loader):
    """(torch.distributed, the group) when the ranks must exchange, else None:
    every rank of the job, over `group=` or the default group, so that the
    state covers every host."""
    if loader.world_size == 1:
        return None
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.state_dict(): {loader.world_size} ranks exchange what they hold "
            f"through torch.distributed: call init_process_group() first")
    return dist, loader._group


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


def _hosts(every):
    """{queue name: what the ranks of that host hold} from every rank's part."""
    hosts = {}
    for part in every:
        host = hosts.setdefault(part["host"], dict(ranges=[], batches=0, records=0))
        if "queue" in part:
            if "queue" in host:
                raise tailcut.InvalidArgumentError(
                    f"PooledLoader.state_dict(): two hosts read a queue named "
                    f"'{part['host']}': a checkpoint tells hosts apart by their queue's name, so "
                    f"give each host's queue its own (name=f'{{job}}.n{{GROUP_RANK}}')")
            host["queue"], host["ring"] = part["queue"], part["ring"]
        host["ranges"] += part["ranges"]
        host["batches"] += part["batches"]
        host["records"] += part["records"]
    for name, host in hosts.items():
        if "queue" not in host:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader.state_dict(): no rank of the host of queue '{name}' has local "
                f"rank 0, which saves the host's queue and ring: check LOCAL_RANK")
    return hosts


def _host_state(host):
    """One host's part: its queue's state with its unused ranges reopened."""
    state, reopened = reopen(host["queue"]["state"], host["ranges"], host["queue"]["name"])
    return dict(ring=host["ring"], queue=dict(host["queue"], state=state),
                unused_batches=host["batches"], unused_records=host["records"],
                reopened_ranges=reopened)


def _exchange(dist, group, mine):
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return every


def state_dict(loader):
    """See PooledLoader.state_dict()."""
    exchange = _group(loader)
    if exchange is not None:
        dist, group = exchange
        dist.barrier(group=group)  # every rank is here: nobody pops until the exchange below
    fed = _fed(loader.queue)
    # A fed queue is '<name>.<host id>' on its host, and every host's shares `name`.
    host_queue = loader.queue.summary()["name"] if fed else loader.queue.name
    mine = dict(host=host_queue, ranges=[], batches=0, records=0)
    if loader.local_rank == 0:
        # First: see the module's comment.
        mine["queue"] = (dict(state=loader.queue._host_state(), name=host_queue) if fed
                         else loader.queue.state_dict())
        mine["ring"] = loader.name
        mine["ranges"], mine["batches"], mine["records"] = _ring_ranges(loader)
    ranges, batches, records = _unused(loader)
    mine["ranges"] += ranges
    mine["batches"] += batches
    mine["records"] += records
    every = [mine] if exchange is None else _exchange(dist, group, mine)
    hosts = {name: _host_state(h) for name, h in sorted(_hosts(every).items())}
    epoch, step = loader._position
    totals = {key: sum(h[key] for h in hosts.values())
              for key in ("unused_batches", "unused_records", "reopened_ranges")}
    if fed:
        # Every host's part is saved (the exchange is over): the coordinator's state now, once.
        first = exchange is None or dist.get_rank(group) == 0
        tier = (loader.queue._state_with_hosts([h["queue"]["state"] for h in hosts.values()])
                if first else None)
        if exchange is not None:
            tier = next(t for t in _exchange(dist, group, tier) if t is not None)
        # Where a restore starts: the coordinator's done marks are the hosts'.
        first_epoch = _core._states_epoch([h["queue"]["state"] for h in hosts.values()],
                                          host_queue)
        return dict(version=STATE_VERSION, epoch=epoch, step=step,
                    queue=dict(hosts={name: h.pop("queue") for name, h in hosts.items()},
                               tier=tier, epoch=first_epoch),
                    hosts=hosts, **totals)
    if len(hosts) == 1:  # laid out as in version 1
        (host,) = hosts.values()
        return dict(host, version=STATE_VERSION, epoch=epoch, step=step)
    # Every host's queue state under its queue's name: QueueDataset(restore_state=
    # state["queue"]) opens each host's queue with its own (host_queue_state()).
    return dict(version=STATE_VERSION, epoch=epoch, step=step,
                queue=dict(hosts={name: h.pop("queue") for name, h in hosts.items()}),
                hosts=hosts, **totals)


def _restore_token():
    """One token for the ranks of a restore, drawn by rank 0 and broadcast
    over the default group (every rank opens its queue with the checkpoint at
    the same time)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        token = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(token, src=0)
        return token[0]
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise tailcut.InvalidArgumentError(
            "restore_state: the checkpoint is of a pool fed by a coordinator, whose ranks agree "
            "on one restore through torch.distributed: call init_process_group() before opening "
            "the queue (QueueDataset, or PooledLoader of a map-style dataset)")
    return uuid.uuid4().hex


def host_queue_state(restore_state, name, host_id=None):
    """The state queue `name` opens with from restore_state: a pool's
    checkpoint of several hosts ({'hosts': {queue name: state}}) gives that
    queue's entry; any other restore_state is the queue's own. A checkpoint of
    a pool fed by a coordinator (with 'tier') gives this host's restore of
    it, under a token drawn for this restore (a collective call: every rank
    makes it)."""
    if not (isinstance(restore_state, dict) and "hosts" in restore_state):
        return restore_state
    hosts = restore_state["hosts"]
    if "tier" in restore_state:
        local = f"{name}.{_core._host_id(name, host_id or '')}"
        if local not in hosts:
            raise tailcut.InvalidArgumentError(
                f"restore_state: the checkpoint holds the queues of {len(hosts)} hosts "
                f"({', '.join(sorted(hosts))}), none named '{local}': restart on as many hosts, "
                f"each with the host id it had when the checkpoint was saved (TAILCUT_HOST_ID)")
        token = _restore_token()
        return dict(state=_core._fed_restore_state(restore_state["tier"], hosts[local]["state"],
                                                   token),
                    tier=restore_state["tier"], epoch=restore_state["epoch"])
    if name not in hosts:
        raise tailcut.InvalidArgumentError(
            f"restore_state: the checkpoint holds the queues of {len(hosts)} hosts "
            f"({', '.join(sorted(hosts))}), none named '{name}': restart on as many hosts, each "
            f"opening its queue under the name it had when the checkpoint was saved")
    return hosts[name]


def load_state_dict(loader, state):
    """See PooledLoader.load_state_dict()."""
    if not isinstance(state, dict) or state.get("version") not in READABLE_VERSIONS:
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.load_state_dict(): not a PooledLoader state of version "
            f"{' or '.join(map(str, READABLE_VERSIONS))} (got {type(state).__name__} with version "
            f"{state.get('version') if isinstance(state, dict) else None!r})")
    queue = state["queue"]
    saved = sorted(queue["hosts"]) if "hosts" in queue else [queue["name"]]
    hosts_now = loader.world_size // loader.local_world_size
    if len(saved) != hosts_now:
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.load_state_dict(): the state covers {len(saved)} host(s) (queues "
            f"{', '.join(saved)}), this job runs on {hosts_now} ({loader.world_size} ranks, "
            f"{loader.local_world_size} per host): restart it on {len(saved)} host(s)")
    if "tier" in queue:
        opened = getattr(loader.dataset, "_queue_args", {}).get("restore_state")
        if not (isinstance(opened, dict) and opened.get("tier") == queue["tier"]):
            raise tailcut.InvalidArgumentError(
                f"queue '{loader.queue.name}': an open WorkQueue cannot jump to a checkpoint; "
                f"open the restarted job's queue with it: QueueDataset(..., "
                f"restore_state=state['queue']) on every rank, then load_state_dict(state)")
    else:
        # Raises, saying how, unless the queue was opened from this state.
        loader.queue.load_state_dict(host_queue_state(queue, loader.queue.name))
    loader.set_epoch(state["epoch"])
    loader._position = (state["epoch"], 0)
