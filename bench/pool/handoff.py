"""Hand-off of one batch (4 MiB by default) from a loader process to a trainer:
the batch ring's pop + release against DataLoader's worker -> main transfer,
alternating in the same run.

    PYTHONPATH=build/python python3 bench/pool/handoff.py [--out DIR]

ring_bare    A forked loader process acquires slots and publishes them as fast
             as the ring lets it. It writes each slot's batch (one uint8 array
             of --bytes, tailcut.pool.loader.encode_batch) the first time it gets that
             slot and only publishes it again later: no bytes are written per
             batch, so what is timed is the hand-off. The trainer (this
             process) times, per batch: pop, release.
ring         As ring_bare, and between pop and release the trainer makes the
             torch tensor over the slot as PooledLoader(zero_copy=True) does
             (decode_batch, tailcut.torch._tensors.from_numpy) and drops it:
             the cost a PooledLoader user pays per batch, less its
             equal-steps agreement and the copy that makes the batch the
             caller's own (bench/pool/step_profile.py times those). That
             Python (tensor made and dropped) is also timed on its own per
             batch: the 'python' row.
dl_same      DataLoader(num_workers=1, batch_size=None) over a dataset that
             yields one preallocated tensor of --bytes again and again. After
             the first batch its storage is in shared memory, so each batch
             costs the transfer alone: pickling, the storage's file descriptor
             sent through the worker's resource sharer (a Unix socket
             connection, SCM_RIGHTS), the unpickling in main; main keeps the
             mapping of a storage it still holds. This favours the baseline:
             no new shared memory per batch, no copy.
dl_fresh     As dl_same, but the worker yields a new tensor per batch,
             allocated in shared memory as default_collate does in a worker
             (storage._new_shared) and filled with one copy of the batch (the
             copy collate makes anyway): a new shared-memory file, passed and
             mapped by main, per batch. The usual case.

The trainer times each batch (wall: the call that returns it, so a producer
slower than the trainer shows as waiting) after --warmup batches, and the CPU
time of its thread. --touch also reads one byte of every 4 KiB page of the
batch in the timed region (the page faults of a newly mapped batch). Each
repeat runs every method (alternating the order); the table gives the median
over repeats of each repeat's median per batch (min-max over repeats) and the
ratios to ring_bare (pop + release, the hand-off itself) and to ring.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

METHODS = ("ring_bare", "ring", "dl_same", "dl_fresh")


class Batches(IterableDataset):
    """Yields `count` batches of `nbytes`: the same tensor, or a new shared one each."""

    def __init__(self, nbytes, count, fresh):
        super().__init__()
        self.nbytes, self.count, self.fresh = nbytes, count, fresh

    def __iter__(self):
        src = torch.arange(self.nbytes, dtype=torch.int64).to(torch.uint8)
        for _ in range(self.count):
            if self.fresh:  # as collate_tensor_fn does in a worker
                storage = src.storage()._new_shared(src.numel(), device=src.device)
                out = src.new(storage).resize_(src.shape)
                out.copy_(src)
                yield out
            else:
                yield src


def touch(t, nbytes):
    return int(t[::4096].sum()) if nbytes else 0


def time_dataloader(fresh, args):
    dl = DataLoader(Batches(args.bytes, args.warmup + args.batches, fresh), batch_size=None,
                    num_workers=1)
    wall, cpu = [], []
    it = iter(dl)
    b = None
    for i in range(args.warmup + args.batches):
        t0, c0 = time.perf_counter(), time.thread_time()
        b = next(it)
        if args.touch:
            touch(b, args.bytes)
        t1, c1 = time.perf_counter(), time.thread_time()
        if i >= args.warmup:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
    assert b.numel() == args.bytes
    del b
    for _ in it:
        pass
    return wall, cpu


def ring_loader(name, args):
    """The forked loader: publishes warmup + batches batches, then ends epoch 0."""
    from tailcut import _core
    from tailcut.pool.loader import encode_batch

    ring = _core.BatchRing(name, args.bytes + 4096, args.slots, "loader")
    src = np.arange(args.bytes, dtype=np.int64).astype(np.uint8)
    meta, nbytes = {}, None
    for _ in range(args.warmup + args.batches):
        slot = ring.acquire()
        if slot.index not in meta:  # the first time: write the batch and its header
            nbytes = encode_batch(src, slot.data, slot.header)
            meta[slot.index] = True
        ring.publish(slot, 0, 1, nbytes)
    ring.end_epoch(0)
    ring.close()


def time_ring(args, run, view):
    import tailcut
    from tailcut import _core
    from tailcut.pool.loader import decode_batch
    from tailcut.torch._tensors import from_numpy  # PooledLoader's: read-only views

    name = f"handoff-{os.getpid()}-{run}-{int(view)}"
    pid = os.fork()  # before this process opens the ring (the ring's fork rule)
    if pid == 0:
        code = 1
        try:
            ring_loader(name, args)
            code = 0
        finally:
            os._exit(code)
    ring = _core.BatchRing(name, args.bytes + 4096, args.slots, "trainer")
    wall, cpu, python = [], [], []
    try:
        for i in range(args.warmup + args.batches):
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = ring.pop(through_epoch=0, timeout=60)
            if view:
                p0 = time.perf_counter()
                t = from_numpy(decode_batch(batch.data, batch.header))
                if args.touch:
                    touch(t, args.bytes)
                del t
                if i >= args.warmup:
                    python.append(time.perf_counter() - p0)
            elif args.touch:
                touch(np.frombuffer(batch.data, dtype=np.uint8), args.bytes)
            ring.release(batch)
            t1, c1 = time.perf_counter(), time.thread_time()
            if i >= args.warmup:
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
        assert ring.pop(through_epoch=0, timeout=60) is None
    finally:
        ring.close()
        _, status = os.waitpid(pid, 0)
        tailcut.remove_batch_ring(name)
    assert status == 0, f"loader exited with {status}"
    return wall, cpu, python


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=4 << 20, help="batch size in bytes")
    p.add_argument("--batches", type=int, default=1000, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--slots", type=int, default=8, help="ring slots")
    p.add_argument("--touch", action="store_true", help="read one byte per page of each batch")
    p.add_argument("--out", default=None, help="directory for handoff.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{args.bytes} bytes per batch, {args.batches} batches x {args.repeats} repeats, "
          f"touch={args.touch}, load average {os.getloadavg()}", file=sys.stderr, flush=True)
    results = {m: {"wall_us": [], "cpu_us": []} for m in METHODS}
    python_us = []  # ring's Python around the pop, timed alone
    for rep in range(args.repeats):
        order = METHODS if rep % 2 == 0 else METHODS[::-1]
        for m in order:
            if m.startswith("ring"):
                wall, cpu, python = time_ring(args, rep, m == "ring")
                if python:
                    python_us.append(statistics.median(python) * 1e6)
            else:
                wall, cpu = time_dataloader(m == "dl_fresh", args)
            results[m]["wall_us"].append(statistics.median(wall) * 1e6)
            results[m]["cpu_us"].append(statistics.median(cpu) * 1e6)
            print(f"  rep {rep} {m:8s}: wall {results[m]['wall_us'][-1]:9.1f} us, trainer CPU "
                  f"{results[m]['cpu_us'][-1]:9.1f} us per batch (p99 wall "
                  f"{np.percentile(wall, 99) * 1e6:9.1f} us)", file=sys.stderr, flush=True)
    print(f"\nper batch, median over {args.repeats} repeats of the median (min-max); "
          f"ratios per repeat, median (min-max)", file=sys.stderr)
    summary = {}
    for m in METHODS:
        s = {}
        for key in ("wall_us", "cpu_us"):
            v = results[m][key]
            s[key] = dict(median=statistics.median(v), min=min(v), max=max(v))
            for base in ("ring_bare", "ring"):
                r = [a / b for a, b in zip(v, results[base][key])]
                s[key][f"over_{base}"] = dict(median=statistics.median(r), min=min(r), max=max(r))
        summary[m] = s
        for key, what in (("wall_us", "wall"), ("cpu_us", "trainer CPU")):
            w = s[key]
            ratios = "  ".join(f"/{b} {w['over_' + b]['median']:6.1f}x ({w['over_' + b]['min']:.1f}"
                               f"-{w['over_' + b]['max']:.1f})" for b in ("ring_bare", "ring"))
            print(f"  {m:9s} {what:11s} {w['median']:9.1f} us ({w['min']:.1f}-{w['max']:.1f})  "
                  f"{ratios}", file=sys.stderr)
    py = dict(median=statistics.median(python_us), min=min(python_us), max=max(python_us))
    summary["ring_python_us"] = py
    print(f"  ring's Python around the pop (decode_batch, from_numpy, the tensor dropped), "
          f"timed alone: {py['median']:.2f} us ({py['min']:.2f}-{py['max']:.2f}); target <= 3 us: "
          f"{'met' if py['median'] <= 3 else 'NOT met'}", file=sys.stderr)
    print("target: the ring's hand-off >= 10x cheaper than DataLoader's (wall per batch)",
          file=sys.stderr)
    for m in ("dl_same", "dl_fresh"):
        for base in ("ring_bare", "ring"):
            r = summary[m]["wall_us"][f"over_{base}"]["median"]
            print(f"  {m} / {base}: {r:.1f}x, {'met' if r >= 10 else 'NOT met'}", file=sys.stderr)
    print(f"load average at the end {os.getloadavg()}", file=sys.stderr)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "handoff_touch.json" if args.touch else "handoff.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(dict(args=vars(args), runs=results, summary=summary), f, indent=1)


if __name__ == "__main__":
    main()
