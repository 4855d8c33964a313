"""A DDP script written for DataLoader + DistributedSampler, run by
test_dataloader_face.py under torchrun (2 ranks, gloo) with argv[1] naming
the loader class: "DataLoader" or "PooledLoader". Nothing else differs
between the two runs, and the script never calls close(), as DataLoader
scripts do not. Each rank writes, per epoch, the sample ids it trained and
its steps to OUT/rank-R.json, with len(loader) and, for the test's check
that nothing of the job is left, its queue's name and loader pids.

    _dataloader_switch.py CLASS OUT SAMPLES EPOCHS [NUM_WORKERS]

NUM_WORKERS (default 2) is the script's own setting, the same for both
classes: 0 is the usual debugging run, loading in each rank's process.
"""

import json
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tailcut.pool import PooledLoader

LOADERS = {"DataLoader": DataLoader, "PooledLoader": PooledLoader}


class Samples(Dataset):
    """Sample i is (a 4-float feature vector, its id i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


def main():
    loader_class = LOADERS[sys.argv[1]]
    out, samples, epochs = pathlib.Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = Samples(samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3, drop_last=False)
    more = dict(persistent_workers=True, prefetch_factor=2) if workers else {}
    loader = loader_class(dataset, batch_size=8, sampler=sampler, num_workers=workers,
                          pin_memory=True, drop_last=False, **more)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    log = {"len": len(loader), "epochs": []}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ids, steps = [], 0
        for features, labels in loader:
            loss = model(features).sum()
            opt.zero_grad()
            loss.backward()  # an all-reduce: a rank with one step more would hang here
            opt.step()
            ids += labels.tolist()
            steps += 1
        log["epochs"].append({"ids": ids, "steps": steps})
    # What the test looks for once the job is over: the pool's names and processes.
    dataset_queue = getattr(getattr(loader, "dataset", None), "queue", None)
    log["queue"] = getattr(dataset_queue, "name", None)
    log["loader_pids"] = [p.pid for p in getattr(loader, "loaders", [])]
    # PooledLoader: the records each epoch repeated to fill its last steps (pad).
    log["padded"] = [r["padded_records"] for r in getattr(loader, "reports", [])]
    (out / f"rank-{rank}.json").write_text(json.dumps(log))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
