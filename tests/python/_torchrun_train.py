"""A DDP training job for tests/python/test_torchrun.py, run under torchrun.

    _torchrun_train.py DATA_DIR OUT_DIR EPOCHS [--persistent] [--kill-rank R --kill-step S]
                       [--file-order-rank L]

Every rank reads the *.bin files of DATA_DIR through a QueueDataset (default
queue name, 2 DataLoader workers, records shuffled) and EqualSteps (carrying
leftovers over, the default); rank 1 is slower. Each rank writes
OUT_DIR/rank-R-attempt-A.json: per epoch the steps, the ids it trained on
(those of the batches carried in from the epoch before apart), its leftover
report, and the time of its last step. With --kill-rank, that rank SIGKILLs
itself at its step S of the last epoch in the first attempt only (an elastic
restart must then finish the job). With --file-order-rank, that rank reads
records in file order with one DataLoader worker (it reads less ahead than
the others), so from epoch 1 on the group ends an epoch when that rank runs
out, and what the others read ahead is carried over. (Epoch 0 comes out even:
the shuffling ranks' workers take their whole even share at its start.) Rank 0
alone checkpoints the trainer state at each epoch end, in OUT_DIR/ckpt.pt;
every rank restores from it.
"""

import json
import multiprocessing.util
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import tailcut.torch

RECORD_BYTES = 24
BATCH = 16


def write_time(out_dir, rank, attempt):
    with open(os.path.join(out_dir, f"exit-{rank}-{attempt}"), "w") as f:
        f.write(repr(time.time()))


def main():
    data_dir, out_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = sys.argv[4:]
    persistent = "--persistent" in args
    kill_rank = int(args[args.index("--kill-rank") + 1]) if "--kill-rank" in args else None
    kill_step = int(args[args.index("--kill-step") + 1]) if "--kill-step" in args else None
    file_order = (int(args[args.index("--file-order-rank") + 1])
                  if "--file-order-rank" in args else None)
    rank = int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(out_dir, f"pid-{rank}-{attempt}"), "w") as f:
        f.write(str(os.getpid()))  # the test watches this process exit
    # The last of Python's exit steps (after the DataLoader workers are joined
    # and the queues closed), before the interpreter's own teardown.
    multiprocessing.util.Finalize(None, write_time, args=(out_dir, rank, attempt),
                                  exitpriority=-100)
    dist.init_process_group("gloo")
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".bin"))
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = torch.load(ckpt_path) if os.path.exists(ckpt_path) else None
    # The queue's leases_per_client is the shuffling ranks' default, the same on every rank.
    order = (dict(shuffle_buffer=0, interleave=1, leases_per_client=tailcut.torch.SHUFFLE_LEASES)
             if rank == file_order else {})
    ds = tailcut.torch.QueueDataset(
        files, BATCH, num_epochs=epochs, num_slices=32, seed=3, format="fixed",
        record_bytes=RECORD_BYTES, restore_state=checkpoint and checkpoint["steps"]["queue"],
        **order)
    loader = DataLoader(ds, batch_size=None, num_workers=1 if rank == file_order else 2,
                        persistent_workers=persistent)
    steps = tailcut.torch.EqualSteps(loader, timeout=60)
    if checkpoint is not None:
        steps.load_state_dict(checkpoint["steps"])
    result = dict(rank=rank, attempt=attempt, len=len(steps), queue=ds.queue.name,
                  start_epoch=steps.epoch, epochs=[])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    last_step = time.time()
    for epoch in range(steps.epoch, epochs):
        ids, carried_ids = [], []
        for i, batch in enumerate(steps):
            if rank == 1:
                time.sleep(0.004)  # the slower rank
            if rank == kill_rank and attempt == 0 and epoch == epochs - 1 and i == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            batch_ids = batch[:, :8].contiguous().view(torch.int64).reshape(-1).tolist()
            # The batches carried in from the epoch before come first.
            (carried_ids if i < steps.reports[-1]["carried_in"] else ids).extend(batch_ids)
            x = batch[:, 8:].contiguous().view(torch.float32)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            last_step = time.time()
        report = steps.reports[-1]
        result["epochs"].append(dict(epoch=epoch, steps=report["steps"], ids=ids,
                                     carried_ids=carried_ids, carried_out=report["carried_out"],
                                     dropped_records=report["dropped_records"]))
        if rank == 0:  # every rank's carried batches are in its state (gathered)
            torch.save({"steps": steps.state_dict()}, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
        dist.barrier()  # the checkpoint is written before any rank goes on
        result["last_step"] = last_step
        result["epoch_end"] = time.time()
        with open(os.path.join(out_dir, f"rank-{rank}-attempt-{attempt}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
