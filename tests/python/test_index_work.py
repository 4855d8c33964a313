"""Index works: WorkQueue(num_samples=N) from Python (items give their sample indices) and
tailcut.torch.IndexDataset, the per-rank path for a map-style dataset (DataLoader workers
pulling index items, EqualSteps over the ranks)."""

import collections
import json
import multiprocessing
import os
import pathlib
import time

import pytest

import tailcut


def drain(q):
    seen = collections.Counter()
    while (item := q.take(timeout=10)) is not None:
        with item:
            seen.update((item.epoch, i) for i in item.indices())
    return seen


def test_an_index_queue_hands_out_every_sample_once_per_epoch(qname):
    with tailcut.WorkQueue(num_samples=1000, num_epochs=2, seed=4, name=qname) as q:
        assert q.num_samples == 1000
        assert q.num_items == 4  # items of 256 samples
        assert q.open_args["works"] is None and q.open_args["num_samples"] == 1000
        seen = drain(q)
    assert set(seen) == {(e, i) for e in range(2) for i in range(1000)}
    assert set(seen.values()) == {1}


def test_items_give_their_samples_in_a_shuffled_order_set_by_the_seed(qname):
    def order(name, seed):
        with tailcut.WorkQueue(num_samples=500, num_slices=1, seed=seed, name=name) as q:
            item = q.take()
            with item:
                assert (item.begin, item.end) == (0, 500)
                return item.indices(), item.indices(10, 20)
    a, part = order(qname, 1)
    assert part == a[10:20]
    assert sorted(a) == list(range(500)) and a != list(range(500))
    assert order(qname + "-same", 1)[0] == a
    assert order(qname + "-other", 2)[0] != a


def test_indices_written_into_an_array_are_the_listed_ones(qname):
    """indices(start, stop, out=array): what a batch of global shuffle reads, one uint64
    array per batch and no Python int per sample; the same samples as the list."""
    import numpy as np
    for n, shuffle in ((100_000, True), (200, True), (1000, False)):
        with tailcut.WorkQueue(num_samples=n, num_slices=1, seed=3, shuffle=shuffle,
                               name=f"{qname}-{n}") as q:
            item = q.take()
            with item:
                out = np.full(n + 1, 7, np.uint64)
                assert item.indices(0, n, out=out[:n]) is not None
                assert out[:n].tolist() == item.indices() and out[n] == 7
                assert item.indices(5, 14, out=out[:9]).tolist() == item.indices(5, 14)
                for bad in (np.empty(9, np.int32), np.empty(8, np.uint64),
                            np.empty(18, np.uint64)[::2], np.empty(9, np.uint64).reshape(3, 3),
                            [0] * 9):
                    with pytest.raises(tailcut.InvalidArgumentError, match="out must be"):
                        item.indices(5, 14, out=bad)


def test_a_commit_counts_positions_and_the_item_resumes_there(qname):
    with tailcut.WorkQueue(num_samples=100, num_slices=1, seed=1, name=qname) as q:
        item = q.take()
        first = item.indices()
        item.commit(30)  # positions 0..29 delivered
        item.give_back()
        again = q.take()
        assert (again.begin, again.end) == (30, 100)
        assert again.indices() == first[30:]
        again.ack()


def test_bad_index_work_arguments_name_the_fix(tmp_path, qname):
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    with pytest.raises(tailcut.InvalidArgumentError, match="both works and num_samples"):
        tailcut.WorkQueue([str(path)], num_samples=10, name=qname)
    with pytest.raises(tailcut.InvalidArgumentError, match="format 'tfrecord' is set with"):
        tailcut.WorkQueue(num_samples=10, format="tfrecord", name=qname)
    with pytest.raises(tailcut.InvalidArgumentError, match="or num_samples"):
        tailcut.WorkQueue(name=qname)
    with pytest.raises(ValueError, match="num_samples"):
        tailcut.WorkQueue(num_samples=0, name=qname)
    with tailcut.WorkQueue([str(path)], name=qname) as q:
        with q.take() as item:
            with pytest.raises(tailcut.InvalidArgumentError, match="not samples by index"):
                item.indices()
    with tailcut.WorkQueue(num_samples=10, name=qname + "-n") as q:
        with pytest.raises(tailcut.ConfigMismatchError,
                           match="num_samples=20 here, num_samples=10 in segment"):
            tailcut.WorkQueue(num_samples=20, name=qname + "-n")
        with q.take() as item:
            with pytest.raises(tailcut.InvalidArgumentError, match="start <= stop <= 10"):
                item.indices(0, 11)


def test_records_of_an_index_queue_are_refused_with_what_to_do(qname):
    with tailcut.WorkQueue(num_samples=10, name=qname) as q:
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=r"is an index work \(num_samples=10\): it has no file to read"):
            next(iter(q.records(format="lines")))


torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

import tailcut.torch as tt  # noqa: E402
from _index_workers import Labelled, index_rank  # noqa: E402


def test_dataloader_workers_read_every_sample_once_with_its_label(qname):
    ds = tt.IndexDataset(Labelled(1000), name=qname, num_epochs=2, seed=2, num_clients=1)
    loader = DataLoader(ds, batch_size=16, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = []
        for x, y in loader:
            assert x.shape[1] == 2 and torch.equal(x[:, 0].long() % 10, y)
            ids += x[:, 0].long().tolist()
        assert sorted(ids) == list(range(1000)), epoch
        assert ids != sorted(ids)  # shuffled
    ds.close()
    assert not os.path.exists(tailcut.segment_path(qname))


def test_index_dataset_refuses_what_it_cannot_index(qname):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    class NoLen:
        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match="IterableDataset.*use tailcut.torch.QueueDataset"):
        tt.IndexDataset(Stream(), name=qname)
    with pytest.raises(TypeError, match="has no __len__"):
        tt.IndexDataset(NoLen(), name=qname)
    with pytest.raises(ValueError, match=r"is empty \(len 0\)"):
        tt.IndexDataset(Labelled(0), name=qname)


def test_an_exception_of_getitem_names_the_index(qname):
    class Broken(Labelled):
        def __getitem__(self, i):
            if i == 7:
                raise KeyError("no such image")
            return super().__getitem__(i)

    ds = tt.IndexDataset(Broken(50), name=qname, num_clients=1)
    with pytest.raises(KeyError) as info:
        list(ds)
    assert "raised by dataset[7] (Broken" in "\n".join(getattr(info.value, "__notes__", []))
    ds.close()


def test_ranks_with_dataloader_workers_run_equal_steps_and_use_every_sample_once(tmp_path,
                                                                                qname):
    """2 ranks x 2 DataLoader workers on one index queue, rank 1 slow: equal steps, and
    every sample of every epoch trained once or reported left over."""
    args = dict(n=960, epochs=2, items=48, job=qname, world=2, slow=0.002,
                out_dir=str(tmp_path))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=index_rank, args=(r, args)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    logs = [json.loads((pathlib.Path(tmp_path) / f"rank{r}.json").read_text()) for r in range(2)]
    for e in range(2):
        assert logs[0][e]["steps"] == logs[1][e]["steps"]
        used = collections.Counter()
        for log in logs:
            used.update(log[e]["trained"] + log[e]["dropped"])
        assert set(used) == set(range(960)) and set(used.values()) == {1}, e
    assert not os.path.exists(tailcut.segment_path(qname))


def test_an_idle_process_splits_the_unread_tail_of_an_index_item(qname):
    """Index works split in positions, not bytes, in parts of at least 8 samples (not
    64 KiB): a claimed item gives its tail to a process with nothing to take."""
    owner = tailcut.WorkQueue(num_samples=10000, num_slices=1, seed=1, name=qname)
    thief = tailcut.WorkQueue(num_samples=10000, num_slices=1, seed=1, name=qname)
    item = owner.take()
    order = item.indices()
    assert item.claim(1000) == 10000
    piece = thief.take(timeout=1)
    assert 1000 < piece.begin < 10000 and piece.end == 10000
    end = item.claim(10000)
    assert end == piece.begin
    assert sorted(item.indices(0, end) + piece.indices()) == list(range(10000))
    assert piece.indices() == order[piece.begin:]
    item.ack()
    piece.ack()
    owner.close()
    thief.close()


def test_a_small_item_splits_and_min_split_bytes_is_the_thiefs_own(qname):
    """An item of 256 samples (the default size) splits too: the engine's split unit
    is one position below 2^20 of them, no longer 4096. min_split_bytes is the
    thief's: a process that wants parts of 200 samples at least leaves a tail of
    224 whole, one that takes the default 8 splits it."""
    owner = tailcut.WorkQueue(num_samples=256, num_slices=1, seed=1, name=qname)
    picky = tailcut.WorkQueue(num_samples=256, num_slices=1, seed=1, name=qname,
                              min_split_bytes=200)
    thief = tailcut.WorkQueue(num_samples=256, num_slices=1, seed=1, name=qname)
    item = owner.take()
    assert item.claim(32) == 256
    with pytest.raises(tailcut.Empty):
        picky.take(timeout=0)
    piece = thief.take(timeout=1)
    assert 32 < piece.begin < 256 and piece.end == 256
    assert item.claim(256) == piece.begin
    assert sorted(item.indices(0, piece.begin) + piece.indices()) == list(range(256))
    item.ack()
    piece.ack()
    for q in (owner, picky, thief):
        q.close()
    with pytest.raises(tailcut.InvalidArgumentError, match="min_split_bytes"):
        tailcut.WorkQueue(num_samples=256, name=qname + "-bad", min_split_bytes=0)


def test_a_thief_with_split_multiple_takes_whole_batches(qname):
    """split_multiple (a pool loader's batch of samples): the split falls on a multiple
    of it past the item's begin, so an item of whole batches splits into whole batches."""
    owner = tailcut.WorkQueue(num_samples=256, num_slices=1, seed=1, name=qname)
    thief = tailcut.WorkQueue(num_samples=256, num_slices=1, seed=1, name=qname,
                              split_multiple=32, min_split_bytes=32)
    item = owner.take()
    assert item.claim(40) == 256
    piece = thief.take(timeout=1)
    assert piece.begin % 32 == 0 and 64 <= piece.begin < 256, piece
    assert item.claim(256) == piece.begin
    item.ack()
    piece.ack()
    owner.close()
    thief.close()
    with pytest.raises(tailcut.InvalidArgumentError, match="split_multiple"):
        tailcut.WorkQueue(num_samples=256, name=qname + "-bad", split_multiple=0)
