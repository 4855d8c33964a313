"""Synchronous DDP: per-rank DataLoaders vs one host-wide pool of loaders.

    GLOO_SOCKET_IFNAME=lo PYTHONPATH=build/python python3 -m torch.distributed.run \
        --standalone --nproc_per_node=4 bench/pool/ddp_pooled.py [--epochs 2 ...]

Both modes read the same fixed-record file through a tailcut QueueDataset, with the
same number of loader processes on the host (per-rank: --workers-per-rank per rank;
pooled: that times the ranks) and the same per-batch transform cost: a sleep drawn
from a lognormal distribution (median --median-ms, shape --sigma), standing in for
decoding and augmentation whose cost has a long tail. Each step is a DDP forward
and backward (gloo, CPU), so every step waits for the slowest rank's batch.

Rank 0 prints, per mode and epoch, the epoch time and the p50/p99 data wait (time
spent in next(loader), over all ranks), then the ratios per-rank / pooled. Epoch 0
includes starting the loader processes; later epochs are the steady state.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import tailcut.torch as tt


class LognormalCost:
    """A transform that sleeps a lognormal time per batch (picklable, seeded per process)."""

    def __init__(self, median_ms, sigma):
        self.median, self.sigma, self.rng = median_ms / 1e3, sigma, None

    def __call__(self, batch):
        if self.rng is None:
            self.rng = np.random.default_rng(os.getpid())
        time.sleep(self.median * float(np.exp(self.sigma * self.rng.standard_normal())))
        return batch


def run_epochs(mode, args, path, model, opt):
    rank = dist.get_rank()
    name = f"ddp-pooled-{mode}-{os.getppid()}"
    cost = LognormalCost(args.median_ms, args.sigma)
    common = dict(name=name, format="fixed", record_bytes=args.record_bytes,
                  num_slices=args.slices, num_epochs=args.epochs, seed=1)
    if mode == "per_rank":
        ds = tt.QueueDataset([path], batch_size=args.batch, transform=cost, **common)
        loader = tt.EqualSteps(DataLoader(ds, batch_size=None, num_workers=args.workers_per_rank,
                                          persistent_workers=True))
    else:
        ds = tt.QueueDataset([path], **common)
        loader = tt.PooledLoader(ds, num_workers=args.workers_per_rank * dist.get_world_size(),
                                 batch_size=args.batch, transform=cost,
                                 slot_bytes=args.batch * args.record_bytes + 4096, num_slots=32)
    rows = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        waits, start = [], time.perf_counter()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            waits.append(time.perf_counter() - t0)
            if batch is None:
                break
            x = batch[:, :8].float()
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        dist.barrier()
        seconds = time.perf_counter() - start
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, waits)
        if rank == 0:
            w = np.concatenate([np.array(g) for g in gathered]) * 1e3
            rows.append((seconds, np.percentile(w, 50), np.percentile(w, 99), len(waits) - 1))
            print(f"{mode:8s} epoch {epoch}: {seconds:6.2f} s, {len(waits) - 1} steps, data wait "
                  f"p50 {rows[-1][1]:6.1f} ms p99 {rows[-1][2]:6.1f} ms", file=sys.stderr,
                  flush=True)
    if mode == "pooled":
        loader.close()
    ds.close()
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--records", type=int, default=12800)
    p.add_argument("--record-bytes", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--slices", type=int, default=64)
    p.add_argument("--workers-per-rank", type=int, default=2)
    p.add_argument("--median-ms", type=float, default=20.0)
    p.add_argument("--sigma", type=float, default=1.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = f"/tmp/ddp_pooled_{os.getppid()}.bin"
    if rank == 0:
        np.random.default_rng(0).integers(0, 255, (args.records, args.record_bytes),
                                          dtype=np.uint8).tofile(path)
    dist.barrier()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    results = {m: run_epochs(m, args, path, model, opt) for m in ("per_rank", "pooled")}
    if rank == 0:
        base, pooled = results["per_rank"], results["pooled"]
        for e, (b, q) in enumerate(zip(base, pooled)):
            print(f"epoch {e}: epoch time per_rank/pooled {b[0] / q[0]:.2f}x, "
                  f"p99 data wait per_rank/pooled {b[2] / max(q[2], 1e-3):.2f}x", file=sys.stderr)
        os.unlink(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
