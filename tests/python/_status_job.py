"""A rank of test_pool_status.py's torchrun job: PooledLoader(balance=...)
with the last rank slow (a sleep per record stands for its compute); local
rank 0 runs `tailcut top NAME --once` after the last epoch, while its pool
is still open, and writes what it printed and the shares it knows.

    _status_job.py DATA OUT NAME TAILCUT EPOCHS
"""

import json
import os
import subprocess
import sys
import time

import torch.distributed as dist

import tailcut.torch
import tailcut.pool
from tailcut.pool import Balance

BATCH = 8
PER_RECORD_S = 0.0015


def main():
    data, out, name, cli, epochs = sys.argv[1:6]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = 2.0 if rank == world - 1 else 1.0
    ds = tailcut.torch.QueueDataset(data, BATCH, format="fixed", record_bytes=16,
                                    num_epochs=int(epochs), num_slices=16, shuffle=False,
                                    name=name)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, num_slots=24, slot_bytes=1 << 12,
                                        balance=Balance(unit=2, every=2), timeout=60.0)
    for epoch in range(int(epochs)):
        for batch in loader:
            time.sleep(PER_RECORD_S * slow * len(batch))
    if rank == 0:
        top = subprocess.run([cli, "top", name, "--once"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=30)
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(dict(top=top.stdout, top_status=top.returncode, shares=loader.shares), f)
    loader.close()
    ds.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
