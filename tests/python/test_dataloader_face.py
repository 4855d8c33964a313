"""PooledLoader speaks DataLoader's words: DataLoader's signature, each of its
arguments honoured as DataLoader honours it or refused by name, batches the
caller owns, num_workers=0 in the rank's own process, and a DDP script
written for DataLoader + DistributedSampler that switches by its class name
alone (under torchrun). Also the IndexDataset loop with a new EqualSteps per
epoch, and a quiet close after a finished loop."""

import inspect
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

import tailcut  # noqa: E402
import tailcut.torch as tt  # noqa: E402
from tailcut.pool import PooledLoader  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


class Samples(Dataset):
    """Sample i is (a 4-float feature vector, its id i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


@pytest.fixture
def one_rank(monkeypatch, qname):
    """PooledLoader(dataset, ...) of a job with one rank, its job named qname."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    made = []

    def make(dataset, **kw):
        kw.setdefault("name", qname)
        loader = PooledLoader(dataset, **kw)
        made.append(loader)
        return loader

    yield make
    for loader in made:
        loader.close()


def epoch_ids(loader):
    return [i for _, labels in loader for i in labels.tolist()]


# ---- The signature ----------------------------------------------------------------------------


def test_the_signature_is_dataloaders_then_tailcuts_own_keywords():
    theirs = inspect.signature(DataLoader).parameters
    ours = inspect.signature(PooledLoader).parameters
    positional = [n for n, p in theirs.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [n for n, p in ours.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == positional
    for name, p in theirs.items():
        assert name in ours and ours[name].kind is p.kind, name
    for name in ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last",
                 "timeout", "worker_init_fn", "multiprocessing_context", "generator",
                 "persistent_workers", "pin_memory_device"):
        assert ours[name].default == theirs[name].default, name
    # tailcut's own keywords are keyword-only.
    for name in ("loaders_per_host", "num_slots", "slot_bytes", "balance", "carry_over", "name",
                 "zero_copy", "local_rank", "local_world_size"):
        assert ours[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_no_public_signature_takes_arbitrary_keywords():
    for api in (PooledLoader, tt.EqualSteps, tt.IndexDataset, tt.QueueDataset):
        kinds = {p.kind for p in inspect.signature(api).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, api
    with pytest.raises(TypeError, match="unexpected keyword argument 'queue_name'"):
        PooledLoader(Samples(8), queue_name="x")


# ---- Refused by name --------------------------------------------------------------------------


@pytest.mark.parametrize("kw, error, words", [
    (dict(batch_sampler=[[0, 1]]), tailcut.InvalidArgumentError,
     "PooledLoader: batch_sampler= is refused"),
    (dict(sampler="RandomSampler"), tailcut.InvalidArgumentError,
     "PooledLoader: sampler=RandomSampler is refused: the host's work queue is the sampler"),
    (dict(multiprocessing_context="spawn"), tailcut.InvalidArgumentError,
     "PooledLoader: multiprocessing_context='spawn' is refused"),
    (dict(num_workers=(1, 3)), TypeError,
     "an autoscaling range is loaders_per_host=(min, max)"),
    (dict(num_workers=2, loaders_per_host=4), tailcut.InvalidArgumentError,
     "num_workers=2 (per rank) and loaders_per_host=4 (the host's) both set the pool"),
    (dict(seed=1, generator="generator"), tailcut.InvalidArgumentError,
     "PooledLoader: seed= and generator= both set the order"),
    (dict(pin_memory_device="mps"), tailcut.InvalidArgumentError,
     "PooledLoader: pin_memory_device='mps' is refused"),
    (dict(drop_last="False"), TypeError,
     "PooledLoader: drop_last must be True or False, got 'False' (str)"),
    (dict(drop_last=1), TypeError, "PooledLoader: drop_last must be True or False, got 1 (int)"),
    (dict(shuffle="yes"), TypeError, "PooledLoader: shuffle must be True or False"),
    (dict(persistent_workers=1), TypeError, "PooledLoader: persistent_workers must be True"),
    (dict(batch_size=None), tailcut.InvalidArgumentError,
     "PooledLoader: batch_size=None (no batching) is refused for a map-style dataset"),
    (dict(zero_copy=True, pin_memory=True), tailcut.InvalidArgumentError,
     "zero_copy=True hands out views of the ring, pin_memory=True pinned copies"),
])
def test_what_cannot_be_honoured_is_refused_naming_pooledloader_and_the_argument(
        one_rank, kw, error, words):
    ds = Samples(16)
    if kw.get("sampler") == "RandomSampler":
        kw["sampler"] = RandomSampler(ds)
    if kw.get("generator") == "generator":
        kw["generator"] = torch.Generator()
    with pytest.raises(error) as e:
        one_rank(ds, **kw)
    assert words in str(e.value), str(e.value)
    assert "WorkQueue" not in str(e.value)


def test_queue_options_take_the_index_queues_other_options_and_refuse_the_rest(one_rank, qname):
    loader = one_rank(Samples(16), batch_size=4, num_epochs=1,
                      queue_options=dict(lease_timeout=30.0))
    assert loader.dataset._queue_args["lease_timeout"] == 30.0
    with pytest.raises(tailcut.InvalidArgumentError, match="pass seed= to PooledLoader"):
        one_rank(Samples(16), name=qname + "s", queue_options=dict(seed=1))
    with pytest.raises(tailcut.InvalidArgumentError, match="'record_bytes': ...} is not an "
                                                           "option of the index queue"):
        one_rank(Samples(16), name=qname + "r", queue_options=dict(record_bytes=8))


def test_a_distributed_sampler_of_other_ranks_or_with_shuffle_is_refused(one_rank):
    ds = Samples(16)
    with pytest.raises(tailcut.InvalidArgumentError, match="mutually exclusive|with sampler="):
        one_rank(ds, sampler=DistributedSampler(ds, num_replicas=1, rank=0), shuffle=True)
    with pytest.raises(tailcut.InvalidArgumentError, match="num_replicas=2 but the job has "
                                                           "world_size=1"):
        one_rank(ds, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    with pytest.raises(tailcut.InvalidArgumentError, match="DistributedSampler of another"):
        one_rank(ds, sampler=DistributedSampler(Samples(16), num_replicas=1, rank=0))


def test_queue_options_given_with_a_queue_dataset_are_refused_by_name(one_rank, tmp_path,
                                                                       qname):
    path = tmp_path / "ids.bin"
    path.write_bytes(bytes(64))
    with tt.QueueDataset([str(path)], 4, name=qname + "q", format="fixed", record_bytes=8) as ds:
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=r"shuffle= are for a map-style dataset"):
            PooledLoader(ds, shuffle=True)


# ---- Honoured ---------------------------------------------------------------------------------


def test_num_workers_is_per_rank_so_the_host_runs_it_times_its_local_ranks(one_rank):
    loader = one_rank(Samples(64), batch_size=8, num_workers=2, rank=0, world_size=2,
                      local_rank=0, local_world_size=2)
    assert loader.num_workers == 2 and loader.loaders_per_host == 4
    assert len(loader.start_loaders()) == 4
    host = one_rank(Samples(64), batch_size=8, loaders_per_host=3, name=None)
    assert host.loaders_per_host == 3 and host.num_workers == 0


def test_num_workers_0_loads_in_the_ranks_own_process_every_sample_once_per_epoch(one_rank):
    n = 100
    loader = one_rank(Samples(n), batch_size=8, num_workers=0, num_epochs=3)
    for _ in range(3):
        assert sorted(epoch_ids(loader)) == list(range(n))
    assert loader.loaders == [] and multiprocessing.active_children() == []
    ring = f"/dev/shm/tailcut-ring.{os.geteuid()}.{loader.name}"
    loader.close()
    assert not os.path.exists(ring)


def test_shuffle_false_reads_in_order_and_a_generator_sets_the_order(one_rank, qname):
    n = 64
    assert epoch_ids(one_rank(Samples(n), batch_size=8, num_epochs=1)) == list(range(n))

    def order(seed, name):
        g = torch.Generator()
        g.manual_seed(seed)
        loader = one_rank(Samples(n), batch_size=8, shuffle=True, generator=g, num_epochs=1,
                          name=name, num_slices=8)
        return epoch_ids(loader)

    first, again, other = order(5, qname + "a"), order(5, qname + "b"), order(6, qname + "c")
    assert sorted(first) == list(range(n))
    assert first == again and first != other


def test_a_distributed_samplers_shuffle_seed_and_set_epoch_are_read(one_rank):
    ds = Samples(40)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=11)
    loader = one_rank(ds, batch_size=8, sampler=sampler, num_epochs=4)
    assert loader.dataset.queue.seed == 11 and loader.dataset._queue_args["shuffle"] is True
    for epoch in range(3):
        sampler.set_epoch(epoch)  # DDP's loop, unchanged: the loader runs that epoch
        assert sorted(epoch_ids(loader)) == list(range(40))
        assert loader.reports[-1]["epoch"] == epoch


def test_worker_init_fn_runs_in_each_loader_with_its_index(one_rank, tmp_path):
    def init(worker_id):
        (tmp_path / f"{worker_id}-{os.getpid()}").write_text("")

    loader = one_rank(Samples(32), batch_size=8, num_workers=2, worker_init_fn=init,
                      num_epochs=1)
    assert sorted(epoch_ids(loader)) == list(range(32))
    loader.close()
    seen = sorted(p.name.split("-") for p in tmp_path.iterdir())
    assert [w for w, _ in seen] == ["0", "1"]
    assert all(int(pid) != os.getpid() for _, pid in seen)


def test_timeout_0_waits_for_ever_and_a_positive_one_is_seconds(one_rank, qname):
    assert one_rank(Samples(8)).timeout is None
    assert one_rank(Samples(8), timeout=2.5, name=qname + "t").timeout == 2.5


def test_pin_memory_without_cuda_warns_as_dataloader_does(one_rank):
    if torch.cuda.is_available():
        loader = one_rank(Samples(16), batch_size=8, num_workers=1, pin_memory=True,
                          num_epochs=1)
        assert all(f.is_pinned() for f, _ in loader)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = one_rank(Samples(16), batch_size=8, num_workers=1, pin_memory=True,
                          num_epochs=1)
    assert any("pin_memory=True but no CUDA device" in str(w.message) for w in caught)
    assert sorted(epoch_ids(loader)) == list(range(16))


def test_batches_kept_past_their_step_keep_their_values(one_rank):
    n = 160
    # Fewer slots than batches: the ring reuses every slot while the batches are kept.
    loader = one_rank(Samples(n), batch_size=8, num_workers=1, num_slots=3, num_epochs=1)
    kept = [(features, labels, labels.clone()) for features, labels in loader]
    assert len(kept) == n // 8
    for features, labels, then in kept:
        assert torch.equal(labels, then)
        assert torch.equal(features[:, 0], then.to(torch.float32))
    features[0, 0] = -1.0  # the caller's: writable, no warning, nobody else's memory


def test_zero_copy_hands_out_views_of_the_ring(one_rank):
    loader = one_rank(Samples(32), batch_size=8, num_workers=1, zero_copy=True, num_epochs=1)
    assert sorted(epoch_ids(loader)) == list(range(32))
    assert loader.zero_copy


def test_balance_on_four_ranks_runs_with_the_default_ring(one_rank):
    # Refused before with "num_slots is 16: pass num_slots=20 or more".
    loader = one_rank(Samples(64), batch_size=8, num_workers=8, balance=True, rank=0,
                      world_size=4, local_rank=0, local_world_size=4)
    from tailcut.pool import _balance
    held = _balance.held_units(_balance.Balance(), 8, 4, 4)
    assert loader.num_slots >= held + 4 * 8  # the shares, and each loader's prefetch


class Big(Dataset):
    """Sample i: a 2 MiB uint8 image and its id, so that a batch of 3 is 6 MiB,
    more than a slot's 4 MiB before slots were sized from the first sample."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.full((2 << 20,), i % 251, dtype=torch.uint8), i


@pytest.mark.parametrize("feature", ["map-style", "autoscale", "big samples", "in process"])
def test_each_feature_runs_with_no_sizing_argument(one_rank, feature):
    kw = {"map-style": dict(num_workers=2), "autoscale": dict(loaders_per_host=(1, 3)),
          "big samples": dict(num_workers=1), "in process": dict(num_workers=0)}[feature]
    ds = Big() if feature == "big samples" else Samples(90)
    loader = one_rank(ds, batch_size=3, shuffle=True, num_epochs=2, **kw)
    for _ in range(2):
        assert sorted(epoch_ids(loader)) == list(range(len(ds)))
    if feature == "big samples":  # a batch of 6 MiB, a quarter more, a power of two
        assert loader.slot_bytes == 8 << 20


def test_the_documented_index_dataset_loop_runs_every_epoch(qname, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.IndexDataset(Samples(50), seed=0, name=qname, num_epochs=3)
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    for epoch in range(3):
        loader.dataset.set_epoch(epoch)
        ids = [i for _, labels in tt.EqualSteps(loader) for i in labels.tolist()]
        assert sorted(ids) == list(range(50)), epoch
    ds.close()


CLOSE = """
    import torch
    from torch.utils.data import Dataset
    from tailcut.pool import PooledLoader

    class Samples(Dataset):
        def __len__(self):
            return 40
        def __getitem__(self, i):
            return i

    loader = PooledLoader(Samples(), batch_size=8, num_workers=1, name={name!r})
    for epoch in range(2):
        for batch in loader:
            if {leave_early}:
                break
    loader.close()
    print("closed")
"""


@pytest.mark.parametrize("leave_early", [False, True])
def test_a_finished_loop_closes_quietly_and_one_left_early_says_what_it_left(qname,
                                                                             leave_early):
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(var, None)
    code = textwrap.dedent(CLOSE.format(name=qname, leave_early=leave_early))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr
    assert ("removed unfinished" in done.stderr) == leave_early, done.stderr


# ---- A DDP script switched by its class name ---------------------------------------------------


def torchrun(loader_class, out, samples, epochs, port, workers=2):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_backend=c10d",
           "--redirects", "1", "--tee", "2",
           str(HERE / "_dataloader_switch.py"), loader_class, str(out), str(samples), str(epochs),
           str(workers)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    assert_nothing_left(ranks[0]["queue"], [p for r in ranks for p in r["loader_pids"]], log)
    return ranks


def assert_nothing_left(queue, pids, log):
    """A job that ran its loop to the end left nothing: no notice, nothing of
    its queue or pool in /dev/shm, no process."""
    for notice in ("a process of it died", "left unfinished", "removed unfinished"):
        assert notice not in log, log[-6000:]
    if queue is not None:
        left = [f for f in os.listdir("/dev/shm") if queue in f]
        assert left == [], (left, log[-6000:])
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state == "Z", f"loader {pid} outlived its job (state {state})"


@pytest.mark.parametrize("workers", [2, 0])
def test_a_ddp_script_for_dataloader_switches_by_its_class_name(tmp_path, workers):
    # 400 samples: items of 256 and 144, whole batches of 8 each, so the epoch has no
    # leftover to carry and each one trains every sample (25 steps a rank). workers=0: the
    # debugging run, each rank loading in its own process.
    samples, epochs = 400, 2
    runs = {}
    for i, name in enumerate(("DataLoader", "PooledLoader")):
        out = tmp_path / name
        out.mkdir()
        port = 29650 + (os.getpid() % 150) * 4 + 2 * (workers > 0) + i
        runs[name] = torchrun(name, out, samples, epochs, port, workers)
    for name, ranks in runs.items():
        assert ranks[0]["len"] == ranks[1]["len"] == 25, name
        for epoch in range(epochs):
            steps = [r["epochs"][epoch]["steps"] for r in ranks]
            assert steps[0] == steps[1], (name, epoch, steps)
            ids = sorted(i for r in ranks for i in r["epochs"][epoch]["ids"])
            if name == "DataLoader":
                assert ids == list(range(samples))  # DistributedSampler's own promise
            else:
                assert ids == list(range(samples)), (epoch, len(ids))  # once each, none missing


def test_a_switched_ddp_script_of_any_length_trains_every_sample_each_epoch(tmp_path):
    """1,100 samples, batch 8, 2 ranks, 2 loaders a rank: epoch 0 ends with a
    partial global batch here (8 records; a carried-over run trains them in
    epoch 1). DistributedSampler(drop_last=False) pads each rank's share with
    repeats; PooledLoader under that sampler pads too (pad=True by default
    there): every sample in each epoch, equal steps, the repeats reported."""
    from test_pooled_checkpoint import free_port

    samples, epochs = 1100, 2
    runs = {}
    for name in ("DataLoader", "PooledLoader"):
        out = tmp_path / name
        out.mkdir()
        runs[name] = torchrun(name, out, samples, epochs, free_port())
    for name, ranks in runs.items():
        for epoch in range(epochs):
            steps = [r["epochs"][epoch]["steps"] for r in ranks]
            assert steps[0] == steps[1], (name, epoch, steps)
            ids = [i for r in ranks for i in r["epochs"][epoch]["ids"]]
            assert set(ids) == set(range(samples)), (name, epoch, samples - len(set(ids)))
            if name == "PooledLoader":
                padded = sum(r["padded"][epoch] for r in ranks)
                assert len(ids) == samples + padded, (epoch, len(ids), padded)
                assert padded < 2 * 8, padded  # less than a step of the two ranks
