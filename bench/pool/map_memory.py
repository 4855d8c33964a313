"""Memory of a pool of loaders over a map-style dataset: the PSS (proportional set size,
/proc/PID/smaps_rollup) of the rank and of each of its loaders while they load, for a data set
of N samples. The dataset holds one int32 label per sample (a numpy array the loaders share
copy-on-write after the fork); the sample order is computed per position, never stored.

    PYTHONPATH=build/python python3 bench/pool/map_memory.py --samples 1000000 --loaders 8
"""

import argparse
import os
import time

import numpy as np
import torch

import tailcut.torch
import tailcut.pool


class Labels:
    """Sample i: (a float tensor [i], its label)."""

    def __init__(self, n):
        self.labels = np.arange(n, dtype=np.int32) % 1000

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.tensor([float(i)]), int(self.labels[i])


def pss_kib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10**6)
    parser.add_argument("--loaders", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200, help="batches popped before measuring")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loader = tailcut.pool.PooledLoader(Labels(args.samples), batch_size=32,
                                        loaders_per_host=args.loaders, seed=1, rank=0, world_size=1,
                                        local_rank=0, name=f"map-memory-{os.getpid()}")
    it = iter(loader)
    for _ in range(args.batches):
        next(it)
    time.sleep(0.5)
    pids = [p.pid for p in loader.loaders]
    loaders = [pss_kib(p) for p in pids]
    print(f"N={args.samples} items={loader.queue.num_items} loaders={len(pids)}: "
          f"rank PSS {pss_kib(os.getpid()) / 1024:.1f} MiB, loaders' PSS "
          f"{sum(loaders) / 1024:.1f} MiB in all ({min(loaders) / 1024:.1f}.."
          f"{max(loaders) / 1024:.1f} MiB each); dataset labels "
          f"{args.samples * 4 / 2**20:.1f} MiB")
    it.close()
    loader.close()


if __name__ == "__main__":
    main()
