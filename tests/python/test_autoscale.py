"""Loader autoscaling (tailcut.pool.Autoscale): PooledLoader(loaders_per_host=(min, max)) adds
loaders when the trainers starve and removes them when the ring stays full, with real loader
processes, and every record still comes once per epoch."""

import gc
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tailcut
from tailcut import pool

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, fork, wait_ok, write_ids  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def ids_dataset(tmp_path, name, n, epochs=1):
    """A queue of n such records in 60 items."""
    return tt.QueueDataset([write_ids(tmp_path / "ids.bin", n)], name=name, format="fixed", record_bytes=RECORD,
                           num_slices=60, num_epochs=epochs, num_clients=1)


def one_rank(ds, monkeypatch, num_workers, transform):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return tailcut.pool.PooledLoader(ds, loaders_per_host=num_workers, batch_size=20, transform=transform,
                           slot_bytes=1 << 14, num_slots=4, rank=0, world_size=1, local_rank=0,
                           timeout=60)


def ids_of(batch):
    return np.ascontiguousarray(batch.numpy()[:, :8]).view(np.uint64).ravel().tolist()


def decisions_logged(caplog):
    return [r.getMessage() for r in caplog.records if "autoscale of ring" in r.getMessage()]


def test_starving_trainers_get_more_loaders_up_to_max(rname, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="tailcut.pool")
    n = 3000
    ds = ids_dataset(tmp_path, rname, n)
    # The loaders sleep: they may take 3 CPUs of this 2-core machine (the default limit,
    # CPUs less ranks, is 1 here).
    monkeypatch.setenv("TAILCUT_LOADER_CPUS", "3")
    # 30 ms per batch in a loader, no time in the trainer: it starves with any 3 loaders.
    loader = one_rank(ds, monkeypatch, (1, 3), Slow(0.03))
    assert loader.loaders_per_host == 1 and loader.autoscale.maximum == 3
    ids, most = [], 0
    for batch in loader:
        ids += ids_of(batch)
        most = max(most, len(loader.live_loaders()))
    assert sorted(ids) == list(range(n))
    assert most == 3 and len(loader.loaders) == 3  # up to max, never past it
    made = loader.autoscale.decisions
    assert [d["action"] for d in made] == ["add"] * len(made) and made[-1]["loaders"] == 3
    logged = decisions_logged(caplog)
    # Once per decision, and once for starving at max (not once per look).
    assert len(logged) == len(made) + 1, logged
    assert "trainers waited" in logged[0] and "adding" in logged[0], logged
    assert "starving at the maximum of 3 loaders" in logged[-1], logged
    # The policy holds no reference to its PooledLoader: dropping it ends the pool at once,
    # as close() does, with no wait for the garbage collector.
    loaders, ring = loader.loaders, loader.name
    gc.disable()
    try:
        del loader, batch
        with pytest.raises(tailcut.NotFoundError):
            tailcut.inspect_batch_ring(ring)
    finally:
        gc.enable()
    assert [p.exitcode for p in loaders] == [0, 0, 0]
    ds.close()


def test_an_over_provisioned_job_ends_its_warm_up_with_fewer_loaders(rname, tmp_path,
                                                                      monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="tailcut.pool")
    n = 6000
    ds = ids_dataset(tmp_path, rname, n, epochs=2)  # one run: its loaders wait for epoch 1
    scale = pool.Autoscale(1, 4, window=0.25, full_for=0.4, cooldown=0.2)
    loader = one_rank(ds, monkeypatch, scale, None)
    loader.add_loaders(3)  # with the one the first iteration starts: 4, for a slow trainer
    ids, down_at = [], None
    for step, batch in enumerate(loader):
        if step == 0:
            assert len(loader.live_loaders()) == 4
        if down_at is None and len(loader.live_loaders()) == 1:
            down_at = step
        ids += ids_of(batch)
        time.sleep(0.01)  # the training step; a loader makes a batch in far less
    assert sorted(ids) == list(range(n))
    # Down to min well before the epoch's end (300 steps, 3.3 s), and not below it.
    assert down_at is not None and down_at < 250, (down_at, scale.decisions)
    assert len(loader.live_loaders()) == 1
    made = scale.decisions
    assert made and all(d["action"] == "remove" for d in made), made
    assert made[-1]["loaders"] == 1
    logged = decisions_logged(caplog)
    assert len(logged) == len(made) and "the ring stayed full for" in logged[0], logged
    assert "loaders waited" in logged[0] and "removing" in logged[0], logged
    loader.close()
    assert all(p.exitcode == 0 for p in loader.loaders)  # those removed left, not killed
    ds.close()


def test_a_starving_pool_reaches_the_loaders_it_needs_in_one_decision_within_a_second(
        rname, tmp_path, monkeypatch):
    # A loader makes a batch in 40 ms (25 per second), the trainer takes one every 10 ms
    # (100 per second): 4 loaders feed it, and one decision from 1 should reach them.
    n = 8000
    ds = ids_dataset(tmp_path, rname, n)
    loader = one_rank(ds, monkeypatch, pool.Autoscale(1, 8, cpus=8), Slow(0.04))
    ids, first = [], None
    for batch in loader:
        if first is None:
            first = time.time()  # the first batch: the policy's window starts with it
        ids += ids_of(batch)
        time.sleep(0.01)
    assert sorted(ids) == list(range(n))
    made = loader.autoscale.decisions
    assert made and made[0]["action"] == "add", made
    assert made[0]["loaders"] >= 4, made  # the need in one decision, not steps of a few
    assert made[0]["time"] - first <= 1.0, (made[0]["time"] - first, made)
    assert not [d for d in made[1:] if d["action"] == "add" and d["time"] - first < 2.0], made
    loader.close()
    ds.close()


def test_by_default_the_pool_takes_no_more_loaders_than_cpus_less_ranks(
        rname, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="tailcut.pool")
    monkeypatch.delenv("TAILCUT_LOADER_CPUS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    n = 3000
    ds = ids_dataset(tmp_path, rname, n)
    # 1 rank of a starving job: the limit is the CPUs less that rank (at least min, 1).
    loader = one_rank(ds, monkeypatch, (1, cpus + 2), Slow(0.03))
    most = 0
    for batch in loader:
        most = max(most, len(loader.live_loaders()))
    limit = max(cpus - 1, 1)
    assert most == limit, (most, loader.autoscale.decisions)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "autoscale" in r.getMessage()]
    assert len(warned) == 1 and f"starving at the CPU limit of {limit} loader" in warned[0], warned
    assert f"({cpus} CPUs less 1 local rank)" in warned[0], warned
    assert "cpus=N) or $TAILCUT_LOADER_CPUS=N" in warned[0], warned
    loader.close()
    ds.close()


def test_bad_autoscale_arguments_are_refused_with_the_fix(rname, tmp_path, monkeypatch):
    ds = ids_dataset(tmp_path, rname, 100)
    refused = [
        ((2, 1), tailcut.InvalidArgumentError, "min 2 is above max 1: give 1 <= min <= max"),
        ((0, 2), tailcut.InvalidArgumentError, "loaders_per_host=(min, max): min must be an int >= 1"),
        ((1.5, 2), TypeError, "min must be an int >= 1, got 1.5 (float)"),
        ((1, "8"), TypeError, "max must be an int >= 1, got '8' (str)"),
        ((1, 64), tailcut.InvalidArgumentError, "max 64 is more loaders than the ring holds: "
                                                "give max <= 63"),
        ((True, 2), TypeError, "min must be an int >= 1, got True (bool)"),
        ((1, 2, 3), TypeError, "loaders_per_host must be an int or (min, max), got (1, 2, 3)"),
        (1.0, TypeError, "loaders_per_host must be an int >= 0, got 1.0 (float)"),
    ]
    for workers, error, text in refused:
        with pytest.raises(error) as e:
            one_rank(ds, monkeypatch, workers, None)
        assert text in str(e.value), (workers, str(e.value))
    with pytest.raises(tailcut.InvalidArgumentError, match=r"starve must be a share of time"):
        pool.Autoscale(1, 2, starve=1.0)
    with pytest.raises(tailcut.InvalidArgumentError, match=r"interval must be a number of "):
        pool.Autoscale(1, 2, interval=0)
    with pytest.raises(tailcut.InvalidArgumentError, match="give max <= 63"):
        one_rank(ds, monkeypatch, pool.Autoscale(1, 64), None)
    with pytest.raises(TypeError, match=r"cpus must be an int >= 1 or None, got 2.5"):
        pool.Autoscale(1, 2, cpus=2.5)
    monkeypatch.setenv("TAILCUT_LOADER_CPUS", "0")
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=r"\$TAILCUT_LOADER_CPUS must be an int >= 1 .* got '0'"):
        one_rank(ds, monkeypatch, (1, 2), None)
    ds.close()


def test_every_record_comes_once_per_epoch_while_loaders_come_and_go(rname, tmp_path,
                                                                      monkeypatch):
    n, epochs = 3000, 2
    ds = ids_dataset(tmp_path, rname, n, epochs)
    scale = pool.Autoscale(1, 4, full_for=0.6, cooldown=0.3, cpus=4)
    loader = one_rank(ds, monkeypatch, scale, Slow(0.02))
    removed_mid_epoch, known = False, 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        ids = []
        for batch in loader:
            made, known = scale.decisions[known:], len(scale.decisions)  # before this batch
            if any(d["action"] == "remove" for d in made):
                removed_mid_epoch |= ds.queue.summary()["done"] % ds.queue.num_items != 0
            ids += ids_of(batch)
            # Epoch 0: a trainer with no step time starves, and loaders are added; epoch 1:
            # a 30 ms step, slower than 4 loaders at 20 ms per batch, and loaders are removed.
            if epoch == 1:
                time.sleep(0.03)
        assert sorted(ids) == list(range(n)), f"epoch {epoch}"  # each record once
        assert loader.reports[-1]["leftover_records"] == 0
    actions = [d["action"] for d in scale.decisions]
    assert "add" in actions and actions[-1] == "remove", scale.decisions
    assert removed_mid_epoch, scale.decisions
    assert ds.queue.summary()["recovered_items"] == 0  # nothing read twice: none was killed
    loader.close()
    assert all(p.exitcode == 0 for p in loader.loaders)
    ds.close()


def test_a_killed_loader_is_replaced_when_the_trainers_starve_and_no_record_is_lost(
        rname, tmp_path, monkeypatch):
    n = 3000
    ds = ids_dataset(tmp_path, rname, n)
    loader = one_rank(ds, monkeypatch, pool.Autoscale(1, 2, cooldown=0.3, cpus=2), Slow(0.03))
    ids, killed = [], None
    for batch in loader:
        ids += ids_of(batch)
        if killed is None and len(loader.live_loaders()) == 2 and len(ids) >= 600:
            killed = loader.live_loaders()[0]
            os.kill(killed.pid, signal.SIGKILL)
            killed.join(10)
    assert killed is not None and killed.exitcode == -signal.SIGKILL
    assert set(ids) == set(range(n))  # nothing lost: its items went to the others
    # Its items are read again whole: what it had published of them comes twice (at least
    # once), at most the items it held (50 records each).
    assert len(ids) - n <= 2 * 50, len(ids) - n
    made = [(d["action"], d["loaders"]) for d in loader.autoscale.decisions]
    assert made[:1] == [("add", 2)] and ("add", 2) in made[1:], made  # added, then replaced
    loader.close()
    assert sorted(p.exitcode for p in loader.loaders) == [-signal.SIGKILL, 0, 0]
    ds.close()


def test_only_local_rank_0_scales_and_forked_ranks_get_every_record_once(rname, tmp_path):
    n = 2000
    path = write_ids(tmp_path / "ids.bin", n)

    def rank(r):
        os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                          TAILCUT_LOADER_CPUS="3")
        ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD,
                             num_slices=40)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=(1, 3), batch_size=20, transform=Slow(0.03),
                                 slot_bytes=1 << 14, num_slots=4, timeout=60)
        ids = [i for batch in loader for i in ids_of(batch)]
        rep = loader.reports[-1]
        head = [rep["steps"], rep["leftover_records"], len(loader.autoscale.decisions),
                len(loader.loaders)]
        loader.close()
        ds.close()
        (tmp_path / f"rank{r}").write_text(" ".join(map(str, head + ids)))

    for pid in [fork(lambda r=r: rank(r)) for r in range(2)]:
        wait_ok(pid, timeout=120)
    rows = [[int(x) for x in (tmp_path / f"rank{r}").read_text().split()] for r in range(2)]
    assert rows[0][0] == rows[1][0] > 0  # equal steps
    assert rows[0][2] > 0 and rows[0][3] > 1  # rank 0 decided and added loaders ...
    assert rows[1][2] == 0 and rows[1][3] == 0  # ... rank 1 started none and never looked
    ids = rows[0][4:] + rows[1][4:]
    assert len(set(ids)) == len(ids) and len(ids) + rows[0][1] + rows[1][1] == n


def test_the_autoscale_demo_scales_a_starving_job_and_keeps_every_record_once():
    demo = ROOT / "bench" / "pool" / "autoscale.py"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pathlib.Path(tailcut.__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, str(demo), "--demo", "--records", "3000"],
                         env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "autoscale of ring 'autoscale-" in out and "adding" in out, out
    assert out.count("every record once") == 2, out
