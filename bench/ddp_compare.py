"""Per-epoch time of a synchronous DDP job with one slower rank: DistributedSampler
against tailcut's QueueDataset + EqualSteps, on the same data.

    PYTHONPATH=build/python python3 bench/ddp_compare.py [--ranks 4] [--records 16384]
        [--batch 32] [--fast-ms 2] [--slow-ms 8] [--epochs 3] [--shuffle-buffer N]
        [--interleave K]

Every rank (gloo on CPU, spawned here) reads fixed-size records through a
DataLoader with one worker; the worker's per-batch work takes --fast-ms, on
rank 1 --slow-ms (a slower disk or transform on that rank). A step is a DDP
forward/backward of a small linear model. Prints per epoch and pipeline the
wall time (rank 0, between barriers), the steps and the records trained, the
share of neighbouring records in a batch whose ids are consecutive (records
carry their id, 0..n-1 in file order, in their first 8 bytes), and the ratio
of the epoch times (the median of the epochs after the first). tailcut uses
QueueDataset's record-level shuffle (its defaults unless --shuffle-buffer or
--interleave are given; 0 and 1 read records in file order).
"""

import argparse
import datetime
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, DistributedSampler

RECORD_BYTES = 64


class Records(Dataset):
    """A map-style dataset over the same file, for DistributedSampler."""

    def __init__(self, path):
        self.data = np.memmap(path, dtype=np.uint8, mode="r").reshape(-1, RECORD_BYTES)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.data[i]))


class Work:
    """The worker's per-batch work: sleeps `ms` (the rank's loading cost)."""

    def __init__(self, ms):
        self.ms = ms

    def __call__(self, batch):
        time.sleep(self.ms / 1000)
        return batch


class Collate(Work):
    """The same work for DistributedSampler's batches, after stacking them."""

    def __call__(self, items):
        return super().__call__(torch.stack(items))


def rank_main(rank, args, path, rendezvous, pipeline, results):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=args.ranks, timeout=datetime.timedelta(seconds=120))
    ms = args.slow_ms if rank == 1 else args.fast_ms
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(RECORD_BYTES, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    if pipeline == "sampler":
        ds = Records(path)
        sampler = DistributedSampler(ds, num_replicas=args.ranks, rank=rank, seed=0)
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=1,
                            collate_fn=Collate(ms), persistent_workers=True,
                            multiprocessing_context="fork")
        epochs = []
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            epochs.append(loader)
    else:
        import tailcut.torch
        shuffle = {k: v for k, v in (("shuffle_buffer", args.shuffle_buffer),
                                     ("interleave", args.interleave)) if v is not None}
        ds = tailcut.torch.QueueDataset([path], args.batch, transform=Work(ms),
                                        num_epochs=args.epochs, num_slices=64, seed=0,
                                        format="fixed", record_bytes=RECORD_BYTES,
                                        num_clients=args.ranks, name=os.path.basename(rendezvous),
                                        **shuffle)
        loader = DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True,
                            multiprocessing_context="fork")
        steps = tailcut.torch.EqualSteps(loader, local_rank=rank, local_world_size=args.ranks,
                                         carry_over=True, timeout=120)
        epochs = [steps] * args.epochs
    out = []
    for epoch, batches in enumerate(epochs):
        dist.barrier()
        start = time.perf_counter()
        n_steps = n_records = pairs = adjacent = 0
        for batch in batches:
            ids = batch[:, :8].contiguous().view(torch.int64).reshape(-1)
            pairs += len(ids) - 1
            adjacent += int(((ids[1:] - ids[:-1]).abs() == 1).sum())
            loss = model(batch.float()).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            n_steps += 1
            n_records += len(batch)
        dist.barrier()
        out.append((time.perf_counter() - start, n_steps, n_records, adjacent, pairs))
    results.put((pipeline, rank, out))
    if pipeline == "tailcut":
        ds.close()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--records", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--fast-ms", type=float, default=2.0)
    parser.add_argument("--slow-ms", type=float, default=8.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shuffle-buffer", type=int, default=None)
    parser.add_argument("--interleave", type=int, default=None)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.bin")
        records = np.random.default_rng(0).integers(0, 255, (args.records, RECORD_BYTES),
                                                    dtype=np.uint8)
        records[:, :8] = np.arange(args.records, dtype=np.int64).view(np.uint8).reshape(-1, 8)
        records.tofile(path)
        median = {}
        print(f"{args.ranks} ranks, {args.records} records of {RECORD_BYTES} B, batch "
              f"{args.batch}, worker work {args.fast_ms} ms/batch, rank 1 {args.slow_ms} ms/batch")
        for pipeline in ("sampler", "tailcut"):
            results = ctx.Queue()
            rendezvous = os.path.join(tmp, f"ddp-compare-{os.getpid()}-{pipeline}")
            procs = [ctx.Process(target=rank_main,
                                 args=(r, args, path, rendezvous, pipeline, results))
                     for r in range(args.ranks)]
            for p in procs:
                p.start()
            got = dict((r, out) for _, r, out in (results.get(timeout=120) for _ in procs))
            for p in procs:
                p.join(60)
            for epoch, (secs, n_steps, *_) in enumerate(got[0]):
                records = sum(got[r][epoch][2] for r in got)
                adjacent = sum(got[r][epoch][3] for r in got) / sum(got[r][epoch][4] for r in got)
                print(f"{pipeline:8} epoch {epoch}: {secs:6.3f} s, {n_steps} steps per rank, "
                      f"{records} records trained, {adjacent:.2%} of neighbours in a batch "
                      f"consecutive")
            median[pipeline] = statistics.median(e[0] for e in got[0][1:] or got[0])
        print(f"epoch time tailcut / DistributedSampler: "
              f"{median['tailcut'] / median['sampler']:.2f}")


if __name__ == "__main__":
    main()
