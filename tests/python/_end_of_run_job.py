"""A torchrun job (2 ranks, gloo) that runs one epoch of a map-style
PooledLoader whose queue has more (num_epochs defaults to 100), for
test_epoch_accounting.py: 200 samples in one item, one loader, batches of 16
make 13 batches, so one is left when the ranks end the epoch at 6 steps each
and is carried into an epoch that never runs. Each rank writes the sample
ids it trained and its last report after close() (END "close", the
default) or once the loader is dropped without it (END "drop") to
OUT/rank-R.json.

    _end_of_run_job.py OUT NAME EPOCHS [END]

With EPOCHS=2 the batch carried out of epoch 0 is trained first in epoch 1
(14 batches there: none left), its loader.batch_epoch 0.
"""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist

import tailcut.torch
import tailcut.pool

N = 200


class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor(i)


def main():
    out, name, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    end = sys.argv[4] if len(sys.argv) > 4 else "close"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = tailcut.pool.PooledLoader(Ids(), 16, loaders_per_host=1, name=name, num_slices=1,
                                        timeout=60)
    trained = []  # (the epoch its samples belong to, ids) per batch
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            trained.append((loader.batch_epoch, batch.tolist()))
    reports = loader.reports
    if end == "close":
        loader.close()
    else:  # "drop": the loader dropped without close(), as DataLoader scripts do
        del loader
        gc.collect()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(dict(trained=trained, report=reports[-1]), f)


if __name__ == "__main__":
    main()
