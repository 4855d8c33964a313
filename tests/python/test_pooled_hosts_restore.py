"""A checkpoint of a PooledLoader job on several hosts, fed by a coordinator, restored on
another number of hosts: a job of 2 nodes x 2 ranks under torchrun SIGKILLed mid-epoch and
resumed on 3 nodes and on 1, a job of 3 nodes resumed on 2 (the nodes simulated on this
machine as in test_pooled_hosts.py, each a torchrun launch with a TAILCUT_HOST_ID of its own
and one redis-server of the test's own). What cannot be restored is refused in one line."""

import os
import pathlib
import time
import types

import pytest

import tailcut

torch = pytest.importorskip("torch")

from test_global import REDIS, redis_url  # noqa: E402,F401 (the fixture)
from test_pooled_hosts import (PER_NODE, check_restored_nodes, kill_nodes,  # noqa: E402
                               remove_dead_rings, remove_nodes_queues, start_nodes, write_data)

from tailcut import _pool_state  # noqa: E402


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
@pytest.mark.parametrize("before,after,extra", [(2, 3, []), (2, 1, []), (3, 2, []),
                                               (2, 1, ["--map"])],
                         ids=["2_hosts_to_3", "2_hosts_to_1", "3_hosts_to_2",
                              "2_hosts_to_1_map_style"])
def test_a_fed_job_killed_mid_epoch_resumes_on_another_number_of_hosts_every_record_once(
        redis_url, tmp_path, before, after, extra):  # noqa: F811
    """`before` nodes x 2 ranks, one queue per node fed by a coordinator, node
    1's steps slower; every rank calls loader.state_dict() every 40 steps and
    rank 0 saves it; 0.1 s after the first checkpoint every launch is
    SIGKILLed (torchrun, ranks, loaders). The job resumes on `after` nodes
    with the same two lines (restore_state=state['queue'], load_state_dict):
    every record of the job once per epoch across the two runs (trained up to
    the checkpoint or after it, or left over and reported), the same steps on
    every rank of the resumed run, nothing left in /dev/shm or running. On
    fewer nodes node 0 resumes the open items of the nodes that are gone
    beside its own; on more, node 2 starts empty and takes what the
    coordinator hands out again. map_style: the same ids as a map-style
    dataset, whose index queue picks its host's part as QueueDataset does.
    Before, load_state_dict() refused: 'the state covers 2 host(s) ... this
    job runs on 3'."""
    job = f"pytest-hosts-restore-{os.getpid()}-{before}-{after}-{len(extra)}"
    data, out = write_data(tmp_path)
    every = ["--every", "40"] + extra
    ckpt = out / "ckpt.pt"
    procs = start_nodes(data, out, job, run=f"{job}-a", extra=every, coordinator=redis_url,
                        nodes=before)
    finished = False
    try:
        deadline = time.monotonic() + 150
        while not ckpt.exists():
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                logs = kill_nodes(procs)
                pytest.fail("no checkpoint:\n" + "\n".join(log[-3000:] for log in logs))
            time.sleep(0.01)
        time.sleep(0.1)
        kill_nodes(procs)
        remove_dead_rings(job, before)
        saved = torch.load(ckpt)
        state = saved["loader"]
        cut = (state["epoch"], state["step"])
        assert sorted(state["queue"]["hosts"]) == [f"{job}.n{n}" for n in range(before)]
        assert cut[1] > 0 and "tier" in state["queue"], cut
        # The rings held batches not used yet: read again after the restore.
        assert state["unused_batches"] > 0, state["hosts"]
        # A node that does not come back leaves its killed queue on its machine.
        for node in range(after, before):
            tailcut.remove_queue(f"{job}.n{node}", force=True)
        procs = start_nodes(data, out, job, run=f"{job}-b", extra=every + ["--resume", str(ckpt)],
                            coordinator=redis_url, nodes=after)
        for p in procs:
            log, _ = p.communicate(timeout=200)
            assert p.returncode == 0, log[-4000:]
        finished = True
    finally:
        if not finished:  # what the failed job left
            kill_nodes(procs)
            remove_nodes_queues(job, max(before, after))
    check_restored_nodes(out, saved["run"], cut, job, fed=True, ranks=after * PER_NODE,
                         killed_ranks=before * PER_NODE)


def test_the_parts_of_a_checkpoint_are_dealt_to_the_hosts_of_a_restore():
    """Each host of the checkpoint that restores resumes its own part; every
    other part goes to the host with the fewest (the first by name), the same
    on every rank."""
    saved = {"j.n0": 0, "j.n1": 0, "j.n2": 0}
    assert _pool_state.share_parts(saved, ["j.n0", "j.n1"]) == {
        "j.n0": ["j.n0", "j.n2"], "j.n1": ["j.n1"]}
    assert _pool_state.share_parts(saved, ["j.n1"]) == {"j.n1": ["j.n1", "j.n0", "j.n2"]}
    assert _pool_state.share_parts(["j.n0", "j.n1"], ["j.n0", "j.n1", "j.n2"]) == {
        "j.n0": ["j.n0"], "j.n1": ["j.n1"], "j.n2": []}
    assert _pool_state.share_parts(saved, ["j.b", "j.a"]) == {
        "j.a": ["j.n0", "j.n2"], "j.b": ["j.n1"]}


def test_what_cannot_be_restored_on_other_hosts_is_refused_in_one_line():
    """A fed state passes the host count check on any number of hosts; a state
    of a static split (a queue per host, each its own works) on another number
    of hosts, and a fed state of another job, are refused naming the fix."""
    def loader(hosts, queue_args):
        return types.SimpleNamespace(world_size=2 * hosts, local_world_size=2,
                                     dataset=types.SimpleNamespace(_queue_args=queue_args))

    part = dict(state=b"x" * 88)
    fed = dict(version=2, epoch=0, step=3, queue=dict(hosts={"j.n0": part, "j.n1": part},
                                                      tier=b"t", epoch=0))
    for hosts in (1, 2, 3):
        _pool_state.check_state(fed, loader(hosts, dict(name="j", coordinator="redis://x")))
    split = dict(fed, queue=dict(hosts={"j.n0": part, "j.n1": part}))
    with pytest.raises(tailcut.InvalidArgumentError) as refused:
        _pool_state.check_state(split, loader(3, dict(name="j.n0")))
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        "PooledLoader.load_state_dict(): state['queue'] covers 2 host(s) (queues j.n0, j.n1), "
        "this job runs on 3 (6 ranks, 2 per host), and each of its queues holds its own host's "
        "works: restart it on 2 host(s), or feed the hosts' queues from a coordinator"), refused
    with pytest.raises(tailcut.InvalidArgumentError) as refused:
        _pool_state.host_queue_state(fed["queue"], "k", "n0")
    assert str(refused.value) == (
        "restore_state: the checkpoint holds the queues j.n0, j.n1, of another job than 'k' (its "
        "hosts' queues are 'k.<host id>'): open the queue under the name it had when the "
        "checkpoint was saved")


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_a_host_with_no_part_replaces_the_queue_an_earlier_run_left_there(
        redis_url, tmp_path, monkeypatch):  # noqa: F811
    """A restore on more hosts than the checkpoint's: the host that has no
    part of the state (n1 here; the restore's other host, n0, resumes the
    only part) opens its queue from a state of the job with nothing handed
    out, so a queue an earlier run left on it when it was killed is replaced
    and the host takes what the coordinator hands out again. Before (no state
    of its own), it resumed that queue and was refused: 'queue ... was fed by
    another run of job ...'."""
    import subprocess
    import sys
    import uuid

    import tailcut.torch
    import tailcut.pool
    data, _ = write_data(tmp_path)
    job = f"pytest-no-part-{os.getpid()}"
    files = sorted(str(p) for p in data.glob("*.bin"))
    opts = dict(name=job, format="fixed", record_bytes=8, num_slices=40, shuffle_buffer=0,
                coordinator=redis_url, global_block_size=2)
    # An earlier run's host n1, killed holding an item: its queue stays in /dev/shm.
    subprocess.run([sys.executable, "-c",
                    "import os, sys, tailcut.torch\n"
                    f"ds = tailcut.torch.QueueDataset({files!r}, host_id='n1', **{opts!r})\n"
                    "assert ds.queue.take() is not None\n"
                    "os._exit(0)\n"], check=True, capture_output=True, timeout=60)
    quiet = dict(opts, on_notice=lambda line: None)
    ds = tailcut.torch.QueueDataset(files, host_id="n0", **quiet)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, world_size=1,
                                        local_rank=0)
    state = loader.state_dict()
    loader.close()
    ds.close()
    tailcut.remove_batch_ring(f"{job}.n0.pool")
    assert sorted(state["queue"]["hosts"]) == [f"{job}.n0"]
    # The restore's hosts are n0 and n1, as two torchrun launches would tell each other.
    monkeypatch.setattr(_pool_state, "_restore_hosts",
                        lambda local: (uuid.uuid4().hex, [f"{job}.n0", f"{job}.n1"]))
    ds = tailcut.torch.QueueDataset(files, host_id="n1", restore_state=state["queue"], **quiet)
    try:
        item = ds.queue.take(timeout=20)
        assert item is not None
        item.ack()
    finally:
        ds.close()
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut*{job}*")]
    assert not left, left
