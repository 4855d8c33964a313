#!/usr/bin/env python3
"""Loader autoscaling, shown and measured: PooledLoader(loaders_per_host=Autoscale(min, max)).

    python3 bench/pool/autoscale.py --demo      # one autoscaled job; its decisions logged
    python3 bench/pool/autoscale.py --bench     # autoscaled against a fixed pool

A job here is one rank and its pool: a PooledLoader whose transform takes --cost-ms per batch
of --batch records, and a trainer that needs --step-ms per step. Both are sleeps, so that on a
small machine the numbers measure the policy (when loaders are added and removed), not how
many cores the loaders get. The trainer checks that every record of every epoch reached it
exactly once, and prints each epoch's time.

--demo runs one job with loaders_per_host=Autoscale(1, --max-loaders, cpus=--max-loaders) (the
loaders sleep, so they may outnumber this machine's CPUs) for a transform 10x the step, and shows
the "tailcut.pool" log: a line for each decision. The exit status is the job's.

--bench runs --repeats rounds, alternating the order of the cases within each, each job in its
own process:
  starving:  transform 10x the step; Autoscale(1, 8) against a fixed 8 (target: epoch
             time within 1.15x of the fixed pool's)
  too many:  transform 1.5x the step; a fixed 8 against (1, 8) that also starts 8 (what
             both keep alive at the end, and the loader-seconds they held)
and prints medians and ranges. docs/autoscale.md has a run.
"""

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

_RECORD = 16


def costly(batch):
    """The job's transform: $AUTOSCALE_COST_MS of work per batch (a sleep)."""
    time.sleep(float(os.environ["AUTOSCALE_COST_MS"]) / 1e3)
    return batch


def workers_arg(text):
    """'8' (a fixed pool) or '1:8' (autoscaled between 1 and 8)."""
    if ":" in text:
        low, high = text.split(":")
        return (int(low), int(high))
    return int(text)


def job(args):
    """One rank and its pool for --epochs epochs; prints a line per epoch and
    one `result: {json}` line. Returns the exit status (1 if a record was
    missing or repeated)."""
    import numpy as np

    import tailcut.torch as tt
    import tailcut.pool
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        os.environ.pop(var, None)
    os.environ["AUTOSCALE_COST_MS"] = str(args.cost_ms)
    logging.basicConfig(level=logging.INFO, format="[%(relativeCreated)7.0f ms] %(message)s")
    workers = workers_arg(args.workers)
    if isinstance(workers, tuple):
        # The loaders sleep: they may outnumber the CPUs (by default the pool stops at the
        # CPUs less the ranks, docs/autoscale.md).
        from tailcut.pool import Autoscale
        workers = Autoscale(*workers, cpus=workers[1])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ids.bin")
        data = np.zeros((args.records, _RECORD), np.uint8)
        data[:, :8] = np.arange(args.records, dtype=np.uint64).view(np.uint8).reshape(-1, 8)
        data.tofile(path)
        ds = tt.QueueDataset([path], name=args.name, format="fixed", record_bytes=_RECORD,
                             num_slices=args.records // 50, num_epochs=args.epochs,
                             num_clients=1)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=workers, batch_size=args.batch,
                                 transform=costly, slot_bytes=args.batch * _RECORD,
                                 num_slots=16, timeout=120)
        first = workers if isinstance(workers, int) else workers.minimum
        if args.start > first:
            loader.add_loaders(args.start - first)  # started with more than needed
        ok, epochs, alive, held = True, [], [], 0.0
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            seen = np.zeros(args.records, np.int64)
            start = t = time.monotonic()
            for batch in loader:
                seen[batch[:, :8].numpy().copy().view(np.uint64).ravel()] += 1
                time.sleep(args.step_ms / 1e3)  # the training step
                now = time.monotonic()
                held += len(loader.live_loaders()) * (now - t)
                t = now
            epochs.append(time.monotonic() - start)
            alive.append(len(loader.live_loaders()))  # after the last epoch: those still leaving
            once = bool((seen == 1).all())
            ok &= once
            print(f"trainer: epoch {epoch}: {int(seen.sum())} records in {epochs[-1]:.2f} s, "
                  f"{alive[-1]} loaders alive; "
                  f"{'every record once' if once else 'RECORDS MISSING OR REPEATED'}",
                  flush=True)
        result = dict(epochs=epochs, alive=alive, started=len(loader.loaders),
                      loader_seconds=held, ok=ok,
                      decisions=len(loader.autoscale.decisions) if loader.autoscale else 0)
        loader.close()
        ds.close()
    print("result: " + json.dumps(result), flush=True)
    return 0 if ok else 1


def run_job(args, workers, cost_ms, step_ms, records, epochs, start=0, quiet=True):
    cmd = [sys.executable, os.path.abspath(__file__), "--job", "--workers", workers,
           "--name", f"autoscale-{os.getpid()}-{time.monotonic_ns()}", "--records", str(records),
           "--epochs", str(epochs), "--batch", str(args.batch), "--cost-ms", str(cost_ms),
           "--step-ms", str(step_ms), "--start", str(start)]
    run = subprocess.run(cmd, capture_output=quiet, text=True)
    if not quiet:
        return run.returncode
    if run.returncode != 0:
        raise SystemExit(f"job {' '.join(cmd)} failed ({run.returncode}):\n"
                         f"{run.stdout}{run.stderr}")
    return json.loads(run.stdout.rsplit("result: ", 1)[1])


def spread(values, fmt="{:.2f}"):
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def bench(args):
    step = args.step_ms
    cases = {
        "starving": [("fixed 8", "8", 0), ("autoscaled (1, 8)", "1:8", 0)],
        "too many": [("fixed 8", "8", 0), ("autoscaled (1, 8), starts 8", "1:8", 8)],
    }
    costs = {"starving": 10 * step, "too many": 1.5 * step}
    results = {(case, label): [] for case, runs in cases.items() for label, _, _ in runs}
    for r in range(args.repeats):
        for case, runs in cases.items():
            order = runs if r % 2 == 0 else runs[::-1]
            for label, workers, start in order:
                res = run_job(args, workers, costs[case], step, args.records, args.epochs, start)
                results[(case, label)].append(res)
                print(f"round {r} {case:8s} {label:28s} epochs "
                      f"{' '.join(f'{e:.2f}' for e in res['epochs'])} s, loaders alive after "
                      f"epoch 0: {res['alive'][0]}, loader-s {res['loader_seconds']:.1f}",
                      flush=True)
    print(f"\n{args.repeats} rounds, {args.records} records x {args.epochs} epochs, batch "
          f"{args.batch}, step {step} ms; median [range]")
    for case, runs in cases.items():
        base = results[(case, runs[0][0])]
        print(f"{case} (transform {costs[case]:g} ms per batch):")
        for label, _, _ in runs:
            rs = results[(case, label)]
            cols = []
            for e in range(args.epochs):
                times = [x["epochs"][e] for x in rs]
                ratios = [x["epochs"][e] / b["epochs"][e] for x, b in zip(rs, base)]
                cols.append(f"epoch {e} {spread(times)} s ({spread(ratios)}x)")
            total = [sum(x["epochs"]) / sum(b["epochs"]) for x, b in zip(rs, base)]
            print(f"  {label:28s} {'; '.join(cols)}; all epochs {spread(total)}x; alive after "
                  f"epoch 0 {spread([x['alive'][0] for x in rs], '{:.0f}')}; loader-s "
                  f"{spread([x['loader_seconds'] for x in rs], '{:.1f}')}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--demo", action="store_true", help="run one autoscaled job")
    p.add_argument("--bench", action="store_true", help="autoscaled against a fixed pool")
    p.add_argument("--repeats", type=int, default=3, help="bench: rounds")
    p.add_argument("--max-loaders", type=int, default=8, help="demo: loaders at most")
    p.add_argument("--records", type=int, default=None,
                   help="records per epoch (demo 6000, bench 32000)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per job")
    p.add_argument("--batch", type=int, default=32, help="records per batch")
    p.add_argument("--step-ms", type=float, default=None,
                   help="training step time (demo 2, bench 4); the transform takes 10x")
    for hidden in ("--job", "--workers", "--name", "--cost-ms", "--start"):
        p.add_argument(hidden, action="store_true" if hidden == "--job" else None,
                       help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        args.cost_ms, args.step_ms = float(args.cost_ms), float(args.step_ms)
        args.start = int(args.start)
        return job(args)
    if args.bench:
        if args.epochs < 2:
            p.error("--bench needs --epochs 2 or more (it reports the loaders alive after epoch 0)")
        args.records, args.step_ms = args.records or 32000, args.step_ms or 4.0
        return bench(args)
    if args.demo:
        records, step = args.records or 6000, args.step_ms or 2.0
        print(f"demo: one trainer ({step:g} ms per step), loaders of {10 * step:g} ms per "
              f"batch of {args.batch}, loaders_per_host=Autoscale(1, {args.max_loaders}, "
              f"cpus={args.max_loaders})", flush=True)
        return run_job(args, f"1:{args.max_loaders}", 10 * step, step, records, args.epochs,
                       quiet=False)
    p.error("give --demo or --bench")


if __name__ == "__main__":
    sys.exit(main())
