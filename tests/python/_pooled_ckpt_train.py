"""A DDP job over a PooledLoader that checkpoints, for test_pooled_checkpoint.py
and bench/pool/ckpt_stress.py, run under torchrun (gloo, CPU):

    _pooled_ckpt_train.py DATA OUT NAME EPOCHS [--every N] [--resume CKPT]

Reads the one fixed-format file DATA (16-byte records, record i starting with
i as u64) through a QueueDataset named NAME and a PooledLoader with 2 loaders.
Every N steps (and at each epoch end) every rank calls loader.state_dict()
and rank 0 saves {'loader': state, 'run': its torchrun run id} to
OUT/ckpt.pt, atomically. Each rank
appends one line per step to OUT/rank-R.jsonl: {'run', 'epoch', 'step',
'ids'} (one unbuffered write, a newline first, so that a line a SIGKILL tears
stands alone: _pool_helpers.jsonl_lines),
{'ckpt', 'epoch', 'step'} after each checkpoint, and {'dropped', 'epoch',
'ids'} for each leftover batch. --resume CKPT restores from it: with
--one-call by loader.load_state_dict(state) alone, else also through the
dataset's restore_state=. --map reads DATA as a map-style dataset instead;
--global reads it through QueueDataset(shuffle="global") (its records in one
seeded permutation, read by number; the record index kept in OUT/index).
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import tailcut.torch
import tailcut.pool

BATCH = 16


def ids_of(batch):
    return np.ascontiguousarray(batch[:, :8].numpy()).view(np.uint64).ravel().tolist()


class Records(torch.utils.data.Dataset):
    """A map-style dataset over DATA: dataset[i] is record i as a uint8 tensor."""

    def __init__(self, path):
        self.data = np.fromfile(path, np.uint8).reshape(-1, 16)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return torch.from_numpy(self.data[i].copy())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("epochs", type=int)
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--resume")
    p.add_argument("--step-ms", type=float, default=2.0)
    # Restore with loader.load_state_dict(state) alone, the dataset built as in the first run
    # (else the dataset also gets restore_state=state['queue']).
    p.add_argument("--one-call", action="store_true")
    # A map-style dataset over DATA's records (dataset[i] = record i) instead of a QueueDataset.
    p.add_argument("--map", action="store_true")
    p.add_argument("--global", dest="global_shuffle", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    log = os.open(os.path.join(args.out, f"rank-{rank}.jsonl"),
                  os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(**line):
        # One write, a newline first: a SIGKILL may still tear it (_pool_helpers.jsonl_lines).
        os.write(log, ("\n" + json.dumps(dict(line, run=run))).encode())

    state = torch.load(args.resume)["loader"] if args.resume else None
    restore_state = state["queue"] if state and not args.one_call else None
    # Leftovers reported, not carried: the check counts each record in its own epoch.
    options = dict(num_slots=8, slot_bytes=1 << 16, timeout=60, carry_over=False,
                   on_leftover=lambda b: write(dropped=True, epoch=current[0], ids=ids_of(b)))
    if args.map:
        ds = Records(args.data)
        loader = tailcut.pool.PooledLoader(
            ds, BATCH, loaders_per_host=1, name=args.name, num_epochs=args.epochs, num_slices=60,
            seed=11, restore_state=restore_state, **options)
    elif args.global_shuffle:
        ds = tailcut.torch.QueueDataset(
            args.data, BATCH, name=args.name, format="fixed", record_bytes=16,
            num_epochs=args.epochs, num_slices=60, seed=11, shuffle="global",
            index_dir=os.path.join(args.out, "index"), restore_state=restore_state)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, **options)
    else:
        ds = tailcut.torch.QueueDataset(
            args.data, BATCH, name=args.name, format="fixed", record_bytes=16,
            num_epochs=args.epochs, num_slices=60, seed=11, shuffle_buffer=0, interleave=1,
            restore_state=restore_state)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, **options)
    first = 0
    if state is not None:
        loader.load_state_dict(state)
        first = state["epoch"]

    def checkpoint(epoch, step):
        s = loader.state_dict()
        if rank == 0:
            tmp = os.path.join(args.out, "ckpt.pt.tmp")
            torch.save({"loader": s, "run": run}, tmp)
            os.replace(tmp, os.path.join(args.out, "ckpt.pt"))
        dist.barrier()  # saved before any rank trains on
        write(ckpt=True, epoch=epoch, step=step)

    one = torch.zeros(1)
    current = [first]
    for epoch in range(first, args.epochs):
        current[0] = epoch
        loader.set_epoch(epoch)
        step = 0
        for batch in loader:
            dist.all_reduce(one)  # a synchronous step, as DDP's gradient all-reduce
            time.sleep(args.step_ms / 1000)
            step += 1
            write(epoch=epoch, step=step, ids=ids_of(batch))
            if args.every and step % args.every == 0:
                checkpoint(epoch, step)
        write(report=loader.reports[-1], epoch=epoch)
        checkpoint(epoch + 1, 0)
    loader.close()
    if not args.map:
        ds.close()
    dist.destroy_process_group()
    os.close(log)


if __name__ == "__main__":
    main()
