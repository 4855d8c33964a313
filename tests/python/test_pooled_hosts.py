"""PooledLoaders of a job on several nodes: two nodes of two ranks under torchrun, a pool and a
queue per node, end every epoch at the same step (also with a loader of one node killed), with
a static split of the files and with each node's queue fed by a coordinator (a redis-server of
the test's own, the nodes told apart by TAILCUT_HOST_ID)."""

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tailcut

torch = pytest.importorskip("torch")

from _pool_helpers import free_port, jsonl_lines  # noqa: E402
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


def write_data(tmp_path):
    """DATA_DIR (the files) and an empty OUT_DIR under tmp_path."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    for f in range(len(FILE_RECORDS)):
        np.array(file_ids(f), dtype=np.int64).tofile(data / f"part-{f}.bin")
    return data, out


def start_nodes(data, out, job, run=None, extra=(), coordinator=None, slow=0.002, nodes=NODES):
    """torchrun --nnodes `nodes` once per node (each in a session of its own)
    on this machine, rendezvous `run` (default: job); with a coordinator
    (URL), the nodes' queues are fed by it, node n as host 'n<n>'."""
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    fed = {}
    if coordinator is not None:
        fed = dict(TAILCUT_COORDINATOR=coordinator)
    return [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank",
         str(n), f"--nproc_per_node={PER_NODE}", "--rdzv_backend", "c10d", "--rdzv_endpoint",
         f"127.0.0.1:{port}", "--rdzv_id", run or job, "--redirects", "1", "--tee", "2",
         "--monitor_interval=0.2", str(HERE / "_pooled_nodes_job.py"), str(data), str(out),
         str(EPOCHS), job, str(slow)] + (["fed"] if fed else []) + list(extra),
        env=dict(env, **fed, **(dict(TAILCUT_HOST_ID=f"n{n}") if fed else {})),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for n in range(nodes)]


def remove_dead_rings(job, nodes=NODES):
    """What a killed job left of its pools: each node's ring (whose ready
    batches a rerun must not pop) and pool description."""
    for node in range(nodes):
        name = f"{job}.n{node}"
        tailcut.remove_batch_ring(name + ".pool")
        for path in pathlib.Path("/dev/shm").glob(f"tailcut-pool.*.{name}.pool.*"):
            path.unlink()


def remove_nodes_queues(job, nodes=NODES):
    """What a killed or failed job left: its pools and each node's queue."""
    remove_dead_rings(job, nodes)
    for node in range(nodes):
        name = f"{job}.n{node}"
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass


def run_nodes(tmp_path, job, kill_a_loader_of_node_1=False, limit_s=150, coordinator=None,
              extra=(), slow=0.002, no_process_left=False):
    """Runs the job on two nodes (start_nodes); returns the ranks' logs and
    the pid of the loader killed, if any. no_process_left: also checks that
    no process of either launch (torchrun, ranks, loaders) outlives it."""
    data, out = write_data(tmp_path)
    procs = start_nodes(data, out, job, coordinator=coordinator, extra=extra, slow=slow)
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
        if no_process_left:
            for p in procs:
                assert not group_alive(p.pid), "a process of the job outlived it"
    finally:
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if hung:  # a failed job: what it left is removed (orphaned loaders exit on their own)
            time.sleep(3)
            remove_nodes_queues(job)
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


def coordinator_of(request, fed):
    """The URL of a redis-server of the test's own where `fed`, else None;
    skips a fed case where redis-server is not installed."""
    if not fed:
        return None
    if REDIS is None:
        pytest.skip("redis-server is not installed")
    return request.getfixturevalue("redis_url")


@pytest.mark.parametrize("fed", [False, True], ids=["static_split", "fed"])
def test_two_nodes_of_a_map_style_dataset_end_every_epoch_at_the_same_step(request, tmp_path,
                                                                            fed):
    """The same job over a map-style dataset (dataset[i] an id), through
    PooledLoader(dataset, ...) and its index queue: node n's share of the ids
    (static_split), or every id with the index queue fed by a coordinator
    (fed). Equal steps, every id once per epoch (trained or left over and
    reported), nothing left."""
    coordinator = coordinator_of(request, fed)
    job = f"pytest-map-nodes-{os.getpid()}-{int(fed)}"
    ranks, _ = run_nodes(tmp_path, job, coordinator=coordinator, extra=["--map"])
    (check_fed_nodes if fed else check_nodes)(ranks, job)


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_two_nodes_fed_by_a_coordinator_shuffle_records_globally_every_record_once(  # noqa: F811
        redis_url, tmp_path):
    """QueueDataset(files, shuffle="global") on 2 nodes x 2 ranks, one queue over
    all the files (an index work over the records' numbers) fed to the nodes'
    queues by a coordinator, a pool per node, node 1's steps slower, 2 epochs:
    equal steps on every rank, every record of the job once per epoch across
    the nodes (trained, or left over and reported), each rank's first batch of
    an epoch drawn from across the files (the files hold ids in order), nothing
    left in /dev/shm or running."""
    job = f"pytest-global-nodes-{os.getpid()}"
    ranks, _ = run_nodes(tmp_path, job, coordinator=redis_url, extra=["--global"],
                         no_process_left=True)
    check_fed_nodes(ranks, job)
    starts = np.cumsum([0] + FILE_RECORDS)
    for r in ranks:
        for e in range(EPOCHS):
            first = r["epochs"][e]["ids"][:64]
            files = set(np.searchsorted(starts, first, side="right").tolist())
            # 64 draws over 8 files of 10-15 % each: missing 3 has p < 1e-6.
            assert len(files) >= 6, (r["node"], e, sorted(files))


@pytest.mark.parametrize("fed", [False, True], ids=["static_split", "fed"])
def test_two_nodes_with_balanced_shares_end_every_epoch_at_the_same_step(request, tmp_path, fed):
    """balance=True on 2 nodes x 2 ranks, a pool per node, node 1's ranks
    slower per record: the shares move to node 0's ranks (each host's ring
    feeds its own ranks' shares), equal steps on every rank, every record
    once per epoch (trained, or left over and reported), nothing left. With a
    static split most of node 1's records are left over (its ranks take
    little and node 0 runs out first: measured 24,256 of 32,000 per epoch);
    fed by a coordinator the records follow the shares, and what is left over
    is what node 1's loaders hold when node 0 runs out (10,624 of 80,000)."""
    coordinator = coordinator_of(request, fed)
    job = f"pytest-balance-nodes-{os.getpid()}-{int(fed)}"
    ranks, _ = run_nodes(tmp_path, job, extra=["--balance"], slow=0.006,
                         coordinator=coordinator)
    (check_fed_nodes if fed else check_nodes)(ranks, job)
    shares = ranks[0]["epochs"][-1]["shares"]
    assert all(r["epochs"][-1]["shares"] == shares for r in ranks)  # every rank agrees
    fast = [s for r, s in zip(ranks, shares) if r["node"] == 0]
    slow = [s for r, s in zip(ranks, shares) if r["node"] == 1]
    assert sum(shares) == 4 * 64 and min(fast) > max(slow), shares
    left = [sum(len(r["epochs"][e]["dropped"]) for r in ranks) for e in range(EPOCHS)]
    print(f"shares at the end (records per step by rank): {shares}; left over per epoch: {left}")


# ---- Checkpoints of a job on two nodes ---------------------------------------------------------


def group_alive(pgid):
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getpgid(int(d)) == pgid:
                    return True
            except ProcessLookupError:
                pass
    return False


def kill_nodes(procs):
    """SIGKILLs every process of both launches (torchrun, ranks, loaders)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    logs = ["" if p.stdout.closed else p.communicate()[0] or "" for p in procs]
    deadline = time.monotonic() + 30
    for p in procs:
        while group_alive(p.pid):
            assert time.monotonic() < deadline, "a process of the killed job is still running"
            time.sleep(0.05)
    return logs


def step_lines(out, ranks=NODES * PER_NODE):
    lines = []
    for r in range(ranks):
        path = out / f"steps-{r}.jsonl"
        if path.exists():
            lines += [dict(line, rank=r) for line in jsonl_lines(path)]
    return lines


def check_restored_nodes(out, killed_run, cut, job, fed=False, ranks=NODES * PER_NODE,
                         killed_ranks=NODES * PER_NODE):
    """Per epoch and node: what the killed run trained up to its checkpoint
    `cut` ((epoch, step)) and the leftovers of the epochs it ended before it,
    plus what the resumed run trained and left over, is each of the node's
    records exactly once (fed: each record of the job, over every node); every
    one of the resumed run's `ranks` ran the same steps in each epoch; nothing
    left."""
    lines = [line for line in step_lines(out, max(ranks, killed_ranks)) if "ckpt" not in line]
    for e in range(EPOCHS):
        steps = collections.defaultdict(int)
        for node in [None] if fed else range(NODES):
            seen = collections.Counter()
            for line in lines:
                if line["epoch"] != e or node not in (None, line["node"]):
                    continue
                if line["run"] == killed_run and (
                        ("dropped" in line and e >= cut[0]) or
                        ("dropped" not in line and (e, line["step"]) > cut)):
                    continue  # after the checkpoint: trained again after the restore
                seen.update(line["ids"])
                if line["run"] != killed_run and "dropped" not in line:
                    steps[line["rank"]] = max(steps[line["rank"]], line["step"])
            files = range(len(FILE_RECORDS)) if fed else range(node, len(FILE_RECORDS), NODES)
            expected = {i for f in files for i in file_ids(f)}
            missing, extra = expected - set(seen), set(seen) - expected
            twice = [i for i, c in seen.items() if c > 1]
            assert not missing and not extra and not twice, (
                f"epoch {e}, node {node} (checkpoint at {cut}): {len(missing)} records neither "
                f"trained nor left over, {len(twice)} twice, {len(extra)} of another node")
        if e >= cut[0]:
            assert len(steps) == ranks and len(set(steps.values())) == 1, (e, steps)
        print(f"epoch {e}: every record of {'the job' if fed else 'each node'} once "
              f"(checkpoint at {cut}); steps after the restore {sorted(set(steps.values()))}")
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left


@pytest.mark.parametrize("when", ["mid_epoch", "epoch_end", "mid_epoch_map_style",
                                  "mid_epoch_fed", "epoch_end_fed", "mid_epoch_fed_map_style"])
def test_two_nodes_killed_after_a_checkpoint_resume_every_record_once(request, tmp_path, when):
    """2 nodes x 2 ranks under two torchrun launches, a queue and a pool per
    node, node 1's steps slower. Every rank calls loader.state_dict() every 40
    steps (mid_epoch) or at epoch ends only (epoch_end) and rank 0 saves it;
    0.1 s after the first such checkpoint both launches are SIGKILLed (torchrun,
    ranks, loaders) and the dead rings removed; then both rerun with the same
    two lines on every node (restore_state=state['queue'], load_state_dict).
    Every record of each node once per epoch across the two runs (trained up to
    the checkpoint, or after it; or left over and reported), equal steps,
    nothing left in /dev/shm or running. Before, state_dict() refused a job
    that spans hosts and no checkpoint was written. mid_epoch_map_style: the
    same over a map-style dataset, whose index queue picks its host's entry
    from the state as QueueDataset does. fed: one queue over all the files,
    fed to the nodes by a coordinator (mid-epoch, at an epoch end, over a
    map-style dataset); every record of the job once per epoch across the
    nodes. Before, state_dict() refused a fed pool: the
    coordinator's state marks whole items done, and items of the batches not
    yet used were done there."""
    job = f"pytest-nodes-ckpt-{os.getpid()}-{when}"
    fed = "_fed" in when
    coordinator = coordinator_of(request, fed)
    data, out = write_data(tmp_path)
    every = ["--every", "0" if when.startswith("epoch_end") else "40"]
    if when.endswith("map_style"):
        every.append("--map")
    ckpt = out / "ckpt.pt"
    procs = start_nodes(data, out, job, run=f"{job}-a", extra=every, coordinator=coordinator)
    finished = False
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                logs = kill_nodes(procs)
                pytest.fail("no checkpoint:\n" + "\n".join(log[-3000:] for log in logs))
            time.sleep(0.01)
        time.sleep(0.1)
        kill_nodes(procs)
        remove_dead_rings(job)
        saved = torch.load(ckpt)
        state = saved["loader"]
        cut = (state["epoch"], state["step"])
        assert sorted(state["queue"]["hosts"]) == [f"{job}.n0", f"{job}.n1"], state.keys()
        assert (cut[1] > 0) == (not when.startswith("epoch_end")), cut
        # Node 1's steps are slower: its ring is full, and those batches must be read again.
        assert state["hosts"][f"{job}.n1"]["unused_batches"] > 0, state["hosts"]
        procs = start_nodes(data, out, job, run=f"{job}-b",
                            extra=every + ["--resume", str(ckpt)], coordinator=coordinator)
        for p in procs:
            log, _ = p.communicate(timeout=150)
            assert p.returncode == 0, log[-4000:]
            assert not group_alive(p.pid), "a process of the job outlived it"
        finished = True
    finally:
        if not finished:  # what the failed job left
            kill_nodes(procs)
            remove_nodes_queues(job)
    check_restored_nodes(out, saved["run"], cut, job, fed=fed)


def one_host_states(data, job, **restore):
    """PooledLoader states (one rank, nothing read) of each node's queue."""
    import tailcut.torch
    import tailcut.pool
    files = sorted(str(p) for p in data.glob("*.bin"))
    states = {}
    for node in range(NODES):
        name = f"{job}.n{node}"
        ds = tailcut.torch.QueueDataset(files[node::NODES], name=name, format="fixed",
                                        record_bytes=8, num_slices=8, shuffle_buffer=0,
                                        num_clients=1)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, world_size=1,
                                            local_rank=0)
        states[name] = loader.state_dict()
        loader.close()
        ds.close()
        tailcut.remove_batch_ring(name + ".pool")
    return files, states


def test_a_state_of_two_hosts_restores_each_by_its_queue_name_and_refuses_other_hosts(
        tmp_path, monkeypatch):
    """A state of two hosts, a queue per host (a static split):
    QueueDataset(restore_state=state['queue']) opens host 1's queue with its
    own entry and load_state_dict() takes it on a rank of a 2-host job; a
    queue of another name, another number of hosts (also a one-host state on
    two hosts), and two hosts with one queue name are refused, naming the fix.
    A version 1 state (one host) still loads. (A state fed by a coordinator
    restores on any number of hosts: test_pooled_hosts_restore.py.)"""
    import tailcut.torch
    import tailcut.pool
    from tailcut import _pool_state
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    data, _ = write_data(tmp_path)
    job = f"pytest-hosts-state-{os.getpid()}"
    files, parts = one_host_states(data, job)
    state = dict(version=2, epoch=1, step=0,
                 queue=dict(hosts={name: s["queue"] for name, s in parts.items()}))
    opts = dict(format="fixed", record_bytes=8, num_slices=8, shuffle_buffer=0, num_clients=1)
    with pytest.raises(tailcut.InvalidArgumentError, match=f"none named '{job}.n2': restart"):
        tailcut.torch.QueueDataset(files, name=f"{job}.n2", restore_state=state["queue"], **opts)

    def restored(world_size, queue_state):
        ds = tailcut.torch.QueueDataset(files[1::NODES], name=f"{job}.n1",
                                        restore_state=queue_state, **opts)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, local_rank=0,
                                            world_size=world_size)
        return ds, loader

    for world_size, saved, text in [(4, state, None),
                                    (6, state, "covers 2 host.s. .* runs on 3"),
                                    (4, parts[f"{job}.n1"], "covers 1 host.s. .* runs on 2")]:
        ds, loader = restored(world_size, saved["queue"])
        try:
            if text is None:
                loader.load_state_dict(saved)
                assert loader.epoch == 1
            else:
                with pytest.raises(tailcut.InvalidArgumentError, match=text):
                    loader.load_state_dict(saved)
        finally:
            loader.close()
            ds.close()
            tailcut.remove_batch_ring(f"{job}.n1.pool")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    ds, loader = restored(1, parts[f"{job}.n1"]["queue"])
    try:
        loader.load_state_dict(dict(parts[f"{job}.n1"], version=1))
    finally:
        loader.close()
        ds.close()
        tailcut.remove_batch_ring(f"{job}.n1.pool")
    part = dict(host="q", ranges=[], used=[], batches=0, records=0, queue={}, ring="q.pool")
    with pytest.raises(tailcut.InvalidArgumentError, match="two hosts read a queue named 'q'"):
        _pool_state._hosts([part, dict(part)])
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_a_pool_fed_by_a_coordinator_resumes_from_its_checkpoint_exactly_once(  # noqa: F811
        redis_url, tmp_path):
    """One host of a fed job, one rank: a checkpoint taken mid-epoch while the
    loader had batches in the ring, the run going on past it, then a restore
    in the same process (the same two lines as on many hosts): every record
    once between the batches used before the checkpoint and those after the
    restore. A pool that did not open its queue from the state refuses it.
    Before, state_dict() refused a fed pool: the coordinator's state marks
    whole items done, and items of the unused batches were done there."""
    import tailcut.torch
    import tailcut.pool
    data, _ = write_data(tmp_path)
    job = f"pytest-fed-state-{os.getpid()}"
    files = sorted(str(p) for p in data.glob("*.bin"))
    opts = dict(name=job, format="fixed", record_bytes=8, num_slices=40, shuffle_buffer=0,
                coordinator=redis_url, host_id="n0", global_block_size=2,
                on_notice=lambda line: None)
    pool = dict(loaders_per_host=1, batch_size=64, slot_bytes=64 * 8, num_slots=8, rank=0,
                world_size=1, local_rank=0)

    def ids(batch):
        return batch.view(torch.int64).ravel().tolist()

    ds = tailcut.torch.QueueDataset(files, **opts)
    loader = tailcut.pool.PooledLoader(ds, **pool)
    before, batches = [], iter(loader)
    for _ in range(100):
        before += ids(next(batches))
    time.sleep(0.5)  # the loader fills the ring meanwhile
    state = loader.state_dict()
    for _ in range(50):  # past the checkpoint: not counted
        next(batches)
    with pytest.raises(tailcut.InvalidArgumentError, match="cannot jump to a checkpoint"):
        loader.load_state_dict(state)
    loader.close()
    ds.close()
    assert sorted(state["queue"]["hosts"]) == [f"{job}.n0"] and "tier" in state["queue"]
    assert state["unused_batches"] > 0, state  # the ring held batches: read again below

    ds = tailcut.torch.QueueDataset(files, restore_state=state["queue"], **opts)
    loader = tailcut.pool.PooledLoader(ds, **pool)
    loader.load_state_dict(state)
    after = [i for batch in loader for i in ids(batch)]
    loader.close()
    ds.close()
    seen = collections.Counter(before + after)
    every = {i for f in range(len(FILE_RECORDS)) for i in file_ids(f)}
    twice = [i for i, c in seen.items() if c > 1]
    assert set(seen) == every and not twice, (len(every - set(seen)), len(twice))
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left
