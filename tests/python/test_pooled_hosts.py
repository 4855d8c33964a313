"""PooledLoaders of a job on several nodes: two nodes of two ranks under torchrun, a pool and a
queue per node, end every epoch at the same step (also with a loader of one node killed), with
a static split of the files and with each node's queue fed by a coordinator (a redis-server of
the test's own, the nodes told apart by TAILCUT_HOST_ID)."""

import collections
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tailcut

torch = pytest.importorskip("torch")

from test_global import REDIS, redis_url  # noqa: E402,F401 (the fixture)


# ---- Two nodes under torchrun ------------------------------------------------------------------

HERE = pathlib.Path(__file__).resolve().parent
# 8-byte records, each its id, in 8 files, every other one to a node: node 0 gets 48,000
# records, node 1 32,000, so that node 1's ranks run out first in every epoch.
FILE_RECORDS = [12_000, 8_000] * 4
NODES, PER_NODE, EPOCHS = 2, 2, 2


def file_ids(f):
    first = sum(FILE_RECORDS[:f])
    return range(first, first + FILE_RECORDS[f])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(tmp_path, job, kill_a_loader_of_node_1=False, limit_s=150, coordinator=None):
    """Runs torchrun --nnodes 2 twice (one per node) on this machine; returns the
    ranks' logs and the pid of the loader killed, if any. With a coordinator
    (URL), the nodes' queues are fed by it, node n as host 'n<n>'."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    for f in range(len(FILE_RECORDS)):
        np.array(file_ids(f), dtype=np.int64).tofile(data / f"part-{f}.bin")
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    fed = {}
    if coordinator is not None:
        fed = dict(TAILCUT_COORDINATOR=coordinator)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node_rank",
         str(n), f"--nproc_per_node={PER_NODE}", "--rdzv_backend", "c10d", "--rdzv_endpoint",
         f"127.0.0.1:{port}", "--rdzv_id", job, "--redirects", "1", "--tee", "2",
         "--monitor_interval=0.2", str(HERE / "_pooled_nodes_job.py"), str(data), str(out),
         str(EPOCHS), job, "0.002"] + (["fed"] if fed else []),
        env=dict(env, **fed, **(dict(TAILCUT_HOST_ID=f"n{n}") if fed else {})),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for n in range(NODES)]
    killed = None
    deadline = time.monotonic() + limit_s
    try:
        if kill_a_loader_of_node_1:
            # Mid-epoch 0 on node 1 (its local rank 0 is rank 2 or 3, whichever
            # the rendezvous made it): one of its two loaders SIGKILLed.
            while time.monotonic() < deadline and killed is None:
                progress = [int((out / f"progress-{r}").read_text() or 0)
                            for r in range(NODES * PER_NODE) if (out / f"progress-{r}").exists()]
                loaders = out / "loaders-n1"
                if progress and max(progress) >= 100 and loaders.exists() and loaders.read_text():
                    killed = int(loaders.read_text().split()[0])
                    os.kill(killed, signal.SIGKILL)
                time.sleep(0.01)
        logs = []
        for p in procs:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(text)
            assert p.returncode == 0, text[-4000:]
    finally:
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if hung:  # a failed job: what it left is removed (orphaned loaders exit on their own)
            time.sleep(3)
            for node in range(NODES):
                name = f"{job}.n{node}"
                tailcut.remove_batch_ring(name + ".pool")
                for path in pathlib.Path("/dev/shm").glob(f"tailcut-pool.*.{name}.pool.*"):
                    path.unlink()
                try:
                    tailcut.remove_queue(name, force=True)
                except tailcut.NotFoundError:
                    pass
    return [json.loads((out / f"rank-{r}.json").read_text())
            for r in range(NODES * PER_NODE)], killed


def check_nodes(ranks, job, repeats_allowed=0):
    """Equal steps on every rank of every node in each epoch; each node's
    records once per epoch (trained or dropped and reported), apart from
    repeats_allowed records repeated by a killed loader; nothing left."""
    for e in range(EPOCHS):
        steps = {r["epochs"][e]["steps"] for r in ranks}
        assert len(steps) == 1 and min(steps) > 0, [r["epochs"][e]["steps"] for r in ranks]
        for node in range(NODES):
            mine = [r["epochs"][e] for r in ranks if r["node"] == node]
            seen = collections.Counter(i for r in mine for i in r["ids"] + r["dropped"])
            expected = {i for f in range(node, len(FILE_RECORDS), NODES) for i in file_ids(f)}
            assert set(seen) == expected, (e, node, len(set(seen)), len(expected))
            assert sum(seen.values()) - len(seen) <= repeats_allowed, (e, node)
            assert sum(len(r["dropped"]) for r in mine) == sum(
                r["report"]["dropped_records"] for r in mine)
            print(f"epoch {e}: {min(steps)} steps on every rank; node {node}: "
                  f"{sum(len(r['ids']) for r in mine)} records trained, "
                  f"{sum(len(r['dropped']) for r in mine)} left over and reported, "
                  f"{sum(seen.values()) - len(seen)} twice")
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left


@pytest.mark.parametrize("kill", [False, True], ids=["clean", "a_loader_of_node_1_killed"])
def test_two_nodes_under_torchrun_end_every_epoch_at_the_same_step(tmp_path, kill):
    """2 nodes x 2 ranks, node 1's steps slower, each node a pool over its share
    of the files (node 0 has 1.5x node 1's records): the job ends, every rank ran
    the same steps in each epoch, each node's records once per epoch (trained, or
    left over and reported), nothing left in /dev/shm or running. Killed: one of
    node 1's two loaders SIGKILLed mid-epoch; the other reads its items again (at
    most one batch repeated). Before, the pools agreed per node: node 0's ranks
    ran on after node 1's ended the epoch, and the job hung in an all_reduce
    (the test's 150 s limit)."""
    job = f"pytest-nodes-{os.getpid()}-{int(kill)}"
    ranks, killed = run_nodes(tmp_path, job, kill_a_loader_of_node_1=kill)
    assert (killed is not None) == kill
    check_nodes(ranks, job, repeats_allowed=64 if kill else 0)


def check_fed_nodes(ranks, job, repeats_allowed=0):
    """Equal steps on every rank of every node in each epoch; every record of
    the job once per epoch across the nodes (trained or left over and
    reported), apart from repeats_allowed records repeated by a killed loader;
    both nodes took part; nothing left."""
    every = {i for f in range(len(FILE_RECORDS)) for i in file_ids(f)}
    for e in range(EPOCHS):
        steps = {r["epochs"][e]["steps"] for r in ranks}
        assert len(steps) == 1 and min(steps) > 0, [r["epochs"][e]["steps"] for r in ranks]
        seen = collections.Counter(i for r in ranks for i in r["epochs"][e]["ids"] +
                                   r["epochs"][e]["dropped"])
        assert set(seen) == every, (e, len(set(seen)), len(every))
        assert sum(seen.values()) - len(seen) <= repeats_allowed, e
        for r in ranks:
            assert len(r["epochs"][e]["dropped"]) == r["epochs"][e]["report"]["dropped_records"]
        trained = [sum(len(r["epochs"][e]["ids"]) for r in ranks if r["node"] == node)
                   for node in range(NODES)]
        assert min(trained) > 0, trained
        print(f"epoch {e}: {min(steps)} steps on every rank; records trained per node "
              f"{trained}, {sum(len(r['epochs'][e]['dropped']) for r in ranks)} left over and "
              f"reported, {sum(seen.values()) - len(seen)} twice")
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
@pytest.mark.parametrize("kill", [False, True], ids=["clean", "a_loader_of_node_1_killed"])
def test_two_nodes_fed_by_a_coordinator_end_every_epoch_at_the_same_step(  # noqa: F811
        redis_url, tmp_path, kill):
    """2 nodes x 2 ranks, node 1's steps slower, each node a pool over its own
    queue fed by one coordinator (TAILCUT_HOST_ID=n0|n1), 2 epochs: the job
    ends, every rank ran the same steps in each epoch, every record of the job
    once per epoch across the nodes (trained, or left over and reported),
    nothing left in /dev/shm or running. Killed: one of node 1's two loaders
    SIGKILLed mid-epoch; the other reads its items again (at most one batch
    repeated). Before, PooledLoader refused a fed queue: its loaders ended an
    epoch once the host's queue acked every item of it, and a host acks only
    its share."""
    job = f"pytest-fed-{os.getpid()}-{int(kill)}"
    ranks, killed = run_nodes(tmp_path, job, kill_a_loader_of_node_1=kill,
                              coordinator=redis_url)
    assert (killed is not None) == kill
    check_fed_nodes(ranks, job, repeats_allowed=64 if kill else 0)
