"""WebDataset tar shards from Python: format="tar" hands out each sample (the run of members
sharing a key) as WebDataset does, {"__key__": key, suffix: bytes}, per rank through
QueueDataset and pooled through PooledLoader with a decoding transform; every sample once,
from shards written by Python's tarfile (ustar, GNU and pax, long names) and GNU tar."""

import io
import os
import subprocess
import tarfile

import pytest

import tailcut

torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402


def sample_bytes(i):
    return os.urandom(100 + 37 * (i % 13)), str(i).encode()


def write_shard(path, first, n, fmt=tarfile.USTAR_FORMAT, prefix="train"):
    """A shard of samples first..first+n-1: '<prefix>/<id>.jpg' and '<prefix>/<id>.cls'."""
    written = {}
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(first, first + n):
            jpg, cls = sample_bytes(i)
            key = f"{prefix}/{i:06d}"
            for suffix, data in (("jpg", jpg), ("cls", cls)):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            written[key] = {"jpg": jpg, "cls": cls}
    return written


def gnu_tar_shard(tmp_path, first, n):
    """A shard written by GNU tar from files on disk."""
    src = tmp_path / f"src-{first}"
    written = {}
    for i in range(first, first + n):
        jpg, cls = sample_bytes(i)
        key = f"{i:06d}"
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / f"{key}.jpg").write_bytes(jpg)
        (src / f"{key}.cls").write_bytes(cls)
        written[key] = {"jpg": jpg, "cls": cls}
    path = tmp_path / f"gnu-{first}.tar"
    names = sorted(p.name for p in src.iterdir())
    subprocess.run(["tar", "--format=gnu", "-cf", str(path), "-C", str(src), *names], check=True)
    return str(path), written


@pytest.fixture
def shards(tmp_path):
    long_prefix = "a-directory-name-long-enough/" * 4 + "train"  # past ustar's 100 bytes
    written, paths = {}, []
    for k, (fmt, prefix) in enumerate([(tarfile.USTAR_FORMAT, "train"),
                                       (tarfile.GNU_FORMAT, long_prefix),
                                       (tarfile.PAX_FORMAT, "pax")]):
        path = tmp_path / f"shard-{k}.tar"
        written.update(write_shard(path, 30 * k, 30, fmt, prefix))
        paths.append(str(path))
    path, more = gnu_tar_shard(tmp_path, 90, 30)
    written.update(more)
    paths.append(path)
    return paths, written


def test_tar_members_splits_a_sample_and_names_damage():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("k/0001.jpg", b"JPEG"), ("k/0001.seg.png", b"PNG")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()[:3 * 512 + 512]  # two members, no end blocks
    assert tailcut.tar_members(raw) == {"__key__": "k/0001", "jpg": b"JPEG", "seg.png": b"PNG"}
    damaged = bytearray(raw)
    damaged[148] ^= 0x11  # the first header's checksum
    with pytest.raises(tailcut.CorruptError, match="offset 0"):
        tailcut.tar_members(bytes(damaged))


def test_a_rank_reads_every_sample_of_every_shard_once(shards, qname):
    paths, written = shards
    ds = tt.QueueDataset(paths, name=qname, format="tar", num_clients=1, num_slices=7)
    seen = {}
    for sample in ds:
        key = sample.pop("__key__")
        assert key not in seen, f"{key} twice"
        seen[key] = sample
    ds.close()
    assert seen == written


def decode(sample):
    """A loader's transform: the class id and the image's length, as tensors."""
    return torch.tensor(int(sample["cls"])), torch.tensor(len(sample["jpg"]))


def test_pooled_loaders_decode_every_sample_once(shards, rname, monkeypatch):
    paths, written = shards
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset(paths, name=rname, format="tar", num_clients=1, num_slices=7,
                         transform=decode)
    loader = tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0, timeout=60, num_workers=2,
                             batch_size=8, slot_bytes=1 << 14, num_slots=4)
    classes, lengths = [], []
    try:
        for cls, length in loader:
            classes += cls.tolist()
            lengths += length.tolist()
    finally:
        loader.close()
        ds.close()
    assert sorted(classes) == list(range(120))
    want = {int(v["cls"]): len(v["jpg"]) for v in written.values()}
    assert dict(zip(classes, lengths)) == want
