"""A DDP-style job over a PooledLoader for tests/python/test_pooled_lifecycle.py,
run under torchrun (or as a plain process).

    _pooled_job.py DATA_DIR OUT_DIR EPOCHS [--workers N] [--fail-after N]
                   [--slow SECONDS] [--no-close] [--slow-exit SECONDS]

Every rank reads the *.bin files of DATA_DIR through a QueueDataset (default
queue name) and one PooledLoader for the host (N loaders, default 2, or
MIN:MAX for num_workers=(MIN, MAX); batches of 16 records). Each rank appends, per step, "EPOCH id id ..." to
OUT_DIR/ids-R-A (flushed, so a killed attempt's steps are known; A is
"$TEST_RUN.<torchrun restart count>"), writes its pid to OUT_DIR/pid-R-A, the
queue's and ring's names to OUT_DIR/names-R-A, local rank 0 the pids of its
loaders to OUT_DIR/loaders-A, and at the end OUT_DIR/done-R-A.json (with
the number of loader processes the rank started and its metrics() of the run). An
exception is written to OUT_DIR/raised-R-A.json (time, type, text), then
raised. --fail-after N: each loader's transform raises ValueError after its
N-th batch (writing the time to OUT_DIR/failed-PID first). --slow: seconds
per batch in the loaders' transform. --no-close: the job never calls
close(), as a DataLoader user would not. --slow-exit: local rank 0 takes
that long to leave after it raised (torchrun ends it meanwhile, as it ends
every rank once one failed).
"""

import json
import os
import sys
import time
import traceback

import torch

import tailcut.torch
import tailcut.pool

BATCH = 16


class Transform:
    """The loaders' transform: optionally slow, optionally failing."""

    def __init__(self, out_dir, slow, fail_after):
        self.out_dir, self.slow, self.fail_after = out_dir, slow, fail_after
        self.batches = 0

    def __call__(self, batch):
        self.batches += 1
        if self.slow:
            time.sleep(self.slow)
        if self.fail_after is not None and self.batches > self.fail_after:
            with open(os.path.join(self.out_dir, f"failed-{os.getpid()}"), "w") as f:
                f.write(repr(time.time()))
            raise ValueError(f"transform: bad batch {self.batches} in loader {os.getpid()}")
        return batch


_calls = 0


def failing_transform(batch):
    """A transform for `python3 -m tailcut.pool --transform _pooled_job.py:failing_transform`:
    raises ValueError on its 4th batch, writing the time to $TEST_OUT_DIR/failed-PID first."""
    global _calls
    _calls += 1
    if _calls > 3:
        with open(os.path.join(os.environ["TEST_OUT_DIR"], f"failed-{os.getpid()}"), "w") as f:
            f.write(repr(time.time()))
        raise ValueError(f"transform: bad batch {_calls} in loader {os.getpid()}")
    return batch


def wait_for_file(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def option(args, name, kind, default):
    return kind(args[args.index(name) + 1]) if name in args else default


def workers_of(text):
    """--workers: N, or MIN:MAX."""
    return tuple(map(int, text.split(":"))) if ":" in text else int(text)


def main():
    data_dir, out_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = sys.argv[4:]
    workers = option(args, "--workers", workers_of, 2)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Files of a rerun of the same command (the same argv: the same job) are told apart by
    # $TEST_RUN.
    attempt = f"{os.environ.get('TEST_RUN', '0')}.{attempt}"
    tag = f"{rank}-{attempt}"
    with open(os.path.join(out_dir, f"pid-{tag}"), "w") as f:
        f.write(str(os.getpid()))
    if rank > 0:
        # Local rank 0 opens (or, in a rerun, resumes) the job's queue first: QueueDataset's
        # own barrier for that is racy in a rerun (a rank can join the crashed run's queue as
        # it is, or create it fresh under rank 0's resume), which is not what is tested here.
        wait_for_file(os.path.join(out_dir, f"names-0-{attempt}"))
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".bin"))
    transform = Transform(out_dir, option(args, "--slow", float, 0.0),
                          option(args, "--fail-after", int, None))
    # The dataset's batch size and transform run in the loaders, on torch tensors (the
    # one-line change from a DataLoader).
    ds = tailcut.torch.QueueDataset(files, BATCH, transform=transform, num_epochs=epochs,
                                    num_slices=16, seed=3, format="fixed", record_bytes=24)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=workers, slot_bytes=BATCH * 24,
                                        num_slots=4,
                                        timeout=float(os.environ.get("TEST_TIMEOUT", "60")))
    names = os.path.join(out_dir, f"names-{tag}")
    with open(names + ".tmp", "w") as f:
        json.dump(dict(queue=ds.queue.name, ring=loader.name), f)
    os.replace(names + ".tmp", names)
    ids_file = open(os.path.join(out_dir, f"ids-{tag}"), "a", buffering=1)
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                if rank == 0 and not os.path.exists(os.path.join(out_dir, f"loaders-{attempt}")):
                    with open(os.path.join(out_dir, f"loaders-{attempt}"), "w") as f:
                        f.write(" ".join(str(p.pid) for p in loader.loaders))
                ids = batch[:, :8].contiguous().view(torch.int64).reshape(-1)
                ids_file.write(f"{epoch} {' '.join(map(str, ids.tolist()))}\n")
    except BaseException as e:
        with open(os.path.join(out_dir, f"raised-{tag}.json"), "w") as f:
            json.dump(dict(time=time.time(), type=type(e).__name__, text=str(e),
                           traceback="".join(traceback.format_exception(e))), f)
        if rank == 0:
            time.sleep(option(args, "--slow-exit", float, 0.0))
        raise
    with open(os.path.join(out_dir, f"done-{tag}.json"), "w") as f:
        json.dump(dict(reports=loader.reports, queue=ds.queue.name, ring=loader.name,
                       loaders=len(loader.loaders), metrics=loader.metrics(window=3600.0)), f)
    if "--no-close" not in args:
        loader.close()
        ds.close()


if __name__ == "__main__":
    main()
