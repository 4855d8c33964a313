"""Fixtures of the Python tests: unique queue names, generated data files, a process that
holds items."""

import contextlib
import itertools
import multiprocessing
import os
import struct
import time

import pytest

import tailcut

_counter = itertools.count()


@pytest.fixture
def qname():
    """A queue name no other test (or concurrent test run) uses; removed afterwards."""
    name = f"pytest-{os.getpid()}-{next(_counter)}"
    yield name
    try:
        tailcut.remove_queue(name, force=True)
    except tailcut.NotFoundError:
        pass


@pytest.fixture
def rname():
    """A queue name nobody else uses, for a PooledLoader whose ring is '<name>.pool'
    (or a ring of that very name); afterwards the queue, and each ring with its
    pool's files (description, failure record, status), are removed."""
    from tailcut.pool import _lifecycle
    name = f"pytest-ring-{os.getpid()}-{next(_counter)}"
    yield name
    for ring in (name, name + ".pool"):
        _lifecycle.remove_pool(ring)
    try:
        tailcut.remove_queue(name, force=True)
    except tailcut.NotFoundError:
        pass


@pytest.fixture
def notices():
    """A list that collects on_notice lines (and keeps stderr quiet)."""
    return []


def write_lines(path, lines):
    with open(path, "wb") as f:
        for line in lines:
            f.write(line + b"\n")
    return str(path)


# A pure-Python CRC32C (Castagnoli), to check tailcut's TFRecord writer
# against an independent one.
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def py_crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def py_masked_crc(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def py_tfrecord(data):
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", py_masked_crc(py_crc32c(header))) + data +
            struct.pack("<I", py_masked_crc(py_crc32c(data))))


def write_tfrecords(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(py_tfrecord(r))
    return str(path)


# Small reader buffers so that records cross chunk boundaries in small files.
SMALL_READER = dict(buffer_budget_bytes=16 * 4096, chunk_bytes=4096)


@contextlib.contextmanager
def another_process_holding(name, works, tmp_path, count=1, **open_kwargs):
    """Runs a process that opens the queue with these arguments, takes `count` items and
    holds them (alive, no progress) until the block ends; then it acks them and leaves."""
    import _workers
    ready, release = tmp_path / "held", tmp_path / "release"
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_workers.hold_items,
                    args=(name, works, open_kwargs, count, str(ready), str(release)))
    p.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert p.is_alive() and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.01)
        yield p
    finally:
        release.touch()
        p.join(60)
        if p.is_alive():
            p.kill()
