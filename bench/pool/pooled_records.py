"""Records per second of a PooledLoader over small fixed-size records, against the same
QueueDataset iterated in this process (no pool), in the same run: one rank, batches of 256,
every order (file order, item shuffle, global shuffle). What it shows is the loaders' own Python
per record: with 128-byte records, reading is cheap and the loop that cuts records into batches
and tracks their ranges (tailcut/pool/_loader.py) is most of a loader's time.

    PYTHONPATH=build/python python3 bench/pool/pooled_records.py [--records 400000] [--reps 3]

Each rep runs every order, direct then pooled (alternating which goes first), for --epochs
epochs; an epoch's records/s is its records over its wall time, the first epoch left out
(index build, loader start). Prints the median over reps (min-max) and pooled / direct.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import tailcut.pool
import tailcut.torch

ORDERS = {"file": False, "items": True, "global": "global"}


def write_files(root, records, record_bytes, files=4):
    paths = []
    for f in range(files):
        path = os.path.join(root, f"part{f}.bin")
        rng = np.random.default_rng(f)
        rng.integers(0, 256, size=(records // files, record_bytes), dtype=np.uint8).tofile(path)
        paths.append(path)
    return paths


def rate(paths, args, shuffle, pooled, tag):
    name = f"bench-pooled-records-{os.getpid()}-{tag}"
    ds = tailcut.torch.QueueDataset(paths, format="fixed", record_bytes=args.record_bytes,
                                    shuffle=shuffle, name=name, num_epochs=args.epochs,
                                    batch_size=args.batch_size)
    loader = (tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0,
                                        num_workers=args.loaders) if pooled else ds)
    rates = []
    try:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            start, n = time.perf_counter(), 0
            for batch in loader:
                n += len(batch)
            if epoch > 0:
                rates.append(n / (time.perf_counter() - start))
    finally:
        (loader if pooled else ds).close()
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=400_000, help="records in all (4 files)")
    p.add_argument("--record-bytes", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--loaders", type=int, default=2, help="the pool's loader processes")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first not counted)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="pooled-records-")
    try:
        paths = write_files(root, args.records, args.record_bytes)
        got = {(o, pooled): [] for o in ORDERS for pooled in (False, True)}
        for rep in range(args.reps):
            for order, shuffle in ORDERS.items():
                for pooled in ((False, True) if rep % 2 == 0 else (True, False)):
                    r = rate(paths, args, shuffle, pooled, f"{rep}-{order}-{int(pooled)}")
                    got[(order, pooled)].append(r)
                    print(f"  rep {rep} {order:6s} {'pooled' if pooled else 'direct'}: "
                          f"{r:12,.0f} records/s", file=sys.stderr, flush=True)
        print(f"\n{args.records:,} records of {args.record_bytes} B, batches of "
              f"{args.batch_size}, {args.loaders} loaders; median of {args.reps} (min-max); "
              f"load average {os.getloadavg()[0]:.1f}")
        print("| order | direct records/s | pooled records/s | pooled / direct |")
        print("|---|---:|---:|---:|")
        for order in ORDERS:
            d, q = got[(order, False)], got[(order, True)]
            ratios = [b / a for a, b in zip(d, q)]
            print(f"| {order} | {statistics.median(d):,.0f} ({min(d):,.0f}-{max(d):,.0f}) | "
                  f"{statistics.median(q):,.0f} ({min(q):,.0f}-{max(q):,.0f}) | "
                  f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
