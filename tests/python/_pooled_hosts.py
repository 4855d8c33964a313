"""Process entry points for tests/python/test_pooled_steps.py (importable by spawn): one
rank of a PooledLoader job whose "hosts" are simulated on this machine, each with its own
queue and pool, joined by a gloo process group as under torchrun."""

import datetime
import json
import os
import time

from _pool_helpers import RECORD, ids_of


def host_rank(rank, args):
    """Rank `rank` of args['world']; args['local_world'] ranks per host, each host
    its own queue over args['works'][host]. A DDP-like all_reduce after every
    step (a rank that ran more steps than another would wait in it). Rank
    args['fail_rank'] raises ZeroDivisionError for the batch of step
    args['fail_at']. Writes what it saw to out_dir/rank<r>.json."""
    local_world = args["local_world"]
    host, local_rank = divmod(rank, local_world)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args["world"]), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    import tailcut.torch as tt
    import tailcut.pool

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args["init_file"], rank=rank,
                            world_size=args["world"], timeout=datetime.timedelta(seconds=20))
    ds = tt.QueueDataset(args["works"][host], name=f"{args['job']}-h{host}", format="fixed",
                         record_bytes=RECORD, num_slices=args["num_slices"],
                         num_epochs=args["epochs"], shuffle_buffer=0, interleave=1)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=16, slot_bytes=1 << 13, num_slots=4,
                             timeout=30, carry_over=False)
    if rank == args.get("fail_rank"):
        steps_given = [0]
        next_batch = loader._next

        def failing_next(epoch, report):
            if steps_given[0] == args["fail_at"]:
                raise ZeroDivisionError(f"rank {rank} fails at step {args['fail_at']}")
            steps_given[0] += 1
            return next_batch(epoch, report)
        loader._next = failing_next
    out = dict(epochs=[], error=None)
    try:
        for _ in range(args["epochs"]):
            ids = []
            for batch in loader:
                ids += ids_of(batch.numpy())
                flag = torch.ones(1)
                dist.all_reduce(flag)  # as DDP's gradient all_reduce
            out["epochs"].append(dict(ids=ids, report=dict(loader.reports[-1])))
    except Exception as e:
        out.update(error=type(e).__name__, message=str(e), at=time.time())
    loader.close()
    ds.close()
    with open(os.path.join(args["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    # Skip the interpreter's teardown (torch 1.13 and gloo; see _torch_workers.ddp_rank).
    os._exit(0)


class RaiseAt:
    """A QueueDataset transform that raises ZeroDivisionError at its n-th batch
    (n None: never)."""

    def __init__(self, n):
        self.n, self.seen = n, 0

    def __call__(self, batch):
        self.seen += 1
        if self.n is not None and self.seen == self.n:
            raise ZeroDivisionError(f"batch {self.n} fails")
        return batch


def equal_steps_host_rank(rank, args):
    """As host_rank, one rank per host, through EqualSteps over a QueueDataset
    read in the rank (no pool); rank args['fail_rank']'s transform raises at its
    args['fail_at']-th batch."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args["world"]), LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    import tailcut.torch as tt
    import tailcut.pool

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args["init_file"], rank=rank,
                            world_size=args["world"], timeout=datetime.timedelta(seconds=20))
    fail_at = args["fail_at"] if rank == args["fail_rank"] else None
    ds = tt.QueueDataset(args["works"][rank], 16, name=f"{args['job']}-h{rank}", format="fixed",
                         record_bytes=RECORD, num_slices=args["num_slices"],
                         shuffle_buffer=0, interleave=1, transform=RaiseAt(fail_at))
    steps = tt.EqualSteps(ds, timeout=30)
    out = dict(epochs=[], error=None)
    try:
        for batch in steps:
            dist.all_reduce(torch.ones(1))  # as DDP's gradient all_reduce
        out["epochs"].append(dict(steps.reports[-1]))
    except Exception as e:
        out.update(error=type(e).__name__, message=str(e), at=time.time())
    ds.close()
    with open(os.path.join(args["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    os._exit(0)
