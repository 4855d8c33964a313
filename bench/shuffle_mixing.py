"""How well QueueDataset's record-level shuffle mixes, and what it costs:
tailcut in file order and with shuffle buffers, against a full shuffle (what
DistributedSampler(shuffle=True) gives), on the same records.

    PYTHONPATH=build/python python3 bench/shuffle_mixing.py [--records 300000]
        [--record-bytes 64] [--slices 64] [--batch 64] [--repeats 3]

One process reads one epoch of fixed-size records whose first 8 bytes are the
record's id (0..n-1 in file order) through tailcut.torch.QueueDataset with
batch_size=--batch (items shuffled by the queue, shuffle=True, as in training).
For each pipeline it prints:
  adjacent   share of neighbouring records in a batch whose ids are consecutive
  items      distinct items (file slices) per batch, on average
  displaced  mean |position in the epoch - id| / n (a full shuffle: about 1/3)
  records/s  reading the epoch (best of --repeats), and the ratio to file order
The full shuffle is a seeded permutation cut into batches (no reading: no rate).
"""

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import tailcut
import tailcut.torch


def mixing(order, batch, item_records):
    """(adjacent, items per batch, displaced) of an epoch's ids in reading order."""
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    batches = [order[i:i + batch] for i in range(0, n, batch)]
    pairs = sum(len(b) - 1 for b in batches)
    adjacent = sum(int(np.count_nonzero(np.abs(np.diff(b)) == 1)) for b in batches)
    items = np.mean([len(np.unique(b // item_records)) for b in batches])
    displaced = float(np.mean(np.abs(np.arange(n) - order))) / n
    return adjacent / pairs, items, displaced


def read_epoch(path, args, name, **shuffle):
    ds = tailcut.torch.QueueDataset(
        [path], args.batch, num_slices=args.slices, seed=1, format="fixed",
        record_bytes=args.record_bytes, name=name, on_notice=lambda line: None, **shuffle)
    start = time.perf_counter()
    ids = [batch[:, :8].contiguous().view(torch.int64).reshape(-1).numpy().copy() for batch in ds]
    secs = time.perf_counter() - start
    ds.close()
    return np.concatenate(ids), secs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-bytes", type=int, default=64)
    parser.add_argument("--slices", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.records
    item_records = -(-n // args.slices)
    pipelines = [
        ("tailcut, file order (shuffle_buffer=0, interleave=1)",
         dict(shuffle_buffer=0, interleave=1)),
        ("tailcut, shuffle_buffer=512, interleave=1", dict(shuffle_buffer=512, interleave=1)),
        (f"tailcut, default (shuffle_buffer={tailcut.torch.SHUFFLE_BUFFER}, "
         f"interleave={tailcut.torch.INTERLEAVE})", {}),
        ("tailcut, shuffle_buffer=8192, interleave=4", dict(shuffle_buffer=8192, interleave=4)),
        # An item stays leased until its last record leaves the buffer: with the
        # queue's default 8 leases (QueueDataset's shuffle default is 32), 4
        # readers and a large buffer fill them, and the buffer drains.
        ("tailcut, shuffle_buffer=8192, interleave=4, leases_per_client=8",
         dict(shuffle_buffer=8192, interleave=4, leases_per_client=8)),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.bin")
        records = np.zeros((n, args.record_bytes), dtype=np.uint8)
        records[:, :8] = np.arange(n, dtype=np.int64).view(np.uint8).reshape(n, 8)
        records.tofile(path)
        print(f"{n} records of {args.record_bytes} B, {args.slices} items (shuffled), "
              f"batches of {args.batch}, 1 process")
        print(f"{'pipeline':66} {'adjacent':>9} {'items':>6} {'displaced':>9} "
              f"{'records/s':>10} {'vs file order':>13}")
        full = np.random.default_rng(0).permutation(n)
        adj, items, disp = mixing(full, args.batch, item_records)
        print(f"{'full shuffle (DistributedSampler, shuffle=True)':66} {adj:9.4%} {items:6.1f} "
              f"{disp:9.3f} {'-':>10} {'-':>13}")
        base = None
        for label, shuffle in pipelines:
            best, order = None, None
            for r in range(args.repeats):
                ids, secs = read_epoch(path, args, f"shuffle-mixing-{os.getpid()}-{r}", **shuffle)
                assert np.array_equal(np.sort(ids), np.arange(n)), "a record missing or twice"
                best = secs if best is None else min(best, secs)
                order = ids
            rate = n / best
            base = base or rate
            adj, items, disp = mixing(order, args.batch, item_records)
            print(f"{label:66} {adj:9.4%} {items:6.1f} {disp:9.3f} {rate:10.0f} "
                  f"{rate / base:12.2f}x")


if __name__ == "__main__":
    main()
