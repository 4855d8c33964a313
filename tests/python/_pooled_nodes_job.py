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

    ... [--every N] [--resume CKPT] [--map] [--global] [--balance]

--map: the same ids as a map-style dataset (dataset[i] is a 0-d int64 tensor;
node n's share of the ids in a static split, every id when fed) read through
PooledLoader(dataset, ...) and its index queue under the same name.
--global: the same files through QueueDataset(files, shuffle="global") (every
record of the queue's files in one seeded permutation, read by number; the
record indexes kept in OUT_DIR/index).
--balance: PooledLoader(balance=True) over 32 slots; node 1 sleeps SLOW_SECONDS
per BATCH records it gets, and no all_reduce follows a step (the time between
two batches is then the rank's own compute; the pool's step agreement is the
synchronous point).

Checkpoints: every N steps (N > 0) and at each epoch end every rank calls
loader.state_dict() (every host's part) and rank 0 saves {'loader': state,
'run': $TORCHELASTIC_RUN_ID} to OUT_DIR/ckpt.pt, atomically; each rank then
appends one line per step to OUT_DIR/steps-R.jsonl ({'run', 'node', 'epoch',
'step', 'ids'}, one unbuffered write each, a newline first, so that a line a
SIGKILL tears stands alone: _pool_helpers.jsonl_lines),
{'ckpt', 'epoch', 'step'} after each checkpoint and {'dropped', 'epoch', 'ids'}
per leftover batch. --resume CKPT restores every node from rank 0's state: the
same two lines on every node.
"""

import argparse
import json
import os
import pathlib
import time

import numpy as np
import torch
import torch.distributed as dist

import tailcut.torch
import tailcut.pool

BATCH = 64


class Ids(torch.utils.data.Dataset):
    """A map-style dataset of ids: dataset[i] is ids[i]."""

    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


def main():
    p = argparse.ArgumentParser()
    for arg in ("data", "out", "epochs", "job", "slow"):
        p.add_argument(arg)
    p.add_argument("fed", nargs="?", choices=["fed"])
    p.add_argument("--every", type=int, default=None)
    p.add_argument("--resume")
    p.add_argument("--map", action="store_true")
    p.add_argument("--global", dest="global_shuffle", action="store_true")
    p.add_argument("--balance", action="store_true")
    args = p.parse_args()
    data, job, fed = args.data, args.job, args.fed is not None
    out, epochs, slow = pathlib.Path(args.out), int(args.epochs), float(args.slow)
    dist.init_process_group("gloo")
    rank, node = dist.get_rank(), int(os.environ["GROUP_RANK"])
    nodes = dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"])
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    steps_log = None
    if args.every is not None:
        steps_log = os.open(out / f"steps-{rank}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                            0o600)

    def write(**line):
        if steps_log is not None:
            # A newline first: a SIGKILL may tear the write (_pool_helpers.jsonl_lines).
            os.write(steps_log, ("\n" + json.dumps(dict(line, run=run, node=node))).encode())

    state = torch.load(args.resume)["loader"] if args.resume else None
    files = sorted(str(p) for p in pathlib.Path(data).glob("*.bin"))
    if fed:
        opts = dict(name=job, global_block_size=2, on_notice=lambda line: None)
    else:
        files, opts = files[node::nodes], dict(name=f"{job}.n{node}")
    dropped = []
    current = [0]

    def on_leftover(batch):
        ids = batch.view(torch.int64).ravel().tolist()
        dropped.extend(ids)
        write(dropped=True, epoch=current[0], ids=ids)

    restore = dict(restore_state=state["queue"] if state else None)
    pool = dict(loaders_per_host=2, batch_size=BATCH, num_slots=32 if args.balance else 8,
                timeout=60, carry_over=False, on_leftover=on_leftover, balance=args.balance)
    if args.map:
        ds = None
        ids = torch.from_numpy(np.concatenate([np.fromfile(f, np.int64) for f in files]))
        # The index queue's other WorkQueue options go in queue_options (the pool prints
        # the queue's notices itself).
        more = {k: v for k, v in opts.items() if k not in ("name", "on_notice")}
        loader = tailcut.pool.PooledLoader(Ids(ids), slot_bytes=1 << 14, num_epochs=epochs,
                                            num_slices=40, name=opts["name"],
                                            queue_options=more or None, **restore, **pool)
    elif args.global_shuffle:
        ds = tailcut.torch.QueueDataset(files, format="fixed", record_bytes=8,
                                        num_epochs=epochs, num_slices=40, shuffle="global",
                                        seed=5, index_dir=out / "index", **restore, **opts)
        loader = tailcut.pool.PooledLoader(ds, slot_bytes=BATCH * 8, **pool)
    else:
        ds = tailcut.torch.QueueDataset(files, format="fixed", record_bytes=8,
                                        num_epochs=epochs, num_slices=40, shuffle_buffer=0,
                                        interleave=1, **restore, **opts)
        loader = tailcut.pool.PooledLoader(ds, slot_bytes=BATCH * 8, **pool)
    if state is not None:
        loader.load_state_dict(state)

    def checkpoint(epoch, step):
        s = loader.state_dict()
        if rank == 0:
            tmp = out / "ckpt.pt.tmp"
            torch.save({"loader": s, "run": run}, tmp)
            os.replace(tmp, out / "ckpt.pt")
        dist.barrier()  # saved before any rank trains on
        write(ckpt=True, epoch=epoch, step=step)

    log, steps = [], 0
    for epoch in range(loader.epoch, epochs):
        current[0] = epoch
        loader.set_epoch(epoch)
        ids = []
        for step, batch in enumerate(loader, 1):
            if loader.loaders and not (out / f"loaders-n{node}").exists():
                (out / f"loaders-n{node}").write_text(" ".join(str(p.pid) for p in loader.loaders))
            trained = batch.view(torch.int64).ravel().tolist()
            ids += trained
            if slow and node == 1:
                time.sleep(slow * (len(trained) / BATCH if args.balance else 1))
            if not args.balance:
                dist.all_reduce(torch.ones(1))  # as DDP's gradient all_reduce
            write(epoch=epoch, step=step, ids=trained)
            if args.every and step % args.every == 0:
                checkpoint(epoch, step)
            steps += 1
            if steps % 20 == 0:
                (out / f"progress-{rank}").write_text(str(steps))
        log.append(dict(steps=loader.reports[-1]["steps"], ids=ids, dropped=list(dropped),
                        report=dict(loader.reports[-1]), shares=loader.shares))
        dropped.clear()
        if args.every is not None:
            checkpoint(epoch + 1, 0)
    loader.close()
    if ds is not None:
        ds.close()
    (out / f"rank-{rank}.json").write_text(json.dumps(dict(node=node, epochs=log)))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
