"""The core pieces tailcut.torch builds on (no torch needed): WorkQueue.agree_step,
and the max_epoch, short_at_end, read() and epoch additions of the batch iterator."""

import threading
import time

import numpy as np
import pytest

import tailcut

from conftest import SMALL_READER


def fixed_file(path, n, start=0):
    np.arange(start, start + n, dtype=np.int64).tofile(path)
    return str(path)


def agree_all(q, has, step, timeout=10):
    """Runs agree_step for ranks 0..len(has)-1 in threads; returns their answers."""
    out = [None] * len(has)

    def rank(r):
        out[r] = q.agree_step(r, len(has), step, has[r], timeout=timeout)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(has))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_agree_step_gives_every_rank_the_same_answer(tmp_path, qname):
    with tailcut.WorkQueue([fixed_file(tmp_path / "a.bin", 10)], name=qname) as q:
        assert agree_all(q, [True, True, True], step=0) == ["all_have_batch"] * 3
        assert agree_all(q, [True, False, True], step=1) == ["end_epoch"] * 3
        assert agree_all(q, [True, True, True], step=(1 << 32)) == ["all_have_batch"] * 3
        assert q.agree_step(0, 1, (1 << 32) + 1, True) == "all_have_batch"


def test_agree_step_times_out_when_a_rank_is_missing(tmp_path, qname):
    with tailcut.WorkQueue([fixed_file(tmp_path / "a.bin", 10)], name=qname) as q:
        start = time.monotonic()
        assert q.agree_step(0, 2, 0, True, timeout=0.2) == "timeout"
        assert 0.15 < time.monotonic() - start < 5
        # The late rank then finds rank 0's answer and decides: both agree.
        assert q.agree_step(1, 2, 0, True, timeout=0.2) == "all_have_batch"


def test_agree_step_refuses_bad_arguments(tmp_path, qname):
    with tailcut.WorkQueue([fixed_file(tmp_path / "a.bin", 10)], name=qname) as q:
        with pytest.raises(tailcut.InvalidArgumentError, match="not below ranks"):
            q.agree_step(2, 2, 0, True)
        with pytest.raises(tailcut.InvalidArgumentError, match="ranks must be an int >= 1, got 0"):
            q.agree_step(0, 0, 0, True)
        assert q.agree_step(0, 1, 5, True) == "all_have_batch"
        with pytest.raises(tailcut.InvalidArgumentError, match="Steps must grow"):
            q.agree_step(0, 1, 4, True)
        with pytest.raises(tailcut.InvalidArgumentError, match="max_clients"):
            q.agree_step(0, 100_000, 6, True)
    with pytest.raises(tailcut.InvalidArgumentError, match="is closed"):
        q.agree_step(0, 1, 7, True)


@pytest.mark.parametrize("kind", ["records", "batches"])
def test_max_epoch_reads_one_epoch_per_iteration(tmp_path, qname, kind):
    works = [fixed_file(tmp_path / "a.bin", 3000), fixed_file(tmp_path / "b.bin", 1000, 3000)]
    with tailcut.WorkQueue(works, num_epochs=3, num_slices=7, name=qname, format="fixed",
                           record_bytes=8) as q:
        for epoch in range(3):
            if kind == "records":
                it = q.records(max_epoch=epoch, **SMALL_READER)
                ids = [int.from_bytes(r, "little") for r in it]
            else:
                it = q.batches(100, max_epoch=epoch, **SMALL_READER)
                ids = []
                for b in it:
                    assert it.epoch == epoch
                    ids += b.view(np.int64).ravel().tolist()
            assert sorted(ids) == list(range(4000)), epoch
            # Every item of this epoch is done; the first of the next went back.
            assert q.summary()["done"] == 7 * (epoch + 1)
        assert q.summary()["done"] == q.summary()["total"]


def test_batches_with_max_epoch_never_mix_epochs(tmp_path, qname):
    works = [fixed_file(tmp_path / "a.bin", 1000)]
    with tailcut.WorkQueue(works, num_epochs=2, num_slices=3, name=qname, format="fixed",
                           record_bytes=8) as q:
        # An epoch-0 item given back late is read along with epoch 1.
        item = q.take()
        got = {0: [], 1: []}
        it = q.batches(64, max_epoch=0, **SMALL_READER)
        for b in it:
            got[it.epoch] += b.view(np.int64).ravel().tolist()
        item.give_back()  # every other epoch-0 item is done: this one is late now
        it = q.batches(64, max_epoch=1, **SMALL_READER)
        for b in it:
            got[it.epoch] += b.view(np.int64).ravel().tolist()  # one epoch per batch
        # The late item's records come in batches of their own epoch: both
        # epochs are complete, so no batch mixed them.
        assert sorted(got[0]) == list(range(1000)) and sorted(got[1]) == list(range(1000))


def test_read_returns_at_most_the_records_asked_for(tmp_path, qname):
    with tailcut.WorkQueue([fixed_file(tmp_path / "a.bin", 1000)], name=qname, shuffle=False,
                           format="fixed", record_bytes=8) as q:
        it = q.batches(100, **SMALL_READER)
        assert len(it.read(30)) == 30
        assert len(it.read(500)) == 100  # capped at batch_size
        rest = [len(b) for b in it]
        assert sum(rest) == 870
        with pytest.raises(StopIteration):
            it.read(10)


def test_short_at_end_cuts_a_batch_only_where_the_reader_would_wait_for_others(tmp_path, qname):
    # One item nobody else holds: the reader never waits for another process,
    # so short_at_end packs full batches, as without it. (It once cut a batch
    # wherever a reader call ended; now it cuts only where the reader would
    # wait: test_blocking.py, test_short_at_end_hands_out_a_short_batch_...)
    with tailcut.WorkQueue([fixed_file(tmp_path / "a.bin", 5000)], name=qname, format="fixed",
                           record_bytes=8) as q:
        sizes = [len(b) for b in q.batches(300, short_at_end=True, **SMALL_READER)]
    assert all(s == 300 for s in sizes[:-1]) and sum(sizes) == 5000
    with tailcut.WorkQueue([fixed_file(tmp_path / "b.bin", 5000)], name=qname + "-b",
                           format="fixed", record_bytes=8) as q:
        sizes = [len(b) for b in q.batches(300, **SMALL_READER)]
    assert all(s == 300 for s in sizes[:-1]) and sum(sizes) == 5000
