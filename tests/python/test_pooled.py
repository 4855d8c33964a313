"""tailcut.BatchRing from Python and tailcut.pool.PooledLoader: zero copy, every
record delivered, loaders killed with SIGKILL, equal steps, Ctrl-C; loaders that join
(add_loaders, python3 -m tailcut.pool) and leave (remove_loaders, SIGTERM) mid-epoch;
carry-over; the dataset's own batch size and transform; the records of one item."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tailcut
from tailcut.pool import loader as pool_loader

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, fork, ids_of, wait_ok, write_ids  # noqa: E402




def mapping_of(path):
    """The [start, end) address ranges at which this process maps `path`."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith(path):
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def test_round_trip_across_processes_is_zero_copy(rname, tmp_path):
    batches, slot_bytes = 24, 4096

    def loader():
        ring = tailcut.BatchRing(rname, slot_bytes, 4, "loader")
        for i in range(batches):
            slot = ring.acquire(timeout=30)
            data = np.frombuffer(slot.data, np.uint32)
            data[:100] = i  # a stamp through the whole batch
            slot.header[:4] = i.to_bytes(4, "little")
            assert ring.publish(slot, 0, i + 1, 400)
        ring.end_epoch(0)
        ring.close()

    def trainer(k):
        def run():
            ring = tailcut.BatchRing(rname, slot_bytes, 4, "trainer")
            spans = mapping_of(ring.stats()["segment_path"])
            assert spans, "the ring's segment is not mapped"
            seen = []
            while (b := ring.pop(through_epoch=0, timeout=30)) is not None:
                a = np.frombuffer(b.data, np.uint32)
                i = int.from_bytes(bytes(b.header[:4]), "little")
                assert len(b.data) == 400 and b.records == i + 1 and b.epoch == 0
                assert (a == i).all()
                t = torch.frombuffer(b.data, dtype=torch.uint8)
                assert any(lo <= t.data_ptr() < hi for lo, hi in spans)  # no copy
                assert any(lo <= a.ctypes.data < hi for lo, hi in spans)
                del a, t
                seen.append(i)
                ring.release(b)
            (tmp_path / f"t{k}").write_text(" ".join(map(str, seen)))
            ring.close()
        return run

    # The trainers open the ring before the loader can end its epoch.
    ring = tailcut.BatchRing(rname, slot_bytes, 4, "trainer")
    pids = [fork(trainer(0)), fork(trainer(1)), fork(loader)]
    for pid in pids:
        wait_ok(pid)
    seen = [int(x) for k in range(2) for x in (tmp_path / f"t{k}").read_text().split()]
    assert sorted(seen) == list(range(batches))
    stats = ring.stats()
    assert stats["free"] == 4 and stats["published"] == stats["released"] == batches
    ring.close()


def test_use_after_release_raises(rname):
    loader = tailcut.BatchRing(rname, 1024, 2, "loader")
    trainer = tailcut.BatchRing(rname, 1024, 2, "trainer")
    slot = loader.acquire(timeout=5)
    written = slot.data
    written[:3] = b"abc"
    assert loader.publish(slot, 0, 1, 3)
    with pytest.raises(ValueError):
        written[0]  # the slot view died with publish
    with pytest.raises(tailcut.InvalidArgumentError):
        loader.publish(slot, 0, 1, 3)
    batch = trainer.pop(timeout=5)
    view, header = batch.data, batch.header
    assert bytes(view) == b"abc"
    trainer.release(batch)
    with pytest.raises(ValueError):
        view[0]
    with pytest.raises(ValueError):
        bytes(header)
    with pytest.raises(tailcut.InvalidArgumentError):
        batch.data
    with pytest.raises(tailcut.InvalidArgumentError):
        trainer.release(batch)
    with pytest.raises(tailcut.Empty):
        trainer.pop(timeout=0.05)
    with pytest.raises(tailcut.InvalidArgumentError):
        trainer.acquire(timeout=0)  # wrong role
    trainer.end_epoch(0)
    assert trainer.pop(through_epoch=0, timeout=1) is None
    loader.close()
    trainer.close()
    with pytest.raises(tailcut.InvalidArgumentError):
        trainer.pop(timeout=0)


def test_ctrl_c_ends_a_trainer_waiting_in_pop(rname):
    r, w = os.pipe()

    def waiter():
        os.close(r)
        ring = tailcut.BatchRing(rname, 1024, 2, "trainer")
        os.write(w, b"r")
        try:
            ring.pop()
        except KeyboardInterrupt:
            os.write(w, f"{time.monotonic():.6f}".encode())

    ring = tailcut.BatchRing(rname, 1024, 2, "loader")  # keeps the ring while the child waits
    pid = fork(waiter)
    os.close(w)
    assert os.read(r, 1) == b"r"
    time.sleep(0.3)  # in pop by now
    sent = time.monotonic()
    os.kill(pid, signal.SIGINT)
    got = os.read(r, 64)
    wait_ok(pid)
    os.close(r)
    assert got, "pop did not raise KeyboardInterrupt"
    assert float(got) - sent < 1.0
    ring.close()


def dataset(path, name, **kw):
    return tt.QueueDataset([path], name=name, format="fixed", record_bytes=RECORD,
                           num_clients=1, **kw)


def test_two_loaders_two_trainers_deliver_every_record_once(rname, tmp_path):
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    ring_args = dict(batch_size=25, slot_bytes=1 << 14, num_slots=6)

    ready_r, ready_w = os.pipe()

    def trainer(k):
        def run():
            ring = tailcut.BatchRing(rname + ".pool", 1 << 14, 6, "trainer")
            os.write(ready_w, b"r")
            ids = []
            while (b := ring.pop(through_epoch=0, timeout=60)) is not None:
                ids += ids_of(pool_loader.decode_batch(b.data, b.header))
                time.sleep(0.001)  # a step: the other trainer pops meanwhile
                ring.release(b)
            np.save(tmp_path / f"ids{k}.npy", np.array(ids, np.uint64))
        return run

    ds = dataset(path, rname, num_slices=37, shuffle=True, seed=3)
    keep = tailcut.BatchRing(rname + ".pool", 1 << 14, 6, "trainer")
    pids = [fork(trainer(0)), fork(trainer(1))]
    # Both trainers have joined before the first batch exists, so both get some.
    assert os.read(ready_r, 1) + os.read(ready_r, 1) == b"rr"
    os.close(ready_r)
    os.close(ready_w)
    loaders = pool_loader.start_loaders(ds, rname + ".pool", 2, **ring_args)
    for pid in pids:
        wait_ok(pid)
    for p in loaders:
        p.join(30)
        assert p.exitcode == 0
    ids = np.concatenate([np.load(tmp_path / f"ids{k}.npy") for k in range(2)])
    assert len(np.load(tmp_path / "ids0.npy")) and len(np.load(tmp_path / "ids1.npy"))
    assert sorted(ids.tolist()) == list(range(n))  # each once
    stats = keep.stats()
    assert stats["free"] == 6 and stats["published"] == stats["released"]
    keep.close()
    ds.close()


def test_a_loader_killed_mid_run_loses_nothing_and_leaks_no_slot(rname, tmp_path):
    n = 2000
    path = write_ids(tmp_path / "ids.bin", n)
    ds = dataset(path, rname, num_slices=10, shuffle=False)  # 200 records an item

    def slow(batch):
        time.sleep(0.01)
        return batch

    trainer = tailcut.BatchRing(rname + ".pool", 1 << 14, 4, "trainer")
    loaders = pool_loader.start_loaders(ds, rname + ".pool", 2, batch_size=20, slot_bytes=1 << 14,
                                 num_slots=4, transform=slow)
    ids, killed = [], False
    while (b := trainer.pop(through_epoch=0, timeout=60)) is not None:
        if not killed and len(ids) >= 300:
            os.kill(loaders[0].pid, signal.SIGKILL)
            killed = True
        ids += ids_of(pool_loader.decode_batch(b.data, b.header))
        trainer.release(b)
    loaders[0].join(10)
    loaders[1].join(30)
    assert loaders[0].exitcode == -signal.SIGKILL and loaders[1].exitcode == 0
    assert set(ids) == set(range(n))  # its items came back
    # Its items came back from their committed offsets: at most the batch it
    # published just before it died (between the publish and its commit)
    # comes out twice, not the records it published of the item it was
    # reading (about 160 here without commits).
    assert ds.queue.summary()["recovered_items"] >= 1
    assert len(ids) - n <= 20
    stats = trainer.stats()
    assert (stats["free"], stats["filling"], stats["ready"], stats["popped"]) == (4, 0, 0, 0)
    assert stats["published"] == stats["released"]
    trainer.close()
    ds.close()


def test_pooled_loader_gives_forked_ranks_equal_steps(rname, tmp_path):
    n, epochs = 1000, 2
    path = write_ids(tmp_path / "ids.bin", n)

    def rank(r):
        def run():
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                              LOCAL_WORLD_SIZE="2")
            ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD,
                                 num_slices=23, num_epochs=epochs)
            # Leftovers dropped, not carried over: each epoch's records stand alone.
            loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, batch_size=32, slot_bytes=1 << 14,
                                     num_slots=6, timeout=60, carry_over=False)
            out = []
            for e in range(epochs):
                loader.set_epoch(e)
                ids = []
                for batch in loader:
                    assert batch.dtype == torch.uint8 and batch.shape[1] == RECORD
                    ids += ids_of(batch.numpy())
                rep = loader.reports[-1]
                out.append(f"{e} {rep['steps']} {rep['leftover_records']} {len(loader)} "
                           + " ".join(map(str, ids)))
            loader.close()
            ds.close()
            (tmp_path / f"rank{r}").write_text("\n".join(out))
        return run

    pids = [fork(rank(0)), fork(rank(1))]
    for pid in pids:
        wait_ok(pid, 120)
    lines = [(tmp_path / f"rank{r}").read_text().split("\n") for r in range(2)]
    for e in range(epochs):
        rows = [[int(x) for x in lines[r][e].split()] for r in range(2)]
        assert rows[0][0] == rows[1][0] == e
        assert rows[0][1] == rows[1][1] > 0  # equal steps
        assert rows[0][3] == n // 32 // 2  # len(): the estimate
        ids = rows[0][4:] + rows[1][4:]
        leftover = rows[0][2] + rows[1][2]
        assert len(set(ids)) == len(ids)  # each record once ...
        assert len(ids) + leftover == n  # ... or left over


def test_close_from_another_thread_ends_a_waiting_pop(rname):
    import threading
    ring = tailcut.BatchRing(rname, 1024, 2, "trainer")
    got = []

    def wait():
        try:
            ring.pop()
        except tailcut.InvalidArgumentError as e:
            got.append((time.monotonic(), str(e)))

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    closed = time.monotonic()
    ring.close()
    t.join(5)
    assert got and got[0][0] - closed < 1.0 and "closed" in got[0][1]


def test_the_batch_ring_example_of_the_doc_runs(tmp_path):
    import pathlib
    import re
    import subprocess
    import sys
    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "pooled.md"
    blocks = re.findall(r"^```python\n(.*?)^```", doc.read_text(), re.S | re.M)
    example = [b for b in blocks if "tailcut.BatchRing(" in b]
    assert example
    name = f"pytest-doc-{os.getpid()}"
    script = tmp_path / "example.py"
    script.write_text(example[0].replace('"r"', repr(name)))
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(tailcut.__file__).resolve().parents[1]))
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path, env=env, timeout=60)


# ---- Loaders that join and leave at run time -----------------------------------------------------


def one_rank(ds, monkeypatch, **kw):
    """A PooledLoader of a job with one rank, small slots."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    kw.setdefault("slot_bytes", 1 << 14)
    kw.setdefault("num_slots", 4)
    return tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0, timeout=60, **kw)


def loader_publishers(loader, pids):
    """The pids among `pids` of live ring clients that have published a batch."""
    return {c["pid"] for c in loader.ring.stats()["clients"]
            if c["pid"] in pids and c["alive"] and c["published"] > 0}


def test_loaders_added_mid_epoch_publish_and_every_record_comes_once(rname, tmp_path,
                                                                      monkeypatch):
    n, epochs = 2000, 2
    path = write_ids(tmp_path / "ids.bin", n)
    ds = dataset(path, rname, num_slices=40, num_epochs=epochs)
    loader = one_rank(ds, monkeypatch, num_workers=1, batch_size=20, transform=Slow(0.01))
    added, publishers = [], set()
    for e in range(epochs):
        loader.set_epoch(e)
        ids = []
        for step, batch in enumerate(loader):
            if e == 0 and step == 10:
                assert ds.queue.summary()["done"] < ds.queue.num_items  # mid-epoch
                added = loader.add_loaders(2)
                assert pool_loader.pool_spec_path(loader.name) and len(loader.loaders) == 3
            if added:
                publishers |= loader_publishers(loader, {p.pid for p in added})
            ids += ids_of(batch.numpy())
        assert sorted(ids) == list(range(n))  # each once, in each epoch
        assert loader.reports[-1]["leftover_records"] == 0
    assert publishers == {p.pid for p in added}  # both joined and loaded
    assert os.path.exists(pool_loader.pool_spec_path(loader.name))
    name = loader.name
    loader.close()
    assert all(p.exitcode == 0 for p in loader.loaders)
    assert not os.path.exists(pool_loader.pool_spec_path(name))
    del loader, batch
    import gc
    gc.collect()
    with pytest.raises(tailcut.NotFoundError):  # ended by rank 0, removed by the last to leave
        tailcut.inspect_batch_ring(name)
    ds.close()


def test_a_loader_removed_mid_epoch_leaves_cleanly_and_nothing_comes_twice(rname, tmp_path,
                                                                           monkeypatch):
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    ds = dataset(path, rname, num_slices=60)
    loader = one_rank(ds, monkeypatch, num_workers=3, batch_size=20, transform=Slow(0.02))
    ids, left, gone_at = [], [], None
    for step, batch in enumerate(loader):
        if step == 10:
            left = loader.remove_loaders(1)
            assert len(left) == 1 and left[0] is loader.loaders[-1]
        if left and gone_at is None and left[0].exitcode is not None:
            gone_at = ds.queue.summary()["done"]
        ids += ids_of(batch.numpy())
    left[0].join(30)
    assert left[0].exitcode == 0  # left, not killed by the SIGTERM
    assert gone_at is not None and gone_at < ds.queue.num_items  # while the epoch ran
    # It published and acked what it held before leaving: every record exactly once.
    assert sorted(ids) == list(range(n))
    assert ds.queue.summary()["recovered_items"] == 0
    stats = loader.ring.stats()
    assert stats["published"] == stats["released"] + (1 if loader._current else 0)
    loader.close()
    assert [p.exitcode for p in loader.loaders] == [0, 0, 0]
    ds.close()


def cli_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pathlib.Path(tailcut.__file__).resolve().parents[1])
    return env


def start_cli(*args):
    return subprocess.Popen([sys.executable, "-m", "tailcut.pool", *args], env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_line(proc, timeout=60):
    """The first line the command prints on stderr (its 'joined' line, or its error)."""
    import select
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    assert ready, "the loader command printed nothing"
    return proc.stderr.readline()


def test_loaders_started_from_a_shell_join_mid_epoch_and_one_leaves_on_ctrl_c(
        rname, tmp_path, monkeypatch):
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    ds = dataset(path, rname, num_slices=60)
    # Slow is importable by reference: the command loads the job's transform itself.
    loader = one_rank(ds, monkeypatch, num_workers=1, batch_size=20, transform=Slow(0.02))
    ids, joiner, leaver, lines = [], None, None, {}
    for step, batch in enumerate(loader):
        if step == 5:
            joiner, leaver = start_cli("--ring", loader.name), start_cli("--ring", loader.name)
            for p in (joiner, leaver):
                lines[p.pid] = first_line(p)
                assert "joined ring" in lines[p.pid], lines[p.pid]
        if step == 40:
            assert ds.queue.summary()["done"] < ds.queue.num_items  # mid-epoch
            leaver.send_signal(signal.SIGINT)  # Ctrl-C
        ids += ids_of(batch.numpy())
    assert sorted(ids) == list(range(n))  # exactly once: the leaver published what it held
    assert ds.queue.summary()["recovered_items"] == 0
    out = {}
    for p in (joiner, leaver):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        out[p] = err
    assert "left on SIGINT: published" in out[leaver], out[leaver]
    assert "finished (no item left): published" in out[joiner], out[joiner]
    for p in (joiner, leaver):
        published = int(out[p].split("published ")[1].split()[0])
        assert published > 0  # both loaded batches of this epoch
    loader.close()
    ds.close()


def test_the_loader_command_needs_a_transform_it_can_import(rname, tmp_path, monkeypatch):
    n = 600
    path = write_ids(tmp_path / "ids.bin", n)
    ds = dataset(path, rname, num_slices=12)
    # No loader of its own, and a transform no other process can import.
    loader = one_rank(ds, monkeypatch, loaders_per_host=0, batch_size=20,
                      transform=lambda batch: batch)
    loader.start_loaders()  # what the first iteration does: describes the pool
    refused = start_cli("--ring", loader.name)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert "cannot be pickled" in err and "--transform" in err, err
    helper = pathlib.Path(__file__).with_name("_pool_helpers.py")
    cli = start_cli("--ring", loader.name, "--transform", f"{helper}:identity")
    ids = [x for batch in loader for x in ids_of(batch.numpy())]
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err
    assert sorted(ids) == list(range(n))  # all of them from the command's loader
    assert "published 30 batches, 600 records of 12 items" in err, err
    loader.close()
    ds.close()


def test_the_loader_command_explains_itself_and_refuses_a_missing_job(rname):
    helped = subprocess.run([sys.executable, "-m", "tailcut.pool", "--help"], env=cli_env(),
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    for word in ("--ring", "--transform", "--list", "SIGTERM", "Exit status"):
        assert word in helped.stdout, word
    missing = subprocess.run([sys.executable, "-m", "tailcut.pool", "--ring", rname],
                             env=cli_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "no pool description for ring" in missing.stderr
    bare = subprocess.run([sys.executable, "-m", "tailcut.pool"], env=cli_env(),
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--ring" in bare.stderr


# ---- Carry-over and the dataset's own settings --------------------------------------------------


def test_carry_over_yields_the_leftover_first_in_the_next_epoch(rname, tmp_path):
    # One loader, 1000 records in batches of 40: 25 batches per epoch for two
    # ranks, so one batch is left over in epoch 0 and carried into epoch 1.
    n, epochs = 1000, 2
    path = write_ids(tmp_path / "ids.bin", n)

    def rank(r):
        def run():
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                              LOCAL_WORLD_SIZE="2")
            ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD,
                                 num_slices=23, num_epochs=epochs)
            loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=40, slot_bytes=1 << 14,
                                     num_slots=6, timeout=60, carry_over=True)
            out = []
            for e in range(epochs):
                loader.set_epoch(e)
                ids = [x for batch in loader for x in ids_of(batch.numpy())]
                rep = loader.reports[-1]
                out.append(" ".join(str(rep[k]) for k in (
                    "steps", "carried_in", "carried_out", "dropped_records")) + " | "
                    + " ".join(map(str, ids)))
            loader.close()
            ds.close()
            (tmp_path / f"rank{r}").write_text("\n".join(out))
        return run

    pids = [fork(rank(0)), fork(rank(1))]
    for pid in pids:
        wait_ok(pid, 120)
    rows = [[line.split(" | ") for line in (tmp_path / f"rank{r}").read_text().split("\n")]
            for r in range(2)]
    counts = [[[int(x) for x in rows[r][e][0].split()] for e in range(epochs)] for r in range(2)]
    assert [counts[r][0][0] for r in range(2)] == [12, 12]  # 24 of 25 batches used in epoch 0
    assert sum(counts[r][0][2] for r in range(2)) == 1  # the 25th carried out ...
    assert sum(counts[r][1][1] for r in range(2)) == 1  # ... and in
    assert [counts[r][1][0] for r in range(2)] == [13, 13]  # 25 + 1 batches in epoch 1
    assert sum(counts[r][e][3] for r in range(2) for e in range(epochs)) == 0  # none dropped
    ids = [int(x) for r in range(2) for e in range(epochs) for x in rows[r][e][1].split()]
    assert sorted(ids) == sorted(list(range(n)) * 2)  # every record of both epochs, once each


def to_ids(batch):
    """A QueueDataset batch transform: the u64 ids of a uint8 tensor of records."""
    assert isinstance(batch, torch.Tensor) and batch.dtype == torch.uint8
    return batch[:, :8].contiguous().view(torch.int64).reshape(-1)


def record_id(record):
    """A QueueDataset record transform."""
    return int.from_bytes(record[:8], "little")


def test_replacing_a_dataloader_keeps_the_datasets_batch_size_and_transform(rname, tmp_path,
                                                                            monkeypatch):
    from torch.utils.data import DataLoader
    n = 1000
    path = write_ids(tmp_path / "ids.bin", n)
    results = {}
    for k, (ds_kw, dl_kw) in enumerate([(dict(batch_size=40, transform=to_ids),
                                         dict(batch_size=None)),
                                        (dict(transform=record_id), dict(batch_size=25))]):
        for how in ("per_rank", "pooled"):
            name = f"{rname}-{k}-{how}"
            ds = tt.QueueDataset([path], name=name, format="fixed", record_bytes=RECORD,
                                 num_slices=20, num_clients=1, **ds_kw)
            if how == "per_rank":
                loader = DataLoader(ds, num_workers=2, **dl_kw)
            else:  # the one line that changes; batch_size as the DataLoader had it
                loader = one_rank(ds, monkeypatch, num_workers=2,
                                  batch_size=dl_kw["batch_size"])
            batches = list(b.clone() for b in loader)
            if how == "pooled":
                loader.close()
            ds.close()
            results[k, how] = batches
            tailcut.remove_batch_ring(name + ".pool")
        for how in ("per_rank", "pooled"):
            batches = results[k, how]
            assert all(b.dtype == torch.int64 and b.ndim == 1 for b in batches)
            assert sorted(torch.cat(batches).tolist()) == list(range(n))
            size = 40 if k == 0 else 25
            assert max(len(b) for b in batches) == size


# ---- The records of one item ------------------------------------------------------------------


def three_formats(tmp_path):
    """[(path, format tag, its records)]: a TFRecord file (empty records among them), lines
    ending in \\n or \\r\\n and a last one unterminated, fixed-size records of 16 bytes."""
    rng = np.random.default_rng(5)
    payloads = [bytes(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8))
                for _ in range(200)]
    tfr = tmp_path / "a.tfrecord"
    tfr.write_bytes(b"".join(tailcut.encode_tfrecord(p) for p in payloads))
    lines = tmp_path / "a.txt"
    lines.write_bytes(b"".join(b"line %d\r\n" % i if i % 3 else b"line %d\n" % i
                               for i in range(300)) + b"last")
    fixed = tmp_path / "a.bin"
    fixed.write_bytes(bytes(range(256)) * 12)
    return [(tfr, "tfrecord", payloads),
            (lines, "lines", [b"line %d" % i for i in range(300)] + [b"last"]),
            (fixed, "fixed:16", [fixed.read_bytes()[i:i + 16] for i in range(0, 3072, 16)])]


def test_item_records_cut_anywhere_yield_every_record_of_every_format_once(tmp_path):
    rng = np.random.default_rng(5)
    cases = three_formats(tmp_path)
    tfr, fixed = cases[0][0], cases[2][0]
    for path, fmt, expected in cases:
        size = path.stat().st_size
        for _ in range(5):
            cuts = sorted({0, size, *rng.integers(0, size, 7).tolist()})
            got = [r for b, e in zip(cuts, cuts[1:]) for r in pool_loader.item_records(str(path), b, e,
                                                                                 fmt)]
            assert got == expected, fmt
    assert tailcut.slice_records(str(fixed), 0, 1, "file") == [fixed.read_bytes()]
    bad = bytearray(tfr.read_bytes())
    bad[len(bad) // 2] ^= 0x40
    (tmp_path / "bad.tfrecord").write_bytes(bytes(bad))
    with pytest.raises(tailcut.CorruptError, match="bad.tfrecord' at offset"):
        pool_loader.item_records(str(tmp_path / "bad.tfrecord"), 0, len(bad), "tfrecord")
    with pytest.raises(tailcut.NotFoundError):
        pool_loader.item_records(str(tmp_path / "none"), 0, 1, "lines")


def test_claimed_records_stop_where_an_idle_loader_split_the_tail_off(tmp_path, qname):
    """A loader hands out an item's records a batch at a time, claiming each batch first;
    a process with nothing to take splits off the unclaimed rest, mid-record in any format
    (split offsets are bytes), and the owner stops at the first record that starts past
    the split: between the two, every record once, in order."""
    from tailcut.pool._claimed_records import ClaimedRecords
    for k, (path, tag, expected) in enumerate(three_formats(tmp_path)):
        fmt, _, size = tag.partition(":")
        opts = dict(num_epochs=1, name=f"{qname}-{k}", format=fmt)
        if size:
            opts["record_bytes"] = int(size)
        owner_q = tailcut.WorkQueue([str(path)], **opts)
        thief_q = tailcut.WorkQueue([str(path)], min_split_bytes=1, **opts)
        item = owner_q.take()
        owner = ClaimedRecords(item, owner_q.format, False)
        mine, _ = owner.take(7)
        piece = thief_q.take(timeout=1)  # splits off half of what the owner has not claimed
        assert piece is not None and piece.begin > item.begin, fmt
        while True:
            got, end = owner.take(7)
            if not got:
                break
            assert len(got) <= 7
            mine += got
        assert owner.end == piece.begin, fmt
        theirs, reader = [], ClaimedRecords(piece, thief_q.format, False)
        while True:
            got, _ = reader.take(50)
            if not got:
                break
            theirs += got
        assert mine + theirs == expected, fmt
        assert len(mine) > 7 and theirs, fmt
        item.ack()
        piece.ack()
        owner_q.close()
        thief_q.close()


def test_loaders_share_a_single_file_by_splitting_its_tail(tmp_path, qname):
    """One file is one item: the pool's loaders split it between them rather than leave it
    to the loader that took it, and every record still comes once."""
    n = 64 * 32
    path = write_ids(tmp_path / "one.bin", n)
    ds = tt.QueueDataset([path], format="fixed", record_bytes=RECORD, num_epochs=1, name=qname)
    loader = tailcut.pool.PooledLoader(ds, batch_size=32, loaders_per_host=4,
                                       transform=PidOf(0.02))
    ids, pids = [], set()
    for batch, pid in loader:
        ids += ids_of(batch.numpy())
        pids.add(int(pid[0]))
    loader.close()
    ds.close()
    assert sorted(ids) == list(range(n))
    assert len(pids) >= 2, "one loader read the whole file"


def test_a_batch_of_more_items_than_a_loader_may_hold_goes_out_short(tmp_path, qname):
    """Items smaller than a batch (or pieces split off others' items) each hold a lease
    until their batch is out: a loader at its leases_per_client hands its batch on short
    rather than fail in take() ("already holds 3 open items")."""
    n = 64
    path = write_ids(tmp_path / "small.bin", n)
    ds = tt.QueueDataset([path], format="fixed", record_bytes=RECORD, num_epochs=1, name=qname,
                         num_slices=n, leases_per_client=3)
    loader = tailcut.pool.PooledLoader(ds, batch_size=8, loaders_per_host=2)
    ids = [i for batch in loader for i in ids_of(batch.numpy())]
    loader.close()
    ds.close()
    assert sorted(ids) == list(range(n))


class PidOf(Slow):
    """Slow, and says which loader made the batch."""

    def __call__(self, batch):
        return super().__call__(batch), np.array([os.getpid()], np.int64)


def test_pooled_loaders_read_tfrecord(rname, tmp_path, monkeypatch):
    n = 700
    path = tmp_path / "ids.tfrecord"
    path.write_bytes(b"".join(tailcut.encode_tfrecord(b"record %d" % i + b"." * (i % 50))
                              for i in range(n)))
    ds = tt.QueueDataset([str(path)], name=rname, format="tfrecord", num_slices=17,
                         num_clients=1)
    loader = one_rank(ds, monkeypatch, num_workers=2, batch_size=32)
    got = []
    for data, offsets in loader:  # default collate: (data, offsets) as for lines
        raw, off = data.numpy().tobytes(), offsets.tolist()
        got += [raw[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    assert sorted(got) == sorted(b"record %d" % i + b"." * (i % 50) for i in range(n))
    assert abs(len(loader) - n // 32) <= 1
    loader.close()
    ds.close()


# ---- Lifecycle: what a pool leaves behind, dead attempts, orphaned loaders ---------------------


def ring_files(name):
    return [p for p in (f"/dev/shm/tailcut-ring.{os.geteuid()}.{name}", pool_loader.pool_spec_path(name),
                        pool_loader.pool_spec_path(name)[:-5] + ".error") if os.path.exists(p)]


def test_close_with_a_batch_still_referenced_leaves_nothing_in_shm(rname, tmp_path):
    path = write_ids(tmp_path / "ids.bin", 400)
    ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD, num_slices=4)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=32, slot_bytes=1 << 12, num_slots=4,
                             timeout=60)
    batch = next(iter(loader))
    assert ring_files(loader.name)
    loader.close()
    assert ring_files(loader.name) == []  # the name is gone ...
    assert batch.shape == (32, RECORD) and int(batch.sum()) >= 0  # ... the mapping is not
    ds.close()


@pytest.mark.parametrize("end", ["close", "exit"])
def test_a_pooled_loader_ended_before_its_first_iteration_leaves_nothing_in_shm(rname, tmp_path,
                                                                                end):
    # A process that makes the loader and closes it (or exits) before iterating: no loader
    # was started, so none removes the ring when it leaves.
    path = write_ids(tmp_path / "ids.bin", 400)
    program = textwrap.dedent(f"""
        import tailcut.torch as tt
        import tailcut.pool
        ds = tt.QueueDataset([{path!r}], name={rname!r}, format="fixed",
                             record_bytes={RECORD}, num_slices=4)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=32, slot_bytes=1 << 12,
                                 num_slots=4, timeout=60)
        assert loader.ring is not None
        if {end!r} == "close":
            loader.close()
            import os
            left = [f for f in os.listdir("/dev/shm") if f.endswith({rname!r} + ".pool")]
            assert left == [], left
        """)
    env = dict(os.environ)
    env.pop("LOCAL_WORLD_SIZE", None)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ring_files(rname + ".pool") == []


@pytest.mark.parametrize("steps", [
    # Local rank 0 removes the ring it made and closed; rank 1 makes it again, then closes it.
    [(0, "make"), (0, "close"), (1, "make"), (1, "close")],
    # The reverse: rank 1 alone made and closed it.
    [(1, "make"), (1, "close"), (0, "make"), (0, "close")],
    # Both in the ring, rank 1 closes first, then rank 0; or rank 0 first.
    [(0, "make"), (1, "make"), (1, "close"), (0, "close")],
    [(0, "make"), (1, "make"), (0, "close"), (1, "close")],
])
def test_ranks_that_close_before_iterating_leave_nothing_in_shm(rname, tmp_path, steps):
    # Two ranks of a host that make the loader and close it without iterating (a job resumed
    # from a checkpoint taken at its end) never meet in the ring: the first may remove it and
    # the second make it again. Whichever rank closes last removes it, local rank 0 or not.
    path = write_ids(tmp_path / "ids.bin", 400)
    program = textwrap.dedent(f"""
        import sys
        import tailcut.torch as tt
        import tailcut.pool
        ds = tt.QueueDataset([{path!r}], name={rname!r}, format="fixed",
                             record_bytes={RECORD}, num_slices=4)
        print("ready", flush=True)
        for step in sys.stdin:
            if step.strip() == "make":
                loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=32, slot_bytes=1 << 12,
                                         num_slots=4, timeout=60)
            elif step.strip() == "close":
                loader.close()
            else:
                break
            print("done", flush=True)
        ds.close()
        """)
    ranks = []
    for rank in (0, 1):  # rank 1 opens the queue once local rank 0 prepared it
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2")
        ranks.append(subprocess.Popen([sys.executable, "-c", program], env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    try:
        for p in ranks:
            assert p.stdout.readline().strip() == "ready"
        for rank, step in steps:
            ranks[rank].stdin.write(step + "\n")
            ranks[rank].stdin.flush()
            assert ranks[rank].stdout.readline().strip() == "done", (rank, step)
        for p in ranks:
            p.stdin.write("end\n")
            p.stdin.close()
        for p in ranks:
            assert p.wait(timeout=60) == 0
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert ring_files(rname + ".pool") == []


def test_a_dropped_pooled_loader_leaves_nothing_in_shm(rname, tmp_path):
    import gc
    path = write_ids(tmp_path / "ids.bin", 400)
    ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD, num_slices=4)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=32, slot_bytes=1 << 12, num_slots=4,
                             timeout=60)
    name, procs = loader.name, loader.start_loaders()
    for batch in loader:
        pass
    del loader, batch
    gc.collect()
    assert ring_files(name) == []
    assert all(p.exitcode is not None for p in procs)
    ds.close()


def test_a_new_attempt_never_pops_a_dead_attempts_batches(rname, tmp_path):
    n = 256
    path = write_ids(tmp_path / "ids.bin", n)
    ring_name = rname + ".pool"

    def dead_attempt():  # a trainer and a loader that published two batches, then SIGKILL
        trainer = tailcut.BatchRing(ring_name, 1 << 12, 4, "trainer")  # noqa: F841
        ring = tailcut.BatchRing(ring_name, 1 << 12, 4, "loader")
        for i in range(2):
            slot = ring.acquire(timeout=10)
            records = np.full((32, RECORD), 0xFF, np.uint8)  # ids no file has
            nbytes = pool_loader.encode_batch(records, slot.data, slot.header)
            assert ring.publish(slot, 0, 32, nbytes)
        os.kill(os.getpid(), signal.SIGKILL)

    pid = fork(dead_attempt)
    os.waitpid(pid, 0)
    assert tailcut.inspect_batch_ring(ring_name)["ready"] == 2
    ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD, num_slices=4)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=32, slot_bytes=1 << 12, num_slots=4,
                             timeout=60)
    assert loader.ring.stats()["ready"] == 0  # a fresh ring
    ids = [i for batch in loader for i in ids_of(batch.numpy())]
    assert sorted(ids) == list(range(n))
    loader.close()
    ds.close()


def test_loaders_leave_when_the_rank_that_started_them_is_killed(rname, tmp_path):
    path = write_ids(tmp_path / "ids.bin", 4000)
    pids = tmp_path / "loaders"

    def rank():
        ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD,
                             num_slices=16)
        loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, batch_size=32, slot_bytes=1 << 12,
                                 num_slots=2, timeout=60, transform=Slow(0.01))
        next(iter(loader))
        pids.write_text(" ".join(str(p.pid) for p in loader.loaders))
        time.sleep(60)  # holding a batch; the ring fills up

    pid = fork(rank)
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    loaders = [int(p) for p in pids.read_text().split()]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    killed = time.monotonic()

    def alive(p):
        try:
            with open(f"/proc/{p}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False

    while any(alive(p) for p in loaders) and time.monotonic() < killed + 5:
        time.sleep(0.01)
    gone = time.monotonic() - killed
    assert not any(alive(p) for p in loaders)
    assert gone < 2.0, f"the loaders outlived their rank by {gone:.2f} s"
    assert ring_files(rname + ".pool") == []  # no trainer left: the last loader removed it


def test_a_failure_is_recorded_past_a_held_lock_and_never_after_the_pool_is_gone(rname):
    from tailcut.pool import _lifecycle
    ring = tailcut.BatchRing(rname, 64, 2, "trainer")
    try:
        # The ring's lock held (as by a process stopped while it removes the pool): the
        # record is written without it after 5 s rather than lost.
        with _lifecycle.ring_lock(rname):
            _lifecycle.report_failure(rname, os.getpid(), ValueError("bad batch"))
        with pytest.raises(ValueError, match="bad batch"):
            _lifecycle.raise_if_failed(rname)
    finally:
        ring.close()
        _lifecycle.remove_pool(rname)
    # Once the pool is removed, a late record (a loader failing as the job ends) would be
    # left in /dev/shm with nothing to remove it: it is dropped.
    _lifecycle.report_failure(rname, os.getpid(), ValueError("late"))
    assert not os.path.exists(_lifecycle.failure_path(rname))
