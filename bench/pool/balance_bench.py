"""Ranks of unequal speed: PooledLoader with equal batches against balance=model.

    GLOO_SOCKET_IFNAME=lo PYTHONPATH=build/python python3 -m torch.distributed.run \\
        --nnodes 1 --rdzv_backend c10d --rdzv_endpoint localhost:29517 \\
        --nproc_per_node=4 --redirects 1 --tee 2 bench/pool/balance_bench.py

Every rank trains a DistributedDataParallel linear model (gloo): its compute
is a sleep of --record-ms per record of its batch before the backward, times
--slow-factor on the last rank in case "slow" (1 everywhere in case "equal"):
compute that scales with the batch, as a GPU's does, without taking the
small machine's cores; the backward's all-reduce makes the ranks step
together. The data is cheap (fixed 16-byte records, no transform), so the
step is compute, the all-reduce and the step agreement. The pool is sized by
its defaults: no num_slots, no slot_bytes (--num-slots to give one).

Each repeat runs both cases in both modes (off: balance=False, every rank
batch_size records per step; on: balance=model, or balance=True with
--balance true (timed between batches), shares follow speed),
alternating which mode and which case go first; each run is a new queue and
a new pool and trains --epochs epochs, of which epoch 0 (the pool starting,
the shares converging) is left out. Per run: the median epoch time over
epochs 1.. and the ideal: the compute of the records the epoch used, spread
over the ranks' speeds (records x record_ms / sum of 1 / factor). Printed per
case and mode: the median over repeats of epoch / ideal, with the range; and
per repeat, in the same run, on / off. "x job ideal" is the ideal of the
issue that set the target: the same job with every rank at full speed (the
equal case without balance, of the same repeat) plus the compute the slow
rank makes unavoidable (records x record_ms x (1 / sum of 1 / factor -
1 / ranks)); it counts the pool's, DDP's and the step agreement's own cost
as the equal job pays it, where "x ideal" counts compute alone.

Targets: slow, on: epoch <= 1.15x job ideal; equal: on / off <= 1.02.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

import tailcut.torch
import tailcut.pool
from tailcut.pool import Balance


def say(*lines):
    """Results go to stderr: torchrun --tee 2 shows it (torch 1.13 takes no --tee 3)."""
    print(*lines, file=sys.stderr, flush=True)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32, help="records per rank per step")
    p.add_argument("--unit", type=int, default=None,
                   help="records per unit under balance (default: Balance's)")
    p.add_argument("--steps", type=int, default=40, help="steps per epoch with equal batches")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--record-ms", type=float, default=1.0, help="compute per record")
    p.add_argument("--slow-factor", type=float, default=2.0, help="the last rank's, case slow")
    p.add_argument("--workers", type=int, default=2, help="loader processes")
    p.add_argument("--num-slots", type=int, default=None,
                   help="the ring's slots (default: none given, the pool sizes them)")
    p.add_argument("--balance", choices=["model", "true"], default="model",
                   help="balance=model (the DDP model, timed by its hook) or balance=True")
    p.add_argument("--out", default=None, help="write results.json here")
    return p.parse_args()


def run(args, data, case, mode, tag):
    """One run: a new queue and pool, --epochs epochs. Returns [(epoch s, records)]."""
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = args.slow_factor if case == "slow" and rank == world - 1 else 1.0
    ds = tailcut.torch.QueueDataset(data, args.batch_size, format="fixed", record_bytes=16,
                                    num_epochs=args.epochs, num_slices=64,
                                    name=f"balance-bench-{tag}")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    balance = False
    if mode == "on" and args.balance == "model" and args.unit is None:
        balance = model  # as documented: the DDP model, nothing else
    elif mode == "on":
        balance = Balance(model=model if args.balance == "model" else None, unit=args.unit)
    sizing = {} if args.num_slots is None else dict(num_slots=args.num_slots)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=args.workers, balance=balance,
                                        timeout=120.0, **sizing)
    epochs, shares = [], None
    for _ in range(args.epochs):
        dist.barrier()
        start = time.perf_counter()
        records = 0
        for batch in loader:
            records += len(batch)
            loss = loader.weight * model(batch.float()).mean()
            time.sleep(args.record_ms / 1000.0 * factor * len(batch))  # compute
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce: the ranks step together
            opt.step()
        dist.barrier()
        seconds = time.perf_counter() - start
        total = torch.tensor([records], dtype=torch.int64)
        dist.all_reduce(total)
        epochs.append((seconds, int(total.item())))
    if loader._shares is not None:
        shares = loader._shares.shares
    loader.close()
    ds.close()
    return epochs, shares


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    records = args.batch_size * world * args.steps
    data = os.path.join(tempfile.gettempdir(), f"balance-bench-{os.getppid()}.bin")
    if rank == 0:
        a = np.zeros((records, 16), np.uint8)
        a[:, :8] = np.arange(records, dtype=np.int64).view(np.uint8).reshape(records, 8)
        a.tofile(data)
    dist.barrier()
    speeds = dict(slow=(world - 1) + 1 / args.slow_factor, equal=float(world))
    results = []
    for repeat in range(args.repeats):
        cases = ["slow", "equal"] if repeat % 2 == 0 else ["equal", "slow"]
        modes = ["off", "on"] if repeat % 2 == 0 else ["on", "off"]
        for case in cases:
            for mode in modes:
                tag = f"{os.getppid()}-{repeat}-{case}-{mode}"
                epochs, shares = run(args, data, case, mode, tag)
                kept = epochs[1:]
                seconds = statistics.median(s for s, _ in kept)
                ideal = statistics.median(n * args.record_ms / 1000.0 / speeds[case]
                                          for _, n in kept)
                results.append(dict(repeat=repeat, case=case, mode=mode, epochs=epochs,
                                    records=statistics.median(n for _, n in kept),
                                    shares=shares, seconds=seconds, ideal=ideal,
                                    vs_ideal=seconds / ideal))
                if rank == 0:
                    say(f"repeat {repeat} {case:5s} {mode:3s}: epoch {seconds:.3f} s, "
                        f"ideal {ideal:.3f} s, {seconds / ideal:.3f}x ideal, load average "
                        f"{os.getloadavg()[0]:.1f}"
                        + (f", shares {shares}" if shares else ""))
    if rank == 0:
        report(args, results)
        os.unlink(data)
    dist.barrier()
    dist.destroy_process_group()


def spread(values):
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def report(args, results):
    say(f"\n{dist.get_world_size()} ranks, batch {args.batch_size}, unit "
          f"{args.unit or 'default'}, {args.steps} equal steps per epoch, {args.record_ms} ms "
          f"per record, slow factor {args.slow_factor}, {args.repeats} repeats "
          f"(median [min, max] over repeats); balance={args.balance}, num_slots "
          f"{args.num_slots or 'default'}; load average {os.getloadavg()[0]:.1f} at the end")
    say(f"{'case':6s} {'mode':4s} {'epoch s':24s} {'x ideal':24s}")
    for case in ("slow", "equal"):
        for mode in ("off", "on"):
            rows = [r for r in results if r["case"] == case and r["mode"] == mode]
            say(f"{case:6s} {mode:4s} {spread([r['seconds'] for r in rows]):24s} "
                  f"{spread([r['vs_ideal'] for r in rows]):24s}")
    summary = {}
    for case in ("slow", "equal"):
        ratios = []
        for repeat in range(args.repeats):
            on, off = (next(r["seconds"] for r in results if r["repeat"] == repeat and
                            r["case"] == case and r["mode"] == m) for m in ("on", "off"))
            ratios.append(on / off)
        summary[case] = ratios
        say(f"{case}: on / off per repeat {spread(ratios)}")
    world = dist.get_world_size()
    speed = (world - 1) + 1 / args.slow_factor
    job = {}
    for mode in ("off", "on"):
        job[mode] = []
        for repeat in range(args.repeats):
            slow, equal_off = (next(r for r in results if r["repeat"] == repeat and
                                    r["case"] == c and r["mode"] == m)
                               for c, m in (("slow", mode), ("equal", "off")))
            extra = slow["records"] * args.record_ms / 1000.0 * (1 / speed - 1 / world)
            job[mode].append(slow["seconds"] / (equal_off["seconds"] + extra))
        say(f"slow {mode}: x job ideal (equal job without balance + the slow rank's "
            f"unavoidable compute) per repeat {spread(job[mode])}")
    summary["slow_on_vs_job_ideal"] = job["on"]
    slow_on = statistics.median(job["on"])
    equal = statistics.median(summary["equal"])
    say(f"targets: slow, on <= 1.15x job ideal: {slow_on:.3f} "
          f"({'met' if slow_on <= 1.15 else 'NOT met'}); equal, on / off <= 1.02: {equal:.3f} "
          f"({'met' if equal <= 1.02 else 'NOT met'})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(args=vars(args), runs=results, on_over_off=summary), f, indent=1)


if __name__ == "__main__":
    main()
