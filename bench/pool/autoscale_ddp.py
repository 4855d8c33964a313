#!/usr/bin/env python3
"""Autoscaling under synchronous DDP: loaders_per_host=Autoscale(1, 8) against a fixed pool of 8.

    PYTHONPATH=build/python python3 bench/pool/autoscale_ddp.py [--rounds 3]

A job is 4 ranks under torchrun (gloo) training a DistributedDataParallel
linear model: each step is --step-ms of compute (a sleep) and the model's
gradient all-reduce, so the ranks step together. The host's pool runs a
heavy-tailed transform per batch: a sleep drawn from a log-normal of mean
--cost-ms (sigma 1: median 0.6x the mean, 1 batch in 20 above 2.5x), the
same draw for the same batch in every job. The sleeps stand for work that
scales: on a 2-core machine 8 loaders that burn CPU would measure the
machine, not the policy.

Each round runs the fixed pool (loaders_per_host=8) and the autoscaled one
(loaders_per_host=Autoscale(1, 8, cpus=8)), the order alternating; each
job trains --epochs epochs of --records records and checks that every
record of every epoch came once. Printed: per job the epochs' times and the
policy's decisions (when, to how many loaders); then medians [min-max] of
the epoch times and of the ratios autoscaled / fixed, per round.

cpus=8: by default a pool takes no more loaders than the host's CPUs less
its local ranks (2 - 4 here: none past min). The loaders of this job sleep,
so the benchmark says they may take 8 (Autoscale(..., cpus=8); the same as
TAILCUT_LOADER_CPUS=8 in the job's environment).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

_RECORD = 16


def cost_of(batch):
    """The transform's time for a batch: log-normal, mean $AS_COST_MS ms, drawn
    from the batch's first record id (the same batch costs the same in every job)."""
    import numpy as np
    first = int(np.ascontiguousarray(np.asarray(batch)[0, :8]).view(np.uint64)[0])
    mean = float(os.environ["AS_COST_MS"]) / 1e3
    sigma = 1.0
    draw = np.random.default_rng(first).lognormal(np.log(mean) - sigma * sigma / 2, sigma)
    return min(draw, 20 * mean)


def heavy_tailed(batch):
    time.sleep(cost_of(batch))
    return batch


def rank_main(args):
    import numpy as np
    import torch
    import torch.distributed as dist

    import tailcut.torch as tt
    import tailcut.pool
    from tailcut.pool import Autoscale

    os.environ["AS_COST_MS"] = str(args.cost_ms)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.log and rank == 0:
        import logging
        logging.basicConfig(level=logging.DEBUG if args.log == "debug" else logging.INFO,
                            format="[%(relativeCreated)7.0f ms] %(message)s")
    ds = tt.QueueDataset([args.data], args.batch, name=args.name, format="fixed",
                         record_bytes=_RECORD, num_slices=args.records // (4 * args.batch),
                         num_epochs=args.epochs)
    if args.workers == "auto":
        workers = Autoscale(1, 8, cpus=8)
    else:
        workers = int(args.workers)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=workers, transform=heavy_tailed,
                             slot_bytes=args.batch * _RECORD, timeout=120)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(_RECORD, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    epochs, counts, t_start = [], [], None
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        seen = np.zeros(args.records, np.int64)
        dist.barrier()
        start = time.monotonic()
        if t_start is None:
            t_start = start
        for batch in loader:
            seen[batch[:, :8].numpy().copy().view(np.uint64).ravel()] += 1
            time.sleep(args.step_ms / 1e3)  # the step's compute
            loss = model(batch.float()).mean()
            opt.zero_grad()
            loss.backward()  # the gradient all-reduce: the ranks step together
            opt.step()
        dist.barrier()
        epochs.append(time.monotonic() - start)
        every = torch.from_numpy(seen)
        dist.all_reduce(every)
        counts.append(bool((every == 1).all()))
    decisions = []
    if rank == 0 and loader.autoscale is not None:
        # `at` counts from the policy's first look, the first batch request of epoch 0.
        decisions = [dict(at=d["at"], action=d["action"], n=d["n"], loaders=d["loaders"])
                     for d in loader.autoscale.decisions]
    loader.close()
    ds.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(dict(epochs=epochs, once=counts, decisions=decisions), f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(args, data, workers, tmp, tag):
    out = os.path.join(tmp, f"{tag}.json")
    name = f"asddp-{os.getpid()}-{tag}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.pop("TAILCUT_LOADER_CPUS", None)  # the job says cpus= itself
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}",
           f"--nproc_per_node={args.ranks}", "--redirects", "1", "--tee", "2",
           os.path.abspath(__file__), "--rank-job", "--data", data, "--name", name,
           "--workers", workers, "--out", out, "--records", str(args.records),
           "--epochs", str(args.epochs), "--batch", str(args.batch),
           "--cost-ms", str(args.cost_ms), "--step-ms", str(args.step_ms)]
    if args.log:
        cmd += ["--log", args.log]
    run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    if args.log:
        print("\n".join(line for line in run.stdout.splitlines() if "tailcut.pool" in line
                        or "window" in line), flush=True)
    if run.returncode != 0:
        raise SystemExit(f"job {tag} failed ({run.returncode}):\n{run.stdout[-6000:]}")
    with open(out) as f:
        result = json.load(f)
    if not all(result["once"]):
        raise SystemExit(f"job {tag}: a record missing or repeated: {result}")
    return result


def spread(values, fmt="{:.3f}"):
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--records", type=int, default=20480, help="records per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--cost-ms", type=float, default=50.0, help="transform mean per batch")
    p.add_argument("--step-ms", type=float, default=30.0, help="compute per step")
    p.add_argument("--log", choices=["info", "debug"], default=None,
                   help="show rank 0's tailcut.pool log (the policy's decisions)")
    for hidden in ("--rank-job", "--data", "--name", "--workers", "--out"):
        p.add_argument(hidden, action="store_true" if hidden == "--rank-job" else None,
                       help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_job:
        return rank_main(args)
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "ids.bin")
        a = np.zeros((args.records, _RECORD), np.uint8)
        a[:, :8] = np.arange(args.records, dtype=np.uint64).view(np.uint8).reshape(-1, 8)
        a.tofile(data)
        print(f"{args.ranks} ranks (DDP, gloo), step {args.step_ms:g} ms + all-reduce, "
              f"transform log-normal mean {args.cost_ms:g} ms per batch of {args.batch}, "
              f"{args.records} records x {args.epochs} epochs; load average "
              f"{os.getloadavg()[0]:.1f} at the start", flush=True)
        runs = {"fixed": [], "auto": []}
        for r in range(args.rounds):
            order = [("fixed", "8"), ("auto", "auto")]
            for label, workers in (order if r % 2 == 0 else order[::-1]):
                res = run_job(args, data, workers, tmp, f"{r}-{label}")
                runs[label].append(res)
                ramp = " ".join(f"{d['at']:.2f}s:{'+' if d['action'] == 'add' else '-'}"
                                f"{d['n']}->{d['loaders']}" for d in res["decisions"])
                print(f"round {r} {label:5s} epochs "
                      f"{' '.join(f'{e:.2f}' for e in res['epochs'])} s"
                      + (f"; decisions {ramp}" if label == "auto" else "")
                      + f"; load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"\nmedian [min-max] over {args.rounds} rounds; ratios per round, same run; "
              f"load average {os.getloadavg()[0]:.1f} at the end")
        for e in range(args.epochs):
            fixed = [x["epochs"][e] for x in runs["fixed"]]
            auto = [x["epochs"][e] for x in runs["auto"]]
            ratios = [a / f for a, f in zip(auto, fixed)]
            print(f"epoch {e}: fixed 8 {spread(fixed, '{:.2f}')} s, Autoscale(1, 8) "
                  f"{spread(auto, '{:.2f}')} s, ratio {spread(ratios)}")
        total = [sum(a["epochs"]) / sum(f["epochs"]) for a, f in zip(runs["auto"], runs["fixed"])]
        print(f"all epochs: ratio {spread(total)}")
        first = [next((d["at"] for d in x["decisions"] if d["loaders"] >= 7), float("nan"))
                 for x in runs["auto"]]
        print(f"first reached 7+ loaders at (s after the first batch request): "
              f"{' '.join(f'{t:.2f}' for t in first)}; decisions per job: "
              f"{' '.join(str(len(x['decisions'])) for x in runs['auto'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
