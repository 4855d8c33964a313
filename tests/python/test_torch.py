"""tailcut.torch: QueueDataset under DataLoader workers, EqualSteps under DDP (gloo, CPU).

The multi-process tests spawn their ranks (plain multiprocessing, gloo with a
file:// rendezvous in a temporary directory) and give every wait a bound: a
hang fails the test instead of blocking the run.
"""

import collections
import json
import multiprocessing
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import warnings

import pytest

import tailcut
from tailcut import _job

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")
from torch.utils.data import DataLoader  # noqa: E402

import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402
from _torch_workers import (RECORD_BYTES, DieInWorker1, ddp_rank, loader_rank, quiet,  # noqa: E402
                            record_id, split, write_records)

SMALL = dict(chunk_bytes=4096, buffer_budget_bytes=64 << 10)
FILE_ORDER = dict(shuffle_buffer=0, interleave=1)  # records in file order, zero-copy batches


def ids_of(batch):
    return split(batch)[0].tolist()


@pytest.fixture
def uneven(tmp_path):
    """Three files of 3000, 1000 and 500 records (ids 0..4499): uneven items."""
    works = [write_records(tmp_path / "a.bin", range(0, 3000)),
             write_records(tmp_path / "b.bin", range(3000, 4000)),
             write_records(tmp_path / "c.bin", range(4000, 4500))]
    return works, set(range(4500))


def test_importing_tailcut_does_not_import_torch():
    code = "import sys, tailcut; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_batches_are_zero_copy_views_in_the_reading_process(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(2000))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's not-writable warning must not reach the caller
        ds = tt.QueueDataset(works, 16, name=qname, shuffle=False, format="fixed",
                             record_bytes=RECORD_BYTES, reader_options=SMALL, **FILE_ORDER)
        got, ptrs = [], []
        for batch in ds:
            assert batch.dtype == torch.uint8 and batch.shape == (16, RECORD_BYTES)
            got += ids_of(batch)
            ptrs.append(batch.data_ptr())
    ds.close()
    assert got == list(range(2000))
    # Consecutive batches of one chunk sit next to each other in the reader's
    # buffers: views, not copies.
    steps = collections.Counter(b - a for a, b in zip(ptrs, ptrs[1:]))
    assert steps[16 * RECORD_BYTES] > len(ptrs) // 2


def test_copy_true_gives_owned_writable_tensors(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(500))]
    with tt.QueueDataset(works, 50, copy=True, name=qname, shuffle=False, format="fixed",
                         record_bytes=RECORD_BYTES, reader_options=SMALL, **FILE_ORDER) as ds:
        kept = list(ds)
    kept[0][0, 0] = 7  # writable, owned
    assert sum(len(ids_of(b)) for b in kept) == 500
    assert ids_of(kept[-1])[-1] == 499


def test_records_mode_and_text_batches(tmp_path, qname):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    with tt.QueueDataset([str(path)], name=qname, num_slices=7,
                         reader_options=SMALL) as ds:
        records = list(ds)
    assert sorted(records) == sorted(f"line {i}".encode() for i in range(1000))
    with tt.QueueDataset([str(path)], 64, name=qname + "-b", num_slices=7,
                         reader_options=SMALL) as ds:
        lines = []
        for data, offsets in ds:
            raw = data.numpy().tobytes()
            lines += [raw[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    assert sorted(lines) == sorted(f"line {i}".encode() for i in range(1000))


def test_dataloader_workers_read_each_record_once_per_epoch(uneven, qname):
    works, all_ids = uneven
    with tt.QueueDataset(works, 32, transform=split, name=qname, num_epochs=2, num_slices=9,
                         format="fixed", record_bytes=RECORD_BYTES, reader_options=SMALL,
                         on_notice=lambda line: None) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen = collections.Counter()
            for ids, x in DataLoader(ds, batch_size=None, num_workers=2, timeout=60):
                seen.update(ids.tolist())
                assert torch.equal(x[:, 0], ids.to(torch.float32))
            assert set(seen) == all_ids and set(seen.values()) == {1}, epoch
        assert ds.queue.summary()["done"] == ds.queue.summary()["total"]
    assert not os.path.exists(tailcut.segment_path(qname))  # finished: removed


def test_spawned_persistent_workers_in_records_mode_without_set_epoch(uneven, qname):
    """Per-record mode batched by the DataLoader; spawned workers (the dataset is
    pickled) that persist across epochs; the epoch comes from the queue."""
    works, all_ids = uneven
    with tt.QueueDataset(works, transform=record_id, name=qname, num_epochs=2, num_slices=5,
                         format="fixed", record_bytes=RECORD_BYTES, reader_options=SMALL,
                         on_notice=quiet) as ds:
        loader = DataLoader(ds, batch_size=100, num_workers=2, timeout=60,
                            multiprocessing_context="spawn", persistent_workers=True)
        for epoch in range(2):
            seen = collections.Counter()
            for ids in loader:
                seen.update(ids.tolist())
            assert set(seen) == all_ids and set(seen.values()) == {1}, epoch
        del loader  # its workers close their queues as they exit
    assert not os.path.exists(tailcut.segment_path(qname))


@pytest.mark.parametrize("shuffle_buffer", [0, 256], ids=["file-order", "shuffled"])
def test_a_dataloader_worker_that_dies_loses_no_records(uneven, qname, shuffle_buffer):
    """Worker 1 is SIGKILLed holding items: the DataLoader raises, and the next
    pass over the same epoch (here, in the trainer process) gets them back --
    all of them, in file order and with a shuffle buffer alike (an item is
    done only once its records have left the buffer in a batch)."""
    works, all_ids = uneven
    with tt.QueueDataset(works, 32, transform=DieInWorker1(), name=qname, num_slices=9,
                         format="fixed", record_bytes=RECORD_BYTES, reader_options=SMALL,
                         shuffle_buffer=shuffle_buffer, interleave=1 + (shuffle_buffer > 0),
                         on_notice=quiet) as ds:
        ds.set_epoch(0)
        seen = collections.Counter()
        it = iter(DataLoader(ds, batch_size=None, num_workers=2, timeout=60))
        with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
            for ids, _ in it:
                seen.update(ids.tolist())
        del it  # shuts the other worker down: its open items go back
        again = collections.Counter()
        for ids, _ in ds:  # the same epoch, read in this process
            again.update(ids.tolist())
        lost = all_ids - set(seen) - set(again)
        assert not lost, f"{len(lost)} records of the dead worker were lost"
        summary = ds.queue.summary()
        assert summary["recovered_items"] >= 1, "the dead worker held no item"
        assert summary["done"] == summary["total"]


def test_a_shuffling_dataset_opens_its_queue_with_leases_for_the_items_its_buffer_holds(tmp_path,
                                                                                       qname):
    """An item stays leased until its last record leaves the shuffle buffer, so
    the shuffle's queue gets SHUFFLE_LEASES leases; a given value is kept, and
    file order keeps the queue's default."""
    works = [write_records(tmp_path / "a.bin", range(100))]
    fixed = dict(format="fixed", record_bytes=RECORD_BYTES, on_notice=quiet)
    cases = [({}, tt.SHUFFLE_LEASES), (dict(leases_per_client=12), 12), (FILE_ORDER, None),
             (dict(max_clients=1024), None)]
    for i, (kw, leases) in enumerate(cases):
        with tt.QueueDataset(works, 10, name=f"{qname}-{i}", **fixed, **kw) as ds:
            assert ds.queue.open_args.get("leases_per_client") == leases, kw
    assert tt.SHUFFLE_LEASES == 32


def test_queue_dataset_refuses_bad_arguments_by_name(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(100))]
    fixed = dict(format="fixed", record_bytes=RECORD_BYTES)
    with pytest.raises(ValueError,
                       match=r"^batch_size must be an int >= 1 or None, got 0 \(int\)$"):
        tt.QueueDataset(works, 0, name=qname, **fixed)
    with pytest.raises(TypeError,
                       match=r"^reader_options may not set 'max_epoch': QueueDataset sets it$"):
        tt.QueueDataset(works, 10, name=qname, reader_options={"max_epoch": 1}, **fixed)
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=rf"^queue '{qname}': num_epochs is 0; it must be at least 1$"):
        tt.QueueDataset(works, 10, name=qname, num_epochs=0, **fixed)
    with pytest.raises(ValueError, match=r"^shuffle_buffer must be an int >= 0, got -1 \(int\)$"):
        tt.QueueDataset(works, 10, name=qname, shuffle_buffer=-1, **fixed)
    with pytest.raises(ValueError, match=r"^interleave must be an int >= 1, got 0 \(int\)$"):
        tt.QueueDataset(works, 10, name=qname, interleave=0, **fixed)
    with pytest.raises(TypeError,
                       match=r"^reader_options may not set 'interleave': QueueDataset sets it$"):
        tt.QueueDataset(works, 10, name=qname, reader_options={"interleave": 2}, **fixed)
    ds = tt.QueueDataset(works, 10, name=qname, **fixed)
    with pytest.raises(ValueError, match=r"^epoch must be an int >= 0, got -1$"):
        ds.set_epoch(-1)
    ds.close()
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=rf"^QueueDataset of queue '{qname}' is closed$"):
        iter(ds)


def test_equal_steps_refuses_bad_arguments_by_name(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(100))]
    with pytest.raises(TypeError,
                       match=r"^EqualSteps needs queue= unless the loader reads a QueueDataset$"):
        tt.EqualSteps([1, 2, 3])
    with tt.QueueDataset(works, 10, name=qname, format="fixed", record_bytes=RECORD_BYTES) as ds:
        with pytest.raises(ValueError, match=r"^EqualSteps: local_rank 2 is not in "
                                             r"\[0, local_world_size=2\)$"):
            tt.EqualSteps(ds, local_rank=2, local_world_size=2)
        with pytest.raises(ValueError,
                           match=r"^timeout must be a number of seconds > 0 or None, "
                                 r"got 0 \(int\)$"):
            tt.EqualSteps(ds, local_rank=0, local_world_size=1, timeout=0)
        steps = tt.EqualSteps(ds, local_rank=0, local_world_size=1)
        with pytest.raises(ValueError, match=r"^epoch must be an int in \[0, 2\*\*30\), got -1$"):
            steps.set_epoch(-1)


def test_equal_steps_alone_times_out_instead_of_hanging(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(100))]
    with tt.QueueDataset(works, 10, name=qname, format="fixed", record_bytes=RECORD_BYTES,
                         num_clients=2) as ds:
        steps = tt.EqualSteps(ds, local_rank=0, local_world_size=2, timeout=0.3)
        start = time.monotonic()
        with pytest.raises(tailcut.TimeoutError, match="epoch 0, step 0"):
            for _ in steps:
                pass
        assert time.monotonic() - start < 5


def test_equal_steps_single_rank_carries_nothing_and_counts_steps(tmp_path, qname):
    works = [write_records(tmp_path / "a.bin", range(1000))]
    with tt.QueueDataset(works, 100, transform=split, name=qname, num_epochs=2,
                         format="fixed", record_bytes=RECORD_BYTES, reader_options=SMALL) as ds:
        steps = tt.EqualSteps(ds, local_rank=0, local_world_size=1, carry_over=True)
        for epoch in range(2):
            ids = [i for batch_ids, _ in steps for i in batch_ids.tolist()]
            assert sorted(ids) == list(range(1000))
        assert [r["steps"] for r in steps.reports] == [10, 10]
        assert steps.leftover == 0 and steps.epoch == 2


def run_ranks(target, args, world, limit_s):
    """Runs target(rank, args) in `world` spawned processes; fails (and kills
    them) past limit_s seconds. Returns each rank's JSON log."""
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
    out = pathlib.Path(args["out_dir"])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def check_accounting(logs, all_ids, epochs, group_of=lambda rank: 0):
    """Equal steps in each group; every record of every epoch trained once (in
    that epoch, or in a later one when carried over) or dropped and reported."""
    for e in range(epochs):
        by_group = collections.defaultdict(set)
        for r, log in enumerate(logs):
            rep = log[e]["report"]
            assert rep["epoch"] == e and len(log[e]["trained"]) == rep["steps"]
            by_group[group_of(r)].add(rep["steps"])
            # Carried batches come first; later ones are the epoch's own (or
            # late items of an earlier epoch).
            origins = [origin for origin, _ in log[e]["trained"]]
            assert all(o < e for o in origins[:rep["carried_in"]]), origins
            assert set(origins) <= set(range(e + 1)), origins
            assert rep["leftover_batches"] == rep["carried_out"] + rep["dropped_batches"]
            assert rep["dropped_records"] == sum(len(ids) for _, ids in log[e]["dropped"])
            if e + 1 == epochs:
                assert rep["carried_out"] == 0  # nothing to carry into
        assert all(len(s) == 1 for s in by_group.values()), (e, dict(by_group))
    per_epoch = collections.defaultdict(collections.Counter)
    for log in logs:
        for e in range(epochs):
            for origin, ids in log[e]["trained"] + log[e]["dropped"]:
                per_epoch[origin].update(ids)
    for e in range(epochs):
        assert set(per_epoch[e]) == all_ids and set(per_epoch[e].values()) == {1}, f"epoch {e}"


@pytest.mark.parametrize("carry_over", [False, True], ids=["drop", "carry"])
def test_ddp_ranks_run_equal_steps_with_a_slow_rank(tmp_path, qname, carry_over):
    """4 gloo DDP ranks, rank 2 loads 5x slower, 3 epochs."""
    all_ids = set(range(1800))
    sizes = [90, 180, 270, 360, 450, 450]  # uneven items: ranks run out at different steps
    works = [write_records(tmp_path / f"part{i}.bin", range(sum(sizes[:i]), sum(sizes[:i + 1])))
             for i in range(len(sizes))]
    args = dict(works=works, job=qname, epochs=3, batch_size=16, num_slices=24, seed=5,
                world=4, slow_rank=2, delay=0.001, carry_over=carry_over,
                init_file=str(tmp_path / "rendezvous"), out_dir=str(tmp_path))
    logs = run_ranks(ddp_rank, args, world=4, limit_s=120)
    check_accounting(logs, all_ids, epochs=3)
    assert not os.path.exists(tailcut.segment_path(qname))


def test_ddp_across_two_hosts_runs_equal_steps(tmp_path, qname):
    """2 "hosts" of 2 ranks, one queue each: the per-host answers are combined
    with an all_reduce, so all 4 ranks run the same steps."""
    works_by_host = [
        [write_records(tmp_path / "h0.bin", range(0, 1200))],  # host 0 has more data
        [write_records(tmp_path / "h1.bin", range(1200, 1800))],
    ]
    args = dict(works_by_host=works_by_host, works=None, job=qname, epochs=2, batch_size=16,
                num_slices=8, seed=5, world=4, local_world=2, slow_rank=None, delay=0.0,
                carry_over=False, init_file=str(tmp_path / "rendezvous"), out_dir=str(tmp_path))
    logs = run_ranks(ddp_rank, args, world=4, limit_s=120)
    steps = {tuple(log[e]["report"]["steps"] for log in logs) for e in range(2)}
    assert all(len(set(s)) == 1 for s in steps), steps
    for host, ids in enumerate([set(range(1200)), set(range(1200, 1800))]):
        check_accounting(logs[2 * host:2 * host + 2], ids, epochs=2)


def test_equal_steps_over_dataloader_workers(tmp_path, qname):
    """2 ranks, each a DataLoader with 2 workers (6 processes on one queue)."""
    all_ids = set(range(2400))
    works = [write_records(tmp_path / f"part{i}.bin", range(i * 800, (i + 1) * 800))
             for i in range(3)]
    args = dict(works=works, job=qname, epochs=2, batch_size=20, num_slices=12, seed=3,
                world=2, slow_rank=1, delay=0.001, carry_over=True, out_dir=str(tmp_path))
    logs = run_ranks(loader_rank, args, world=2, limit_s=120)
    check_accounting(logs, all_ids, epochs=2)


def test_equal_steps_counts_records_of_text_batches_from_dataloader_workers(tmp_path, qname):
    """(data, offsets) batches reach the rank as a list through DataLoader workers; the
    leftover count is their records, not the bytes of data."""
    lines = [b"line %04d" % i for i in range(1000)]
    path = tmp_path / "a.txt"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    ds = tt.QueueDataset([str(path)], batch_size=64, name=qname, num_slices=8,
                         on_notice=quiet)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        timeout=60)
    steps = tt.EqualSteps(loader, local_rank=0, local_world_size=2, timeout=30)
    dropped = []
    steps.on_leftover = dropped.append
    # Rank 1 has no batch at step 0, so rank 0's whole epoch is left over;
    # then both agree that they read their loaders to the end (step 1) and
    # that they took the queue's state (step 2).
    def rank1():
        for step in (0, 1, 2):
            ds.queue.agree_step(1, 2, step, False, timeout=30)

    other = threading.Thread(target=rank1, daemon=True)
    other.start()
    assert list(steps) == []
    other.join(30)
    report = steps.reports[0]
    assert all(isinstance(b, list) for b in dropped)  # what the loader handed on
    assert report["dropped_records"] == sum(len(b[1]) - 1 for b in dropped) == 1000
    assert report["dropped_batches"] == len(dropped) < 1000
    ds.close()


def test_batches_carried_at_an_epoch_end_survive_a_checkpoint_and_restore(tmp_path, qname):
    """By default (carry_over=True) a rank's leftover batches are carried into the next epoch,
    and state_dict() keeps them: the queue's epoch-end state counts their records as done.
    Rank 1 (a thread) has no batch at step 3 of epoch 0, so the rest of rank 0's epoch 0 is
    carried; a new job restores the epoch-end state and yields the carried batches first.
    Shuffled records, DataLoader workers: every record of both epochs exactly once."""
    import io
    works = [write_records(tmp_path / f"p{i}.bin", range(i * 500, (i + 1) * 500))
             for i in range(2)]
    opts = dict(format="fixed", record_bytes=RECORD_BYTES, num_epochs=2, num_slices=8, seed=4,
                on_notice=quiet)
    ds = tt.QueueDataset(works, 20, name=f"{qname}-a", **opts)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        timeout=60)
    steps = tt.EqualSteps(loader, local_rank=0, local_world_size=2, timeout=30)

    def rank1():  # a batch for steps 0..2, none at 3; then the two epoch-end agreements
        for step in range(6):
            ds.queue.agree_step(1, 2, step, step < 3, timeout=30)

    other = threading.Thread(target=rank1, daemon=True)
    other.start()
    epoch0 = [i for batch in steps for i in ids_of(batch)]
    other.join(30)
    report = steps.reports[0]
    assert report["steps"] == 3 and report["dropped_records"] == 0
    assert report["carried_out"] > 0 and len(epoch0) + report["leftover_records"] == 1000
    buffer = io.BytesIO()
    torch.save(steps.state_dict(), buffer)  # rank 0 checkpoints; the job stops
    del loader
    ds.close()

    buffer.seek(0)
    ckpt = torch.load(buffer)
    assert sorted(ckpt["carried"]) == [0] and len(ckpt["carried"][0]) == report["carried_out"]
    with tt.QueueDataset(works, 20, name=f"{qname}-b", restore_state=ckpt["queue"],
                         **opts) as ds:
        with pytest.raises(tailcut.InvalidArgumentError, match=r"rank\(s\) \[0\], not of rank 1"):
            tt.EqualSteps(ds, local_rank=1, local_world_size=2).load_state_dict(ckpt)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                            timeout=60)
        steps = tt.EqualSteps(loader, local_rank=0, local_world_size=1, timeout=30)
        steps.load_state_dict(ckpt)
        assert steps.epoch == 1
        got = [ids_of(batch) for batch in steps]
    carried_in = steps.reports[0]["carried_in"]
    assert carried_in == report["carried_out"]
    epoch0 += [i for ids in got[:carried_in] for i in ids]
    epoch1 = [i for ids in got[carried_in:] for i in ids]
    assert sorted(epoch0) == list(range(1000)), "epoch 0: a record lost or trained twice"
    assert sorted(epoch1) == list(range(1000)), "epoch 1: a record lost or trained twice"
    assert steps.leftover == 0


# ---- Record-level shuffle ----------------------------------------------------------------------


def adjacency(batches):
    """The fraction of neighbouring records in a batch whose ids are consecutive."""
    pairs = adjacent = 0
    for ids in batches:
        pairs += len(ids) - 1
        adjacent += sum(1 for a, b in zip(ids, ids[1:]) if abs(b - a) == 1)
    return adjacent / max(pairs, 1)


def test_records_are_shuffled_by_default_in_an_order_set_by_the_seed(uneven, qname):
    works, all_ids = uneven

    def run(name, seed, **kw):
        with tt.QueueDataset(works, 32, name=name, num_epochs=2, num_slices=9, seed=seed,
                             format="fixed", record_bytes=RECORD_BYTES, reader_options=SMALL,
                             on_notice=quiet, **kw) as ds:
            epochs = []
            for epoch in range(2):
                ds.set_epoch(epoch)
                epochs.append([ids_of(batch) for batch in ds])
            return epochs

    first, again, other = run(qname + "-a", 3), run(qname + "-b", 3), run(qname + "-c", 4)
    in_file_order = run(qname + "-p", 3, **FILE_ORDER)
    for epoch in range(2):
        ids = [i for batch in first[epoch] for i in batch]
        assert len(ids) == len(all_ids) and set(ids) == all_ids, epoch  # each record once
    assert first == again, "same seed, same order"
    assert first != other and first[0] != first[1], "another seed or epoch, another order"
    # Neighbours in a batch: file order (the baseline, measured here) against shuffled.
    assert adjacency(in_file_order[0]) > 0.9
    assert adjacency(first[0]) < 0.05 and adjacency(first[1]) < 0.05


# ---- Queue names, len(), reruns ----------------------------------------------------------------


def remove_quietly(*names):
    for name in names:
        try:
            tailcut.remove_queue(name, force=True)
        except tailcut.NotFoundError:
            pass


@pytest.fixture
def torchrun_env(monkeypatch, tmp_path):
    """A torchrun-like environment: a script and arguments of this test only."""
    for var in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT", "LOCAL_RANK",
                "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", ["/jobs/train.py", "--data", str(tmp_path)])

    def launch(run_id, restart=0, port=29500, static=False):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", str(static))
        return _job.default_name()

    return launch


def test_default_queue_name_is_per_torchrun_job_and_attempt(torchrun_env, monkeypatch):
    assert _job.default_name() == "work_queue"  # not under torchrun
    # --rdzv_id given: the user's job id names the job.
    assert torchrun_env(f"job/{os.getpid()}") == f"torchrun-job_{os.getpid()}-0"
    assert torchrun_env(f"job/{os.getpid()}", restart=2) == f"torchrun-job_{os.getpid()}-2"
    # --standalone: a new uuid per run; the job is its script and arguments, so that a
    # rerun finds the queue a crashed run left.
    standalone = torchrun_env("0d3f2f1e-5b7a-4c1d-9e2f-3a4b5c6d7e8f", port=41234)
    assert standalone.startswith("torchrun-train-") and standalone.endswith("-0")
    assert torchrun_env("7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", port=50111) == standalone
    # c10d without --rdzv_id: the run id is "none" and torchrun draws MASTER_PORT anew for
    # every run and restart attempt: the job is its command, whatever the port.
    c10d = torchrun_env("none", port=41234)
    assert c10d == torchrun_env("none", port=50111) == torchrun_env("none", restart=1,
                                                                     port=37000)[:-1] + "0"
    # Static rendezvous (--master_port, the user's): the port tells concurrent jobs apart.
    none_29500 = torchrun_env("none", port=29500, static=True)
    assert none_29500 == torchrun_env("none", port=29500, static=True)
    assert none_29500 != torchrun_env("none", port=29501, static=True)
    assert none_29500.startswith("torchrun-train-") and none_29500 != standalone
    # Another script, arguments or directory: another job.
    monkeypatch.setattr(sys, "argv", sys.argv[:2] + ["elsewhere"])
    assert torchrun_env("none", port=29500, static=True) != none_29500
    assert torchrun_env("none", port=41234) != c10d
    assert len(none_29500) <= 80


def test_queue_dataset_opens_the_default_torchrun_queue(tmp_path, torchrun_env):
    works = [write_records(tmp_path / "a.bin", range(10))]
    name = torchrun_env(f"job-{os.getpid()}")
    with tt.QueueDataset(works, 4, format="fixed", record_bytes=RECORD_BYTES) as ds:
        assert ds.queue.name == name == f"torchrun-job-{os.getpid()}-0"
    explicit = f"mine-{os.getpid()}"
    with tt.QueueDataset(works, 4, format="fixed", record_bytes=RECORD_BYTES, name=explicit) as ds:
        assert ds.queue.name == explicit  # a given name is kept
    remove_quietly(name, explicit)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_a_rank_that_finds_its_queue_half_made_opens_it_as_a_joiner_would(tmp_path, monkeypatch,
                                                                          local_rank):
    # Another rank of the host has made the queue's segment but not sized it yet (or died
    # there). Looking for an earlier run's queue must not take that for damage: the rank
    # opens the queue, which waits for the creator and removes what a dead one left. Both
    # ranks once raised "did not grow for 0 ms" here when they started together.
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    name = f"half-made-{os.getpid()}-{local_rank}"
    fd = os.open(tailcut.segment_path(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    notices = []
    works = [write_records(tmp_path / "a.bin", range(40))]
    try:
        with tt.QueueDataset(works, 8, name=name, format="fixed", record_bytes=RECORD_BYTES,
                             attach_timeout=0.2, on_notice=notices.append, **FILE_ORDER) as ds:
            assert sorted(i for b in ds for i in ids_of(b)) == list(range(40))
    finally:
        remove_quietly(name)
    assert any("removed an empty segment left by a creator that died" in n for n in notices)


def test_a_rerun_under_standalone_resumes_or_restores_the_crashed_run(tmp_path, torchrun_env):
    works = [write_records(tmp_path / "a.bin", range(800))]
    opts = dict(format="fixed", record_bytes=RECORD_BYTES, num_slices=8, num_clients=1,
                on_notice=quiet, **FILE_ORDER)

    def crashed_run(run_id, restart=0):
        name = torchrun_env(run_id, restart=restart)
        ds = tt.QueueDataset(works, 100, keep_unfinished=True, **opts)  # kept, as by a crash
        steps = iter(tt.EqualSteps(ds, local_rank=0, local_world_size=1))
        next(steps), next(steps)  # the first item is done; steps 0 and 1 agreed
        ds.queue.close()
        assert os.path.exists(tailcut.segment_path(name))
        return name

    first = crashed_run("11111111-1111-4111-8111-111111111111")
    # The rerun has a new uuid (--standalone) but finds the queue, and says so; it goes
    # on in a fresh queue made from the old one's state, so EqualSteps (whose steps
    # the crashed run agreed on in the old one) works.
    name = torchrun_env("22222222-2222-4222-8222-222222222222")
    assert name == first
    with pytest.warns(RuntimeWarning, match=rf"resuming queue '{name}', left unfinished"):
        ds = tt.QueueDataset(works, 100, resume=True, **opts)
    steps = tt.EqualSteps(ds, local_rank=0, local_world_size=1)
    assert 0 < sum(len(ids_of(b)) for b in steps) < 800
    ds.close()
    # With a checkpoint (restore_state) the checkpoint decides: the stale queue goes.
    with tt.QueueDataset(works, 100, name=f"ckpt-{os.getpid()}", **opts) as start:
        state = start.queue.state_dict()  # the job's start: nothing done
    crashed_run("44444444-4444-4444-8444-444444444444")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchrun_env("55555555-5555-4555-8555-555555555555")
        ds = tt.QueueDataset(works, 100, restore_state=state, **opts)
    assert sum(len(ids_of(b)) for b in ds) == 800
    ds.close()
    # A run that crashed after an elastic restart left attempt 1's queue: a new run
    # cannot resume it under its own names, and removes it.
    later = crashed_run("66666666-6666-4666-8666-666666666666", restart=1)
    assert later.endswith("-1")
    torchrun_env("77777777-7777-4777-8777-777777777777")
    with tt.QueueDataset(works, 100, **opts) as ds:
        assert sum(len(ids_of(b)) for b in ds) == 800
    assert not os.path.exists(tailcut.segment_path(later))
    remove_quietly(name, later)


def test_len_is_exact_for_fixed_records_and_estimated_for_lines(tmp_path, qname):
    from conftest import write_lines
    works = [write_records(tmp_path / "a.bin", range(1000)),
             write_records(tmp_path / "b.bin", range(1000, 1250))]
    ds = tt.QueueDataset(works, 16, name=qname, format="fixed", record_bytes=RECORD_BYTES,
                         num_clients=1)
    assert ds.records_per_epoch() == (1250, True)
    assert len(ds) == -(-1250 // 16) == sum(1 for _ in ds)  # one reader: exact
    assert len(tt.EqualSteps(ds, local_rank=0, local_world_size=1)) == 1250 // 16
    ds.close()
    four = tt.QueueDataset(works, 16, name=qname + "-4", format="fixed",
                           record_bytes=RECORD_BYTES, num_clients=4)
    assert len(four) == -(-(-(-1250 // 4)) // 16)  # a rank's even share
    assert len(tt.EqualSteps(four, local_rank=0, local_world_size=4)) == 1250 // (4 * 16)
    four.close()
    tailcut.remove_queue(qname + "-4", force=True)
    lines = [write_lines(tmp_path / f"{i}.txt", [b"x" * (i % 7) for i in range(3000)])
             for i in range(2)]
    text = tt.QueueDataset(lines, name=qname + "-t", format="lines", num_clients=1)
    records, exact = text.records_per_epoch()
    assert not exact and abs(records - 6000) <= 60
    assert len(DataLoader(text, batch_size=100)) == -(-records // 100)
    text.close()
    assert not os.path.exists(tailcut.segment_path(qname + "-t"))


def test_rerun_starts_over_in_one_line_or_resumes_when_told_to(tmp_path, qname, monkeypatch,
                                                                caplog, capfd):
    works = [write_records(tmp_path / "a.bin", range(800))]
    # File order: which records come again after the "crash" below is known exactly.
    opts = dict(format="fixed", record_bytes=RECORD_BYTES, num_slices=8, name=qname,
                num_clients=1, **FILE_ORDER)

    def crash():
        # keep_unfinished=True keeps the unfinished queue at close, as a process that died
        # would (a clean close of every process removes it).
        crashed = tt.QueueDataset(works, 100, keep_unfinished=True, on_notice=quiet, **opts)
        it = iter(crashed)
        first = [ids_of(next(it)) for _ in range(2)]
        del it
        crashed.queue.close()  # the "crash": the queue stays, unfinished
        return {i for b in first for i in b}

    before = crash()
    capfd.readouterr()
    with pytest.warns(RuntimeWarning, match=r"resuming queue .*left unfinished by an earlier "
                      r"run \(epoch 0, [12] of 8 items done\).*goes on at epoch 0"):
        resumed = tt.QueueDataset(works, 100, resume=True, **opts)
    # One line: the notice of the state's reader ("removed unfinished ... to resume it
    # later") no longer contradicts it.
    assert "unfinished" not in capfd.readouterr().err
    got = [i for b in resumed for i in ids_of(b)]
    # The rest; records of the item open at the crash come again (from its
    # last reported progress), a finished item's do not.
    assert len(set(got)) == len(got) and set(got) | before == set(range(800))
    assert len(got) < 800
    resumed.close()
    crash()
    monkeypatch.setenv("TAILCUT_RESUME", "1")
    with pytest.warns(RuntimeWarning, match="resuming"):
        tt.QueueDataset(works, 100, on_notice=quiet, **opts).close()
    monkeypatch.delenv("TAILCUT_RESUME")
    # By default a rerun without a checkpoint starts over (a fresh model sees every
    # record), and says so once.
    crash()
    capfd.readouterr()
    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = tt.QueueDataset(works, 100, **opts)
    lines = [r.getMessage() for r in caplog.records if r.name == "tailcut.torch"]
    assert len(lines) == 1 and re.search(r"starting over: discarded queue .*left unfinished by an "
                                         r"earlier run .*restore_state", lines[0]), lines
    assert "unfinished" not in capfd.readouterr().err
    assert len([i for b in fresh for i in ids_of(b)]) == 800
    fresh.close()


def test_a_resumed_queue_starts_the_epoch_counters_at_its_epoch(tmp_path, qname):
    """A rerun told to resume a queue left in epoch 1 runs epoch 1 first, not an
    epoch 0 of no steps."""
    works = [write_records(tmp_path / "a.bin", range(800))]
    opts = dict(format="fixed", record_bytes=RECORD_BYTES, num_slices=8, name=qname,
                num_clients=1, num_epochs=2, on_notice=quiet, **FILE_ORDER)
    crashed = tt.QueueDataset(works, 100, keep_unfinished=True, **opts)
    steps = tt.EqualSteps(crashed, local_rank=0, local_world_size=1)
    assert steps.epoch == 0
    assert sum(1 for _ in steps) == 8  # epoch 0, whole
    it = iter(steps)
    next(it)
    del it
    crashed.queue.close()
    with pytest.warns(RuntimeWarning, match="goes on at epoch 1"):
        ds = tt.QueueDataset(works, 100, resume=True, **opts)
    steps = tt.EqualSteps(ds, local_rank=0, local_world_size=1)
    assert steps.epoch == 1
    assert 0 < sum(1 for _ in steps) <= 8  # the rest of epoch 1, not an empty epoch 0
    ds.close()


def test_a_pooled_loader_refuses_a_queue_resumed_without_a_checkpoint(tmp_path, qname):
    # Its loaders ack what they publish, so the crashed run's batches that no rank used are
    # done in the queue's state: resuming it would lose them (64-75 records in the torchrun
    # rerun of test_pooled_lifecycle.py, about num_slots batches).
    works = [write_records(tmp_path / "a.bin", range(800))]
    opts = dict(format="fixed", record_bytes=RECORD_BYTES, num_slices=8, name=qname,
                num_clients=1, on_notice=quiet, **FILE_ORDER)
    crashed = tt.QueueDataset(works, 100, keep_unfinished=True, **opts)
    next(iter(crashed))
    crashed.queue.close()
    with pytest.warns(RuntimeWarning, match="resuming"):
        ds = tt.QueueDataset(works, 100, resume=True, **opts)
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=r"^PooledLoader: queue '.*', left unfinished by an earlier run "
                             r"\(epoch 0, .*\) was resumed without a checkpoint \(resume=True\), "
                             r"which would lose the batches .* or start over \(resume=False"):
        tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, world_size=1, local_rank=0)
    ds.close()
    # A rerun that starts over (the default) pools as ever.
    fresh = tt.QueueDataset(works, 100, **opts)
    tailcut.pool.PooledLoader(fresh, loaders_per_host=0, rank=0, world_size=1, local_rank=0).close()
    fresh.close()
