"""File names that are not UTF-8, queue names, garbage-collected items and auto_ack."""

import gc
import multiprocessing
import os
import pathlib

import pytest

import tailcut
import _workers

NON_UTF8 = b"\xff.txt"


class BytesPath:
    """An os.PathLike whose __fspath__ returns bytes."""

    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        return self.path


@pytest.fixture
def non_utf8_file(tmp_path):
    path = os.fsencode(tmp_path) + b"/" + NON_UTF8
    with open(path, "wb") as f:
        f.write(b"one\ntwo\nthree\n")
    return path


@pytest.mark.parametrize("kind", ["bytes", "str", "pathlike-bytes", "pathlib"])
def test_a_file_name_that_is_not_utf8_can_be_read_and_round_trips(non_utf8_file, qname, kind):
    work = {"bytes": non_utf8_file, "str": os.fsdecode(non_utf8_file),
            "pathlike-bytes": BytesPath(non_utf8_file),
            "pathlib": pathlib.Path(os.fsdecode(non_utf8_file))}[kind]
    with tailcut.WorkQueue([work], name=qname, shuffle=False) as q:
        # Paths come back as os.fsdecode gives them: os.fsencode restores the bytes.
        assert [os.fsencode(p) for p in q.paths] == [non_utf8_file]
        assert os.fsencode(q.open_args["works"][0]) == non_utf8_file
        item = q.take()
        assert os.fsencode(item.path) == non_utf8_file and os.path.exists(item.path)
        assert "\\udcff" in repr(item)
        item.give_back()
        records = q.records()
        assert [bytes(r) for r in records] == [b"one", b"two", b"three"]
        assert records.item is None
    # The same queue opens again from the paths it returned.
    with tailcut.WorkQueue(**dict(q.open_args, name=qname + "-again")) as again:
        assert [bytes(r) for r in again.records()] == [b"one", b"two", b"three"]


def test_a_missing_file_whose_name_is_not_utf8_is_named_in_the_error(tmp_path, qname):
    missing = os.fsencode(tmp_path) + b"/\xfe-missing.txt"
    with pytest.raises(tailcut.NotFoundError) as e:
        tailcut.WorkQueue([missing], name=qname)
    assert "\\xfe-missing.txt" in str(e.value)


@pytest.mark.parametrize("name, shown", [("é", "'é'"), ("a\x00b", r"'a\x00b'"),
                                         ("q\udcff", r"'q\udcff'")])
def test_a_queue_name_that_is_not_ascii_or_holds_nul_is_named_in_full(tmp_path, name, shown):
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    for call in (lambda: tailcut.WorkQueue([str(f)], name=name),
                 lambda: tailcut.inspect_queue(name), lambda: tailcut.remove_queue(name),
                 lambda: tailcut.segment_path(name)):
        with pytest.raises(tailcut.InvalidArgumentError) as e:
            call()
        assert str(e.value).startswith(f"queue name {shown} contains ")
        assert "use only ASCII letters, digits, '.', '_' and '-'" in str(e.value)
        assert str(e.value).endswith("; use only ASCII letters, digits, '.', '_' and '-'")


def test_an_unacked_item_that_is_garbage_collected_goes_back_at_once(tmp_path, qname):
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    works = [str(f)]
    with tailcut.WorkQueue(works, name=qname) as q:
        item = q.take()
        cycle = [item]
        cycle.append(cycle)  # only the cycle collector frees it
        del item, cycle
        gc.collect()
        # Another process gets it now, not after this process closes the queue.
        out = tmp_path / "taken"
        p = multiprocessing.get_context("spawn").Process(
            target=_workers.take_one, args=(qname, works, {}, str(out)))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and out.read_text() == "0"
        assert q.summary()["done"] == 1


def files_of(tmp_path, n):
    out = []
    for i in range(n):
        p = tmp_path / f"f{i}.txt"
        p.write_text(f"{i}\n")
        out.append(str(p))
    return out


def test_auto_ack_lets_pai_code_take_without_acking(tmp_path, qname):
    works = files_of(tmp_path, 20)
    with tailcut.WorkQueue(works, name=qname, num_epochs=2, leases_per_client=2,
                           auto_ack=True) as q:
        got = []
        while (work := q.take()) is not None:  # PAI: no ack anywhere
            got.append((work.epoch, work.index))
        assert sorted(got) == [(e, i) for e in range(2) for i in range(20)]
        s = q.summary()
        assert s["done"] == s["total"] == 40
        assert q.open_args["auto_ack"] is True


def test_auto_ack_input_producer_runs_past_leases_per_client(tmp_path, qname):
    works = files_of(tmp_path, 12)
    with tailcut.WorkQueue(works, name=qname, auto_ack=True) as q:
        producer = q.input_producer()
        got = [w.index for w in iter(lambda: producer.get(timeout=30), None)]
        assert sorted(got) == list(range(12))
    # Without auto_ack the same code holds 8 items (leases_per_client) unacked; then get()
    # raises what take() raises instead of waiting for an ack only its caller can make
    # (it used to wait forever).
    with tailcut.WorkQueue(works, name=qname + "-b") as q:
        producer = q.input_producer()
        held = []
        with pytest.raises(tailcut.InvalidArgumentError) as e:
            for _ in range(12):
                held.append(producer.get(timeout=30))
        assert str(e.value) == (
            f"queue '{qname}-b': this process already holds 8 open items (leases_per_client); "
            "ack or give one back before taking more, open the queue with auto_ack=True (code "
            "written for PAI, which never acks), or with a larger leases_per_client (in every "
            "process)")
        assert len(held) == 8
        held.pop().ack()
        held.append(producer.get(timeout=30))  # an ack frees a lease: get() goes on
        for w in held:
            w.ack()
        producer.close()
    assert not os.path.exists(tailcut.segment_path(qname + "-b")), "removed though unfinished"


def test_auto_ack_acks_the_last_item_at_close_and_a_dropped_one_at_once(tmp_path, qname):
    works = files_of(tmp_path, 2)
    q = tailcut.WorkQueue(works, name=qname, shuffle=False, auto_ack=True)
    first = q.take()
    del first  # dropped: done (auto_ack), not given back
    gc.collect()
    assert q.summary()["done"] == 1
    last = q.take()
    assert last.index == 1
    q.close()  # the last item is done too: the queue is complete and removed
    assert last.state == "acked"
    assert not os.path.exists(tailcut.segment_path(qname))
