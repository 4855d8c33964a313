"""PooledLoader(balance=...): shares of the global batch that follow each
rank's compute speed (tailcut.pool._balance), under real torchrun jobs with
one slow rank, and the allocation, joining and argument checks alone."""

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tailcut  # noqa: E402
import tailcut.torch  # noqa: E402
from tailcut.pool import Balance, PooledLoader  # noqa: E402
from tailcut.pool._balance import allocate, join  # noqa: E402

from _pool_helpers import free_port, write_ids  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORDS = 480


def ids_of(batch):
    return batch[:, :8].contiguous().view(torch.int64).ravel().tolist()


# ---- The allocation --------------------------------------------------------------------------


def test_allocate_gives_each_rank_units_in_proportion_to_its_speed():
    shares = allocate([100.0, 100.0, 100.0, 50.0], 64, 32)
    assert sum(shares) == 64
    assert shares == [19, 18, 18, 9]  # times 19, 18, 18, 18: the least maximum whole units allow
    assert allocate([100.0] * 4, 32, 16) == [8] * 4


def test_allocate_keeps_every_share_between_one_unit_and_the_cap():
    shares = allocate([1000.0, 1.0, 1.0], 24, 16)
    assert sum(shares) == 24 and shares[0] == 16 and min(shares) >= 1
    assert allocate([1.0, 1e-9], 16, 16)[1] == 1


def test_allocate_takes_an_unmeasured_rank_as_the_median_and_is_deterministic():
    assert allocate([0.0, 0.0], 16, 16) == [8, 8]
    assert allocate([50.0, 0.0, 100.0, 100.0], 32, 16) == allocate([50.0, 100.0, 100.0, 100.0],
                                                                     32, 16)
    with pytest.raises(ValueError):
        allocate([1.0, 1.0], 40, 16)


# ---- Joining a rank's units ------------------------------------------------------------------


def test_join_concatenates_units_along_records_in_a_copy():
    a, b = torch.arange(4).reshape(2, 2), torch.arange(4, 10).reshape(3, 2)
    joined = join([a, b], [2, 3])
    assert joined.tolist() == torch.arange(10).reshape(5, 2).tolist()
    joined[0, 0] = 99
    assert a[0, 0] == 0
    trees = [dict(x=a, y=(torch.zeros(2), ["p", "q"])),
             dict(x=b, y=(torch.ones(3), ["r", "s", "t"]))]
    got = join(trees, [2, 3])
    assert got["x"].shape == (5, 2) and got["y"][0].tolist() == [0, 0, 1, 1, 1]
    assert got["y"][1] == ["p", "q", "r", "s", "t"]


def test_join_refuses_batches_that_are_not_one_row_per_record():
    data, offsets = torch.zeros(17, dtype=torch.uint8), torch.tensor([0, 9, 17])
    with pytest.raises(tailcut.InvalidArgumentError, match="one row per record"):
        join([(data, offsets), (data, offsets)], [2, 2])


# ---- Arguments and balance=False -------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path):
    path = write_ids(tmp_path / "ids.bin", 64)
    ds = tailcut.torch.QueueDataset(path, 8, format="fixed", record_bytes=16, num_epochs=1,
                                    shuffle=False, name=f"balance-{os.getpid()}-{time.time_ns()}")
    yield ds
    ds.close()


def test_bad_balance_arguments_are_refused_naming_the_fix(dataset, monkeypatch):
    with pytest.raises(tailcut.InvalidArgumentError, match="balance must be False, True"):
        PooledLoader(dataset, balance="yes")
    with pytest.raises(tailcut.InvalidArgumentError, match="register_comm_hook"):
        Balance(model=torch.nn.Linear(2, 2))
    with pytest.raises(tailcut.InvalidArgumentError, match="must divide batch_size"):
        PooledLoader(dataset, balance=Balance(unit=3), num_slots=64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 ranks of 4 units, each may hold 1 more
    with pytest.raises(tailcut.InvalidArgumentError, match="pass num_slots=20 or more, or leave "
                                                           "num_slots=None"):
        PooledLoader(dataset, balance=True, world_size=4, rank=0, local_rank=0, num_slots=16)
    # The default ring has room for the shares (it was 16 slots, and refused).
    loader = PooledLoader(dataset, balance=True, world_size=4, rank=0, local_rank=0)
    assert loader.num_slots >= 20
    loader.close()
    with pytest.raises(tailcut.InvalidArgumentError, match="smoothing"):
        Balance(smoothing=0)
    with pytest.raises(TypeError, match="every"):
        Balance(every=1.5)


def test_balance_needs_torch_distributed_with_several_ranks(dataset, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    loader = PooledLoader(dataset, balance=True, num_slots=32, world_size=2, rank=0,
                          local_rank=0, loaders_per_host=0)
    with pytest.raises(tailcut.InvalidArgumentError, match="init_process_group"):
        next(iter(loader))
    loader.close()


def test_balance_false_yields_whole_batches_in_place_as_before(dataset, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with PooledLoader(dataset, loaders_per_host=1) as loader:
        assert loader._loader_kwargs()["batch_size"] == 8  # loaders publish whole batches
        seen = []
        for batch in loader:
            assert batch.shape == (8, 16) and loader.weight == 1.0
            assert len(loader._current) == 1  # the batch is the slot itself, held until next
            seen += ids_of(batch)
        assert sorted(seen) == list(range(64))


def test_one_rank_with_balance_takes_its_whole_batch_of_units(dataset, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with PooledLoader(dataset, loaders_per_host=1, balance=Balance(unit=2), num_slots=8) as loader:
        assert loader._loader_kwargs()["batch_size"] == 2  # loaders publish units
        seen = []
        for batch in loader:
            assert batch.shape == (8, 16) and loader.weight == 1.0
            assert not loader._current  # joined into a copy: the units' slots are free
            seen += ids_of(batch)
        assert sorted(seen) == list(range(64))


@pytest.mark.parametrize("stop", [30, "end"])
def test_a_balanced_rank_restored_from_its_state_reads_every_record_once(tmp_path, stop,
                                                                          monkeypatch):
    """A checkpoint while loaders read ahead and units wait in the ring: the
    restored job trains every record of both epochs once."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    name = f"balance-ckpt-{os.getpid()}-{stop}"
    seen = collections.Counter()

    def open_loader(queue_name, **more):
        ds = tailcut.torch.QueueDataset([path], 16, name=queue_name, format="fixed",
                                        record_bytes=16, num_epochs=2, num_slices=40, seed=7,
                                        **more)
        return ds, PooledLoader(ds, loaders_per_host=2, num_slots=8, slot_bytes=1 << 12, timeout=60,
                                rank=0, world_size=1, local_rank=0, balance=Balance(unit=4))

    ds, loader = open_loader(name)
    try:
        it = iter(loader)
        for step, batch in enumerate(it, 1):
            seen.update((0, i) for i in ids_of(batch))
            if step == stop:
                time.sleep(0.2)  # loaders fill the ring and read ahead
                break
        state = loader.state_dict()
        it.close()
    finally:
        loader.close()
        ds.close()
    if stop != "end":
        assert state["unused_batches"] > 0  # units were waiting: the state had to reopen them
    ds, loader = open_loader(name + "-r", restore_state=state["queue"])
    try:
        loader.load_state_dict(state)
        for epoch in range(state["epoch"], 2):
            loader.set_epoch(epoch)
            for batch in loader:
                seen.update((epoch, i) for i in ids_of(batch))
    finally:
        loader.close()
        ds.close()
    assert max(seen.values()) == 1, "a record trained twice"
    assert {i for e, i in seen if e == 0} == set(range(n))
    assert {i for e, i in seen if e == 1} == set(range(n))


# ---- Real jobs: torchrun, one slow rank ------------------------------------------------------


def torchrun(tmp_path, ranks, mode, epochs):
    data = write_ids(tmp_path / "ids.bin", RECORDS)
    name = f"balance-{mode}-{os.getpid()}-{time.time_ns()}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}",
           f"--nproc_per_node={ranks}", "--redirects", "1", "--tee", "2",
           str(HERE / "_balance_job.py"), data, str(tmp_path), name, mode, str(epochs)]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert not [f for f in os.listdir("/dev/shm") if name in f]
    return json.loads((tmp_path / "result.json").read_text())


def test_shares_follow_a_slow_rank_with_a_fixed_global_batch_and_every_record_once(tmp_path):
    epochs, ranks = 4, 3
    result = torchrun(tmp_path, ranks, "shares", epochs)
    # Equal steps: every rank ran as many steps, epoch by epoch.
    assert len({len(r["steps"]) for r in result}) == 1
    assert len({tuple(rep["steps"] for rep in r["reports"]) for r in result}) == 1
    # The global batch is fixed: at every step the ranks' records add up to 8 x 3.
    for step in zip(*(r["steps"] for r in result)):
        assert sum(s["records"] for s in step) == 8 * ranks
        assert sum(s["share"] for s in step) == 8 * ranks
        for s in step:
            assert s["records"] == s["share"] and s["weight"] == s["records"] / 8
    # The slow rank (2x compute per record) ends with fewer records than the equal 8.
    shares = result[0]["shares"]
    assert all(r["shares"] == shares for r in result)
    assert shares[2] < 8 < min(shares[0], shares[1]), shares
    # Every record once per epoch: what the ranks got plus what the last epoch dropped.
    got = collections.Counter(i for r in result for s in r["steps"] for i in s["ids"])
    got.update(i for r in result for i in r["dropped"])
    assert set(got) == set(range(RECORDS)) and set(got.values()) == {epochs}


def test_balance_weights_make_the_ddp_gradient_that_of_the_whole_global_batch(tmp_path):
    result = torchrun(tmp_path, 2, "ddp", 2)
    for r in result:
        assert r["grad_errors"] and max(r["grad_errors"]) < 1e-9, r["grad_errors"]
    # The test means something only where the shares differ: they did, and the slow
    # rank (timed up to its last gradient bucket by the DDP hook) took fewer records.
    assert result[0]["unequal_steps"] > 0
    assert result[0]["shares"][1] < result[0]["shares"][0]


def test_balance_model_on_four_ranks_runs_with_no_sizing_argument(tmp_path):
    """PooledLoader(ds, num_workers=1, balance=model) as documented, 4 ranks
    (the last at 2x compute per record), nothing sized: the ring sizes its
    slots for the ranks' shares; every record once per epoch, equal steps."""
    epochs, ranks = 3, 4
    result = torchrun(tmp_path, ranks, "defaults", epochs)
    # Sized by default for 4 ranks of 4 units each, which may each hold 1 more (20), and
    # the 4 loaders' prefetch (num_workers=1 per rank, 2 batches each).
    assert {r["num_slots"] for r in result} == {28}, [r["num_slots"] for r in result]
    # Equal steps, epoch by epoch, on every rank.
    assert len({tuple(rep["steps"] for rep in r["reports"]) for r in result}) == 1
    assert all(rep["steps"] > 0 for rep in result[0]["reports"])
    # Every record once per epoch: the records of each epoch (batch_epoch: a batch carried
    # over belongs to the epoch before) and those dropped at the end of the last.
    per_epoch = collections.defaultdict(collections.Counter)
    for r in result:
        for s in r["steps"]:
            per_epoch[s["of_epoch"]].update(s["ids"])
    dropped = sum(rep["dropped_records"] for r in result for rep in r["reports"])
    for epoch in range(epochs):
        got = per_epoch[epoch]
        assert set(got.values()) <= {1}, f"epoch {epoch}: a record twice"
        missing = RECORDS - len(got)
        assert missing == 0 or (epoch == epochs - 1 and missing == dropped), (epoch, missing)
    # The shares moved: the slow rank (timed by the DDP hook) ends with fewer records.
    shares = result[0]["shares"]
    assert shares[3] < 8 < max(shares[:3]), shares
