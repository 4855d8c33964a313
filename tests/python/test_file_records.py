"""format="file": a pooled loader, and a QueueDataset read per rank, hand the transform each
file's bytes with its path and index in works (FileRecord, a bytes subclass: transforms
written for bytes keep working)."""

import os

import numpy as np
import pytest

import tailcut
from tailcut.pool import loader as pool_loader
from tailcut._file_record import FileRecord

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

CLASSES = ["cat", "dog"]


def label_and_size(record):
    """A transform that reads the label from the folder name, as ImageFolder does."""
    label = CLASSES.index(os.path.basename(os.path.dirname(record.path)))
    return torch.tensor(len(record)), label, record.index


def size_only(record):
    """A transform written for plain bytes."""
    return torch.tensor(len(bytes(record)) + len(record.decode()))


@pytest.fixture
def folder(tmp_path):
    works = []
    for c, name in enumerate(CLASSES):
        os.makedirs(tmp_path / name)
        for i in range(5):
            path = tmp_path / name / f"{i}.bin"
            path.write_bytes(b"x" * (10 * c + i + 1))
            works.append(str(path))
    return works


def test_a_file_record_is_bytes_with_its_path_and_index(folder):
    size = os.path.getsize(folder[3])
    (record,) = pool_loader.item_records(folder[3], 0, size, "file")
    assert isinstance(record, bytes) and record == b"x" * size
    assert record.path == folder[3] and record.index is None
    import pickle
    again = pickle.loads(pickle.dumps(record))
    assert again == record and (again.path, again.index) == (record.path, None)


def test_pooled_loaders_hand_the_transform_the_path_and_index(folder, qname, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset(folder, format="file", transform=label_and_size, name=qname,
                         num_slices=len(folder))
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=2, batch_size=3, rank=0, world_size=1,
                             local_rank=0, slot_bytes=1 << 14, num_slots=4, timeout=60)
    got = []
    for sizes, labels, indices in loader:
        got += list(zip(sizes.tolist(), labels.tolist(), indices.tolist()))
    want = [(os.path.getsize(p), CLASSES.index(os.path.basename(os.path.dirname(p))), i)
            for i, p in enumerate(folder)]
    assert sorted(got) == sorted(want)
    loader.close()
    ds.close()


def test_a_transform_written_for_bytes_keeps_working(folder, qname, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset(folder, format="file", transform=size_only, name=qname)
    loader = tailcut.pool.PooledLoader(ds, loaders_per_host=1, batch_size=5, rank=0, world_size=1,
                             local_rank=0, slot_bytes=1 << 14, num_slots=4, timeout=60)
    sizes = sorted(x for batch in loader for x in batch.tolist())
    assert sizes == sorted(2 * os.path.getsize(p) for p in folder)
    loader.close()
    ds.close()


@pytest.mark.parametrize("order", [{}, dict(shuffle_buffer=0, interleave=1)],
                         ids=["shuffled", "file-order"])
def test_a_per_rank_dataset_hands_the_transform_the_path_and_index(folder, qname, monkeypatch,
                                                                   order):
    """QueueDataset read in the rank's DataLoader workers: each record a FileRecord too, though
    the reader's batches of records mix files of several items."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset(folder, format="file", transform=label_and_size, name=qname, **order)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2,
                                         multiprocessing_context="fork", timeout=60)
    got = []
    for sizes, labels, indices in loader:
        got += list(zip(sizes.tolist(), labels.tolist(), indices.tolist()))
    want = [(os.path.getsize(p), CLASSES.index(os.path.basename(os.path.dirname(p))), i)
            for i, p in enumerate(folder)]
    assert sorted(got) == sorted(want)
    ds.close()


def test_per_rank_file_records_have_the_prefixed_path_as_items_do(folder, qname, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    root = os.path.dirname(os.path.dirname(folder[0])) + os.sep
    works = [os.path.relpath(p, root) for p in folder]
    with tt.QueueDataset(works, format="file", prefix=root, name=qname) as ds:
        records = list(ds)
    assert all(type(r) is FileRecord for r in records)
    assert sorted((r.index, r.path, len(r)) for r in records) == [
        (i, p, os.path.getsize(p)) for i, p in enumerate(folder)]


@pytest.mark.parametrize("shuffle_buffer,interleave", [(0, 1), (4, 2)],
                         ids=["batcher", "shuffled"])
def test_batches_say_which_file_each_record_is(folder, qname, shuffle_buffer, interleave):
    """BatchIterator.files: batches of 4 mix items; the file sizes are all distinct, so each
    record's size names its file. None for formats other than 'file'."""
    with tailcut.WorkQueue(folder, format="file", name=qname, on_notice=lambda line: None) as q:
        it = q.batches(4, shuffle_buffer=shuffle_buffer, interleave=interleave)
        assert it.files is None  # before the first batch
        seen = []
        for data, offsets in it:
            files = it.files
            assert files.dtype == np.uint32 and len(files) == len(offsets) - 1
            sizes = (offsets[1:] - offsets[:-1]).tolist()
            assert sizes == [os.path.getsize(folder[f]) for f in files]
            seen += files.tolist()
        assert sorted(seen) == list(range(len(folder)))
    text = os.path.join(os.path.dirname(folder[0]), "lines.txt")
    with open(text, "wb") as f:
        f.write(b"a\nb\n")
    with tailcut.WorkQueue([text], name=qname + "-lines", on_notice=lambda line: None) as q:
        it = q.batches(4)
        next(it)
        assert it.files is None
