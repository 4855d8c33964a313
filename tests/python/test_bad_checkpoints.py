"""Mangled or foreign PooledLoader checkpoints are refused by
load_state_dict() in one line naming the field (never a bare KeyError, never
a resume that trains nothing), before the queue is touched."""

import copy
import os
import time

import pytest

import tailcut

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

import tailcut.torch  # noqa: E402
import tailcut.pool  # noqa: E402

N = 200


class Squares(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


def remove_job(name):
    """Removes what a job of queue `name` may have left: its queue and its ring."""
    for remove, what in ((tailcut.remove_queue, name), (tailcut.remove_batch_ring, name + ".pool")):
        try:
            remove(what)
        except tailcut.NotFoundError:
            pass


@pytest.fixture
def saved(tmp_path):
    """A map-style loader's state after 3 steps, and a factory of fresh loaders
    built as the one that saved it (len(dataset) given)."""
    name = f"pytest-badckpt-{os.getpid()}"
    made = []

    def build(n=N, num_epochs=5):
        loader = tailcut.pool.PooledLoader(Squares(n), 10, name=name, num_epochs=num_epochs,
                                            loaders_per_host=1, rank=0, world_size=1,
                                            local_rank=0)
        made.append(loader)
        return loader

    first = build()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    first.close()
    yield state, build
    for loader in made:
        loader.close()
    remove_job(name)


def mangled(state, change):
    state = copy.deepcopy(state)
    change(state)
    return state


@pytest.mark.parametrize("change, field", [
    (lambda s: s.pop("queue"), r"state\['queue'\] is missing"),
    (lambda s: s.pop("epoch"), r"state\['epoch'\] is missing"),
    (lambda s: s.pop("version"), r"state\['version'\] is missing"),
    (lambda s: s.update(version=99), r"state\['version'\] is 99"),
    (lambda s: s.update(epoch="0"), r"state\['epoch'\] is str"),
    (lambda s: s.update(epoch=-1), r"state\['epoch'\] is -1"),
    (lambda s: s.update(epoch=9), r"state\['epoch'\] is 9, past the queue's 5 epochs"),
    (lambda s: s.update(epoch=4), r"state\['epoch'\] is 4, but its queue state starts in "
                                  r"epoch [01]"),
    (lambda s: s.update(step=True), r"state\['step'\] is bool"),
    (lambda s: s.update(unused_records=-3), r"state\['unused_records'\] is -3"),
    (lambda s: s.update(queue=[1, 2]), r"state\['queue'\] is a list"),
    (lambda s: s["queue"].update(state="abc"), r"state\['queue'\]\['state'\] is str"),
    (lambda s: s["queue"].update(num_epochs=7), r"state\['queue'\]\['num_epochs'\] is 7, this "
                                                r"job's queue has num_epochs=5"),
])
def test_a_mangled_field_is_refused_by_name(saved, change, field):
    state, build = saved
    loader = build()
    with pytest.raises(tailcut.InvalidArgumentError, match=field):
        loader.load_state_dict(mangled(state, change))
    # Nothing was touched: the same loader still restores from the real state.
    loader.load_state_dict(state)
    assert loader.epoch == state["epoch"]


def test_not_a_dict_is_refused(saved):
    _, build = saved
    with pytest.raises(tailcut.InvalidArgumentError, match="the state is a list, not the dict"):
        build().load_state_dict([1])


def test_a_dataset_of_another_length_is_refused_naming_len_dataset(saved):
    state, build = saved
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=rf"state\['num_samples'\] is {N}, but len\(dataset\) is {N + 1}"):
        build(n=N + 1).load_state_dict(state)


def test_one_load_state_dict_resumes_where_the_state_was_taken(saved):
    """The unmangled state restores with one call on a loader built as the
    first: the rest of epoch 0 and then epoch 1, each sample once per epoch
    but for the 3 batches the first loader used."""
    state, build = saved
    loader = build()
    loader.load_state_dict(state)
    seen = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen.append([int(i) for batch in loader for i in batch[:, 0]])
    assert len(seen[0]) == N - 30 and len(set(seen[0])) == N - 30
    assert sorted(seen[1]) == list(range(N))


def test_ranks_calling_state_dict_at_different_steps_all_raise_within_seconds(tmp_path):
    """Rank 0 calls state_dict() after step 3, rank 1 goes on to step 4: both
    raise within seconds (the loader's timeout is 120 s), naming the rank that
    called and its step, and the rank that went on."""
    import json
    import subprocess
    import sys

    from _pool_helpers import write_ids
    from test_pooled_checkpoint import HERE, finish, free_port, remove_dead_run

    name = f"pytest-sdmis-{os.getpid()}"
    data = write_ids(tmp_path / "ids.bin", 2400)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}",
           "--nproc_per_node=2", "--redirects", "1", "--tee", "2",
           str(HERE / "_state_dict_mismatch.py"), str(data), str(tmp_path), name]
    try:
        finish(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True), timeout=100)
    finally:
        remove_dead_run(name)
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank-{rank}.txt").read_text())
        assert got["raised"] is not None, f"rank {rank} did not raise"
        assert got["raised"].startswith("InvalidArgumentError: PooledLoader.state_dict(): "), got
        assert "rank 0 after 3 steps of epoch 0" in got["raised"], got
        assert got["seconds"] < 10, got
    assert "rank 1 went on to step 4 of epoch 0" in json.loads(
        (tmp_path / "rank-1.txt").read_text())["raised"]


def _publish_then_stall(worker_id):
    """worker_init_fn: each publish of this loader returns 0.3 s late, so the
    loader commits a batch's records well after a rank may have used it."""
    ring = tailcut._core.BatchRing
    publish = ring.publish

    def late(self, *args):
        done = publish(self, *args)
        time.sleep(0.3)
        return done

    ring.publish = late


def _first_loader_stalls_after_its_first_publish(worker_id):
    """worker_init_fn: loader 0's first publish returns 2 s late, so that
    batch stays uncommitted while loader 1 feeds the rank's next steps."""
    if worker_id != 0:
        return
    ring = tailcut._core.BatchRing
    publish = ring.publish
    calls = []

    def late(self, *args):
        done = publish(self, *args)
        if not calls:
            calls.append(1)
            time.sleep(2.0)
        return done

    ring.publish = late


def used_then_restored(name, n, loaders, steps, init=None, before_save=None, epochs=(0,)):
    """A map-style job of n Squares in batches of 10 over two epochs: `steps`
    batches used (loaders started with worker_init_fn `init`), before_save()
    run, the state saved, and a fresh loader restored from it run through
    `epochs`. Returns (the records used, the records of each epoch after)."""
    def build(init=None):
        return tailcut.pool.PooledLoader(Squares(n), 10, name=name, num_epochs=2,
                                          loaders_per_host=loaders, rank=0, world_size=1,
                                          local_rank=0, worker_init_fn=init)

    try:
        first = build(init)
        it = iter(first)
        used = [int(i) for _ in range(steps) for i in next(it)[:, 0]]
        if before_save is not None:
            before_save()
        state = first.state_dict()
        del it
        first.close()
        loader = build()
        loader.load_state_dict(state)
        after = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            after.append([int(i) for batch in loader for i in batch[:, 0]])
        loader.close()
    finally:
        remove_job(name)
    return used, after


def test_a_batch_used_before_its_loader_committed_it_is_not_read_again(tmp_path):
    """A loader commits a batch's records right after it publishes the batch;
    a rank that used the batch in between and then saved the state must not
    have it read again after the restore (it was: 10 of the first 30 samples
    came back)."""
    used, (rest,) = used_then_restored(f"pytest-latecommit-{os.getpid()}", N, loaders=1,
                                       steps=3, init=_publish_then_stall)
    assert not set(rest) & set(used), sorted(set(rest) & set(used))
    assert sorted(rest + used) == list(range(N))


def test_a_batch_used_steps_before_its_loader_committed_it_is_not_read_again(tmp_path):
    """As above, with the loader stalled between the publish and the commit
    for several of the rank's steps: the batch was used at an earlier step
    than the one the state was saved at (one batch came back)."""
    MANY = 4000  # more than the ring holds: the loaders cannot publish both epochs ahead
    used, (rest,) = used_then_restored(f"pytest-latecommit2-{os.getpid()}", MANY, loaders=2,
                                       steps=6, init=_first_loader_stalls_after_its_first_publish)
    assert not set(rest) & set(used), sorted(set(rest) & set(used))
    assert sorted(rest + used) == list(range(MANY))


def test_a_state_taken_while_loaders_hold_every_epoch_restores_every_record_once(tmp_path):
    """One item an epoch and two loaders: the second takes the last epoch's
    item at once, and both fill the ring, so the queue state saved at step 6
    has every ticket handed out and what is left in open pieces. Its restore
    was refused ("state['epoch'] is 0, but its queue state starts in epoch
    2"); it must resume both epochs, each record once."""
    name = f"pytest-aheadloaders-{os.getpid()}"

    def ring_full():  # both loaders hold their epoch's item once the ring is full
        deadline = time.monotonic() + 60
        while (tailcut.inspect_batch_ring(name + ".pool")["free"] > 0
               and time.monotonic() < deadline):
            time.sleep(0.05)

    used, epochs = used_then_restored(name, N, loaders=2, steps=6, before_save=ring_full,
                                      epochs=(0, 1))
    assert not set(epochs[0]) & set(used), sorted(set(epochs[0]) & set(used))
    assert sorted(epochs[0] + used) == list(range(N))
    assert sorted(epochs[1]) == list(range(N))
