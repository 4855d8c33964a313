"""tailcut.pool: one pool of loader processes per host, feeding every local rank.

Loader processes (run_loader) take items from a QueueDataset's WorkQueue, read
their records, build batches (collate_fn, then transform) and publish them into
a tailcut BatchRing; every local rank pops the next ready batch (PooledLoader),
whichever loader made it. A slow batch delays one loader, not one rank.

Batch layout in a slot (numpy arrays or torch tensors only): the batch is one
array or a tuple/list of arrays. The slot's 256-byte user header holds
    magic b"TCB1", u8 version (1), u8 count, 2 bytes padding,
then per array: u8 dtype code (_DTYPES), u8 ndim (<= 4), 2 bytes padding,
u64 offset into the slot data, ndim u64 dims. Array bytes are C-contiguous,
each starting at a multiple of 64 in the slot data.

Unit of recovery: the work item. A loader acks an item only after the batch
holding its last record is published. A loader killed while it holds items
(taken, not all records published): the queue hands those items out again
whole, so records of them that were already in published batches come out a
second time (at least once). Its unpublished slot goes back to the ring. No
item is lost and no slot leaks. Records of items it acked come out once.

Epochs: a loader never acks an item of epoch e + 1 before every item of epoch
e is acked; the loader whose ack completes epoch e (WorkQueue summary 'done')
ends it in the ring, so trainers see the end of every epoch. See docs/pooled.md.
"""

import multiprocessing
import os
import struct
import time

import numpy as np

import tailcut
from tailcut import _core

__all__ = ["PooledLoader", "run_loader", "encode_batch", "decode_batch", "HEADER_BYTES"]

HEADER_BYTES = 256
_MAGIC = b"TCB1"
_ALIGN = 64
_DTYPES = [np.dtype(t) for t in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                 "float32", "float64", "bool", "uint16", "uint32", "uint64")]
_CODE = {d: i for i, d in enumerate(_DTYPES)}


def _as_numpy(x):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    numpy = getattr(x, "numpy", None)  # torch.Tensor, without importing torch here
    if numpy is not None:
        return np.ascontiguousarray(x.detach().cpu().numpy())
    raise TypeError(f"a pooled batch holds numpy arrays or torch tensors, got {type(x).__name__}")


def encode_batch(batch, data, header):
    """Writes `batch` (an array, or a tuple/list of arrays) into the writable
    memoryviews `data` and `header` of a slot; returns the bytes used."""
    arrays = [_as_numpy(a) for a in (batch if isinstance(batch, (tuple, list)) else (batch,))]
    meta = bytearray(_MAGIC + struct.pack("<BB2x", 1, len(arrays)))
    offset = 0
    out = np.frombuffer(data, dtype=np.uint8)
    for a in arrays:
        if a.dtype not in _CODE or a.ndim > 4:
            raise TypeError(f"pooled batches hold arrays of dtypes {[str(d) for d in _DTYPES]} "
                            f"and at most 4 dimensions, got {a.dtype} with {a.ndim}")
        offset = -(-offset // _ALIGN) * _ALIGN
        if offset + a.nbytes > len(out):
            raise ValueError(f"a batch of {offset + a.nbytes} bytes does not fit a slot of "
                             f"{len(out)} bytes: pass a larger slot_bytes")
        meta += struct.pack("<BB2xQ", _CODE[a.dtype], a.ndim, offset)
        meta += struct.pack(f"<{a.ndim}Q", *a.shape)
        out[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        offset += a.nbytes
    if len(meta) > HEADER_BYTES:
        raise ValueError(f"a batch of {len(arrays)} arrays does not fit the {HEADER_BYTES}-byte "
                         f"slot header: use fewer arrays")
    header[:len(meta)] = meta
    return offset


def decode_batch(data, header):
    """The arrays of a batch, read-only numpy views over `data` (no copy): one
    array, or a tuple if the batch was a tuple/list."""
    h = bytes(header)
    if h[:4] != _MAGIC:
        raise tailcut.CorruptError(f"pooled batch: bad header magic {h[:4]!r}")
    count = h[5]
    pos, arrays = 8, []
    n = len(data)
    for _ in range(count):
        if pos + 12 > len(h):
            raise tailcut.CorruptError("pooled batch: header too short for its arrays")
        code, ndim, offset = struct.unpack_from("<BB2xQ", h, pos)
        pos += 12
        if code >= len(_DTYPES) or ndim > 4 or pos + 8 * ndim > len(h):
            raise tailcut.CorruptError(f"pooled batch: bad array entry (dtype {code}, ndim {ndim})")
        shape = struct.unpack_from(f"<{ndim}Q", h, pos)
        pos += 8 * ndim
        dtype = _DTYPES[code]
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.uint64))
        if offset + nbytes > n:
            raise tailcut.CorruptError(f"pooled batch: array at {offset} of {nbytes} bytes is "
                                       f"beyond the batch's {n} bytes")
        arrays.append(np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize,
                                    offset=offset).reshape(shape))
    return arrays[0] if count == 1 else tuple(arrays)


def item_records(path, begin, end, fmt):
    """The records that start in [begin, end) of `path`, as bytes, for the
    queue formats 'fixed:<n>' and 'lines' (newline removed)."""
    records = []
    with open(path, "rb") as f:
        if fmt.startswith("fixed:"):
            size = int(fmt.split(":", 1)[1])
            start = -(-begin // size) * size
            if start < end:
                f.seek(start)
                count = (end - start + size - 1) // size
                data = f.read(count * size)
                records = [data[i * size:(i + 1) * size] for i in range(len(data) // size)]
        elif fmt in ("lines", ""):
            pos = begin
            if begin > 0:
                f.seek(begin - 1)
                if f.read(1) != b"\n":
                    f.readline()  # the line that started before begin is another item's
                pos = f.tell()
            while pos < end:
                line = f.readline()
                if not line:
                    break
                pos += len(line)
                records.append(line[:-1] if line.endswith(b"\n") else line)
        else:
            raise tailcut.InvalidArgumentError(
                f"tailcut.pool reads the formats 'fixed' and 'lines', not {fmt!r}")
    return records


def default_collate(records, fmt):
    """Fixed-size records: an (n, record_bytes) uint8 array. Lines: (data,
    offsets), uint8 and int64, record i = data[offsets[i]:offsets[i + 1]]."""
    if fmt.startswith("fixed:"):
        size = int(fmt.split(":", 1)[1])
        return np.frombuffer(b"".join(records), dtype=np.uint8).reshape(len(records), size)
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in records], out=offsets[1:])
    return np.frombuffer(b"".join(records), dtype=np.uint8), offsets


class _EpochGate:
    """Keeps a loader from acking items of epoch e + 1 before every item of
    epoch e is acked, and ends epoch e in the ring once it is."""

    def __init__(self, queue, ring):
        self.queue, self.ring = queue, ring
        self.ended = -1

    def done(self):
        return self.queue.summary()["done"]

    def try_end(self):
        done = self.done()
        n = self.queue.num_items
        while self.ended + 1 < self.queue.num_epochs and done >= (self.ended + 2) * n:
            self.ended += 1
            self.ring.end_epoch(self.ended)
        return self.ended


def run_loader(dataset, ring_name, *, batch_size, slot_bytes, num_slots, collate_fn=None,
               transform=None, max_clients=64, poll=0.005):
    """Runs one loader process's loop until the queue has no item left: takes
    items, reads their records, publishes batches of batch_size records (the
    last of each epoch of this loader may be shorter), acks each item after
    the batch with its last record is published. Returns the batches it
    published. `dataset` is a tailcut.torch.QueueDataset (its queue options)."""
    queue = dataset.queue
    fmt = queue.format
    ring = _core.BatchRing(ring_name, slot_bytes, num_slots, "loader", max_clients=max_clients)
    gate = _EpochGate(queue, ring)
    collate = collate_fn or (lambda records: default_collate(records, fmt))
    pending, done_items, published = [], [], 0
    epoch = None

    def flush():
        nonlocal pending, done_items, published
        if pending:
            batch = collate(pending)
            if transform is not None:
                batch = transform(batch)
            slot = ring.acquire()
            try:
                nbytes = encode_batch(batch, slot.data, slot.header)
            except BaseException:
                ring.abandon(slot)
                raise
            if not ring.publish(slot, epoch, len(pending), nbytes):
                ring.abandon(slot)
                raise tailcut.InvalidArgumentError(
                    f"batch ring '{ring_name}': epoch {epoch} was ended while this loader still "
                    f"had records of it (was the ring ended by hand?)")
            published += 1
        for item in done_items:  # every record of these is in a published batch
            item.ack()
        pending, done_items = [], []
        gate.try_end()

    try:
        while True:
            try:
                item = queue.take(timeout=0)
            except tailcut.Empty:
                # Nothing to take now: publish and ack what this loader holds
                # first, since a take that waits may be waiting for its items.
                flush()
                item = queue.take()
            if item is None:
                break
            if epoch is not None and item.epoch != epoch:
                flush()
            if item.epoch > gate.ended + 1:
                # Epoch item.epoch - 1 has items open elsewhere: hand this one
                # back and look again (an item of that epoch may come back from
                # a dead loader, and must be read by someone).
                item.give_back()
                time.sleep(poll)
                gate.try_end()
                continue
            epoch = item.epoch
            for record in item_records(item.path, item.begin, item.end, fmt):
                pending.append(record)
                if len(pending) == batch_size:
                    flush()
            done_items.append(item)
        flush()
        while gate.try_end() + 1 < queue.num_epochs:
            time.sleep(poll)  # another loader still holds the last items
    finally:
        ring.close()
    return published


def start_loaders(dataset, ring_name, num_workers, **kwargs):
    """Starts num_workers loader processes (forked) running run_loader; returns them."""
    ctx = multiprocessing.get_context("fork")
    procs = []
    for _ in range(num_workers):
        p = ctx.Process(target=_loader_main, args=(dataset, ring_name, kwargs), daemon=True)
        p.start()
        procs.append(p)
    return procs


def _loader_main(dataset, ring_name, kwargs):
    run_loader(dataset, ring_name, **kwargs)
    os._exit(0)


def _env_int(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


class PooledLoader:
    """Batches from a host-wide pool of loader processes, equal steps per rank.

    PooledLoader(dataset, num_workers=2, batch_size=32, collate_fn=None,
                 transform=None, slot_bytes=4 << 20, num_slots=16, rank=None,
                 world_size=None, local_rank=None, name=None, timeout=1800.0)

    `dataset` is a tailcut.torch.QueueDataset (fixed or lines format). Local
    rank 0 ($LOCAL_RANK, else local_rank, else rank, else 0) starts
    num_workers loader processes (run_loader) for the whole host on the first
    iteration; every rank pops the next ready batch of the host's ring.
    Iterating runs one epoch (set_epoch(e), else 0, 1, ...) and yields each
    batch as torch tensors over the ring's shared memory (no copy), READ-ONLY
    AND VALID UNTIL THE NEXT BATCH IS REQUESTED: the previous batch is
    released then. Every local rank gets the same number of batches per epoch
    (WorkQueue.agree_step over the $LOCAL_WORLD_SIZE ranks, else world_size);
    the batches left when one rank has none are released and counted in
    `reports`. len() is this rank's steps per epoch, an estimate (exact in
    records for fixed-size records; loaders' short batches at epoch ends and
    the lines format make it approximate).
    """

    def __init__(self, dataset, num_workers=2, batch_size=32, collate_fn=None, transform=None,
                 slot_bytes=4 << 20, num_slots=16, rank=None, world_size=None, local_rank=None,
                 name=None, timeout=1800.0):
        self.dataset = dataset
        self.queue = dataset.queue
        self.num_workers = int(num_workers)
        self.batch_size = int(batch_size)
        self.collate_fn, self.transform = collate_fn, transform
        self.slot_bytes, self.num_slots = int(slot_bytes), int(num_slots)
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        self.local_rank = (_env_int("LOCAL_RANK", self.rank) if local_rank is None
                           else int(local_rank))
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", self.world_size)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} is not in "
                             f"[0, {self.local_world_size})")
        self.name = name or f"{self.queue.name}.pool"
        self.timeout = timeout
        self.ring = _core.BatchRing(self.name, self.slot_bytes, self.num_slots, "trainer")
        self.epoch = 0
        self.reports = []
        self.loaders = []
        self._current = None
        self._stash = None

    def set_epoch(self, epoch):
        """The epoch the next iteration runs."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < (1 << 30):
            raise ValueError(f"epoch must be an int in [0, 2**30), got {epoch!r}")
        self.epoch = epoch

    def __len__(self):
        fmt = self.queue.format
        paths = self.queue.paths
        total = sum(os.path.getsize(p) for p in paths)
        if fmt.startswith("fixed:"):
            records = total // int(fmt.split(":", 1)[1])
        else:
            with open(paths[0], "rb") as f:
                sample = f.read(1 << 20)
            records = total * max(sample.count(b"\n"), 1) // max(len(sample), 1)
        return records // self.batch_size // self.local_world_size

    def start_loaders(self):
        """Starts this host's loader processes (done by local rank 0 on the first iteration)."""
        if not self.loaders:
            self.loaders = start_loaders(
                self.dataset, self.name, self.num_workers, batch_size=self.batch_size,
                slot_bytes=self.slot_bytes, num_slots=self.num_slots, collate_fn=self.collate_fn,
                transform=self.transform)
        return self.loaders

    def _release_current(self):
        if self._current is not None:
            batch, self._current = self._current, None
            self.ring.release(batch)

    def _next(self, epoch, report):
        """The next batch of `epoch`, or None at its end."""
        self._release_current()
        while True:
            if self._stash is not None:
                if self._stash.epoch > epoch:
                    return None
                batch, self._stash = self._stash, None
            else:
                batch = self.ring.pop(through_epoch=epoch, timeout=self.timeout)
                if batch is None:
                    return None
            if batch.epoch == epoch:
                return batch
            if batch.epoch > epoch:
                self._stash = batch  # the next epoch's first
                return None
            report["late_batches"] += 1  # an earlier epoch's, left by a rank that stopped
            report["leftover_records"] += batch.records
            self.ring.release(batch)

    def _agree(self, epoch, step, has_batch):
        status = self.queue.agree_step(self.local_rank, self.local_world_size,
                                       (epoch << 32) | step, has_batch, timeout=self.timeout)
        if status == "timeout":
            raise tailcut.TimeoutError(
                f"PooledLoader: local rank {self.local_rank} waited {self.timeout} s at epoch "
                f"{epoch}, step {step} for ranks that did not arrive")
        return status == "all_have_batch"

    def __iter__(self):
        return self._epoch_steps()

    def _epoch_steps(self):
        import warnings

        import torch

        if self.local_rank == 0:
            self.start_loaders()
        epoch = self.epoch
        self.epoch = epoch + 1
        report = dict(epoch=epoch, steps=0, leftover_batches=0, leftover_records=0,
                      late_batches=0)
        self.reports.append(report)
        step = 0
        try:
            while True:
                batch = self._next(epoch, report)
                if self._agree(epoch, step, batch is not None):
                    step += 1
                    report["steps"] = step
                    self._current = batch
                    arrays = decode_batch(batch.data, batch.header)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # read-only arrays: documented
                        if isinstance(arrays, tuple):
                            yield tuple(torch.from_numpy(a) for a in arrays)
                        else:
                            yield torch.from_numpy(arrays)
                    continue
                while batch is not None:  # the group ended the epoch: the rest is left over
                    report["leftover_batches"] += 1
                    report["leftover_records"] += batch.records
                    self.ring.release(batch)
                    batch = self._next(epoch, report)
                break
        finally:
            self._release_current()

    def close(self):
        """Releases what this rank holds, leaves the ring, and (local rank 0)
        waits for its loader processes, which finish after the queue's last
        epoch. Loaders still running 10 s later (training stopped early) are
        killed: the items they hold go back to the queue."""
        self._release_current()
        if self._stash is not None:
            self.ring.release(self._stash)
            self._stash = None
        self.ring.close()
        deadline = time.monotonic() + 10.0
        for p in self.loaders:
            p.join(max(deadline - time.monotonic(), 0.0))
            if p.is_alive():
                p.kill()
                p.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
