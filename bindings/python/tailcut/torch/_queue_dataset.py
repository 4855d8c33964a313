"""QueueDataset: an IterableDataset over a tailcut work queue (docs/pytorch.md)."""

import functools
import multiprocessing
import multiprocessing.util
import os
import sys

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

import tailcut
from tailcut import _args, _attempts, _core, _pool_state
from tailcut._file_record import FileRecord
from tailcut._job import default_name as _default_name, env_int
from tailcut._record_files import RecordFiles
from tailcut.torch._global_shuffle import RECORD_GROUP as GLOBAL_RECORD_GROUP
from tailcut.torch._global_shuffle import check_restore as check_global_restore
from tailcut.torch._global_shuffle import generate as generate_global
from tailcut.torch._global_shuffle import recipe as global_recipe
from tailcut.torch._tensors import from_numpy

# Records per read in per-record mode (batch_size=None).
_RECORD_GROUP = 64

# Record-level shuffle by default (see QueueDataset and docs/pytorch.md): 2
# items read at once, their records mixed through a buffer of 2048 records.
SHUFFLE_BUFFER = 2048
INTERLEAVE = 2
# leases_per_client of a queue read with the record-level shuffle: the most
# the default max_clients (256) allows.
SHUFFLE_LEASES = 32

_MASK64 = (1 << 64) - 1


def _mix(*values):
    """A 64-bit seed from ints (splitmix64 steps): the same values give the same
    seed in every run, unlike hash() of a str."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = ((x ^ (int(v) & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x


def current_epoch(q):
    """The epoch the job is in: that of the queue's first item not done
    (items are done in about ticket order), not that of its next ticket, which
    is the next epoch's as soon as every item of this one is handed out -- to
    a sibling's shuffle buffer, say."""
    s = q.summary()
    return min(s["epoch"], s["done"] // max(s["num_items"], 1))


# ---- Reading without waiting for other processes at the end of the data -------------------


class _Source:
    """Reads a BatchIterator; ends instead of waiting at the end of the data.

    At the end of the data a read waits while other processes hold the last
    items. In a DataLoader that wait can deadlock (the loader delivers batches
    in worker order, so a sibling worker holding the last items is not asked
    for more while this worker waits), and under EqualSteps it would keep the
    other ranks waiting for this one. So reads do not wait for them
    (timeout=0): the reader then holds no item and no record back, and the
    iteration ends with nothing lost or read twice.
    """

    def __init__(self, it):
        self._it = it
        # format="file": the work file of each record of the last piece (an
        # index into works); None for other formats.
        self.files = None

    def read(self, want):
        """(piece, epoch): the next piece of at most `want` records and the
        epoch of its items; None at the end."""
        if self._it is None:
            return None
        try:
            piece = self._it.read(want, timeout=0)
            self.files = self._it.files
            return piece, self._it.epoch
        except (StopIteration, tailcut.Empty):
            self.close()
            return None
        except BaseException:
            self.close()
            raise

    def close(self):
        if self._it is not None:
            self._it.close()
        self._it = None


# ---- Batch layouts ----------------------------------------------------------------------------
# A piece is what BatchIterator yields: fixed-size records as an (n, record_bytes)
# uint8 array, other formats as (data uint8, offsets int64 of n + 1).


def _count(piece):
    return len(piece) if isinstance(piece, np.ndarray) else len(piece[1]) - 1


def _owned(piece):
    """The piece itself if it owns its memory, else a copy (zero-copy views are
    read-only and die at the next read)."""
    if isinstance(piece, np.ndarray) and not piece.flags.writeable:
        return piece.copy()
    return piece


def _concat(pieces):
    if isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    datas, offsets, base = [], [np.zeros(1, np.int64)], 0
    for data, off in pieces:
        datas.append(data)
        offsets.append(off[1:] + base)
        base += len(data)
    return np.concatenate(datas), np.concatenate(offsets)


def _to_torch(piece):
    if isinstance(piece, np.ndarray):
        return from_numpy(piece)
    return from_numpy(piece[0]), from_numpy(piece[1])


def _full_batches(source, batch_size, drop_last):
    """(batch, epoch) pairs: batches of exactly batch_size records of one
    epoch, except the last one of each epoch met (dropped with drop_last). A
    full piece passes through untouched (a zero-copy view stays one); short
    pieces (near the end of the data) are joined into owned arrays, asking the
    reader for exactly the rest so that the batches after them line up with
    its buffers again."""
    pending, have, pending_epoch = [], 0, None
    while (got := source.read(batch_size - have)) is not None:
        piece, epoch = got
        if pending and epoch != pending_epoch:  # one epoch per batch
            if not drop_last:
                yield _concat(pending), pending_epoch
            pending, have = [], 0
        n = _count(piece)
        if not pending and n == batch_size:
            yield piece, epoch
            continue
        pending.append(_owned(piece))
        pending_epoch = epoch
        have += n
        if have == batch_size:
            yield _concat(pending), pending_epoch
            pending, have = [], 0
    if pending and not drop_last:
        yield _concat(pending), pending_epoch


def _records(piece, files=None, paths=None):
    """The records of a piece as bytes; with `files` (format="file": each
    record's index in works) as FileRecords, their paths from `paths`."""
    if isinstance(piece, np.ndarray):
        for row in piece:
            yield row.tobytes()
    else:
        data, offsets = piece
        raw = data.tobytes()
        for i in range(len(offsets) - 1):
            record = raw[offsets[i]:offsets[i + 1]]
            if files is None:
                yield record
            else:
                # A record restored from an old shuffle state has no file (index out of range).
                index = int(files[i]) if files[i] < len(paths) else None
                yield FileRecord(record, None if index is None else paths[index], index)


def _count_head(head, fmt):
    """(records, bytes they span) at the start of a file, for an estimate."""
    if fmt == "tfrecord":
        pos = n = 0
        while pos + 12 <= len(head):
            length = int.from_bytes(head[pos:pos + 8], "little")
            if pos + 16 + length > len(head):
                break
            pos += 16 + length
            n += 1
        return n, pos
    end = head.rfind(b"\n") + 1  # lines: whole lines only
    return head.count(b"\n", 0, end), end


# ---- The dataset --------------------------------------------------------------------------------


class _Notices:
    """The queue's notices, to the user's on_notice or printed as the engine
    prints them; none while `quiet` (a one-call restore closes the fresh
    queue it replaces: restore())."""

    def __init__(self, on_notice):
        self.on_notice, self.quiet = on_notice, False

    def __call__(self, line):
        if self.quiet:
            return
        if self.on_notice is not None:
            self.on_notice(line)
        else:
            sys.stderr.write(f"tailcut: {_core._python_wording(line)}\n")
            sys.stderr.flush()


class QueueDataset(IterableDataset):
    """An IterableDataset that reads a tailcut work queue.

    QueueDataset(works, batch_size=None, *, transform=None, copy=False,
                 drop_last=False, shuffle_buffer=2048, interleave=2,
                 reader_options=None, resume=None, name=None, num_epochs=None,
                 shuffle=None, seed=None, ...the other tailcut.WorkQueue options)

    `works` and the keywords from name on are tailcut.WorkQueue's arguments
    (num_epochs, shuffle, seed, num_slices, name, format, record_bytes, ...;
    None keeps WorkQueue's default); every process of the job must pass the
    same ones. num_clients defaults to
    $LOCAL_WORLD_SIZE (torchrun), else 1. The queue is opened (created or
    joined) in this process right away -- a bad option fails here -- and again
    in each DataLoader worker process, which pulls from it on its own.

    batch_size=None: yields each record as bytes, or transform(bytes); batch
    them with the DataLoader (batch_size=..., collate_fn=...). format="file":
    each record is a tailcut FileRecord, bytes with .path and .index (the
    file's place in works), as pooled loaders hand it to a transform.
    batch_size=n: yields batches of n records (the last of each process's
    epoch may be shorter, or dropped with drop_last) as tensors, or
    transform(batch); use DataLoader(batch_size=None). Fixed-size records: a
    (n, record_bytes) uint8 tensor. Other formats: (data, offsets), a uint8 and
    an int64 tensor, record i = data[offsets[i]:offsets[i + 1]].

    Record-level shuffle (on by default, see docs/pytorch.md): each process
    reads `interleave` items at once and hands out their records in a random
    order through a buffer of `shuffle_buffer` records (tf.data's interleave
    + shuffle), seeded by the queue's seed, the epoch and the process's rank
    and worker id, so the same seed gives the same order. The items
    themselves come in the queue's seeded order (shuffle=True). Records are
    copied then. The buffer holds shuffle_buffer records per process, at
    most a quarter of the process's even share of an epoch
    (records_per_epoch() / (num_clients x DataLoader workers)). An item is
    done only once its records have left the buffer in batches that were
    used, so a process that dies (or an iteration left early) loses nothing:
    its unfinished items are read again whole, as in file order.
    shuffle_buffer=0 and interleave=1: records in file order within each
    item, and zero-copy batches.

    Zero copy (shuffle_buffer=0, interleave=1): in the process that reads
    (num_workers=0), a full batch of fixed-size records is a read-only tensor
    over the reader's pinned buffers,
    VALID ONLY UNTIL THE NEXT BATCH IS REQUESTED: use it (or copy it to the
    GPU) before asking for the next, never write to it, and pass copy=True
    for owned tensors. In DataLoader workers batches are always owned (the
    DataLoader sends them to the trainer after the worker moved on).

    Epochs: an iteration reads the items of one epoch of the queue and stops at
    the first item of a later epoch (it goes back to the queue unread). The
    epoch is the one set with set_epoch() (as with DistributedSampler), else
    the queue's current epoch when the iteration starts (the epoch of its
    first item not done). A process that has
    nothing left to read while others still hold items ends its iteration
    rather than wait for them. An item of an earlier epoch that comes back to
    the queue after every process finished that epoch (a reader that stopped
    at an epoch boundary gave it back late, or a process died) is read by a
    later iteration: its records are used once, late. A batch holds records of
    one epoch; `batch_epoch` says which (a transform may read it) and
    `late_records` counts the late ones this process read.

    reader_options: keywords of WorkQueue.batches() (chunk_bytes,
    buffer_budget_bytes, prefetch_items, backend, ...).

    shuffle="global" (docs/shuffle.md): every record of all the files in one
    seeded permutation, as a map-style dataset's samples (a batch of
    label-sorted files holds every label). The files are indexed once (where
    each record starts; kept in index_dir, default $TAILCUT_INDEX_DIR else
    ~/.cache/tailcut/index, and indexed again when a file changed) and the
    queue is an index work over the records' numbers: exactly once,
    checkpoints, the pool and several hosts as for IndexDataset. Records are
    read a group at a time (a batch, or 64) in one call, sorted and
    coalesced; batches are owned tensors. shuffle_buffer, interleave and
    reader_options are not used.
    """

    _records = None  # shuffle="global": the RecordFiles read by number

    def __init__(self, works, batch_size=None, *, transform=None, copy=False, drop_last=False,
                 shuffle_buffer=SHUFFLE_BUFFER, interleave=INTERLEAVE, reader_options=None,
                 resume=None, name=None, num_epochs=None, shuffle=None, seed=None, prefix=None,
                 num_slices=None, num_clients=None, format=None, record_bytes=None,
                 restore_state=None, max_clients=None, leases_per_client=None,
                 attach_timeout=None, lease_timeout=None, stop_timeout=None, on_notice=None,
                 auto_ack=None, keep_unfinished=None, coordinator=None, host_id=None,
                 global_ttl=None, global_block_size=None, index_dir=None):
        super().__init__()
        # The queue's tailcut.WorkQueue options, listed (no **kwargs: an unknown keyword is
        # Python's TypeError naming QueueDataset); those not given keep WorkQueue's default.
        queue_options = {k: v for k, v in dict(
            name=name, num_epochs=num_epochs, shuffle=shuffle, seed=seed, prefix=prefix,
            num_slices=num_slices, num_clients=num_clients, format=format,
            record_bytes=record_bytes, restore_state=restore_state, max_clients=max_clients,
            leases_per_client=leases_per_client, attach_timeout=attach_timeout,
            lease_timeout=lease_timeout, stop_timeout=stop_timeout, on_notice=on_notice,
            auto_ack=auto_ack, keep_unfinished=keep_unfinished, coordinator=coordinator,
            host_id=host_id, global_ttl=global_ttl, global_block_size=global_block_size,
        ).items() if v is not None}
        if isinstance(works, (str, bytes, os.PathLike)):
            works = [works]
        queue_options.setdefault("num_clients", env_int("LOCAL_WORLD_SIZE", 1))
        queue_options.setdefault("name", _default_name())
        self._notices = _Notices(on_notice)
        # shuffle="global": the records of all files in one seeded permutation,
        # read by number from record indexes (tailcut.torch._global_shuffle).
        self._records = None
        if isinstance(shuffle, str):
            if shuffle != "global":
                raise tailcut.InvalidArgumentError(
                    f"shuffle={shuffle!r}: give True (items in a seeded order, records mixed "
                    f"in a buffer), False (file order) or 'global' (every record in one "
                    f"seeded permutation; docs/shuffle.md)")
            self._records = _global_records(works, queue_options, index_dir, self._notices)
            queue_options = {k: v for k, v in queue_options.items()
                             if k not in ("format", "record_bytes", "prefix")}
            queue_options["shuffle"] = True
            # The files, as the queue's configuration: a queue or checkpoint of other files
            # with as many records is refused (docs/checkpoints.md).
            queue_options["samples_id"] = self._records.samples_id()
        elif index_dir is not None:
            raise tailcut.InvalidArgumentError(
                "index_dir= is for shuffle='global' (where record indexes are kept)")
        if self._records is not None:
            works = None
            n = len(self._records)
            queue_options["num_samples"] = n
            # Positions are permuted, so an item's size does not change the mixing, only
            # the calls per batch (take, claim, indices) and how finely processes share an
            # epoch: 64 items, of 256 to 4096 records where there are enough. A batch holds
            # its items open until it is handed on: more leases than items per batch.
            queue_options.setdefault("num_slices",
                                     min(max(1, n // 256), max(-(-n // 4096), 64)))
            if "max_clients" not in queue_options:
                queue_options.setdefault("leases_per_client", SHUFFLE_LEASES)
            smallest = n // queue_options["num_slices"]  # records of the smallest item
            spans = min(-(-(batch_size or GLOBAL_RECORD_GROUP) // max(smallest, 1)) + 1,
                        queue_options["num_slices"])
            leases = queue_options.get("leases_per_client", 8)
            if spans > leases:
                raise tailcut.InvalidArgumentError(
                    f"QueueDataset(shuffle='global'): a batch of {batch_size or 'records'} may "
                    f"span {spans} items of {smallest} records (num_slices="
                    f"{queue_options['num_slices']}), more than a process may hold open "
                    f"(leases_per_client={leases}); give fewer num_slices or more "
                    f"leases_per_client")
        elif (shuffle_buffer or interleave != 1) and "max_clients" not in queue_options:
            # An item stays the process's until its last record leaves the
            # shuffle buffer, and with random eviction that takes about
            # buffer x ln(records per item) records: many items at once. With
            # too few leases the readers pause while the buffer drains, so the
            # processes take unequal shares and EqualSteps ends epochs early
            # (docs/pytorch.md, "Record-level shuffle").
            queue_options.setdefault("leases_per_client", SHUFFLE_LEASES)
        self._queue_args = dict(works=None if works is None else list(works), **queue_options)
        if queue_options.get("restore_state") is not None:
            # A PooledLoader checkpoint of several hosts: this host's queue's entry.
            self._queue_args["restore_state"] = _pool_state.host_queue_state(
                queue_options["restore_state"], queue_options["name"],
                queue_options.get("host_id"))
            if self._records is not None:
                check_global_restore(self._queue_args["restore_state"],
                                              queue_options["samples_id"], "QueueDataset")
        self.batch_size = _args.count("batch_size", batch_size, minimum=1, allow_none=True)
        self.transform = _args.callable_or_none("transform", transform)
        self.copy = _args.flag("copy", copy)
        self.drop_last = _args.flag("drop_last", drop_last)
        self.shuffle_buffer = _args.count("shuffle_buffer", shuffle_buffer)
        self.interleave = _args.count("interleave", interleave, minimum=1)
        if resume is not None:
            _args.flag("resume", resume)
        self._epoch_records = None  # records_per_epoch(), once
        self.reader_options = dict(reader_options or {})
        for key in ("max_epoch", "short_at_end", "copy", "drop_last", "batch_size",
                    "shuffle_buffer", "interleave", "shuffle_seed"):
            if key in self.reader_options:
                raise TypeError(f"reader_options may not set {key!r}: QueueDataset sets it")
        self._epoch = None  # set_epoch()
        # The epoch of the items the batch (or record) being produced came
        # from, for a transform that wants it: the iteration's epoch, or an
        # earlier one for a late item.
        self.batch_epoch = None
        # Records this process read in a later epoch than their own (late
        # items; see "Epochs" above).
        self.late_records = 0
        self._last_epoch = {}  # pid -> the epoch that process iterated last
        self._queue = None
        self._queue_pid = None
        self._closed = False
        self.resume = _attempts.resume_default(resume)
        # What local rank 0 resumed without a checkpoint, if anything:
        # PooledLoader refuses it.
        self._resumed = None
        if multiprocessing.parent_process() is None and get_worker_info() is None:
            self._resumed = _attempts.before_open(self._queue_args, self.resume)
        self.queue  # opens it: joins this process to the queue, checks the options

    @property
    def queue(self):
        """This process's tailcut.WorkQueue (each process opens its own)."""
        if self._queue_pid == os.getpid():
            if self._closed:
                raise tailcut.InvalidArgumentError(
                    f"QueueDataset of queue '{self._queue.name}' is closed")
            return self._queue
        # In a forked worker self._queue is the parent's: never use or close it.
        notices = self.__dict__.setdefault("_notices",
                                           _Notices(self._queue_args.get("on_notice")))
        q = tailcut.WorkQueue(**dict(self._queue_args, on_notice=notices))
        if multiprocessing.parent_process() is not None:
            # A multiprocessing child (a DataLoader worker, say) leaves through
            # os._exit, which skips atexit: close the queue at its exit instead,
            # so that its items go back and its client slot is freed at once.
            multiprocessing.util.Finalize(None, q.close, exitpriority=100)
        self._queue, self._queue_pid, self._closed = q, os.getpid(), False
        return q

    def restore(self, queue_state, barrier, who):
        """Reopens this process's queue from a checkpoint's queue part
        (state['queue'] of a PooledLoader or EqualSteps state), as
        restore_state= would have opened it: the one-call restore of `who`'s
        load_state_dict(), before anything was taken from the queue. Every
        rank of the host calls it: barrier() waits for them all (twice: all
        stop using the fresh queue, all closed it, so that it is gone and the
        checkpoint's replaces it). Returns False, reopening nothing, when the
        queue was opened with restore_state= already: the caller checks it is
        this checkpoint's."""
        name = self._queue_args["name"]
        if self._queue_args.get("restore_state") is not None:
            return False
        q = self.queue
        if self._last_epoch or q.summary()["handed_out"]:
            raise tailcut.InvalidArgumentError(
                f"{who}.load_state_dict(): queue '{name}' has handed out items already (an "
                f"iteration ran), and a queue in use cannot jump to a checkpoint: build the "
                f"dataset and the loader as in the first run and call load_state_dict(state) "
                f"on every rank before the first iteration")
        restore_state = _pool_state.host_queue_state(queue_state, name,
                                                     self._queue_args.get("host_id"))
        if self._records is not None:  # before any rank closes its queue: every rank raises
            check_global_restore(restore_state, self._queue_args["samples_id"],
                                          f"{who}.load_state_dict()")
        barrier()  # every rank of the host opened the fresh queue and uses it no more
        self._notices.quiet = True  # the fresh queue, removed by its last close, is not news
        try:
            q.close()
        finally:
            self._notices.quiet = False
        self._queue = self._queue_pid = None
        barrier()  # every rank closed it: it is gone
        self._queue_args["restore_state"] = restore_state
        self.queue  # opens it from the checkpoint (the options are checked here)
        return True

    def records_per_epoch(self):
        """(records, exact): the records of one epoch of the queue. Exact for
        fixed-size records (file sizes // record_bytes) and format="file" (one
        per file); otherwise estimated from the first MiB of up to 8 files
        (the mean record size there, applied to every file's size)."""
        if self._records is not None:
            return len(self._records), True
        args = self._queue_args
        prefix = args.get("prefix")
        paths = [os.path.join(os.fsdecode(prefix), os.fsdecode(w)) if prefix else os.fsdecode(w)
                 for w in args["works"]]
        sizes = [os.path.getsize(p) for p in paths]
        fmt = args.get("format") or "lines"
        if fmt == "fixed":
            return sum(size // args["record_bytes"] for size in sizes), True
        if fmt == "file":
            return len(paths), True
        sample_bytes = sample_records = 0
        for path, size in zip(paths[:8], sizes):
            if fmt == "tar":
                # Samples starting in the first MiB, found by the tar parser (a tar
                # header is not a line: counting newlines guessed a few records).
                starts, ends = _core.slice_records(path, 0, min(size, 1 << 20), "tar",
                                                   with_ends=True)
                n, used = len(starts), (ends[-1] if ends else 0)
            else:
                with open(path, "rb") as f:
                    head = f.read(1 << 20)
                n, used = _count_head(head, fmt)
            sample_bytes += used
            sample_records += n
        if sample_records == 0:
            return (0, True) if sum(sizes) == 0 else (len(paths), False)
        return round(sum(sizes) * sample_records / sample_bytes), False

    def __len__(self):
        """What one process yields per epoch when the host's num_clients ranks
        split the epoch evenly: ceil(records / num_clients) records
        (batch_size=None), or that many records in batches of batch_size. Exact
        for one reader of fixed-size records; otherwise see records_per_epoch()
        and docs/pytorch.md (DataLoader workers each end on a short batch)."""
        records, _ = self.records_per_epoch()
        share = -(-records // max(self._queue_args["num_clients"], 1))
        return share if self.batch_size is None else -(-share // self.batch_size)

    def set_epoch(self, epoch):
        """The epoch the next iteration reads (like DistributedSampler.set_epoch).
        Set it before iter(loader): DataLoader workers start from a copy of the
        dataset. With persistent_workers, a worker ignores an epoch it already
        read and takes the queue's current epoch instead."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._epoch = epoch

    @property
    def epoch(self):
        """The epoch this process iterates (or last iterated); None before the first."""
        return self._last_epoch.get(os.getpid())

    def _next_epoch(self, q):
        """The epoch this process iterates now: set_epoch()'s, unless this
        process already ran it (or a later one), then the queue's current one."""
        pid = os.getpid()
        epoch, last = self._epoch, self._last_epoch.get(pid)
        if epoch is None or (last is not None and epoch <= last):
            epoch = current_epoch(q)
        self._last_epoch[pid] = epoch
        return epoch

    def __iter__(self):
        q = self.queue
        epoch = self._next_epoch(q)
        if self._records is not None:
            return generate_global(self, q, epoch)
        worker = get_worker_info()
        in_worker = worker is not None
        shuffle = {}
        if self.shuffle_buffer or self.interleave > 1:
            # Deterministic per seed and epoch; distinct per rank and worker.
            shuffle = dict(shuffle_buffer=self._buffer_for(worker), interleave=self.interleave,
                           shuffle_seed=_mix(q.seed, epoch, env_int("LOCAL_RANK", 0),
                                             worker.id + 1 if in_worker else 0))
        if self.batch_size is None:
            it = q.batches(_RECORD_GROUP, copy=True, max_epoch=epoch, short_at_end=True,
                           **shuffle, **self.reader_options)
        else:
            it = q.batches(self.batch_size, copy=self.copy or in_worker, max_epoch=epoch,
                           short_at_end=True, **shuffle, **self.reader_options)
        return self._generate(_Source(it), epoch)

    @property
    def recipe(self):
        """shuffle="global" only (else AttributeError, and the pool makes its
        own): recipe(batch_size, collate_fn, transform), the pooled loaders'
        recipe, reading each batch's records by number in one call."""
        if self._records is None:
            raise AttributeError("recipe: a QueueDataset's own pooled recipe is for "
                                 "shuffle='global'")
        return functools.partial(global_recipe, self)

    def _buffer_for(self, worker):
        """shuffle_buffer, at most a quarter of this process's even share of an
        epoch: a buffer fills before it hands anything out, and what it reads
        ahead is taken from the other processes (the share is num_clients x
        DataLoader workers ways)."""
        if not self.shuffle_buffer:
            return 0
        if self._epoch_records is None:
            self._epoch_records = self.records_per_epoch()[0]
        processes = max(self._queue_args["num_clients"], 1) * (worker.num_workers if worker else 1)
        return max(1, min(self.shuffle_buffer, self._epoch_records // (4 * processes)))

    def _generate(self, source, epoch):
        transform = self.transform
        try:
            if self.batch_size is None:
                paths = self._file_paths()
                # A tar record is a WebDataset sample: handed out as WebDataset does.
                samples = self._queue_args.get("format") == "tar"
                while (got := source.read(_RECORD_GROUP)) is not None:
                    piece, self.batch_epoch = got
                    if self.batch_epoch < epoch:
                        self.late_records += _count(piece)
                    for record in _records(piece, source.files, paths):
                        if samples:
                            record = tailcut.tar_members(record)
                        yield record if transform is None else transform(record)
            else:
                for piece, self.batch_epoch in _full_batches(source, self.batch_size,
                                                             self.drop_last):
                    if self.batch_epoch < epoch:
                        self.late_records += _count(piece)
                    batch = _to_torch(piece)
                    yield batch if transform is None else transform(batch)
        finally:
            source.close()

    def _file_paths(self):
        """format="file": each work's path as WorkItem.path gives it (prefix +
        work), for the FileRecords; None for other formats."""
        args = self._queue_args
        if args.get("format") != "file":
            return None
        prefix = os.fsdecode(args.get("prefix") or "")
        return [prefix + os.fsdecode(w) for w in args["works"]]

    def close(self):
        """Closes this process's queue (its open items go back). Idempotent."""
        if self._queue is not None and self._queue_pid == os.getpid():
            self._queue.close()
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __getstate__(self):
        # For spawned DataLoader workers: a queue is per process.
        state = dict(self.__dict__)
        state["_queue"] = None
        state["_queue_pid"] = None
        return state

    def __repr__(self):
        if self._records is not None:
            return (f"QueueDataset(name={self._queue_args['name']!r}, "
                    f"batch_size={self.batch_size!r}, shuffle='global', "
                    f"records={len(self._records)})")
        return (f"QueueDataset(name={self._queue_args['name']!r}, "
                f"batch_size={self.batch_size!r}, shuffle_buffer={self.shuffle_buffer!r}, "
                f"interleave={self.interleave!r})")


def _global_records(works, queue_options, index_dir, notices):
    """The RecordFiles of QueueDataset(works, shuffle="global", ...): the
    works' paths (prefix applied) in their format, indexed."""
    prefix = queue_options.get("prefix")
    prefix = os.fsdecode(prefix) if prefix is not None else ""
    paths = [prefix + os.fsdecode(w) for w in works]
    if not paths:
        raise tailcut.InvalidArgumentError("QueueDataset: works is empty; give record files")
    records = RecordFiles(paths, queue_options.get("format") or "lines",
                          queue_options.get("record_bytes"), index_dir, on_notice=notices)
    if len(records) == 0:
        raise tailcut.InvalidArgumentError(
            f"QueueDataset(shuffle='global'): the {len(paths)} files hold no records")
    return records
