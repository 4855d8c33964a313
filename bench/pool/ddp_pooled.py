"""Synchronous DDP: per-rank DataLoaders vs one host-wide pool of loaders.

    GLOO_SOCKET_IFNAME=lo PYTHONPATH=build/python python3 -m torch.distributed.run \\
        --standalone --nproc_per_node=4 --redirects 1 --tee 2 \\
        bench/pool/ddp_pooled.py --out /tmp/ddp_pooled

(--standalone listens on port 29400; where another job holds it, use
--nnodes 1 --rdzv_backend c10d --rdzv_endpoint localhost:PORT instead.)

Both modes read the same file (fixed-size records, or with --format tfrecord
the same records framed as TFRecords) through a tailcut QueueDataset with
the same number of loader processes on the host: per_rank, a
DataLoader(num_workers=--workers-per-rank, persistent_workers=True) per rank
under EqualSteps; pooled, one PooledLoader(loaders_per_host=that times the ranks).
Every loader runs the same per-batch transform: a sleep standing for decoding
and augmentation (a sleep, so that on a small machine the loaders do not
compete with the trainers for cores). Every step sleeps --step-ms (the
accelerator's share of a step, default: the mean transform cost) and runs a
DDP forward and backward (gloo, CPU), so every step waits for the slowest
rank's batch.

Cases (--cases, all by default):
  a  heavy tail: the transform cost is lognormal with mean --mean-ms and shape
     --sigma. Targets: pooled >= 1.3x faster per epoch, p99 data wait <= 1/3.
  b  a slow neighbour: the cost is --mean-ms, but --slow-factor times that in
     the loaders of one rank (per_rank: the last rank's DataLoader workers;
     pooled: the same share of the pool, --workers-per-rank of its loader
     processes). Target: pooled >= 1.5x faster per epoch.
  c  balanced: the cost is --mean-ms everywhere. Target: pooled no slower
     than per-rank loaders (per_rank / pooled >= 1 / 1.05).

Each repeat first runs the floor (the same steps with a batch already in
memory, no loader: what the step itself costs on this machine), then every
case in both modes, alternating which mode runs first;
each run starts a new queue and new loaders and trains --epochs epochs. Epoch
0 includes starting the loader processes and is left out of the medians. Data
wait: the time a rank spends in next(loader) for a step (the call that ends
the epoch is not a step), over all ranks. The table gives, per case and mode,
the median over repeats of each repeat's median over epochs 1.. (range: min
and max over repeats), and the ratios per_rank / pooled, per repeat, with
their median and range.

Memory: before step --memory-step of epoch 0 of every run (loaders running,
batches in flight; epoch 0 is not in the medians), each rank reads
/proc/PID/smaps_rollup of itself and of its child processes (per_rank: its
DataLoader workers; pooled, rank 0: the loader processes), and rank 0 the
sizes of the run's segments in /dev/shm (queue, batch ring). PSS divides a
shared page among the processes that map it, so the sum of PSS is the memory
all of them use together; batches in torch's shared memory (per_rank) and the
ring's arena count in it where processes have them mapped.

--out DIR writes results.json (arguments, every epoch, memory, summary),
epochs.csv (one row per run and epoch) and ddp_pooled.png.
"""

import argparse
import csv
import gc
import glob
import inspect
import json
import math
import multiprocessing
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

CASES = {
    "a": "lognormal cost",
    "b": "one rank's loaders slow",
    "c": "balanced",
}
MODES = ("per_rank", "pooled")


class BatchCost:
    """The per-batch transform: sleeps a cost drawn for this batch. Lognormal
    with mean mean_ms when sigma > 0, else mean_ms; times slow_factor in a
    slow loader. Picklable; per process, seeded by the loader's index.

    per_rank: index = rank * workers_per_rank + DataLoader worker id, slow
    when rank == slow_rank. pooled: each loader process claims the next index
    from a shared counter on its first batch; the first num_slow are slow."""

    def __init__(self, mean_ms, sigma, seed, slow_factor=1.0, rank=None, workers_per_rank=0,
                 slow_rank=-1, counter=None, num_slow=0):
        self.median = mean_ms / 1e3 * math.exp(-sigma * sigma / 2)
        self.sigma, self.seed, self.slow_factor = sigma, seed, slow_factor
        self.rank, self.workers_per_rank, self.slow_rank = rank, workers_per_rank, slow_rank
        self.counter, self.num_slow = counter, num_slow
        self.rng, self.factor = None, 1.0
        self.trace = None  # a path prefix: each process appends its batches' (start, end)

    def _start(self):
        if self.counter is None:
            info = get_worker_info()
            index = self.rank * self.workers_per_rank + (info.id if info else 0)
            slow = self.rank == self.slow_rank
        else:
            with self.counter.get_lock():
                index = self.counter.value
                self.counter.value += 1
            slow = index < self.num_slow
        self.factor = self.slow_factor if slow else 1.0
        self.rng = np.random.default_rng([self.seed, index])

    def __call__(self, batch):
        if self.rng is None:
            self._start()
        z = self.rng.standard_normal() if self.sigma > 0 else 0.0
        t0 = time.time()
        time.sleep(self.factor * self.median * math.exp(self.sigma * z))
        if self.trace:
            with open(f"{self.trace}.{os.getpid()}", "a") as f:
                f.write(f"{t0} {time.time()}\n")
        return batch

    def __getstate__(self):  # spawned workers: no shared counter (per_rank only)
        state = dict(self.__dict__)
        if state["counter"] is not None and multiprocessing.get_start_method() != "fork":
            raise RuntimeError("the pooled cost needs forked loaders")
        return state


def loaders_busy(trace, start, end, loaders):
    """The share of the loaders' time in [start, end) (wall clock) spent in the
    transform, from their traces: 1.0 when no loader ever idled."""
    busy = 0.0
    for path in glob.glob(glob.escape(trace) + ".*"):
        a = np.loadtxt(path, ndmin=2)
        busy += float((np.clip(a[:, 1], start, end) - np.clip(a[:, 0], start, end)).sum())
    return busy / (loaders * (end - start))


def smaps_rollup(pid):
    """Rss, Pss, Pss_* and Uss (private pages) of a process in KiB, from
    /proc/PID/smaps_rollup."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Private_Clean",
                           "Private_Dirty"):
                    out[key] = int(rest.split()[0])
        out["Uss"] = out.pop("Private_Clean", 0) + out.pop("Private_Dirty", 0)
    except OSError:
        return None
    return out


def children(pid):
    kids = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                kids += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return sorted(set(kids))


def sample_memory(mode, queue_name, ring_name):
    """Gathered on rank 0: smaps_rollup of every trainer and of every loader."""
    me = os.getpid()
    mine = {"trainer": [smaps_rollup(me)],
            "loader": [m for m in (smaps_rollup(k) for k in children(me)) if m]}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() != 0:
        return None
    uid = os.getuid()
    segments = {}
    for kind, path in (("queue", f"/dev/shm/tailcut.{uid}.{queue_name}"),
                       ("ring", f"/dev/shm/tailcut-ring.{uid}.{ring_name}")):
        try:
            segments[kind] = os.stat(path).st_blocks * 512 // 1024
        except OSError:
            pass
    result = {"mode": mode, "segments_kib": segments}
    for role in ("trainer", "loader"):
        procs = [p for g in gathered for p in g[role]]
        result[role] = {"count": len(procs)}
        for key in ("Rss", "Pss", "Uss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
            result[role][key] = sum(p.get(key, 0) for p in procs)
    return result


def opened_first_by_rank0(make):
    """Rank 0 creates the run's queue before the others join it (were another
    rank first, rank 0 would take the new queue for an unfinished one)."""
    ds = make() if dist.get_rank() == 0 else None
    dist.barrier()
    return ds if ds is not None else make()


def run(case, mode, rep, args, path, model, opt):
    """One run: a new queue and new loaders, args.epochs epochs."""
    import tailcut
    import tailcut.torch as tt
    import tailcut.pool

    rank, world = dist.get_rank(), dist.get_world_size()
    name = f"ddp-pooled-{case}{rep}-{mode}-{os.getppid()}"
    sigma = args.sigma if case == "a" else 0.0
    slow_factor = args.slow_factor if case == "b" else 1.0
    seed = [args.seed + rep, ord(case)]
    common = dict(name=name, num_slices=args.slices, num_epochs=args.epochs, seed=1)
    if args.format == "fixed":
        common.update(format="fixed", record_bytes=args.record_bytes)
    else:
        common.update(format="tfrecord")
    # A TFRecord batch is (data, offsets): 8 bytes of offset per record beside its bytes.
    slot_bytes = args.batch * (args.record_bytes + 8) + 4096
    if mode == "per_rank":
        cost = BatchCost(args.mean_ms, sigma, seed, slow_factor, rank=rank,
                         workers_per_rank=args.workers_per_rank, slow_rank=world - 1)
        reader = ({} if args.reader_budget_mib is None
                  else dict(buffer_budget_bytes=args.reader_budget_mib << 20))
        ds = opened_first_by_rank0(lambda: tt.QueueDataset(
            [path], batch_size=args.batch, transform=cost, reader_options=reader, **common))
        dl = DataLoader(ds, batch_size=None, num_workers=args.workers_per_rank,
                        persistent_workers=True)
        loader = tt.EqualSteps(dl)
        ring_name = None
    else:
        counter = multiprocessing.get_context("fork").Value("i", 0)
        cost = BatchCost(args.mean_ms, sigma, seed, slow_factor, counter=counter,
                         num_slow=args.workers_per_rank)
        if args.trace_loaders and rank == 0:  # rank 0's loaders are the host's
            cost.trace = os.path.join(args.trace_loaders, name)
        ds = opened_first_by_rank0(lambda: tt.QueueDataset([path], **common))
        # The host's loader processes: loaders_per_host= since the DataLoader-shaped
        # signature, num_workers= before it (a build of an older version: floor_guard.py).
        loaders = args.workers_per_rank * world
        count = ({"loaders_per_host": loaders}
                 if "loaders_per_host" in inspect.signature(tailcut.pool.PooledLoader).parameters
                 else {"num_workers": loaders})
        loader = tailcut.pool.PooledLoader(ds, batch_size=args.batch, transform=cost,
                                 slot_bytes=slot_bytes, num_slots=args.slots, **count)
        ring_name = loader.name
    rows, memory, all_waits = [], None, []
    step_s = args.step_ms / 1e3
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        waits, start, wall = [], time.perf_counter(), time.time()
        it = iter(loader)
        while True:
            if epoch == 0 and len(waits) == args.memory_step:
                memory = sample_memory(mode, name, ring_name)
            t0 = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            waits.append(time.perf_counter() - t0)
            train_step(batch, step_s, model, opt)
        dist.barrier()
        seconds = time.perf_counter() - start
        busy = (None if mode != "pooled" or cost.trace is None else
                round(loaders_busy(cost.trace, wall, time.time(), args.workers_per_rank * world), 4))
        gathered = [None] * world
        dist.all_gather_object(gathered, waits)
        if rank == 0:
            w = np.concatenate([np.array(g, dtype=float) for g in gathered]) * 1e3
            if epoch >= 1:
                all_waits.append(w)
            rows.append(dict(case=case, rep=rep, mode=mode, epoch=epoch,
                             seconds=round(seconds, 4), steps=len(waits),
                             wait_mean_ms=round(float(w.mean()), 3),
                             wait_p50_ms=round(float(np.percentile(w, 50)), 3),
                             wait_p99_ms=round(float(np.percentile(w, 99)), 3),
                             wait_max_ms=round(float(w.max()), 3), loaders_busy=busy))
            r = rows[-1]
            print(f"  {case} rep {rep} {mode:8s} epoch {epoch}: {seconds:6.2f} s, {r['steps']} "
                  f"steps, data wait mean {r['wait_mean_ms']:6.1f} p50 {r['wait_p50_ms']:7.1f} "
                  f"p99 {r['wait_p99_ms']:7.1f} ms"
                  + ("" if busy is None else f", loaders in the transform {busy:.1%}"),
                  file=sys.stderr, flush=True)
    if mode == "pooled":
        loader.close()
    else:
        del it, loader, dl  # shuts the persistent workers down
        gc.collect()
    ds.close()
    dist.barrier()
    if rank == 0:
        for remove in (lambda: tailcut.remove_queue(name, force=True),
                       lambda: ring_name and tailcut.remove_batch_ring(ring_name)):
            try:
                remove()
            except tailcut.NotFoundError:
                pass
    dist.barrier()
    waits = np.concatenate(all_waits) if all_waits else np.zeros(0)
    return rows, memory, waits


def features(batch):
    """The model's input: the first 8 bytes of each record. A fixed-record batch
    is an (n, record_bytes) tensor, a TFRecord one (data, offsets) of
    records of equal size."""
    if isinstance(batch, (tuple, list)):
        data, offsets = batch
        n = len(offsets) - 1
        return data.reshape(n, -1)[:, :8].float()
    return batch[:, :8].float()


def train_step(batch, step_s, model, opt):
    time.sleep(step_s)  # the accelerator's share of the step
    x = features(batch)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()  # DDP: the gradients' all-reduce, every rank waits for all
    opt.step()


def run_floor(rep, args, model, opt):
    """The floor: the same steps with a batch already in memory (no loader)."""
    steps = args.records // args.batch // dist.get_world_size()
    batch = torch.zeros(args.batch, args.record_bytes, dtype=torch.uint8)
    if args.format == "tfrecord":  # the batch a TFRecord loader hands out
        batch = (batch.reshape(-1), torch.arange(args.batch + 1) * args.record_bytes)
    rows = []
    for epoch in range(args.epochs):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            train_step(batch, args.step_ms / 1e3, model, opt)
        dist.barrier()
        seconds = time.perf_counter() - start
        rows.append(dict(case="floor", rep=rep, mode="no_data", epoch=epoch,
                         seconds=round(seconds, 4), steps=steps, wait_mean_ms=0.0,
                         wait_p50_ms=0.0, wait_p99_ms=0.0, wait_max_ms=0.0, loaders_busy=None))
        if dist.get_rank() == 0:
            print(f"  floor rep {rep} no_data  epoch {epoch}: {seconds:6.2f} s, {steps} steps",
                  file=sys.stderr, flush=True)
    return rows


def summarize(rows, cases, reps):
    """Per case and mode: each repeat's median over epochs 1..; then median and
    range over repeats, and the per-repeat ratios per_rank / pooled."""
    def per_rep(case, mode, key):
        out = []
        for rep in range(reps):
            v = [r[key] for r in rows if r["case"] == case and r["mode"] == mode
                 and r["rep"] == rep and r["epoch"] >= 1]
            out.append(float(np.median(v)))
        return out

    summary = {}
    for case in cases:
        s = {}
        for key in ("seconds", "wait_mean_ms", "wait_p50_ms", "wait_p99_ms"):
            base, pooled = per_rep(case, "per_rank", key), per_rep(case, "pooled", key)
            ratios = [b / max(p, 1e-3) for b, p in zip(base, pooled)]
            s[key] = {"per_rank": base, "pooled": pooled, "ratio": ratios}
        summary[case] = s
    summary["floor"] = {"seconds": per_rep("floor", "no_data", "seconds")}
    return summary


def med_range(v, fmt="{:.2f}"):
    return f"{fmt.format(np.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


TARGETS = {  # case: (what, key, test on the per_rank / pooled ratio)
    "a": [("epoch time >= 1.3x", "seconds", lambda r: r >= 1.3),
          ("p99 data wait <= 1/3", "wait_p99_ms", lambda r: r >= 3.0)],
    "b": [("epoch time >= 1.5x", "seconds", lambda r: r >= 1.5)],
    "c": [("pooled no slower than 1.05x", "seconds", lambda r: r >= 1 / 1.05)],
}


def report(summary, memory, args, out=sys.stderr):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\nmedian over {args.repeats} repeats of the median over epochs 1..{args.epochs - 1} "
      f"(min-max over repeats); ratio = per_rank / pooled, per repeat")
    p(f"{'case':24s} {'mode':9s} {'epoch s':>18s} {'mean wait ms':>20s} {'p50 wait ms':>20s} "
      f"{'p99 wait ms':>22s}")
    floor = summary["floor"]["seconds"]
    p(f"{'floor':24s} {'no_data':9s} {med_range(floor):>18s}   (the same steps, the batch "
      f"already in memory)")
    for case, s in summary.items():
        if case == "floor":
            continue
        for mode in MODES:
            p(f"{case + ' ' + CASES[case]:24s} {mode:9s} {med_range(s['seconds'][mode]):>18s} "
              f"{med_range(s['wait_mean_ms'][mode], '{:.1f}'):>20s} "
              f"{med_range(s['wait_p50_ms'][mode], '{:.1f}'):>20s} "
              f"{med_range(s['wait_p99_ms'][mode], '{:.1f}'):>22s}")
        p(f"{'':24s} {'ratio':9s} {med_range(s['seconds']['ratio']):>18s} "
          f"{med_range(s['wait_mean_ms']['ratio']):>20s} "
          f"{med_range(s['wait_p50_ms']['ratio']):>20s} "
          f"{med_range(s['wait_p99_ms']['ratio']):>22s}")
    p("\ntargets (on the median ratio; repeats meeting it in brackets)")
    for case, s in summary.items():
        for what, key, test in TARGETS.get(case, []):
            ratios = s[key]["ratio"]
            met = test(float(np.median(ratios)))
            p(f"  {case}: {what:30s} ratio {np.median(ratios):6.2f}: "
              f"{'met' if met else 'NOT met'} [{sum(map(test, ratios))}/{len(ratios)}]")
    if memory:
        p(f"\nmemory before step {args.memory_step} of epoch 0, MiB, summed over processes "
          f"(median over runs). USS: private pages; PSS shmem: shared memory (torch's batches, "
          f"the ring's arena)")
        p(f"{'mode':9s} {'processes':14s} {'RSS':>8s} {'PSS':>8s} {'USS':>8s} {'PSS shmem':>10s} "
          f"{'PSS/process':>12s}")
        for mode in MODES:
            ms = [m for m in memory if m["mode"] == mode]
            if not ms:
                continue
            for role in ("trainer", "loader", "all"):
                def med(key):
                    roles = ("trainer", "loader") if role == "all" else (role,)
                    return float(np.median([sum(m[r][key] for r in roles) for m in ms])) / 1024
                n = sum(ms[0][r]["count"] for r in (("trainer", "loader") if role == "all"
                                                    else (role,)))
                p(f"{mode:9s} {n:3d} {role + 's' if role != 'all' else 'together':10s} "
                  f"{med('Rss'):8.1f} {med('Pss'):8.1f} {med('Uss'):8.1f} "
                  f"{med('Pss_Shmem'):10.1f} {med('Pss') / max(n, 1):12.1f}")
            seg = {k: float(np.median([m["segments_kib"].get(k, 0) for m in ms])) / 1024
                   for k in ("queue", "ring")}
            p(f"{'':9s} segments in /dev/shm: queue {seg['queue']:.2f} MiB, "
              f"batch ring {seg['ring']:.2f} MiB")


def plot(summary, waits, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in summary if c != "floor"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    colors = {"per_rank": "#999999", "pooled": "#1f77b4"}
    labels = {"per_rank": f"DataLoader({args.workers_per_rank}) per rank",
              "pooled": f"PooledLoader({args.workers_per_rank * args.world})"}
    x = np.arange(len(cases))
    for ax, key, title in ((axes[0], "seconds", "epoch time, s"),
                           (axes[1], "wait_p99_ms", "p99 data wait per step, ms")):
        for i, mode in enumerate(MODES):
            v = [summary[c][key][mode] for c in cases]
            med = np.array([np.median(a) for a in v])
            err = np.array([[m - min(a) for m, a in zip(med, v)],
                            [max(a) - m for m, a in zip(med, v)]])
            ax.bar(x + (i - 0.5) * 0.38, med, 0.38, yerr=err, capsize=3, color=colors[mode],
                   label=labels[mode])
        for j, c in enumerate(cases):
            r = np.median(summary[c][key]["ratio"])
            top = max(max(summary[c][key]["per_rank"]), max(summary[c][key]["pooled"]))
            ax.text(j, top * (1.4 if key == "wait_p99_ms" else 1.03), f"{r:.2f}x", ha="center",
                    va="bottom", fontsize=9)
        short = {"a": f"(a) lognormal\nsigma {args.sigma:g}",
                 "b": f"(b) one rank's\nloaders {args.slow_factor:g}x slower", "c": "(c) balanced"}
        ax.set_xticks(x, [short[c] for c in cases], fontsize=8)
        ax.set_title(title + ("" if key == "seconds" else " (log)"), fontsize=10)
        if key == "seconds":
            ax.axhline(np.median(summary["floor"]["seconds"]), color="k", ls="--", lw=0.8,
                       label="no loader (batch in memory)")
            ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
        else:
            ax.set_yscale("log")
            ax.set_ylim(top=ax.get_ylim()[1] * 4)
    ax = axes[2]
    shown = False
    for mode in MODES:
        w = waits.get(("a", mode))
        if w is not None and len(w):
            w = np.sort(w)
            ax.plot(np.maximum(w, 1e-2), 1 - np.arange(len(w)) / len(w), color=colors[mode],
                    label=labels[mode])
            shown = True
    if shown:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("data wait per step, ms", fontsize=9)
        ax.set_ylabel("fraction of steps waiting longer", fontsize=9)
        ax.set_title("(a) data wait, all steps of epochs 1..", fontsize=10)
    else:
        ax.axis("off")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"Synchronous DDP, {args.world} ranks (gloo), step {args.step_ms:g} ms, mean "
                 f"transform {args.mean_ms:g} ms; medians of {args.repeats} repeats, bars: range",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=80)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="abc", help="which cases to run, e.g. 'ab' (default abc)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4, help="per run; epoch 0 is not in the medians")
    p.add_argument("--records", type=int, default=12800)
    p.add_argument("--record-bytes", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--format", choices=("fixed", "tfrecord"), default="fixed",
                   help="the records' file format (tfrecord: records of --record-bytes "
                        "each, framed)")
    p.add_argument("--slices", type=int, default=64, help="work items per epoch")
    p.add_argument("--seed", type=int, default=0,
                   help="the transform costs' seed (repeat r draws from seed + r)")
    p.add_argument("--slots", type=int, default=32, help="batch slots in the pooled ring")
    p.add_argument("--workers-per-rank", type=int, default=2)
    p.add_argument("--mean-ms", type=float, default=30.0, help="mean transform cost per batch")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape, case a")
    p.add_argument("--slow-factor", type=float, default=3.0, help="case b")
    p.add_argument("--step-ms", type=float, default=None,
                   help="the accelerator's share of a step (a sleep); default --mean-ms")
    p.add_argument("--memory-step", type=int, default=10,
                   help="the step of epoch 0 before which memory is read")
    p.add_argument("--reader-budget-mib", type=int, default=None,
                   help="per_rank: the Reader's buffer budget in each DataLoader worker "
                        "(default: the Reader's, 64 MiB); pooled loaders read with plain reads")
    p.add_argument("--trace-loaders", default=None, metavar="DIR",
                   help="pooled: the loaders write each batch's transform (start, end) to files "
                        "in DIR, and each epoch reports the share of the loaders' time spent in "
                        "the transform (loaders_busy: 1.0 when none ever idled)")
    p.add_argument("--out", default=None, help="directory for results.json, epochs.csv, png")
    args = p.parse_args()
    if args.step_ms is None:
        args.step_ms = args.mean_ms
    if args.epochs < 2 or set(args.cases) - set(CASES) or not args.cases:
        p.error("--epochs must be >= 2 and --cases letters from 'abc'")
    cases = sorted(set(args.cases))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.world = dist.get_world_size()
    path = f"/tmp/ddp_pooled_{os.getppid()}.bin"
    if rank == 0:
        data = np.random.default_rng(0).integers(0, 255, (args.records, args.record_bytes),
                                                 dtype=np.uint8)
        if args.format == "fixed":
            data.tofile(path)
        else:
            import tailcut
            with open(path, "wb") as f:
                for row in data:
                    f.write(tailcut.encode_tfrecord(row.tobytes()))
        print(f"{args.world} ranks, load average at start {os.getloadavg()}, "
              f"{os.cpu_count()} CPUs", file=sys.stderr, flush=True)
    dist.barrier()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows, memory, waits, loads = [], [], {}, [os.getloadavg()]
    for rep in range(args.repeats):
        rows += run_floor(rep, args, model, opt)
        for case in cases:
            order = MODES if (rep + cases.index(case)) % 2 == 0 else MODES[::-1]
            for mode in order:
                r, m, w = run(case, mode, rep, args, path, model, opt)
                rows += r
                if m:
                    memory.append(dict(m, case=case, rep=rep))
                waits[(case, mode)] = np.concatenate([waits.get((case, mode), []), w])
        loads.append(os.getloadavg())
    if rank == 0:
        os.unlink(path)
        summary = summarize(rows, cases, args.repeats)
        report(summary, memory, args)
        print(f"load average after each repeat: {loads[1:]}", file=sys.stderr)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "epochs.csv"), "w", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=list(rows[0]))
                wr.writeheader()
                wr.writerows(rows)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(dict(args=vars(args), load_average=loads, epochs=rows, memory=memory,
                               summary=summary), f, indent=1)
            plot(summary, waits, args, os.path.join(args.out, "ddp_pooled.png"))
            print(f"wrote {args.out}/results.json, epochs.csv, ddp_pooled.png", file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
