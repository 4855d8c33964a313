"""A pool loader that stops running (SIGSTOP: a debugger, a frozen container, a swap storm)
while the ranks wait on its item: the item goes to the other loaders after the loaders' stop
timeout (tailcut.pool loaders open their queue with stop_timeout=STOP_TIMEOUT), the epoch
ends with every record once (but the one batch of a stop between its publish and its commit,
as for a kill), and the stopped loader, back, publishes nothing of what it lost (the fence
before each publish). Ranks that wait past `timeout` name each loader and what the
kernel says it is doing."""

import collections
import os
import signal
import time

import pytest

import tailcut
from tailcut.pool import _loader

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, ids_of, write_ids  # noqa: E402


def one_rank_loader(path, name, monkeypatch, num_workers, timeout, num_epochs=1):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset([path], name=name, format="fixed", record_bytes=RECORD, num_clients=1,
                         num_slices=60, num_epochs=num_epochs)
    loader = tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0, timeout=timeout,
                             loaders_per_host=num_workers, batch_size=20, transform=Slow(0.01),
                             slot_bytes=1 << 14, num_slots=4)
    return ds, loader


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_stopped_loader_loses_its_item_and_its_late_batch_is_fenced(rname, tmp_path,
                                                                      monkeypatch):
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    ds, loader = one_rank_loader(path, rname, monkeypatch, num_workers=3, timeout=120,
                                 num_epochs=2)
    victim, resumed = None, False
    try:
        for epoch in range(2):
            loader.set_epoch(epoch)
            ids, t0 = [], time.monotonic()
            for step, batch in enumerate(loader):
                if epoch == 0 and step == 10:
                    victim = loader.loaders[0].pid
                    os.kill(victim, signal.SIGSTOP)
                    stopped_at = time.monotonic()
                ids += ids_of(batch.numpy())
            if epoch == 0:
                # Its item came back after the stop timeout, not after `timeout` (120 s).
                waited = time.monotonic() - stopped_at
                assert waited < _loader.STOP_TIMEOUT + 15, waited
                assert stopped(victim), "the loader was resumed before the epoch ended"
                os.kill(victim, signal.SIGCONT)  # back: what it held is another loader's
                resumed = True
            assert set(ids) == set(range(n)), f"epoch {epoch}: records lost"
            # A stop that lands between a publish and its commit (microseconds apart) has
            # the item resumed before that batch, as a kill there does: that one batch (20
            # consecutive records of one item) comes twice, nothing else.
            twice = sorted(i for i, c in collections.Counter(ids).items() if c > 1)
            assert len(ids) - n == len(twice), f"epoch {epoch}: a record three times"
            assert not twice or (epoch == 0 and len(twice) <= 20 and
                                 twice == list(range(twice[0], twice[-1] + 1))), twice
            report = loader.reports[-1]
            assert report["late_batches"] == 0 and report["leftover_records"] == 0, report
        assert ds.queue.summary()["recovered_items"] >= 1
    finally:
        if victim is not None and not resumed:
            os.kill(victim, signal.SIGCONT)
        loader.close()
        ds.close()
    assert all(p.exitcode == 0 for p in loader.loaders), [p.exitcode for p in loader.loaders]


def test_ranks_that_wait_past_timeout_name_the_stopped_loader(rname, tmp_path, monkeypatch):
    path = write_ids(tmp_path / "ids.bin", 3000)
    ds, loader = one_rank_loader(path, rname, monkeypatch, num_workers=1, timeout=3)
    victim = None
    try:
        with pytest.raises(tailcut.TimeoutError) as e:
            for step, batch in enumerate(loader):
                if step == 5:
                    victim = loader.loaders[0].pid
                    os.kill(victim, signal.SIGSTOP)
                    t0 = time.monotonic()
        waited = time.monotonic() - t0
        assert waited < 3 + 5, waited
        message = str(e.value)
        assert f"loader {victim} is stopped by a signal (SIGSTOP" in message, message
        assert f"`kill -CONT {victim}` resumes it" in message, message
        assert "waited 3 s (timeout) for a batch of epoch 0" in message, message
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
        loader.close()
        ds.close()
