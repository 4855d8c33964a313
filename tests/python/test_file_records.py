"""format="file": a pooled loader hands the transform each file's bytes with its path and
index in works (FileRecord, a bytes subclass: transforms written for bytes keep working)."""

import os

import pytest

import tailcut
import tailcut.pool as pool

torch = pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")
import tailcut.torch as tt  # noqa: E402

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
    (record,) = pool.item_records(folder[3], 0, size, "file")
    assert isinstance(record, bytes) and record == b"x" * size
    assert record.path == folder[3] and record.index is None
    import pickle
    again = pickle.loads(pickle.dumps(record))
    assert again == record and (again.path, again.index) == (record.path, None)


def test_pooled_loaders_hand_the_transform_the_path_and_index(folder, qname, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset(folder, format="file", transform=label_and_size, name=qname,
                         num_slices=len(folder))
    loader = tt.PooledLoader(ds, num_workers=2, batch_size=3, rank=0, world_size=1,
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
    loader = tt.PooledLoader(ds, num_workers=1, batch_size=5, rank=0, world_size=1,
                             local_rank=0, slot_bytes=1 << 14, num_slots=4, timeout=60)
    sizes = sorted(x for batch in loader for x in batch.tolist())
    assert sizes == sorted(2 * os.path.getsize(p) for p in folder)
    loader.close()
    ds.close()
