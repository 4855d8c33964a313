"""tailcut.BatchRing from Python and tailcut.torch.PooledLoader: zero copy, every
record delivered, loaders killed with SIGKILL, equal steps, Ctrl-C."""

import itertools
import os
import signal
import time

import numpy as np
import pytest

import tailcut
from tailcut import pool

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402

_counter = itertools.count()
RECORD = 16


@pytest.fixture
def rname():
    """A ring name (and the queue name it is derived from) nobody else uses."""
    name = f"pytest-ring-{os.getpid()}-{next(_counter)}"
    yield name
    for n in (name, name + ".pool"):
        tailcut.remove_batch_ring(n)
    try:
        tailcut.remove_queue(name, force=True)
    except tailcut.NotFoundError:
        pass


def write_ids(path, n):
    """A fixed-format file of n 16-byte records; record i starts with i (u64)."""
    a = np.zeros((n, RECORD), np.uint8)
    a[:, :8] = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    a.tofile(path)
    return str(path)


def ids_of(batch):
    return np.ascontiguousarray(batch[:, :8]).view(np.uint64).ravel().tolist()


def fork(fn):
    """Runs fn() in a forked child that exits 0 if it returned, 1 if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def wait_ok(pid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            assert os.waitstatus_to_exitcode(status) == 0, f"process {pid} failed"
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"process {pid} did not finish in {timeout} s")


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

    def trainer(k):
        def run():
            ring = tailcut.BatchRing(rname + ".pool", 1 << 14, 6, "trainer")
            ids = []
            while (b := ring.pop(through_epoch=0, timeout=60)) is not None:
                ids += ids_of(pool.decode_batch(b.data, b.header))
                ring.release(b)
            np.save(tmp_path / f"ids{k}.npy", np.array(ids, np.uint64))
        return run

    ds = dataset(path, rname, num_slices=37, shuffle=True, seed=3)
    keep = tailcut.BatchRing(rname + ".pool", 1 << 14, 6, "trainer")
    pids = [fork(trainer(0)), fork(trainer(1))]
    loaders = pool.start_loaders(ds, rname + ".pool", 2, **ring_args)
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
    ds = dataset(path, rname, num_slices=40, shuffle=False)

    def slow(batch):
        time.sleep(0.01)
        return batch

    trainer = tailcut.BatchRing(rname + ".pool", 1 << 14, 4, "trainer")
    loaders = pool.start_loaders(ds, rname + ".pool", 2, batch_size=20, slot_bytes=1 << 14,
                                 num_slots=4, transform=slow)
    ids, killed = [], False
    while (b := trainer.pop(through_epoch=0, timeout=60)) is not None:
        if not killed and len(ids) >= 200:
            os.kill(loaders[0].pid, signal.SIGKILL)
            killed = True
        ids += ids_of(pool.decode_batch(b.data, b.header))
        trainer.release(b)
    loaders[0].join(10)
    loaders[1].join(30)
    assert loaders[0].exitcode == -signal.SIGKILL and loaders[1].exitcode == 0
    assert set(ids) == set(range(n))  # its items came back
    # At least once: only the items the killed loader held (recovered) come
    # out twice, at most their records (50 per item here).
    recovered = ds.queue.summary()["recovered_items"]
    assert len(ids) - n <= recovered * (n // 40)
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
            loader = tt.PooledLoader(ds, num_workers=2, batch_size=32, slot_bytes=1 << 14,
                                     num_slots=6, timeout=60)
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
