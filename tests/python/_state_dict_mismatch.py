"""A torchrun job (2 ranks, gloo) whose ranks call PooledLoader.state_dict()
at different steps, for test_bad_checkpoints.py: rank 0 calls it after step
3, rank 1 goes on. Each rank writes what it raised, and how many seconds
after the call, to OUT/rank-R.txt.

    _state_dict_mismatch.py DATA OUT NAME
"""

import json
import os
import sys
import time

import torch.distributed as dist

import tailcut.torch
import tailcut.pool


def main():
    data, out, name = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = tailcut.torch.QueueDataset(data, 16, name=name, format="fixed", record_bytes=16,
                                    num_slices=60, shuffle_buffer=0, interleave=1)
    # A long timeout: the mismatch must be found long before it.
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, timeout=120)
    start = None
    try:
        for step, _ in enumerate(loader, 1):
            if step == 3:
                start = time.monotonic()
                if rank == 0:
                    loader.state_dict()
        result = dict(raised=None)
    except Exception as e:
        result = dict(raised=f"{type(e).__name__}: {e}")
    result["seconds"] = time.monotonic() - start if start is not None else None
    with open(os.path.join(out, f"rank-{rank}.txt"), "w") as f:
        json.dump(result, f)
    loader.close()
    ds.close()


if __name__ == "__main__":
    main()
