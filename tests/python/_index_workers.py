"""Map-style datasets and rank bodies for tests/python/test_index_work.py (importable by
spawned ranks)."""

import json
import os
import time


class Labelled:
    """Sample i is (a float tensor [i, i], label i % 10); `slow` seconds per sample."""

    def __init__(self, n, slow=0.0):
        self.n, self.slow = n, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        if self.slow:
            time.sleep(self.slow)
        return torch.tensor([float(i), float(i)]), i % 10


def index_rank(rank, args):
    """One rank: DataLoader(IndexDataset(...), num_workers=2) under EqualSteps; writes
    per epoch the sample ids it trained and left over to out_dir/rank<r>.json."""
    import torch
    from torch.utils.data import DataLoader

    import tailcut.torch

    torch.set_num_threads(1)
    ds = tailcut.torch.IndexDataset(Labelled(args["n"], slow=args["slow"] if rank == 1 else 0),
                                    name=args["job"], num_epochs=args["epochs"], seed=3,
                                    num_clients=args["world"] * 3, num_slices=args["items"])
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    left = []
    steps = tailcut.torch.EqualSteps(loader, local_rank=rank, local_world_size=args["world"],
                                     timeout=30,
                                     carry_over=False,
                                     on_leftover=lambda b: left.append(b[0][:, 0].tolist()))
    log = []
    for epoch in range(args["epochs"]):
        trained, left[:] = [], []
        for x, y in steps:
            assert (x[:, 0].long() % 10 == y).all(), "a label is not its sample's"
            trained += x[:, 0].long().tolist()
        log.append(dict(trained=trained, dropped=[i for b in left for i in b],
                        steps=steps.reports[-1]["steps"]))
    ds.close()
    with open(os.path.join(args["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(log, f)
