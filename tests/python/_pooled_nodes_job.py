"""One node of a DDP-style job of several nodes over PooledLoaders, for
tests/python/test_pooled_hosts.py, run under torchrun (--nnodes N).

    _pooled_nodes_job.py DATA_DIR OUT_DIR EPOCHS JOB SLOW_SECONDS [fed]

Node GROUP_RANK reads its share of the *.bin files of DATA_DIR (8-byte records,
each its id) through its own queue (JOB.n<node>) and one PooledLoader for the
node (2 loaders, batches of 64, leftovers dropped and logged through
on_leftover); node 1 sleeps SLOW_SECONDS per step. With `fed`, every node
opens the queue JOB over all the files, and the coordinator of
$TAILCUT_COORDINATOR feeds each node's queue (JOB.$TAILCUT_HOST_ID) its share. After every step an
all_reduce, as DDP's gradient all_reduce. Each rank writes OUT_DIR/rank-R.json:
per epoch its steps, the ids it trained and the ids it dropped; local rank 0
the pids of its loaders to OUT_DIR/loaders-n<node>; every rank its step count
to OUT_DIR/progress-R every 20 steps.
"""

import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import tailcut.torch

BATCH = 64


def main():
    data, out, epochs, job, slow = sys.argv[1:6]
    fed = sys.argv[6:] == ["fed"]
    out, epochs, slow = pathlib.Path(out), int(epochs), float(slow)
    dist.init_process_group("gloo")
    rank, node = dist.get_rank(), int(os.environ["GROUP_RANK"])
    nodes = dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"])
    files = sorted(str(p) for p in pathlib.Path(data).glob("*.bin"))
    if fed:
        opts = dict(name=job, global_block_size=2, on_notice=lambda line: None)
    else:
        files, opts = files[node::nodes], dict(name=f"{job}.n{node}")
    ds = tailcut.torch.QueueDataset(files, format="fixed", record_bytes=8, num_epochs=epochs,
                                    num_slices=40, shuffle_buffer=0, interleave=1, **opts)
    dropped = []

    def on_leftover(batch):
        dropped.extend(batch.view(torch.int64).ravel().tolist())

    loader = tailcut.torch.PooledLoader(
        ds, num_workers=2, batch_size=BATCH, slot_bytes=BATCH * 8, num_slots=8, timeout=60,
        carry_over=False, on_leftover=on_leftover)
    log, steps = [], 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ids = []
        for batch in loader:
            if loader.loaders and not (out / f"loaders-n{node}").exists():
                (out / f"loaders-n{node}").write_text(" ".join(str(p.pid) for p in loader.loaders))
            ids += batch.view(torch.int64).ravel().tolist()
            if slow and node == 1:
                time.sleep(slow)
            dist.all_reduce(torch.ones(1))  # as DDP's gradient all_reduce
            steps += 1
            if steps % 20 == 0:
                (out / f"progress-{rank}").write_text(str(steps))
        log.append(dict(steps=loader.reports[-1]["steps"], ids=ids, dropped=list(dropped),
                        report=dict(loader.reports[-1])))
        dropped.clear()
    loader.close()
    ds.close()
    (out / f"rank-{rank}.json").write_text(json.dumps(dict(node=node, epochs=log)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
