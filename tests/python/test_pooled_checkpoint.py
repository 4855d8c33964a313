"""PooledLoader checkpoints under torchrun (2 ranks, gloo, CPU): the job is
SIGKILLed at a random moment after a checkpoint (mid-epoch, or at an epoch
end) and resumed from it; every record of every epoch after the checkpoint is
trained exactly once, apart from the leftovers reported at each epoch end
(fewer than one batch per rank), with equal steps, and nothing is left in
/dev/shm nor running. The job is tests/python/_pooled_ckpt_train.py."""

import collections
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tailcut
from tailcut.pool import loader as pool_loader

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

from _pool_helpers import free_port, jsonl_lines, write_ids  # noqa: E402,F401 (the stress script uses write_ids too)

HERE = pathlib.Path(__file__).resolve().parent
RANKS = 2
RECORDS = 2400
BATCH = 16
EPOCHS = 3


def start(data, out, name, *extra):
    """The job under torchrun, in a session of its own. Its rendezvous is on a
    free port (--standalone takes 29400, which another job of the host may hold)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}-{time.time_ns()}",
           f"--nproc_per_node={RANKS}", "--redirects", "1", "--tee", "2",
           "--monitor_interval=0.2", str(HERE / "_pooled_ckpt_train.py"), str(data), str(out),
           name, str(EPOCHS), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def group_alive(pgid):
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getpgid(int(d)) == pgid:
                    return True
            except ProcessLookupError:
                pass
    return False


def kill_job(proc):
    """SIGKILLs every process of the job (torchrun, ranks, loaders); returns its output."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    log = proc.communicate()[0] or ""
    deadline = time.monotonic() + 30
    while group_alive(proc.pid):
        assert time.monotonic() < deadline, "a process of the killed job is still running"
        time.sleep(0.05)
    return log


def finish(proc, timeout=120):
    """Waits for the job; fails, leaving no process of it behind, unless it
    exits 0 and no process of it outlives it."""
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish within its time:\n" + kill_job(proc)[-4000:])
    outlived = group_alive(proc.pid)
    if outlived or proc.returncode != 0:
        kill_job(proc)  # a failed rank's loaders, say
    assert proc.returncode == 0, log[-6000:]
    assert not outlived, "a process of the job outlived it"
    return log


def lines(out):
    got = []
    for r in range(RANKS):
        path = out / f"rank-{r}.jsonl"
        if path.exists():
            got += [dict(line, rank=r) for line in jsonl_lines(path)]
    return got


def check(out, cuts):
    """Every epoch: what each killed run trained up to its last checkpoint
    (cuts: run id -> (epoch, step) of that checkpoint, in the run's own step
    count; a killed run absent from cuts wrote none, so nothing of it counts)
    plus what the last run trained is every record once, but for the
    leftovers reported at epoch ends (< one batch per rank); equal steps per
    run and epoch."""
    every = lines(out)
    runs = list(dict.fromkeys(line["run"] for line in every))
    last = runs[-1]
    for epoch in range(EPOCHS):
        trained, dropped = collections.Counter(), []
        steps = collections.defaultdict(lambda: collections.defaultdict(int))
        for line in every:
            run = line["run"]
            if line["epoch"] != epoch or "ckpt" in line or "report" in line:
                continue
            if run != last:
                cut = cuts.get(run)
                if cut is None or ("dropped" in line and epoch >= cut[0]) or (
                        "dropped" not in line and (epoch, line["step"]) > cut):
                    continue
            if "dropped" in line:
                dropped += line["ids"]
            else:
                trained.update(line["ids"])
                steps[run][line["rank"]] = max(steps[run][line["rank"]], line["step"])
        twice = [i for i, c in trained.items() if c > 1]
        assert not twice, f"epoch {epoch}: {len(twice)} records trained twice, e.g. {twice[:5]}"
        assert not set(dropped) & set(trained), f"epoch {epoch}: a reported leftover was trained"
        missing = set(range(RECORDS)) - set(trained) - set(dropped)
        assert not missing, (f"epoch {epoch}: {len(missing)} records neither trained nor reported "
                             f"(checkpoints {cuts}), e.g. {sorted(missing)[:5]}")
        assert len(dropped) < RANKS * BATCH, f"epoch {epoch}: {len(dropped)} records left over"
        if last in steps:
            assert len(set(steps[last].values())) == 1, f"epoch {epoch}: unequal steps {steps}"


def leftovers(name):
    return [f for f in os.listdir("/dev/shm") if name in f]


def remove_dead_run(name):
    """What the killed run left: its ring (whose ready batches a rerun must
    not pop) and the pool's description; the queue the rerun discards itself."""
    tailcut.remove_batch_ring(name + ".pool")
    try:
        os.unlink(pool_loader.pool_spec_path(name + ".pool"))
    except FileNotFoundError:
        pass


@pytest.fixture
def job(tmp_path):
    name = f"pytest-ckpt-{os.getpid()}-{random.randrange(1 << 30)}"
    out = tmp_path / "out"
    out.mkdir()
    data = write_ids(tmp_path / "ids.bin", RECORDS)
    yield name, data, out
    remove_dead_run(name)
    try:
        tailcut.remove_queue(name, force=True)
    except tailcut.NotFoundError:
        pass


def run_killed(data, out, name, delay, *extra):
    """Starts the job, SIGKILLs it `delay` s after its next checkpoint, and
    removes what it left; returns (run id, (epoch, step)) of the checkpoint
    to resume from."""
    ckpt_path = out / "ckpt.pt"
    before = ckpt_path.stat().st_mtime_ns if ckpt_path.exists() else None
    proc = start(data, out, name, *extra)
    deadline = time.monotonic() + 120
    while not ckpt_path.exists() or ckpt_path.stat().st_mtime_ns == before:
        if proc.poll() is not None or time.monotonic() > deadline:
            log = kill_job(proc)
            pytest.fail(f"no checkpoint (exit status {proc.returncode}):\n{log[-4000:]}")
        time.sleep(0.01)
    time.sleep(delay)
    kill_job(proc)
    remove_dead_run(name)
    ckpt = torch.load(ckpt_path)
    return ckpt["run"], (ckpt["loader"]["epoch"], ckpt["loader"]["step"])


def run_killed_and_resumed(name, data, out, every, delay):
    run, cut = run_killed(data, out, name, delay, "--every", str(every))
    finish(start(data, out, name, "--every", str(every), "--resume", str(out / "ckpt.pt")))
    check(out, {run: cut})
    assert not leftovers(name), leftovers(name)
    return cut


def test_killed_after_a_mid_epoch_checkpoint_resumes_every_record_once(job):
    name, data, out = job
    run_killed_and_resumed(name, data, out, every=7, delay=random.uniform(0, 0.5))


def test_killed_after_an_epoch_end_checkpoint_resumes_every_record_once(job):
    name, data, out = job
    epoch, step = run_killed_and_resumed(name, data, out, every=0,
                                         delay=random.uniform(0, 0.3))
    assert step == 0 and epoch >= 1


# ---- One rank, in this process ------------------------------------------------------------


def test_a_batch_carries_the_ranges_of_its_records_in_the_header_or_the_data():
    from tailcut import _batch_layout as layout
    batch = np.arange(64, dtype=np.uint8).reshape(4, 16)
    for n in (1, 7, 50):  # 7 fit the header after one 2-d array, 50 do not
        ranges = [(t, 10 * t, 10 * t + 5) for t in range(n)]
        data, header = bytearray(64 + 24 * n), bytearray(pool_loader.HEADER_BYTES)
        used = pool_loader.encode_batch(batch, memoryview(data), memoryview(header), ranges)
        assert layout.batch_ranges(bytes(data[:used]), bytes(header)) == ranges
        assert (pool_loader.decode_batch(bytes(data[:used]), bytes(header)) == batch).all()
        assert used == (64 if n < 8 else 64 + 24 * n)
    with pytest.raises(ValueError, match="pass a larger slot_bytes"):
        pool_loader.encode_batch(batch, memoryview(bytearray(64 + 24 * 49)),
                          memoryview(bytearray(pool_loader.HEADER_BYTES)), ranges)
    header[-16:-12] = b"XXXX"
    with pytest.raises(tailcut.CorruptError, match="no record ranges"):
        layout.batch_ranges(bytes(data), bytes(header))


def write_lines(path, n):
    with open(path, "wb") as f:
        for i in range(n):
            f.write(b"%d %s\n" % (i, b"x" * (i % 13)))
    return str(path)


def id_list(batch, fmt):
    if fmt == "fixed":
        return np.ascontiguousarray(batch[:, :8].numpy()).view(np.uint64).ravel().tolist()
    data, offsets = batch
    data = bytes(data.numpy())
    offsets = offsets.tolist()
    return [int(data[a:b].split()[0]) for a, b in zip(offsets, offsets[1:])]


@pytest.mark.parametrize("fmt,stop", [("fixed", 30), ("lines", 45), ("fixed", "end"),
                                      ("lines", "end")])
def test_one_rank_restored_from_its_state_reads_every_record_once(tmp_path, fmt, stop):
    """A checkpoint while loaders read ahead and batches wait in the ring: the
    restored job trains every record of both epochs once (carry_over: the
    leftovers come in the next epoch)."""
    n = 3000
    if fmt == "fixed":
        path, opts = write_ids(tmp_path / "ids.bin", n), dict(format="fixed", record_bytes=16)
    else:
        path, opts = write_lines(tmp_path / "ids.txt", n), dict(format="lines")
    name = f"pytest-ckpt1-{os.getpid()}-{fmt}-{stop}"
    opts.update(num_epochs=2, num_slices=40, seed=7, shuffle_buffer=0, interleave=1)
    seen = collections.Counter()

    def open_loader(queue_name, **more):
        ds = tailcut.torch.QueueDataset([path], 16, name=queue_name, **opts, **more)
        return ds, tailcut.pool.PooledLoader(ds, loaders_per_host=2, num_slots=8, slot_bytes=1 << 16,
                                              timeout=60, carry_over=True, rank=0, world_size=1,
                                              local_rank=0)

    import tailcut.torch
    import tailcut.pool
    ds, loader = open_loader(name)
    try:
        it = iter(loader)
        for step, batch in enumerate(it, 1):
            seen.update((0, i) for i in id_list(batch, fmt))
            if step == stop:
                time.sleep(0.2)  # loaders fill the ring and read ahead
                break
        state = loader.state_dict()
        it.close()
    finally:
        loader.close()
        ds.close()
    ds, loader = open_loader(name + "-r", restore_state=state["queue"])
    try:
        loader.load_state_dict(state)
        for epoch in range(state["epoch"], 2):
            loader.set_epoch(epoch)
            for batch in loader:
                seen.update((epoch, i) for i in id_list(batch, fmt))
    finally:
        loader.close()
        ds.close()
        for q in (name, name + "-r"):
            for remove in (tailcut.remove_queue, tailcut.remove_batch_ring):
                try:
                    remove(q if remove is tailcut.remove_queue else q + ".pool")
                except tailcut.NotFoundError:
                    pass
    assert max(seen.values()) == 1, "a record trained twice"
    for epoch in (0, 1):
        missing = set(range(n)) - {i for e, i in seen if e == epoch}
        assert not missing, f"epoch {epoch}: {len(missing)} records never trained"
    assert state["epoch"] == (0 if stop != "end" else 1)
    if stop != "end":
        assert state["unused_batches"] > 0 and state["reopened_ranges"] > 0


def test_load_state_dict_refuses_a_queue_in_use(tmp_path):
    import tailcut.torch
    import tailcut.pool
    path = write_ids(tmp_path / "ids.bin", 320)
    name = f"pytest-ckpt2-{os.getpid()}"
    ds = tailcut.torch.QueueDataset([path], 16, name=name, format="fixed", record_bytes=16,
                                    shuffle_buffer=0, interleave=1)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=0, rank=0, world_size=1, local_rank=0)
    try:
        state = loader.state_dict()
        assert state["epoch"] == 0 and state["step"] == 0
        ds.queue.take().give_back()  # the queue handed out an item: it cannot jump now
        with pytest.raises(tailcut.InvalidArgumentError, match="cannot jump to a checkpoint"):
            loader.load_state_dict(state)
        with pytest.raises(tailcut.InvalidArgumentError, match=r"state\['version'\] is missing"):
            loader.load_state_dict({"queue": state["queue"]})
    finally:
        loader.close()
        ds.close()
        tailcut.remove_batch_ring(name + ".pool")


def test_reopen_state_opens_a_done_range_again_and_refuses_bad_input(tmp_path):
    """The engine edits the checkpoint (engine/checkpoint.h ReopenRanges;
    checkpoint_test has every case): a range of an acked item is handed out
    again by the restored queue; bad input raises the engine's text."""
    from tailcut import _core
    path = write_ids(tmp_path / "ids.bin", 320)
    name = f"pytest-reopen-{os.getpid()}"
    args = dict(name=name, format="fixed", record_bytes=16, num_slices=1, shuffle=False,
                on_notice=lambda _: None)
    with tailcut.WorkQueue([path], **args) as q:
        item = q.take()
        ticket = item.ticket
        item.ack()
        state = q.state_dict()
    reopened, count = _core._reopen_state(state["state"], [(ticket, 160, 480), [ticket, 160, 480]],
                                          name)
    assert count == 1
    with tailcut.WorkQueue([path], **dict(args, name=name + "-r"), restore_state=reopened) as q:
        item = q.take()
        assert (item.ticket, item.begin, item.end) == (ticket, 160, 480)
        item.ack()
    with pytest.raises(tailcut.InvalidArgumentError) as e:
        _core._reopen_state(state["state"], [(ticket, 480, 160)], name)
    assert str(e.value) == (f"queue '{name}': cannot reopen range (ticket {ticket}, begin 480, "
                            f"end 160): begin must be below end; pass the (ticket, begin, end) "
                            f"ranges of records taken from this queue")
    with pytest.raises(tailcut.CorruptError, match="not a valid tailcut checkpoint"):
        _core._reopen_state(state["state"][8:], [], name)
    with pytest.raises(tailcut.CorruptError, match="not a valid tailcut checkpoint"):
        _core._state_epoch(b"\0" * 88, name)
    assert _core._state_epoch(state["state"], name) == 1  # its only item is done


def test_peek_ready_reads_the_ready_batches_in_place_without_taking_them():
    name = f"pytest-peek-{os.getpid()}"
    loader = tailcut.BatchRing(name, slot_bytes=4096, num_slots=4, role="loader")
    trainer = tailcut.BatchRing(name, slot_bytes=4096, num_slots=4, role="trainer")
    try:
        for i in range(3):
            slot = loader.acquire(timeout=5)
            slot.header[:4] = b"b%03d" % i
            slot.data[:8] = bytes([i]) * 8
            assert loader.publish(slot, epoch=i % 2, records=10 + i, nbytes=8)
        popped = trainer.pop(timeout=5)  # the first: no longer ready
        seen = []

        def read(header, data, epoch, records):
            seen.append((bytes(header[:4]), bytes(data), epoch, records))

        assert trainer.peek_ready(read) == 0
        assert sorted(seen) == [(b"b001", b"\x01" * 8, 1, 11), (b"b002", b"\x02" * 8, 0, 12)]
        assert trainer.stats()["ready"] == 2  # still there, in publish order
        trainer.release(popped)
        assert [trainer.pop(timeout=5).records for _ in range(2)] == [11, 12]
    finally:
        loader.close()
        trainer.close()
        tailcut.remove_batch_ring(name)
