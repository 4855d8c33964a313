"""A DDP training job for tests/python/test_torchrun.py, run under torchrun.

    _torchrun_train.py DATA_DIR OUT_DIR EPOCHS [--persistent] [--kill-rank R --kill-step S]

Every rank reads the *.bin files of DATA_DIR through a QueueDataset (default
queue name, 2 DataLoader workers) and EqualSteps; rank 1 is slower. Each rank
writes OUT_DIR/rank-R-attempt-A.json: per epoch the steps, the ids it trained
on and its leftover report, and the time of its last step. With --kill-rank,
that rank SIGKILLs itself at its step S of epoch 1 in the first attempt only
(an elastic restart must then finish the job). Every rank checkpoints its
trainer state at each epoch end in OUT_DIR/ckpt-R.pt.
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
    ckpt_path = os.path.join(out_dir, f"ckpt-{rank}.pt")
    checkpoint = torch.load(ckpt_path) if os.path.exists(ckpt_path) else None
    ds = tailcut.torch.QueueDataset(
        files, BATCH, num_epochs=epochs, num_slices=32, seed=3, format="fixed",
        record_bytes=RECORD_BYTES, restore_state=checkpoint and checkpoint["steps"]["queue"])
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    steps = tailcut.torch.EqualSteps(loader, timeout=60)
    if checkpoint is not None:
        steps.load_state_dict(checkpoint["steps"])
    result = dict(rank=rank, attempt=attempt, len=len(steps), queue=ds.queue.name,
                  start_epoch=steps.epoch, epochs=[])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    last_step = time.time()
    for epoch in range(steps.epoch, epochs):
        ids = []
        for i, batch in enumerate(steps):
            if rank == 1:
                time.sleep(0.004)  # the slower rank
            if rank == kill_rank and attempt == 0 and epoch == 1 and i == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            ids += batch[:, :8].contiguous().view(torch.int64).reshape(-1).tolist()
            x = batch[:, 8:].contiguous().view(torch.float32)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            last_step = time.time()
        report = steps.reports[-1]
        result["epochs"].append(dict(epoch=epoch, steps=report["steps"], ids=ids,
                                     leftover_records=report["leftover_records"]))
        torch.save({"steps": steps.state_dict()}, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)
        result["last_step"] = last_step
        result["epoch_end"] = time.time()
        with open(os.path.join(out_dir, f"rank-{rank}-attempt-{attempt}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
