"""Per-epoch accounting a user can check: no sample of an epoch the job ran
is dropped without a warning and a count."""

import json
import os
import subprocess
import sys

import pytest

import tailcut

pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

from test_pooled_checkpoint import HERE, finish, free_port, remove_dead_run  # noqa: E402


def run_job(tmp_path, epochs, end="close"):
    """Runs _end_of_run_job.py on 2 ranks; returns (each rank's output, the log)."""
    name = f"pytest-endrun-{os.getpid()}-{epochs}-{end}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}",
           "--nproc_per_node=2", "--redirects", "1", "--tee", "2",
           str(HERE / "_end_of_run_job.py"), str(tmp_path), name, str(epochs), end]
    try:
        log = finish(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True), timeout=100)
    finally:
        remove_dead_run(name)
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)], log


def test_batch_epoch_makes_a_per_epoch_check_add_up_with_carry_over(tmp_path):
    """Two epochs with the default carry_over: the batch left at the end of
    epoch 0 is trained first in epoch 1; counted by loader.batch_epoch, each
    epoch's samples are every sample once."""
    ranks, _ = run_job(tmp_path, 2)
    by_epoch = {0: [], 1: []}
    for r in ranks:
        for epoch, ids in r["trained"]:
            by_epoch[epoch] += ids
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(200)), (epoch, len(ids))


@pytest.mark.parametrize("end", ["close", "drop"])
def test_a_leftover_carried_past_the_last_epoch_run_is_counted_and_warned_about(tmp_path, end):
    """One epoch of a map-style queue of 100: the batch left when the ranks
    end the epoch is carried into epoch 1, which never runs. close(), or the
    loader's end when the script drops it without close(), drops it with a
    warning that gives the count, and the report counts it: the trained
    samples and the dropped ones are the epoch, each once."""
    ranks, log = run_job(tmp_path, 1, end)
    trained = [i for r in ranks for _, ids in r["trained"] for i in ids]
    assert len(trained) == len(set(trained)), "a sample trained twice"
    dropped = sum(r["report"]["dropped_records"] for r in ranks)
    assert 0 < dropped < 2 * 16 and len(trained) + dropped == 200, (len(trained), dropped)
    warned = [line for line in log.splitlines() if "carried into an epoch that never ran" in line]
    assert warned and sum(int(w.split("dropped ")[1].split()[0]) for w in warned) == dropped, log
