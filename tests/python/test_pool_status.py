"""The pool status `tailcut top` shows (tailcut.pool._status): an autoscaled pool
publishes its decisions and a balanced one its ranks' shares, `tailcut top --once` shows
them under the ring, and nothing of it is left in /dev/shm after close(), after a
killed job's `tailcut clean`, when the loaders of a killed rank leave, or when the next
attempt opens the ring."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tailcut
from tailcut.pool import _status
from tailcut.pool._status import status_path

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, free_port, tailcut_cli, write_ids  # noqa: E402

HERE = Path(__file__).resolve().parent


def left_in_shm(name):
    return [f for f in os.listdir("/dev/shm") if name in f]


def top_once(name):
    run = subprocess.run([tailcut_cli(), "top", name, "--once"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=30)
    assert run.returncode == 0, run.stdout
    return run.stdout


def test_an_autoscaled_pool_shows_its_decisions_in_top_and_close_removes_them(
        rname, tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("TAILCUT_LOADER_CPUS", "3")  # sleeping loaders: past 2 CPUs less 1 rank
    ds = tt.QueueDataset([write_ids(tmp_path / "ids.bin", 3000)], name=rname, format="fixed",
                         record_bytes=RECORD, num_slices=60, num_clients=1)
    # 30 ms per batch in a loader, no time in the trainer: it starves, and loaders are added.
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=(1, 3), batch_size=20, transform=Slow(0.03),
                             slot_bytes=1 << 14, num_slots=4, rank=0, world_size=1,
                             local_rank=0, timeout=60)
    path = status_path(loader.name)
    writes = []
    write = _status.write_json
    monkeypatch.setattr(_status, "write_json", lambda *a: (writes.append(a), write(*a)))
    shown = None
    for _ in loader:
        if shown is None and not os.path.exists(path):
            pytest.fail("no status once the loaders started")
        if shown is None and loader.autoscale.decisions:
            shown = top_once(rname)
            status = json.loads(Path(path).read_text())
    loader_line = [line for line in shown.splitlines() if line.startswith("autoscale ")]
    made = status["autoscale"]["decisions"]
    assert made and made[-1]["action"] == "add", status
    after, before = made[-1]["after"], made[-1]["before"]
    assert loader_line and re.fullmatch(
        rf"autoscale {after} loaders \(min 1, max 3\): last \+{after - before} at "
        rf"\d\d:\d\d:\d\d \({before} -> {after}\), trainers waited \d+% of the last .*",
        loader_line[0]), shown
    # Under the ring's part, and the policy's own record agrees with the file.
    assert shown.index(f"ring {loader.name} ") < shown.index("autoscale "), shown
    assert made[-1]["why"] == loader.autoscale.decisions[len(made) - 1]["why"]
    assert "shares" not in shown
    # Written when the loaders started and after each decision, never per batch.
    assert len(writes) == 1 + len(loader.autoscale.decisions), writes
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    loader.close()
    ds.close()
    assert not os.path.exists(path)
    assert left_in_shm(loader.name) == []


def test_a_fixed_pool_without_balance_writes_no_status(rname, tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset([write_ids(tmp_path / "ids.bin", 200)], name=rname, format="fixed",
                         record_bytes=RECORD, num_slices=4, num_clients=1)
    with tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=20, slot_bytes=1 << 14, num_slots=4,
                         rank=0, world_size=1, local_rank=0, timeout=60) as loader:
        next(iter(loader))
        assert not os.path.exists(status_path(loader.name))
        assert not re.search(r"^(autoscale|shares|pool status)", top_once(rname), re.M)
    ds.close()


_KILLED_JOB = textwrap.dedent("""
    import sys, time
    import tailcut.torch as tt
    import tailcut.pool
    from _pool_helpers import Slow
    ds = tt.QueueDataset([sys.argv[1]], name=sys.argv[2], format="fixed", record_bytes=16,
                         num_slices=60, num_clients=1)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=(1, 2), batch_size=20, transform=Slow(0.01),
                             slot_bytes=1 << 14, num_slots=4, rank=0, world_size=1,
                             local_rank=0, timeout=60)
    next(iter(loader))
    print("ready", flush=True)
    time.sleep(120)
""")


def start_killed_job(tmp_path, name, kill_loaders=True):
    """A job whose autoscaled pool wrote its status, then its rank SIGKILLed, and first its
    loaders too (kill_loaders): no clean-up of the job's own ran. Returns the ring's name."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), str(HERE)]), LOCAL_WORLD_SIZE="1")
    job = subprocess.Popen([sys.executable, "-c", _KILLED_JOB,
                            write_ids(tmp_path / "ids.bin", 3000), name],
                           stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert job.stdout.readline() == "ready\n"
        ring = name + ".pool"
        assert os.path.exists(status_path(ring))
        for c in tailcut.inspect_batch_ring(ring)["clients"]:
            if kill_loaders and c["role"] == "loader" and c["alive"]:
                os.kill(c["pid"], signal.SIGKILL)
    finally:
        job.kill()
        job.wait()
        job.stdout.close()
    return ring


def test_loaders_whose_rank_was_killed_remove_the_status_with_the_pool(rname, tmp_path):
    ring = start_killed_job(tmp_path, rname, kill_loaders=False)
    deadline = time.monotonic() + 10
    while os.path.exists(status_path(ring)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(status_path(ring))  # the loaders' parent watch removed the pool
    tailcut.remove_queue(rname, force=True)  # kept by design: a process of it died
    assert left_in_shm(rname) == []


def test_tailcut_clean_removes_the_status_a_killed_job_left(rname, tmp_path):
    ring = start_killed_job(tmp_path, rname)
    assert os.path.exists(status_path(ring))
    run = subprocess.run([tailcut_cli(), "clean", rname], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=30)
    assert run.returncode == 0, run.stdout
    assert f"removed pool status {status_path(ring)} (its ring is gone)" in run.stdout
    assert left_in_shm(rname) == []


def test_the_next_attempt_removes_the_status_a_killed_one_left(rname, tmp_path, monkeypatch):
    ring = start_killed_job(tmp_path, rname)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    tailcut.remove_queue(rname, force=True)
    ds = tt.QueueDataset([str(tmp_path / "ids.bin")], name=rname, format="fixed",
                         record_bytes=RECORD, num_slices=4, num_clients=1)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=20, slot_bytes=1 << 14, num_slots=4,
                             rank=0, world_size=1, local_rank=0, timeout=60)
    assert not os.path.exists(status_path(ring))  # fenced with the dead attempt's ring
    next(iter(loader))
    loader.close()
    ds.close()
    assert left_in_shm(rname) == []


def test_a_balanced_job_shows_its_ranks_shares_and_speeds_in_top(tmp_path):
    name = f"status-balance-{os.getpid()}-{time.time_ns()}"
    data = write_ids(tmp_path / "ids.bin", 480)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}",
           "--nproc_per_node=2", "--redirects", "1", "--tee", "2",
           str(HERE / "_status_job.py"), data, str(tmp_path), name, tailcut_cli(), "2"]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["top_status"] == 0, result["top"]
    fast, slow = result["shares"]
    assert slow < fast and fast + slow == 16, result  # the slow rank took fewer records
    line = [s for s in result["top"].splitlines() if s.startswith("shares")]
    assert line and re.fullmatch(
        rf"shares  r0 {fast}  r1 {slow} records/step \(speeds r0 (\d+)  r1 (\d+) records/s, "
        rf"decided at step \d+, \d\d:\d\d:\d\d\)", line[0]), result["top"]
    speeds = [int(v) for v in re.findall(r"r\d (\d+)", line[0].split("speeds")[1])]
    assert speeds[1] < speeds[0], line  # the slow rank measured slower
    assert "autoscale" not in result["top"]
    assert left_in_shm(name) == []
