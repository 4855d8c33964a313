"""One-call restore under torchrun (gloo, CPU): a job killed (SIGKILL) after a
mid-epoch checkpoint is restarted with its dataset and PooledLoader built
exactly as in the first run, then loader.load_state_dict(state) alone before
the first iteration, on as many ranks and on fewer; every record of every
epoch after the checkpoint is trained once (but for the leftovers reported
at each epoch's end), with equal steps. The job is _pooled_ckpt_train.py
(--one-call); the checks are test_pooled_checkpoint.py's."""

import os
import random
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

from test_pooled_checkpoint import (  # noqa: E402
    EPOCHS, HERE, check, finish, free_port, job, kill_job, leftovers, remove_dead_run)

assert job  # the fixture, used by name below


def start(data, out, name, ranks, *extra):
    """The job under torchrun with `ranks` ranks, in a session of its own."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}-{time.time_ns()}",
           f"--nproc_per_node={ranks}", "--redirects", "1", "--tee", "2",
           "--monitor_interval=0.2", str(HERE / "_pooled_ckpt_train.py"), str(data), str(out),
           name, str(EPOCHS), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def killed_then_restored(job, ranks_after, *extra):
    """Runs the job on 2 ranks, SIGKILLs it soon after a mid-epoch checkpoint,
    restarts it from that checkpoint on `ranks_after` ranks with one
    load_state_dict, and checks what both trained."""
    name, data, out = job
    ckpt = out / "ckpt.pt"
    proc = start(data, out, name, 2, "--every", "7", *extra)
    deadline = time.monotonic() + 120
    # A mid-epoch checkpoint (step > 0), so that the restore resumes inside an epoch.
    while not ckpt.exists() or torch.load(ckpt)["loader"]["step"] == 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no mid-epoch checkpoint (exit {proc.returncode}):\n"
                        f"{kill_job(proc)[-4000:]}")
        time.sleep(0.01)
    time.sleep(random.uniform(0, 0.3))
    kill_job(proc)
    remove_dead_run(name)
    saved = torch.load(ckpt)
    run, cut = saved["run"], (saved["loader"]["epoch"], saved["loader"]["step"])
    log = finish(start(data, out, name, ranks_after, "--every", "7", "--one-call",
                       "--resume", str(ckpt), *extra))
    assert "cannot jump to a checkpoint" not in log
    check(out, {run: cut})
    assert not leftovers(name), leftovers(name)


def test_one_load_state_dict_resumes_a_killed_job_on_as_many_ranks(job):
    killed_then_restored(job, 2)


def test_one_load_state_dict_resumes_a_killed_job_on_fewer_ranks(job):
    killed_then_restored(job, 1)


def test_one_load_state_dict_resumes_a_map_style_job(job):
    killed_then_restored(job, 2, "--map")


def test_one_load_state_dict_resumes_a_global_shuffle_job_on_fewer_ranks(job):
    """QueueDataset(shuffle="global"), whose queue's configuration holds its
    files (samples_id): the same files restore, on fewer ranks."""
    killed_then_restored(job, 1, "--global")


def test_equal_steps_restores_with_one_load_state_dict(tmp_path):
    """EqualSteps over a QueueDataset: the state taken after epoch 0, loaded
    with one call into a dataset and EqualSteps built as the first (without
    restore_state=), resumes at epoch 1, which reads every record once."""
    import numpy as np

    import tailcut
    import tailcut.torch
    from _pool_helpers import write_ids

    path = write_ids(tmp_path / "ids.bin", 320)
    name = f"pytest-onecall-eq-{os.getpid()}"

    def build():
        ds = tailcut.torch.QueueDataset(path, 16, name=name, format="fixed", record_bytes=16,
                                        num_epochs=2, shuffle_buffer=0, interleave=1,
                                        keep_unfinished=True)
        return ds, tailcut.torch.EqualSteps(ds)

    def ids(batch):
        return np.ascontiguousarray(batch[:, :8].numpy()).view(np.uint64).ravel().tolist()

    ds, steps = build()
    first = [i for batch in steps for i in ids(batch)]
    assert sorted(first) == list(range(320))
    state = steps.state_dict()
    ds.close()  # the job ends; its queue is kept (keep_unfinished) as a crash would leave it
    ds, steps = build()
    try:
        steps.load_state_dict(state)
        assert steps.epoch == 1
        second = [i for batch in steps for i in ids(batch)]
        assert sorted(second) == list(range(320))
    finally:
        ds.close()
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass
