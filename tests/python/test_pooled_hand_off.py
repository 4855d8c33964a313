"""A rank's hand-off of a pooled batch, on its short path: the slot header's
array table read in C++ (tailcut._batch_layout.decode_batch), a ready batch taken
without a look at the loaders' failure record (PooledLoader._pop), and the
caller's own copy made as the arrays are read."""

import os
import time

import numpy as np
import pytest
import torch

import tailcut
from tailcut._batch_layout import decode_batch, encode_batch
import tailcut.torch as tt
from tailcut.pool import PooledLoader


def slot(nbytes=1 << 16):
    return memoryview(bytearray(nbytes)), memoryview(bytearray(256))


def test_batches_of_other_layouts_after_a_known_one_are_read_by_their_own_table():
    data, header = slot()
    a = np.arange(32 * 64, dtype=np.uint8).reshape(32, 64)
    b = (np.full((16, 8), 1.5, dtype=np.float32), np.arange(16, dtype=np.int64))
    for batch in (a, b, a, b[1], a):  # each layout read, then known
        encode_batch(batch, data, header, [(3, 0, 16)])
        got = decode_batch(data.toreadonly(), header.toreadonly())
        want = batch
        if isinstance(want, tuple):
            assert isinstance(got, tuple) and len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and np.array_equal(g, w)
        else:
            assert not isinstance(got, tuple)
            assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_known_layout_is_read_only_over_a_read_only_slot():
    data, header = slot()
    encode_batch(np.ones((4, 4), dtype=np.int32), data, header)
    for _ in range(2):  # read, then known
        got = decode_batch(data.toreadonly(), header.toreadonly())
        assert not got.flags.writeable
        assert got.sum() == 16


def test_a_known_layout_over_too_few_bytes_is_refused_with_the_header_s_message():
    data, header = slot()
    nbytes = encode_batch(np.ones((64, 64), dtype=np.float64), data, header)
    decode_batch(data, header)  # the layout is known now
    with pytest.raises(tailcut.CorruptError, match="is beyond the batch's"):
        decode_batch(data[:nbytes // 2], header)


def test_views_keep_their_buffer_and_follow_its_writability():
    data, header = slot()
    encode_batch((np.arange(6, dtype=np.int16).reshape(2, 3), np.ones(3, dtype=np.float64)),
                 data, header)
    a, b = decode_batch(data, header)
    assert a.flags.writeable and a.base is b.base
    a[0, 0] = 7
    assert decode_batch(data, header)[0][0, 0] == 7  # a view, no copy
    owner = data.obj
    data.release()  # the slot's view let go (as BatchRing.release() does) ...
    del owner
    assert a.tolist() == [[7, 1, 2], [3, 4, 5]] and b.sum() == 3  # ... the views still hold it
    c = decode_batch(bytes(64), _header_of(np.ones(8, dtype=np.uint8)))
    assert not c.flags.writeable  # over bytes: read-only


def _header_of(array):
    data, header = slot(256)
    encode_batch(array, data, header)
    return bytes(header)


def test_mangled_headers_raise_corrupt_error_and_never_reach_past_the_data():
    """Random bytes over a valid header (and its table in the data): each
    decode gives arrays inside the data, or CorruptError naming the batch."""
    rng = np.random.default_rng(7)
    layouts = (np.ones((4, 4), dtype=np.int32),
               tuple(np.zeros((2, i + 1), dtype=np.float32) for i in range(12)))  # table in data
    for batch in layouts:
        data, header = slot(4096)
        nbytes = encode_batch(batch, data, header)
        good_data, good_header = bytes(data), bytes(header)
        for _ in range(3000):
            h, d = bytearray(good_header), bytearray(good_data[:nbytes])
            for _ in range(int(rng.integers(1, 4))):
                where = h if rng.random() < 0.8 else d
                at = int(rng.integers(0, 64 if where is h else len(d)))
                where[at] = int(rng.integers(0, 256))
            try:
                got = decode_batch(bytes(d), bytes(h))
            except tailcut.CorruptError as e:
                assert str(e).startswith("pooled batch: "), e
                continue
            for a in got if isinstance(got, tuple) else (got,):
                start = a.__array_interface__["data"][0] - np.frombuffer(
                    a.base, dtype=np.uint8).__array_interface__["data"][0]
                assert 0 <= start and start + a.nbytes <= len(d)


def test_a_bad_magic_is_refused_after_its_layout_was_known():
    data, header = slot()
    encode_batch(np.ones((8,), dtype=np.uint8), data, header)
    decode_batch(data, header)
    header[0:4] = b"XXXX"
    with pytest.raises(tailcut.CorruptError, match="bad header magic"):
        decode_batch(data, header)


class FailInFirstLoader:
    """A transform that raises in loader 0 from its third batch on; loader 1
    goes on publishing, so the ring keeps ready batches."""

    def __init__(self):
        self.worker, self.batches = None, 0

    def __call__(self, batch):
        if self.worker is None:
            self.worker = int(os.environ.get("TEST_LOADER_ID", "-1"))
        self.batches += 1
        if self.worker == 0 and self.batches >= 3:
            raise ValueError("loader 0 fails on purpose")
        return batch


def loader_id(worker_id):
    os.environ["TEST_LOADER_ID"] = str(worker_id)


def test_a_loader_that_fails_while_others_keep_the_ring_full_reaches_the_rank_within_the_check(
        tmp_path, rname):
    """A rank that never waits for a batch still looks at the failure record
    at least every FAILURE_CHECK_S: it raises the failed loader's error long
    before its epoch ends."""
    path = tmp_path / "records.bin"
    np.zeros((4000, 64), dtype=np.uint8).tofile(path)  # 500 batches of 8
    ds = tt.QueueDataset([str(path)], name=rname, format="fixed", record_bytes=64,
                         num_slices=64)
    loader = PooledLoader(ds, batch_size=8, loaders_per_host=2, transform=FailInFirstLoader(),
                          worker_init_fn=loader_id, num_slots=64, rank=0, world_size=1,
                          local_rank=0, local_world_size=1)
    steps = 0
    try:
        with pytest.raises(ValueError, match="loader 0 fails on purpose"):
            for _ in loader:
                steps += 1
                time.sleep(0.01)  # a step: loader 1 keeps ahead of it
        # Raised within a check or two of the failure, not at the epoch's end.
        assert steps < 250, steps
    finally:
        loader.close()
        ds.close()


def test_the_caller_s_batch_is_its_own_copy_and_the_ring_s_slot_is_released(tmp_path, rname):
    path = tmp_path / "records.bin"
    np.arange(64 * 64, dtype=np.int64).astype(np.uint8).reshape(64, 64).tofile(path)
    ds = tt.QueueDataset([str(path)], name=rname, format="fixed", record_bytes=64,
                         num_slices=4, shuffle_buffer=0)
    loader = PooledLoader(ds, batch_size=8, loaders_per_host=1, num_slots=4, rank=0,
                          world_size=1, local_rank=0, local_world_size=1)
    try:
        kept = list(loader)  # 8 batches through 4 slots: each slot released in turn
        assert len(kept) == 8
        rows = sorted(bytes(r) for b in kept for r in b.numpy())
        assert rows == sorted(bytes(r) for r in np.fromfile(path, dtype=np.uint8).reshape(64, 64))
        before = [b.clone() for b in kept]
        kept[0].fill_(255)  # writable, and no other batch sees it
        assert all(torch.equal(b, s) for b, s in zip(kept[1:], before[1:]))
    finally:
        loader.close()
        ds.close()


def test_a_ring_used_in_a_forked_child_is_refused_there_and_still_works_in_its_opener(rname):
    """The fork check of every ring call (one load of a counter that a fork
    bumps, no getpid() per batch) still tells a child from the opener."""
    from tailcut import _core
    ring = _core.BatchRing(rname, 4096, 2, "trainer")
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ring.pop(0, 0.0)
            except tailcut.InvalidArgumentError as e:
                code = 0 if "a forked process must open its own BatchRing" in str(e) else 2
            except BaseException:
                code = 3
            os.write(w, bytes([code]))
            os._exit(0)
        os.close(w)
        code = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        assert code == b"\x00", code
        with pytest.raises(tailcut.Empty):  # the opener's ring: nothing ready, no refusal
            ring.pop(0, 0.0)
    finally:
        ring.close()
        tailcut.remove_batch_ring(rname)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_a_watched_rank_waits_past_its_slices_for_a_late_rank(tmp_path, qname, timeout):
    """With a watch (PooledLoader's, for state_dict() calls) a rank waits in
    slices of WATCH_SLICE; timeout=None (DataLoader's timeout=0) waits on
    across them, not a TimeoutError after a slice or two."""
    import threading
    from tailcut import _steps
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with tailcut.WorkQueue([str(path)], name=qname) as q0, \
            tailcut.WorkQueue([str(path)], name=qname) as q1:
        watched = []
        early = _steps.StepAgreement(q0, 0, 2, timeout=timeout, who="PooledLoader")
        early.watch = lambda epoch, step: watched.append(step)
        late = _steps.StepAgreement(q1, 1, 2, timeout=timeout, who="PooledLoader")
        answers = []
        t = threading.Thread(target=lambda: answers.append(early.agree(0, 0, True)))
        t.start()
        time.sleep(4 * _steps.WATCH_SLICE)
        assert late.agree(0, 0, True)
        t.join(10)
        assert answers == [True] and watched
