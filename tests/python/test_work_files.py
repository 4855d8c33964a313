"""Work files that change under a queue, read by the pooled loaders' path
(tailcut.pool.loader.item_records, tailcut.slice_records): the checks the Reader
makes (tailcut/work_file.h). Regression: slice_records opened the file
without O_NONBLOCK, the regular-file check and the identity check, so a FIFO
renamed over a work file blocked the loader in open() forever, and a file
renamed over one was read silently."""

import os
import threading

import pytest

import tailcut
from tailcut.pool import loader as pool_loader


@pytest.fixture
def queue(tmp_path, qname, notices):
    paths = []
    for i in range(2):
        p = tmp_path / f"w{i}.txt"
        p.write_bytes(b"".join(b"%d-%d\n" % (i, j) for j in range(100)))
        paths.append(str(p))
    with tailcut.WorkQueue(paths, name=qname, shuffle=False, format="lines",
                           on_notice=notices.append) as q:
        yield q


def records_of(slice_item, **kw):
    return pool_loader.item_records(slice_item.path, slice_item.begin, slice_item.end, "lines", **kw)


def test_a_fifo_renamed_over_a_work_file_is_refused_at_once(queue, tmp_path):
    item = queue.take()
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    os.rename(fifo, item.path)
    for kw in (dict(item=item), {}):
        outcome = []

        def read():
            try:
                records_of(item, **kw)
            except Exception as e:  # noqa: BLE001 -- the test checks which
                outcome.append(e)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(10)
        if t.is_alive():
            os.close(os.open(item.path, os.O_WRONLY | os.O_NONBLOCK))  # unblock the open()
            t.join(10)
            pytest.fail("opening the FIFO blocked")
        assert len(outcome) == 1 and isinstance(outcome[0], tailcut.InvalidArgumentError), outcome
        assert str(outcome[0]) == (
            f"file '{item.path}' changed since the queue was created: it is no longer a "
            "regular file; recreate the queue or restore the file")
    item.give_back()


def test_a_file_renamed_over_a_work_file_is_refused_naming_the_change(queue, tmp_path):
    item = queue.take()
    assert len(records_of(item, item=item)) == 100
    other = tmp_path / "other"
    other.write_bytes(open(item.path, "rb").read())  # the same bytes, another file
    os.rename(other, item.path)
    with pytest.raises(tailcut.ConfigMismatchError,
                       match=rf"^file '{item.path}' changed since the queue was created: "
                             r"inode \d+ -> \d+.*; recreate the queue or restore the file$"):
        records_of(item, item=item)
    item.give_back()


def test_a_truncated_work_file_is_an_io_error_and_appended_bytes_are_not_read(queue):
    item = queue.take()
    with open(item.path, "ab") as f:
        f.write(b"appended\n")
    assert len(records_of(item, item=item)) == 100
    os.truncate(item.path, 10)
    with pytest.raises(tailcut.IoError, match=r"the file is 10 bytes, \d+ when the queue was "
                                              r"created \(truncated\?"):
        records_of(item, item=item)
    item.give_back()


def test_the_item_must_be_the_slices(queue):
    a, b = queue.take(), queue.take()
    with pytest.raises(tailcut.InvalidArgumentError, match="is not the item's"):
        records_of(a, item=b)
    with pytest.raises(TypeError, match="item must be a WorkItem"):
        records_of(a, item="x")
    a.give_back()
    b.give_back()
