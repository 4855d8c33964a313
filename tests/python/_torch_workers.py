"""Process entry points for tests/python/test_torch.py (importable by spawn).

Records are RECORD_BYTES bytes: an int64 id, then FEATURES float32 features,
so that every batch says which records it holds.
"""

import datetime
import json
import os
import time

import numpy as np

RECORD_BYTES = 24
FEATURES = 4


def write_records(path, ids):
    """Writes one record per id; feature j of record i is i + j / 10."""
    ids = np.asarray(ids, dtype=np.int64)
    rec = np.zeros(len(ids), dtype=[("id", "<i8"), ("x", "<f4", (FEATURES,))])
    rec["id"] = ids
    rec["x"] = ids[:, None] + np.arange(FEATURES, dtype=np.float32)[None, :] / 10
    rec.tofile(path)
    return str(path)


def split(batch):
    """(ids, features) tensors of a (n, RECORD_BYTES) uint8 batch (copies)."""
    import torch
    ids = batch[:, :8].contiguous().view(torch.int64).reshape(-1)
    x = batch[:, 8:].contiguous().view(torch.float32)
    return ids, x


class Loader:
    """A transform that takes `delay` seconds (a slow loader) and returns
    (ids, features, epoch): the queue epoch of the batch's records, so that a
    test can check each epoch, whichever trainer epoch used its records."""

    def __init__(self, delay):
        self.delay = delay
        self.dataset = None

    def __call__(self, batch):
        import torch
        time.sleep(self.delay)
        ids, x = split(batch)
        return ids, x, torch.tensor(self.dataset.batch_epoch)


def record_id(record):
    """The id of a record (bytes)."""
    return int.from_bytes(record[:8], "little")


def quiet(line):
    """on_notice that drops notices (a module-level function: spawn pickles it)."""


def _dataset(args, rank):
    import tailcut.torch
    delay = args["delay"] * (5 if rank == args.get("slow_rank") else 1)
    ds = tailcut.torch.QueueDataset(
        args["works"], args["batch_size"], transform=Loader(delay), name=args["job"],
        num_epochs=args["epochs"], num_slices=args["num_slices"], seed=args["seed"],
        format="fixed", record_bytes=RECORD_BYTES, num_clients=args["world"],
        reader_options=dict(chunk_bytes=4096, buffer_budget_bytes=64 << 10),
        on_notice=quiet)
    ds.transform.dataset = ds
    return ds


def _run_epochs(steps, epochs, train_step):
    """Runs the epochs; logs, per epoch, the batches trained on and left over
    as [epoch read, ids] pairs, and the EqualSteps report."""
    dropped = []
    steps.on_leftover = lambda b: dropped.append([int(b[2]), b[0].tolist()])
    log = []
    for _ in range(epochs):
        trained = []
        for ids, x, epoch in steps:
            train_step(x)
            trained.append([int(epoch), ids.tolist()])
        log.append({"trained": trained, "report": dict(steps.reports[-1]),
                    "dropped": list(dropped)})
        dropped.clear()
    return log


def ddp_rank(rank, args):
    """One DDP rank (gloo, CPU): trains nn.Linear with EqualSteps; writes what it
    trained on, per epoch, to out_dir/rank<r>.json."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import tailcut.torch

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args["init_file"], rank=rank,
                            world_size=args["world"], timeout=datetime.timedelta(seconds=60))
    local_world = args.get("local_world", args["world"])
    local_rank = rank % local_world
    if local_world != args["world"]:  # several "hosts": one queue each
        args = dict(args, job=f"{args['job']}-host{rank // local_world}",
                    works=args["works_by_host"][rank // local_world], world=local_world)
    ds = _dataset(args, rank)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def train_step(x):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    steps = tailcut.torch.EqualSteps(ds, local_rank=local_rank, local_world_size=local_world,
                                     carry_over=args["carry_over"], timeout=30)
    log = _run_epochs(steps, args["epochs"], train_step)
    dist.barrier()
    dist.destroy_process_group()
    ds.close()
    with open(os.path.join(args["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(log, f)
    # Skip the interpreter's teardown: torch 1.13 can deadlock in it when the
    # DDP Reducer is destroyed (holding the GIL, it joins a gloo thread that
    # waits for the GIL to free a finished collective's tensor).
    os._exit(0)


def loader_rank(rank, args):
    """One rank reading through DataLoader(num_workers=2) with EqualSteps (no
    DDP); writes what it got, per epoch, to out_dir/rank<r>.json."""
    import torch
    from torch.utils.data import DataLoader

    import tailcut.torch

    torch.set_num_threads(1)
    ds = _dataset(args, rank)
    # fork: this rank was spawned, and spawned workers would import torch again.
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    steps = tailcut.torch.EqualSteps(loader, local_rank=rank, local_world_size=args["world"],
                                     carry_over=args["carry_over"], timeout=30)
    log = _run_epochs(steps, args["epochs"], lambda x: None)
    ds.close()
    with open(os.path.join(args["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(log, f)


class DieInWorker1:
    """A transform under which DataLoader worker 1 is SIGKILLed at its first
    batch (it holds items then) and worker 0 reads slowly, so that worker 1
    surely starts before the data runs out. Returns split(batch)."""

    def __call__(self, batch):
        import signal
        import torch
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if info is not None:
            time.sleep(0.002)
        return split(batch)
