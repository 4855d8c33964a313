"""records() and batches() over generated files of every format, and their errors."""

import collections
import json
import multiprocessing
import os
import random

import numpy as np
import pytest

import tailcut
import _workers
from conftest import SMALL_READER, py_crc32c, py_masked_crc, py_tfrecord, write_lines, write_tfrecords


def make_lines(tmp_path, n_files=3):
    rng = random.Random(5)
    files, expected = [], []
    for i in range(n_files):
        lines = [b"f%d-l%d-" % (i, j) + b"x" * rng.randrange(0, 300) for j in range(400)]
        lines[7] = b""  # an empty line is a record too
        files.append(write_lines(tmp_path / f"lines-{i}.txt", lines))
        expected += lines
    return files, expected


def make_tfrecords(tmp_path, n_files=3):
    rng = random.Random(6)
    files, expected = [], []
    for i in range(n_files):
        records = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600))) for _ in range(150)]
        files.append(write_tfrecords(tmp_path / f"data-{i}.tfrecord", records))
        expected += records
    return files, expected


def make_fixed(tmp_path, record_bytes=24, n_files=3):
    files, expected = [], []
    for i in range(n_files):
        records = [bytes([(i * 31 + j * 7 + k) % 256 for k in range(record_bytes)]) for j in range(700)]
        path = tmp_path / f"fixed-{i}.bin"
        path.write_bytes(b"".join(records))
        files.append(str(path))
        expected += records
    return files, expected


def read_all(q, **kwargs):
    return [bytes(r) for r in q.records(**kwargs, **SMALL_READER)]


def test_the_tfrecord_writer_matches_an_independent_crc32c():
    for data in [b"", b"a", b"123456789", bytes(range(256)) * 5]:
        assert tailcut.crc32c(data) == py_crc32c(data)
        assert tailcut.masked_crc32c(tailcut.crc32c(data)) == py_masked_crc(py_crc32c(data))
        assert tailcut.encode_tfrecord(data) == py_tfrecord(data)
    assert tailcut.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


@pytest.mark.parametrize("fmt", ["lines", "tfrecord", "fixed", "file"])
def test_records_yields_every_record_once_for_each_format(tmp_path, qname, notices, fmt):
    record_bytes = None
    if fmt == "lines":
        files, expected = make_lines(tmp_path)
    elif fmt == "tfrecord":
        files, expected = make_tfrecords(tmp_path)
    elif fmt == "fixed":
        record_bytes = 24
        files, expected = make_fixed(tmp_path, record_bytes)
    else:
        files, _ = make_lines(tmp_path)
        expected = [open(f, "rb").read() for f in files]
    with tailcut.WorkQueue(files, num_epochs=2, num_slices=9, name=qname, format=fmt,
                           record_bytes=record_bytes, on_notice=notices.append) as q:
        assert q.format == (f"fixed:{record_bytes}" if fmt == "fixed" else fmt)
        got = read_all(q, max_record_bytes=1 << 20)
        assert collections.Counter(got) == collections.Counter(expected * 2)
        stats = q.summary()
        assert stats["done"] == stats["total"] == 18
        assert stats["clients"][0]["records"] == len(expected) * 2


def test_records_over_several_processes_is_exactly_once(tmp_path, qname):
    files, expected = make_tfrecords(tmp_path)
    outs = [str(tmp_path / f"out-{i}.json") for i in range(3)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_workers.read_records, args=(qname, files, "tfrecord", outs[i]))
             for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    got = [bytes.fromhex(h) for o in outs for h in json.load(open(o))]
    assert collections.Counter(got) == collections.Counter(expected)


def test_a_record_view_is_released_when_the_next_is_requested(tmp_path, qname, notices):
    files, _ = make_lines(tmp_path, 1)
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        it = q.records(**SMALL_READER)
        first = next(it)
        assert first.readonly and first.format == "B"
        value = bytes(first)
        assert it.offset == 0 and it.item["path"] == files[0]
        second = next(it)
        with pytest.raises(ValueError, match="released"):
            bytes(first)
        assert value == b"f0-l0-" + value[6:] and bytes(second).startswith(b"f0-l1-")
        # A view someone exported cannot be released; it stays safe to read
        # (the buffers stay mapped) but its bytes may change.
        exported = np.frombuffer(second, dtype=np.uint8)
        next(it)
        assert exported.shape[0] >= 0
        it.close()
        assert list(it) == []


def test_dropping_an_iterator_gives_back_its_items_even_while_a_view_lives(tmp_path, qname, notices):
    files, expected = make_fixed(tmp_path, 32, n_files=2)
    with tailcut.WorkQueue(files, name=qname, format="fixed", record_bytes=32,
                           on_notice=notices.append) as q:
        for batch in q.batches(16, **SMALL_READER):
            break
        kept = batch  # a view: keeps the reader's buffers mapped
        assert not kept.flags.writeable and kept.shape == (16, 32)
        # The iterator is gone: its items are back in the queue.
        rest = sorted(bytes(r) for r in q.records(**SMALL_READER))
        assert rest == sorted(expected)
        assert kept.sum() >= 0  # still safe to touch


def test_records_default_to_the_queue_format_and_refuse_another(tmp_path, qname, notices):
    files, expected = make_fixed(tmp_path, 16)
    with tailcut.WorkQueue(files, name=qname, format="fixed", record_bytes=16,
                           on_notice=notices.append) as q:
        with pytest.raises(tailcut.InvalidArgumentError, match="opened with format 'fixed:16'"):
            q.records(format="lines")
        with pytest.raises(tailcut.InvalidArgumentError, match="record_bytes must match"):
            q.records(record_bytes=8)
        with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'"):
            q.records(chunk_size=4096)
        with pytest.raises(tailcut.InvalidArgumentError, match="unknown record format"):
            tailcut.WorkQueue(files, name=qname + "x", format="csv")
        assert sorted(read_all(q)) == sorted(expected)


def test_fixed_batches_are_read_only_views_or_owned_arrays(tmp_path, qname, notices):
    files, expected = make_fixed(tmp_path, 32)
    with tailcut.WorkQueue(files, name=qname, format="fixed", record_bytes=32, shuffle=False,
                           on_notice=notices.append) as q:
        it = q.batches(64, **SMALL_READER)
        assert it.batch_size == 64
        rows, views, owned = [], 0, 0
        for batch in it:
            assert batch.dtype == np.uint8 and batch.ndim == 2 and batch.shape[1] == 32
            assert 1 <= batch.shape[0] <= 64
            if batch.flags.writeable:
                owned += 1
            else:
                views += 1
                with pytest.raises(ValueError):
                    batch[0, 0] = 1
            rows += [bytes(r) for r in batch]
        assert rows == expected  # no shuffle, one reader: file order
        assert views > 0 and owned > 0  # full batches inside a chunk, packed ones across chunks
        # Every batch but the last of the data is full.
        assert len(expected) % 64 != 0


def test_batches_copy_gives_arrays_that_outlive_the_next_batch(tmp_path, qname, notices):
    files, expected = make_fixed(tmp_path, 32, n_files=1)
    with tailcut.WorkQueue(files, name=qname, shuffle=False, on_notice=notices.append) as q:
        kept = list(q.batches(50, format="fixed", record_bytes=32, copy=True, **SMALL_READER))
        assert all(b.flags.writeable for b in kept)
        assert [bytes(r) for b in kept for r in b] == expected
        assert [len(b) for b in kept] == [50] * 14


def test_batches_drop_last(tmp_path, qname, notices):
    files, expected = make_fixed(tmp_path, 8, n_files=1)
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        sizes = [len(b) for b in q.batches(300, format="fixed", record_bytes=8, drop_last=True,
                                           copy=True, **SMALL_READER)]
        assert sizes == [300, 300]


@pytest.mark.parametrize("fmt", ["lines", "tfrecord", "file"])
def test_variable_batches_are_data_and_offsets(tmp_path, qname, notices, fmt):
    if fmt == "tfrecord":
        files, expected = make_tfrecords(tmp_path)
    else:
        files, expected = make_lines(tmp_path)
        if fmt == "file":
            expected = [open(f, "rb").read() for f in files]
    with tailcut.WorkQueue(files, name=qname, num_slices=5, on_notice=notices.append) as q:
        got = []
        for data, offsets in q.batches(33, format=fmt, max_record_bytes=1 << 20, **SMALL_READER):
            assert data.dtype == np.uint8 and offsets.dtype == np.int64
            assert offsets[0] == 0 and offsets[-1] == len(data)
            assert 1 <= len(offsets) - 1 <= 33
            got += [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
        assert collections.Counter(got) == collections.Counter(expected)


def test_corrupt_tfrecord_raises_corrupt_error_naming_the_file(tmp_path, qname, notices):
    files, _ = make_tfrecords(tmp_path, 1)
    data = bytearray(open(files[0], "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(files[0], "wb").write(bytes(data))
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        with pytest.raises(tailcut.CorruptError) as e:
            read_all(q, format="tfrecord")
        assert files[0] in str(e.value) and "offset" in str(e.value)
        # Nothing is lost: the failing item was given back, not acked.
        assert q.summary()["done"] == 0
        assert q.take().index == 0


def test_fixed_file_of_the_wrong_size_raises_corrupt_error(tmp_path, qname, notices):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"x" * 100)
    with tailcut.WorkQueue([str(path)], name=qname, on_notice=notices.append) as q:
        with pytest.raises(tailcut.CorruptError, match="not a multiple of record_bytes 16") as e:
            read_all(q, format="fixed", record_bytes=16)
        assert str(path) in str(e.value)


def test_a_file_removed_after_the_queue_opened_raises_not_found(tmp_path, qname, notices):
    files, _ = make_lines(tmp_path, 2)
    with tailcut.WorkQueue(files, name=qname, shuffle=False, on_notice=notices.append) as q:
        os.remove(files[0])
        with pytest.raises(tailcut.NotFoundError) as e:
            read_all(q)
        assert files[0] in str(e.value) and isinstance(e.value, FileNotFoundError)


def test_a_truncated_file_raises_io_error(tmp_path, qname, notices):
    files, _ = make_lines(tmp_path, 1)
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        os.truncate(files[0], 1000)
        with pytest.raises(tailcut.IoError) as e:
            read_all(q)
        assert files[0] in str(e.value) and "truncated" in str(e.value)


def test_batches_hand_out_what_was_read_before_an_error(tmp_path, qname, notices):
    good = write_tfrecords(tmp_path / "good.tfrecord", [b"r%d" % i for i in range(10)])
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"\x00" * 40)
    with tailcut.WorkQueue([good, str(bad)], name=qname, shuffle=False,
                           on_notice=notices.append) as q:
        it = q.batches(100, format="tfrecord", copy=True)
        data, offsets = next(it)
        assert len(offsets) == 11  # the good file's records come first
        with pytest.raises(tailcut.CorruptError, match="bad.tfrecord"):
            next(it)


def test_bad_reader_options_are_invalid_argument(tmp_path, qname, notices):
    files, _ = make_lines(tmp_path, 1)
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as q:
        with pytest.raises(tailcut.InvalidArgumentError, match="at least 3 chunks"):
            q.records(buffer_budget_bytes=4096, chunk_bytes=4096)
        with pytest.raises(tailcut.InvalidArgumentError, match="backend 'spdk'"):
            q.records(backend="spdk")
        with pytest.raises(tailcut.InvalidArgumentError, match="batch_size must be an int >= 1"):
            q.batches(0)


@pytest.mark.parametrize("backend", ["pread", "uring"])
def test_each_backend_reads_everything(tmp_path, qname, notices, backend):
    files, expected = make_lines(tmp_path, 2)
    with tailcut.WorkQueue(files, name=qname, num_slices=4, on_notice=notices.append) as q:
        try:
            it = q.records(backend=backend, **SMALL_READER)
        except tailcut.IoError as e:
            pytest.skip(f"io_uring unavailable here: {e}")
        assert it.backend == ("io_uring" if backend == "uring" else "pread")
        assert it.chunk_bytes == 4096 and it.num_chunks == 16
        assert "buffers" in it.memory_state
        got = [bytes(r) for r in it]
        assert collections.Counter(got) == collections.Counter(expected)
        assert it.stats()["records"] == len(expected)


def test_closing_the_queue_closes_its_readers(tmp_path, qname, notices):
    files, _ = make_lines(tmp_path, 2)
    q = tailcut.WorkQueue(files, name=qname, on_notice=notices.append)
    it = q.records(**SMALL_READER)
    batch_it = q.batches(10, **SMALL_READER)
    next(it)
    q.close()
    with pytest.raises(tailcut.InvalidArgumentError, match="closed while it was being read"):
        next(it)
    with pytest.raises(tailcut.InvalidArgumentError, match="closed"):
        next(batch_it)


# ---- Record-level shuffle (shuffle_buffer=, interleave=) ---------------------------------------


def fixed_ids(tmp_path, n_files=4, per_file=600):
    """Files of int64 ids 0..n_files*per_file-1 in file order (8-byte records)."""
    files = []
    for i in range(n_files):
        path = tmp_path / f"ids-{i}.bin"
        np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64).tofile(path)
        files.append(str(path))
    return files, n_files * per_file


def read_ids(q, **kw):
    return [int(i) for b in q.batches(50, **kw) for i in b.view(np.int64).ravel()]


@pytest.mark.parametrize("kw", [dict(shuffle_buffer=256), dict(interleave=3),
                                dict(shuffle_buffer=256, interleave=3)])
def test_shuffled_batches_and_records_hold_every_record_once_in_a_seeded_order(
        tmp_path, qname, notices, kw):
    files, n = fixed_ids(tmp_path)
    opts = dict(num_slices=16, shuffle=False, format="fixed", record_bytes=8,
                on_notice=notices.append)
    orders = []
    for run, seed in enumerate([7, 7, 8]):
        with tailcut.WorkQueue(files, name=f"{qname}-{run}", **opts) as q:
            orders.append(read_ids(q, shuffle_seed=seed, **SMALL_READER, **kw))
    assert sorted(orders[0]) == list(range(n))
    assert orders[0] == orders[1], "same seeds, same order"
    assert orders[0] != orders[2], "another shuffle_seed, another order"
    assert orders[0] != list(range(n))
    with tailcut.WorkQueue(files, name=f"{qname}-r", **opts) as q:
        it = q.records(**SMALL_READER, **kw)
        ids = [int.from_bytes(bytes(r), "little") for r in it]
        assert it.item is None  # records of several items: no one item
        assert it.stats()["records"] == n and it.stats()["items_acked"] == 16
    assert sorted(ids) == list(range(n))


@pytest.mark.parametrize("short_at_end", [False, True])
@pytest.mark.parametrize("buffer", [1, 300])
def test_shuffled_batches_stop_at_max_epoch_and_give_the_next_epoch_back(tmp_path, qname, notices,
                                                                         short_at_end, buffer):
    files, n = fixed_ids(tmp_path, per_file=512)  # whole batches: no short one at the end
    with tailcut.WorkQueue(files, name=qname, num_epochs=2, num_slices=8, format="fixed",
                           record_bytes=8, on_notice=notices.append) as q:
        for epoch in range(2):
            it = q.batches(64, max_epoch=epoch, shuffle_buffer=buffer, interleave=2,
                           short_at_end=short_at_end, **SMALL_READER)
            ids = [int(i) for b in it for i in b.view(np.int64).ravel()]
            assert sorted(ids) == list(range(n)) and it.epoch == epoch
            it.close()
            # Every item of the epoch is done once its iteration ended: none of
            # them (their records all handed out) went back to the queue at close.
            assert q.summary()["done"] == 8 * (epoch + 1), epoch


def test_shuffled_batches_ending_on_items_others_hold_leave_theirs_done(tmp_path, qname, notices):
    """A read(timeout=0) that ends with Empty (another user holds the last item)
    and the close after it give back none of the items whose records were
    handed out: they are all done, only the held one is not."""
    files, n = fixed_ids(tmp_path)
    with tailcut.WorkQueue(files, name=qname, num_slices=8, format="fixed", record_bytes=8,
                           shuffle=False, on_notice=notices.append) as q:
        held = q.take()  # item 0, the first in ticket order
        it = q.batches(64, shuffle_buffer=300, interleave=2, short_at_end=True, **SMALL_READER)
        ids = []
        with pytest.raises(tailcut.Empty):
            while True:
                ids.extend(int(i) for i in it.read(64, timeout=0).view(np.int64).ravel())
        it.close()
        summary = q.summary()
        assert summary["done"] == 7 and summary["in_flight"] == 1, summary
        assert len(ids) == len(set(ids)) == n - (held.end - held.begin) // 8
        held.ack()


def test_interleave_needs_leases_and_memory_and_says_which(tmp_path, qname, notices):
    files, _ = fixed_ids(tmp_path)
    with tailcut.WorkQueue(files, name=qname, format="fixed", record_bytes=8,
                           on_notice=notices.append) as q:  # leases_per_client=8
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=r"^batches\(interleave=4\) with prefetch_items=2: the Readers hold "
                                 r"up to 12 items, but queue '.*' has leases_per_client=8; lower "
                                 r"interleave or prefetch_items, or open the queue with "
                                 r"leases_per_client >= 12 \(in every process\)$"):
            q.batches(10, interleave=4, prefetch_items=2)
        with pytest.raises(tailcut.InvalidArgumentError, match=r"^records\(interleave=9\): 9 "
                           r"Readers need at least one lease each.*leases_per_client >= 9"):
            q.records(interleave=9)
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=r"buffer_budget_bytes \(65536\) is shared by 4 Readers, 16384 "
                                 r"bytes each, less than the 3 chunks of chunk_bytes \(8192\)"):
            q.records(interleave=4, buffer_budget_bytes=65536, chunk_bytes=8192)
        for bad, text in [(dict(interleave=0), "interleave must be an int >= 1, got 0 \\(int\\)"),
                          (dict(interleave=65), "interleave must be 1 to 64, got 65"),
                          (dict(shuffle_buffer=-1),
                           "shuffle_buffer must be an int >= 0, got -1 \\(int\\)"),
                          (dict(shuffle_buffer=2**24 + 1),
                           "shuffle_buffer must be at most 2\\*\\*24 records")]:
            with pytest.raises(tailcut.InvalidArgumentError, match=text):
                q.records(**bad)
        with pytest.raises(TypeError, match="shuffle_seed must be an int"):
            q.records(shuffle_buffer=4, shuffle_seed="x")


@pytest.mark.parametrize("fmt", ["lines", "tfrecord", "fixed"])
def test_record_end_is_where_the_next_record_of_its_file_starts(tmp_path, qname, notices, fmt):
    make = {"lines": make_lines, "tfrecord": make_tfrecords, "fixed": make_fixed}[fmt]
    files, expected = make(tmp_path)
    framing = {"lines": 1, "tfrecord": 16, "fixed": 0}[fmt]
    extra = dict(record_bytes=24) if fmt == "fixed" else {}
    with tailcut.WorkQueue(files, name=qname, num_slices=7, shuffle=False, format=fmt,
                           on_notice=notices.append, **extra) as q:
        it = q.records(**SMALL_READER)
        spans = collections.defaultdict(list)  # path -> [(offset, end)]
        for record in it:
            assert it.end - it.offset == len(record) + framing
            spans[it.item["path"]].append((it.offset, it.end))
    assert len(spans) == len(files)
    for path, s in spans.items():
        s.sort()
        assert s[0][0] == 0 and s[-1][1] == os.path.getsize(path), path
        assert all(a[1] == b[0] for a, b in zip(s, s[1:])), path
