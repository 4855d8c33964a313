"""The step agreement of PooledLoader and EqualSteps (tailcut._steps): its guards on
epochs and steps, equal steps over every rank of every host when the process group spans
hosts, and a rank whose next batch raises making the others raise instead of wait."""

import json
import multiprocessing
import os
import pathlib
import time

import pytest

import tailcut
from tailcut import _steps
from tailcut.pool import loader as pool_loader

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, ids_of, write_ids  # noqa: E402
from _pooled_hosts import equal_steps_host_rank, host_rank  # noqa: E402


def _remove(names):
    for name in names:
        tailcut.remove_batch_ring(name + ".pool")
        for path in (pool_loader.pool_spec_path(name + ".pool"),
                     pool_loader.pool_spec_path(name + ".pool")[:-len(".json")] + ".error"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass


def test_the_step_agreement_refuses_epochs_past_2_30_and_steps_past_2_32(tmp_path, qname):
    path = write_ids(tmp_path / "ids.bin", 64)
    with tailcut.WorkQueue([path], name=qname, format="fixed", record_bytes=RECORD,
                           on_notice=lambda line: None) as q:
        steps = _steps.StepAgreement(q, 0, 1, timeout=5, who="PooledLoader")
        assert steps.agree(0, 0, True) and not steps.agree(0, 1, False)
        # (epoch << 32) | step would run into the next epoch's steps: refused.
        with pytest.raises(ValueError, match=r"PooledLoader: more than 2\*\*32 steps"):
            steps.agree(1, 1 << 32, True)
        with pytest.raises(ValueError, match=r"PooledLoader: epoch 1073741824 is not in"):
            steps.agree(1 << 30, 0, True)


def test_a_pooled_loader_past_epoch_2_30_is_refused(tmp_path, qname, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    path = write_ids(tmp_path / "ids.bin", 64)
    ds = tt.QueueDataset([path], name=qname, format="fixed", record_bytes=RECORD)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, batch_size=16, slot_bytes=1 << 13, num_slots=2,
                             timeout=5)
    try:
        loader.epoch = 1 << 30  # set_epoch refuses it; a long job's counter gets there
        with pytest.raises(ValueError, match=r"PooledLoader: epoch must be below 2\*\*30"):
            next(iter(loader))
    finally:
        loader.close()
        ds.close()
        _remove([qname])


def run_hosts(tmp_path, job, works, local_world, limit_s=90, target=host_rank, **extra):
    """Runs len(works) * local_world spawned ranks of `target`; returns their logs."""
    world = len(works) * local_world
    args = dict(works=works, job=job, world=world, local_world=local_world, epochs=2,
                num_slices=12, init_file=str(tmp_path / "rendezvous"), out_dir=str(tmp_path),
                **extra)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + limit_s
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        assert not hung, f"ranks {hung} still running after {limit_s} s: a hang"
        assert [p.exitcode for p in procs] == [0] * world
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        _remove([f"{job}-h{h}" for h in range(len(works))])
    return [json.loads((pathlib.Path(tmp_path) / f"rank{r}.json").read_text())
            for r in range(world)]


def test_pooled_loaders_of_two_hosts_end_every_epoch_at_the_same_step(tmp_path, qname):
    """Host 0 has 3x the records of host 1: without the agreement over the
    process group, host 0's ranks run more steps and wait in an all_reduce that
    host 1's ranks never join (before: the job hung at the end of epoch 0)."""
    works = [[write_ids(tmp_path / "h0.bin", 1200)],
             [write_ids(tmp_path / "h1.bin", 400, first=1200)]]
    logs = run_hosts(tmp_path, qname, works, local_world=1)
    assert [log["error"] for log in logs] == [None, None], logs
    for e in range(2):
        steps = {log["epochs"][e]["report"]["steps"] for log in logs}
        assert len(steps) == 1 and steps.pop() > 0
        for host, (first, n) in enumerate([(0, 1200), (1200, 400)]):
            report = logs[host]["epochs"][e]["report"]
            ids = logs[host]["epochs"][e]["ids"]
            # Each host's records once: trained, or left over and reported.
            assert len(ids) == len(set(ids)) and set(ids) <= set(range(first, first + n))
            assert len(ids) + report["leftover_records"] == n
    assert logs[0]["epochs"][0]["report"]["leftover_records"] > 0  # host 0 had more


def test_a_rank_whose_batch_raises_makes_every_rank_of_every_host_raise(tmp_path, qname):
    """2 hosts x 2 ranks; rank 3 (host 1) raises for its batch of step 3. Its
    host's other rank raises the same exception (the pool's failure record), the
    ranks of host 0 raise RankFailed naming rank 3, all within seconds. Before,
    rank 3 only voted "no batch" on its host: host 0 went on to its next step's
    all_reduce and waited for host 1 until the process group timed out."""
    works = [[write_ids(tmp_path / "h0.bin", 800)],
             [write_ids(tmp_path / "h1.bin", 800, first=800)]]
    logs = run_hosts(tmp_path, qname, works, local_world=2, fail_rank=3, fail_at=3)
    assert [log["error"] for log in logs] == ["RankFailed", "RankFailed", "ZeroDivisionError",
                                             "ZeroDivisionError"], logs
    assert "rank 3 of the process group raised at epoch 0, step 3" in logs[0]["message"]
    assert "rank 3 fails at step 3" in logs[2]["message"]
    times = [log["at"] for log in logs]
    assert max(times) - min(times) < 5.0, times
    assert all(log["epochs"] == [] for log in logs)  # nobody finished an epoch


def test_a_rank_whose_batch_raises_makes_the_other_local_rank_raise_without_torch_distributed(
        tmp_path, qname):
    """2 local ranks, no process group: rank 1's batch of step 2 raises; rank 0
    raises the same exception (the pool's failure record), promptly. Before,
    rank 0 ended the epoch there and finished the job as if nothing happened."""
    path = write_ids(tmp_path / "ids.bin", 2000)
    out = tmp_path / "out"
    out.mkdir()

    def rank(r):
        os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        ds = tt.QueueDataset([path], name=qname, format="fixed", record_bytes=RECORD,
                             num_slices=20, num_epochs=1, shuffle_buffer=0, interleave=1)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=16, slot_bytes=1 << 13,
                                 num_slots=4, timeout=30, carry_over=False)
        if r == 1:
            given = [0]
            next_batch = loader._next

            def failing_next(epoch, report):
                if given[0] == 2:
                    raise ZeroDivisionError("rank 1 fails at step 2")
                given[0] += 1
                return next_batch(epoch, report)
            loader._next = failing_next
        result = dict(error=None, ids=[])
        try:
            for batch in loader:
                result["ids"] += ids_of(batch.numpy())
        except Exception as e:
            result.update(error=type(e).__name__, message=str(e), at=time.time())
        loader.close()
        ds.close()
        (out / f"rank{r}.json").write_text(json.dumps(result))

    pids = []
    for r in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rank(r)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    deadline = time.monotonic() + 60
    for pid in pids:
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                for p in pids:
                    try:
                        os.kill(p, 9)
                    except ProcessLookupError:
                        pass
                pytest.fail("a rank did not finish in 60 s")
            time.sleep(0.01)
    _remove([qname])
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["error"] for r in results] == ["ZeroDivisionError", "ZeroDivisionError"], results
    assert results[0]["message"] == "rank 1 fails at step 2"
    assert abs(results[0]["at"] - results[1]["at"]) < 5.0


def test_equal_steps_on_two_hosts_raise_everywhere_when_a_rank_s_loader_raises(tmp_path, qname):
    """EqualSteps through the same agreement: host 1's transform raises at its
    3rd batch; host 0's rank raises RankFailed naming rank 1 and the step.
    Before, host 1's vote stayed on its own host's queue: host 0 went on into
    the step's all_reduce and failed with gloo's "Connection closed by peer"
    once host 1's process was gone (or waited the group's timeout while it
    lived)."""
    works = [[write_ids(tmp_path / "h0.bin", 800)],
             [write_ids(tmp_path / "h1.bin", 800, first=800)]]
    logs = run_hosts(tmp_path, qname, works, local_world=1, target=equal_steps_host_rank,
                     fail_rank=1, fail_at=3)
    assert [log["error"] for log in logs] == ["RankFailed", "ZeroDivisionError"], logs
    assert "EqualSteps: rank 1 of the process group raised at epoch 0, step 2" in logs[0]["message"]
    assert abs(logs[0]["at"] - logs[1]["at"]) < 5.0
