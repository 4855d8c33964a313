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
from, and the others join (tailcut::FedRestoreState). On another number of
hosts the parts are dealt out again (share_parts): each host that saved a
part resumes it, each other part goes to a host of the restore, which
resumes it beside its own (the engine merges the two states: the same job's
tickets, _core._merge_states), and a host with no part starts empty and
takes what the coordinator hands out again. The hosts' parts are the same
items split another way; exactly once holds as on as many hosts.

The queue checkpoint is edited by the engine (_core._reopen_state,
engine/checkpoint.h ReopenRanges), which owns its byte layout: this module
never reads it. The engine checks the edited state again (checksum, counts,
pieces inside their items) when it restores.
"""

import os
import sys
import time
import uuid

import tailcut
from tailcut import _core
from tailcut._batch_layout import batch_ranges, marked_ranges

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


def _fed_args(queue_args):
    """True when a coordinator feeds the queue of these WorkQueue arguments
    (its coordinator= option, else $TAILCUT_COORDINATOR, as the engine
    resolves it)."""
    return bool(queue_args.get("coordinator") or os.environ.get("TAILCUT_COORDINATOR"))


def _fed(queue):
    return _fed_args(queue.open_args)


def host_queue_name(queue_args):
    """The name of this host's queue, from the dataset's WorkQueue arguments
    and without opening it: '<name>.<host id>' where a coordinator feeds it,
    else its name (what WorkQueue.summary()['name'] says once open)."""
    name = queue_args["name"]
    if _fed_args(queue_args):
        return f"{name}.{_core._host_id(name, queue_args.get('host_id') or '')}"
    return name


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
    held = (list(loader._carried_now) + list(loader._carried)
            + [b for b in loader._pad_rest if isinstance(b, Held)])
    ranges, records = [], 0
    for h in held:
        ranges += h.ranges
        records += h.records
    for batch in [b for b in loader._pad_rest if not isinstance(b, Held)] + (
            [] if loader._stash is None else [loader._stash]):
        ranges += batch_ranges(batch.data, batch.header)
        records += batch.records
        held.append(batch)
    return ranges, len(held), records


# Batches a rank remembers as used (_batch_layout.ranges_mark), its last ones: enough for
# loaders descheduled between a publish and its commit for that many of the
# rank's steps.
RECENT_USED = 64


def _used(loader):
    """The ranges of the batches this rank used at its last steps (its last
    RECENT_USED batches and the one it holds). A loader commits a batch's
    records right after it publishes the batch, so a rank may have used one
    before that commit, and the loader may stay descheduled there while the
    ranks go on for a few steps: the queue's state would have those records
    read again, and the checkpoint counts them as consumed
    (_core._consume_state; a range already committed is consumed already)."""
    ranges = list(loader._balanced_ranges)
    for mark in loader._recent_used:
        ranges += marked_ranges(mark)
    for batch in loader._current:
        ranges += batch_ranges(batch.data, batch.header)
    return ranges


def _hosts(every):
    """{queue name: what the ranks of that host hold} from every rank's part."""
    hosts = {}
    for part in every:
        host = hosts.setdefault(part["host"], dict(ranges=[], used=[], batches=0, records=0))
        if "queue" in part:
            if "queue" in host:
                raise tailcut.InvalidArgumentError(
                    f"PooledLoader.state_dict(): two hosts read a queue named "
                    f"'{part['host']}': a checkpoint tells hosts apart by their queue's name, so "
                    f"give each host's queue its own (name=f'{{job}}.n{{GROUP_RANK}}')")
            host["queue"], host["ring"] = part["queue"], part["ring"]
        host["ranges"] += part["ranges"]
        host["used"] += part["used"]
        host["batches"] += part["batches"]
        host["records"] += part["records"]
    for name, host in hosts.items():
        if "queue" not in host:
            raise tailcut.InvalidArgumentError(
                f"PooledLoader.state_dict(): no rank of the host of queue '{name}' has local "
                f"rank 0, which saves the host's queue and ring: check LOCAL_RANK")
    return hosts


def _host_state(host):
    """One host's part: its queue's state with the ranges its ranks used at
    their last step consumed and its unused ranges reopened."""
    state = _core._consume_state(host["queue"]["state"], host["used"], host["queue"]["name"])
    state, reopened = reopen(state, host["ranges"], host["queue"]["name"])
    return dict(ring=host["ring"], queue=dict(host["queue"], state=state),
                unused_batches=host["batches"], unused_records=host["records"],
                reopened_ranges=reopened)


def _exchange(dist, group, mine):
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return every


# ---- Every rank calls state_dict() at the same step ---------------------------------------
# Before the collectives of state_dict() the ranks meet in torch.distributed's
# store (no collective: a rank that went on to its next step instead is not in
# one), each under its position: the n-th call of rank r sets
# 'tailcut/state_dict/<job>/<n>/<r>' to 'epoch step' and counts itself in
# '.../<n>/arrived'. A rank waiting for its next step (StepAgreement.watch)
# that finds its n-th call begun elsewhere says so in '.../<n>/mismatch' and
# raises; the callers, polling, raise with it: every rank within a second or so.

_POLL = 0.01


def _store(dist):
    return dist.distributed_c10d._get_default_store()


def _group_ranks(dist, group):
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return sorted(dist.distributed_c10d._pg_group_ranks[group])


_loaders_made = [0]  # PooledLoaders made in this process: their index names their calls


def call_index():
    """The next PooledLoader's index in this process: every rank makes its
    loaders in the same order, so the same index names the same loader on
    every rank of every host (whose queues have names of their own)."""
    _loaders_made[0] += 1
    return _loaders_made[0] - 1


def _call_key(loader, n):
    return f"tailcut/state_dict/{loader._call_index}/{n}"


def _has(store, key):
    """Whether `key` was set with _put() (torch 1.13's PrefixStore has no check())."""
    return store.add(f"{key}#", 0) > 0


def _put(store, key, text):
    store.set(key, text)
    store.add(f"{key}#", 1)


def _positions(store, prefix, ranks):
    got = {}
    for r in ranks:
        if _has(store, f"{prefix}/{r}"):
            epoch, step = store.get(f"{prefix}/{r}").decode().split()
            got[r] = (int(epoch), int(step))
    return got


def _meet(loader, dist, group):
    """Waits until every rank of the group called state_dict() (this call),
    then checks that all did at the same position; raises on a mismatch, the
    same on every rank, naming the ranks and their steps."""
    store, ranks, me = _store(dist), _group_ranks(dist, group), dist.get_rank()
    prefix = _call_key(loader, loader._state_calls)
    loader._state_calls += 1
    epoch, step = loader._position
    _put(store, f"{prefix}/{me}", f"{epoch} {step}")
    store.add(f"{prefix}/arrived", 1)
    deadline = None if loader.timeout is None else time.monotonic() + loader.timeout
    while store.add(f"{prefix}/arrived", 0) < len(ranks):
        if _has(store, f"{prefix}/mismatch"):
            raise tailcut.InvalidArgumentError(store.get(f"{prefix}/mismatch").decode())
        if deadline is not None and time.monotonic() > deadline:
            missing = sorted(set(ranks) - set(_positions(store, prefix, ranks)))
            raise tailcut.TimeoutError(
                f"PooledLoader.state_dict(): rank {me} waited {loader.timeout} s (timeout) for "
                f"rank(s) {missing} to call it too, after {step} steps of epoch {epoch}: call "
                f"state_dict() on every rank at the same step")
        time.sleep(_POLL)
    positions = _positions(store, prefix, ranks)
    if len(set(positions.values())) > 1:
        said = "; ".join(f"rank {r} after {s} steps of epoch {e}"
                         for r, (e, s) in sorted(positions.items()))
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.state_dict(): the ranks called it at different steps ({said}): call "
            f"it on every rank at the same step")


def watch_calls(loader, epoch, step):
    """StepAgreement.watch of a PooledLoader: raises, and tells the ranks in
    state_dict() why, when another rank called state_dict() while this one
    asked for its next batch (step `step` of `epoch`) instead."""
    dist = sys.modules.get("torch.distributed")
    if loader.world_size == 1 or dist is None or not dist.is_initialized():
        return
    store = _store(dist)
    prefix = _call_key(loader, loader._state_calls)
    if store.add(f"{prefix}/arrived", 0) == 0:
        return
    ranks = _group_ranks(dist, loader._group)
    said = ", ".join(f"rank {r} after {s} steps of epoch {e}"
                     for r, (e, s) in sorted(_positions(store, prefix, ranks).items()))
    message = (f"PooledLoader.state_dict(): the ranks did not call it at the same step: {said} "
               f"called it; rank {dist.get_rank()} went on to step {step + 1} of epoch {epoch} "
               f"without calling it: call state_dict() on every rank at the same step")
    _put(store, f"{prefix}/mismatch", message)
    raise tailcut.InvalidArgumentError(message)


def state_dict(loader):
    """See PooledLoader.state_dict()."""
    exchange = _group(loader)
    if exchange is not None:
        dist, group = exchange
        _meet(loader, dist, group)  # every rank calls it at the same step, or all raise
        dist.barrier(group=group)  # every rank is here: nobody pops until the exchange below
    fed = _fed(loader.queue)
    # A fed queue is '<name>.<host id>' on its host, and every host's shares `name`.
    host_queue = loader.queue.summary()["name"] if fed else loader.queue.name
    mine = dict(host=host_queue, ranges=[], batches=0, records=0, used=_used(loader))
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
        # The data set, for a restore that names what differs (see WorkQueue.state_dict()).
        samples = {k: v for k, v in loader.queue.open_args.items() if k == "samples_id"}
        return dict(version=STATE_VERSION, epoch=epoch, step=step,
                    queue=dict(hosts={name: h.pop("queue") for name, h in hosts.items()},
                               tier=tier, epoch=first_epoch, **samples),
                    hosts=hosts, **totals)
    if len(hosts) == 1:  # laid out as in version 1
        (host,) = hosts.values()
        # len(dataset) of a map-style one (None for files): one host's, so a one-host state's.
        return dict(host, version=STATE_VERSION, epoch=epoch, step=step,
                    num_samples=loader.queue.num_samples)
    # Every host's queue state under its queue's name: QueueDataset(restore_state=
    # state["queue"]) opens each host's queue with its own (host_queue_state()).
    return dict(version=STATE_VERSION, epoch=epoch, step=step,
                queue=dict(hosts={name: h.pop("queue") for name, h in hosts.items()}),
                hosts=hosts, **totals)


def _restore_hosts(local):
    """(token, hosts): one token for the ranks of a restore, drawn by rank 0,
    and the sorted queue names of every host of the restore, gathered over
    the default group (every rank opens its queue with the checkpoint at the
    same time). One process: a token of its own, and its host alone."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        every = [None] * dist.get_world_size()
        mine = (local, uuid.uuid4().hex if dist.get_rank() == 0 else None)
        dist.all_gather_object(every, mine)
        return every[0][1], sorted({host for host, _ in every})
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise tailcut.InvalidArgumentError(
            "restore_state: the checkpoint is of a pool fed by a coordinator, whose ranks agree "
            "on one restore through torch.distributed: call init_process_group() before opening "
            "the queue (QueueDataset, or PooledLoader of a map-style dataset)")
    return uuid.uuid4().hex, [local]


def share_parts(saved, hosts):
    """{host: [saved host parts it resumes]}: which hosts of a restore resume
    the open items of which hosts of the checkpoint (queue names both). A
    host of the checkpoint that restores takes its own part; each other part
    goes to the host with the fewest so far (the first by name of those), so
    that on fewer hosts some host resumes two parts, and on more some resume
    none and take only what the coordinator hands out again. The same on
    every rank: from the names alone."""
    given = {host: [host] if host in saved else [] for host in hosts}
    for part in sorted(set(saved) - set(hosts)):
        given[min(sorted(hosts), key=lambda host: len(given[host]))].append(part)
    return given


def _fed_host_state(restore_state, name, local):
    """This host's restore_state from a fed pool's checkpoint: the tier's
    state and the host parts share_parts() gives this host, merged into one
    queue state by the engine (none: a state of the job with nothing handed
    out, so that the host starts with an empty queue, replacing what an
    earlier run left there as any restore does)."""
    hosts = restore_state["hosts"]
    others = sorted(h for h in hosts if not h.startswith(f"{name}."))
    if others:
        raise tailcut.InvalidArgumentError(
            f"restore_state: the checkpoint holds the queues {', '.join(sorted(hosts))}, of "
            f"another job than '{name}' (its hosts' queues are '{name}.<host id>'): open the "
            f"queue under the name it had when the checkpoint was saved")
    token, restoring = _restore_hosts(local)
    parts = [hosts[part]["state"] for part in share_parts(hosts, restoring)[local]]
    host = (_core._merge_states(parts, local) if parts else
            _core._empty_state(next(iter(hosts.values()))["state"], local))
    samples = {k: v for k, v in restore_state.items() if k == "samples_id"}
    return dict(state=_core._fed_restore_state(restore_state["tier"], host, token),
                tier=restore_state["tier"], epoch=restore_state["epoch"], **samples)


def host_queue_state(restore_state, name, host_id=None):
    """The state queue `name` opens with from restore_state: a pool's
    checkpoint of several hosts ({'hosts': {queue name: state}}) gives that
    queue's entry; any other restore_state is the queue's own. A checkpoint of
    a pool fed by a coordinator (with 'tier') gives this host's restore of
    it, on any number of hosts, under a token drawn for this restore (a
    collective call: every rank makes it)."""
    if not (isinstance(restore_state, dict) and "hosts" in restore_state):
        return restore_state
    hosts = restore_state["hosts"]
    if "tier" in restore_state:
        return _fed_host_state(restore_state, name,
                               f"{name}.{_core._host_id(name, host_id or '')}")
    if name not in hosts:
        raise tailcut.InvalidArgumentError(
            f"restore_state: the checkpoint holds the queues of {len(hosts)} hosts "
            f"({', '.join(sorted(hosts))}), none named '{name}': restart on as many hosts, each "
            f"opening its queue under the name it had when the checkpoint was saved (a queue "
            f"per host holds that host's own works; a pool fed by a coordinator restores on "
            f"any number of hosts)")
    return hosts[name]


# ---- Checking a state before it is used ----------------------------------------------------


def _refuse(field, problem, fix="pass the state_dict() this job saved, unchanged"):
    raise tailcut.InvalidArgumentError(
        f"PooledLoader.load_state_dict(): state[{field}] {problem}: {fix}")


def _int_field(where, field, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int):
        _refuse(field, f"is {type(value).__name__} {value!r} in {where}, not an int")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        _refuse(field, f"is {value} in {where}, not in {bound}")


def _queue_part(field, part):
    """Checks one queue's entry of a state: {'state': bytes, 'name': str, ...}."""
    if not isinstance(part, dict):
        _refuse(field, f"is a {type(part).__name__}, not a queue's state (a dict)")
    if not isinstance(part.get("state"), (bytes, bytearray)) or not part["state"]:
        _refuse(f"{field}]['state'", f"is {type(part.get('state')).__name__}, not the "
                f"queue's checkpoint bytes")
    if "name" in part and not isinstance(part["name"], str):
        _refuse(f"{field}]['name'", f"is {type(part['name']).__name__}, not a queue name")
    for key in ("num_epochs", "num_items"):
        if key in part:
            _int_field("the queue's state", f"{field}][{key!r}", part[key], 1)


def check_state(state, loader):
    """Refuses, naming the field, a state that is not a PooledLoader state
    this job can resume from: each field's type and range, the version, the
    number of hosts, the dataset's length and the queue's epochs. Reads the
    dataset's queue arguments, never opens the queue. The queue checkpoint's
    bytes are checked by the engine when the queue opens (checksum, works)."""
    if not isinstance(state, dict):
        raise tailcut.InvalidArgumentError(
            f"PooledLoader.load_state_dict(): the state is a {type(state).__name__}, not the "
            f"dict PooledLoader.state_dict() returns")
    for key in ("version", "epoch", "step", "queue"):
        if key not in state:
            _refuse(repr(key), "is missing (a PooledLoader state has version, epoch, step, "
                    "queue)")
    if state["version"] not in READABLE_VERSIONS or isinstance(state["version"], bool):
        _refuse("'version'", f"is {state['version']!r}, a state this tailcut cannot read "
                f"(versions {', '.join(map(str, READABLE_VERSIONS))})",
                "resume with the tailcut that saved it")
    args = getattr(loader.dataset, "_queue_args", {})
    num_epochs = args.get("num_epochs", 1)
    _int_field("the state", "'epoch'", state["epoch"], 0)
    _int_field("the state", "'step'", state["step"], 0)
    for key in ("unused_batches", "unused_records", "reopened_ranges"):
        if key in state:
            _int_field("the state", repr(key), state[key], 0)
    queue = state["queue"]
    if not isinstance(queue, dict):
        _refuse("'queue'", f"is a {type(queue).__name__}, not a queue's state (a dict)")
    if "hosts" in queue:
        if not isinstance(queue["hosts"], dict) or not queue["hosts"]:
            _refuse("'queue']['hosts'", "is not a dict of the hosts' queue states")
        for name, part in queue["hosts"].items():
            _queue_part(f"'queue']['hosts'][{name!r}", part)
        parts = list(queue["hosts"].values())
        saved = sorted(queue["hosts"])
    else:
        _queue_part("'queue'", queue)
        parts = [queue]
        saved = [queue.get("name", "?")]
    hosts_now = loader.world_size // loader.local_world_size
    # A fed pool's hosts share one job: its state restores on any number of them
    # (host_queue_state). Each queue of a static split holds its own host's works.
    if "tier" not in queue and len(saved) != hosts_now:
        _refuse("'queue'", f"covers {len(saved)} host(s) (queues {', '.join(saved)}), this job "
                f"runs on {hosts_now} ({loader.world_size} ranks, {loader.local_world_size} per "
                f"host), and each of its queues holds its own host's works",
                f"restart it on {len(saved)} host(s), or feed the hosts' queues from a "
                f"coordinator, whose checkpoints restore on any number of hosts")
    saved_epochs = parts[0].get("num_epochs")
    if saved_epochs is not None and "num_epochs" in args and saved_epochs != num_epochs:
        _refuse("'queue']['num_epochs'", f"is {saved_epochs}, this job's queue has "
                f"num_epochs={num_epochs}", f"build the dataset with num_epochs={saved_epochs}, "
                f"as in the run that saved it")
    if saved_epochs is not None:
        num_epochs = saved_epochs
    if state["epoch"] > num_epochs:
        _refuse("'epoch'", f"is {state['epoch']}, past the queue's {num_epochs} epochs (a "
                f"resumed loop would train nothing)")
    if "tier" not in queue and "hosts" not in queue:
        # Where the queue's own state starts (its first item not done): a state whose epoch
        # is behind it would skip done records, ahead of it would skip epochs.
        first = _core._state_epoch(bytes(queue["state"]), str(queue.get("name", "")))
        if not first - 1 <= state["epoch"] <= first + 1:
            _refuse("'epoch'", f"is {state['epoch']}, but its queue state starts in epoch "
                    f"{first} (the two come from different checkpoints)")
    saved_samples = state.get("num_samples")
    now_samples = args.get("num_samples")
    if saved_samples is not None and now_samples is not None and saved_samples != now_samples:
        _refuse("'num_samples'", f"is {saved_samples}, but len(dataset) is {now_samples}",
                "resume with the dataset the checkpoint was taken of (same samples, same "
                "order), or start a new run without the checkpoint")


def host_barrier(local_world_size, group, who):
    """A barrier of the ranks for a one-call restore (QueueDataset.restore):
    torch.distributed's, over `group` or the default group; none for one
    rank per host."""
    def barrier():
        if local_world_size == 1:
            return
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_initialized():
            raise tailcut.InvalidArgumentError(
                f"{who}.load_state_dict(): the host's {local_world_size} ranks reopen their "
                f"queue from the checkpoint together, through torch.distributed: call "
                f"init_process_group() first (or open the dataset with "
                f"restore_state=state['queue'])")
        dist.barrier(group=group)
    return barrier


def load_state_dict(loader, state):
    """See PooledLoader.load_state_dict()."""
    check_state(state, loader)
    queue = state["queue"]
    restore = getattr(loader.dataset, "restore", None)
    if restore is not None and restore(queue, host_barrier(loader.local_world_size, loader._group,
                                                           "PooledLoader"), "PooledLoader"):
        pass  # the dataset's queue reopened from the checkpoint
    elif "tier" in queue:
        opened = getattr(loader.dataset, "_queue_args", {}).get("restore_state")
        if not (isinstance(opened, dict) and opened.get("tier") == queue["tier"]):
            raise tailcut.InvalidArgumentError(
                f"PooledLoader.load_state_dict(): queue '{loader.queue.name}' is open already "
                f"and cannot jump to a checkpoint: call load_state_dict(state) before the first "
                f"iteration (or open the dataset with restore_state=state['queue'])")
    else:
        # Raises, saying how, unless the queue was opened from this state.
        loader.queue.load_state_dict(host_queue_state(queue, loader.queue.name))
    loader.set_epoch(state["epoch"])
    loader._position = (state["epoch"], 0)
