"""A rank of test_balance.py's torchrun jobs: PooledLoader(balance=...) with
the last rank slow (a sleep per record stands for its compute).

    _balance_job.py DATA OUT NAME MODE EPOCHS

MODE shares: balance=Balance(unit=2, every=2), no DDP; each step's records,
  share, weight and ids of every rank go to OUT/result.json (rank 0 writes).
MODE ddp: a linear model under DDP (gloo), balance=model; at every step the
  DDP gradient of weight x mean loss is compared with the gradient of the
  mean loss over the whole global batch on one process.
MODE defaults: the documented call with nothing sized, PooledLoader(ds,
  num_workers=1, balance=model) under DDP; each step's ids, the epoch they
  belong to (batch_epoch) and the ring's num_slots go to OUT/result.json.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import tailcut.torch
import tailcut.pool
from tailcut.pool import Balance

BATCH = 8
SLOW = 2.0  # the last rank's compute per record, against the others'
PER_RECORD_S = 0.0015


def ids_of(batch):
    return batch[:, :8].contiguous().view(torch.int64).ravel()


def features(ids):
    x = torch.stack([(ids % 7).double(), (ids % 5).double() - 2.0, torch.ones_like(ids).double()],
                    dim=1)
    y = (ids % 3).double().unsqueeze(1)
    return x, y


def main():
    data, out, name, mode, epochs = sys.argv[1:6]
    epochs = int(epochs)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = SLOW if rank == world - 1 else 1.0
    ds = tailcut.torch.QueueDataset(data, BATCH, format="fixed", record_bytes=16,
                                    num_epochs=epochs, num_slices=16, shuffle=False, name=name)
    model = None
    if mode == "defaults":
        return defaults(ds, out, rank, world, factor, epochs)
    if mode == "ddp":
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Linear(3, 1, bias=False).double())
        balance = model
    else:
        balance = Balance(unit=2, every=2)
    dropped = []
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, num_slots=24, slot_bytes=1 << 12,
                                        balance=balance, timeout=60.0,
                                        on_leftover=lambda b: dropped.extend(ids_of(b).tolist()))
    steps, grad_errors, unequal = [], [], 0
    for epoch in range(epochs):
        for batch in loader:
            ids = ids_of(batch)
            n = len(ids)
            steps.append(dict(epoch=epoch, records=n, share=loader.shares[rank],
                              weight=loader.weight, ids=ids.tolist()))
            if model is None:
                time.sleep(PER_RECORD_S * factor * n)
                continue
            x, y = features(ids)
            model.zero_grad()
            time.sleep(PER_RECORD_S * factor * n)  # this rank's compute before its backward
            loss = loader.weight * torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            everyone = [None] * world
            dist.all_gather_object(everyone, ids.tolist())
            all_ids = torch.tensor([i for part in everyone for i in part], dtype=torch.int64)
            ref = model.module.weight.detach().clone().requires_grad_(True)
            xa, ya = features(all_ids)
            torch.nn.functional.mse_loss(xa @ ref.t(), ya).backward()
            grad_errors.append(float((model.module.weight.grad - ref.grad).abs().max()))
            unequal += len({len(part) for part in everyone}) > 1
    result = dict(rank=rank, steps=steps, dropped=dropped, reports=loader.reports,
                  shares=loader.shares, grad_errors=grad_errors, unequal_steps=unequal)
    every = [None] * world
    dist.all_gather_object(every, result)
    loader.close()
    ds.close()
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


def defaults(ds, out, rank, world, factor, epochs):
    """balance=model with every sizing argument left to its default."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1).double())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = tailcut.pool.PooledLoader(ds, num_workers=1, balance=model)
    steps = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            ids = ids_of(batch)
            steps.append(dict(epoch=epoch, of_epoch=loader.batch_epoch, ids=ids.tolist()))
            time.sleep(PER_RECORD_S * factor * len(ids))  # this rank's compute
            x, y = features(ids)
            loss = loader.weight * torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    result = dict(rank=rank, steps=steps, reports=loader.reports, shares=loader.shares,
                  num_slots=loader.num_slots, slot_bytes=loader.slot_bytes)
    every = [None] * world
    dist.all_gather_object(every, result)
    loader.close()
    ds.close()
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
