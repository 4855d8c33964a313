"""WorkQueue, WorkItem, input_dataset and input_producer from Python."""

import collections
import json
import multiprocessing
import os
import signal
import threading
import time

import pytest

import tailcut
import _workers
from conftest import write_lines


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(4):
        paths.append(write_lines(tmp_path / f"part-{i}.txt",
                                 [b"file %d line %d" % (i, j) for j in range(200 + 50 * i)]))
    return paths


def open_queue(files, qname, notices, **kwargs):
    return tailcut.WorkQueue(files, name=qname, on_notice=notices.append, **kwargs)


def test_take_hands_out_every_item_once_per_epoch_then_none(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=3, num_slices=10, seed=1) as q:
        assert q.num_items == 10 and q.num_epochs == 3 and q.seed == 1
        seen = collections.Counter()
        while (item := q.take()) is not None:
            assert item.state == "open"
            assert item.path == q.paths[item.file]
            assert (item.file, item.begin, item.end) == tuple(q.items[item.index])
            assert item.ticket // q.num_items == item.epoch
            seen[(item.epoch, item.index)] += 1
            item.ack()
            assert item.state == "acked"
        assert seen == {(e, i): 1 for e in range(3) for i in range(10)}
        assert q.take() is None
        assert q.summary()["done"] == 30


def test_same_seed_gives_same_order(files, qname, notices):
    def order(name):
        with open_queue(files, name, notices, num_epochs=2, num_slices=8, seed=42) as q:
            out = []
            while (item := q.take()) is not None:
                out.append(item.index)
                item.ack()
            return out, [q.item_at(e, p) for e in range(2) for p in range(8)]

    a, a_table = order(qname)
    b, _ = order(qname + "-b")  # finished, so removed by close()
    assert a == b == a_table


def test_work_item_context_manager_acks_on_success_and_gives_back_on_error(files, qname, notices):
    with open_queue(files, qname, notices, shuffle=False) as q:
        with q.take() as first:
            assert first.index == 0
        assert first.state == "acked"
        with pytest.raises(RuntimeError):
            with q.take() as second:
                raise RuntimeError("training step failed")
        assert second.state == "given_back"
        again = q.take()  # the given-back item comes back first
        assert again.index == second.index and again.epoch == second.epoch
        with again:
            again.give_back()  # an explicit outcome inside the block wins
        assert again.state == "given_back"
        third = q.take()
        assert third.index == second.index
        third.ack()
        with pytest.raises(tailcut.InvalidArgumentError, match="already acked"):
            third.ack()
        with pytest.raises(tailcut.InvalidArgumentError, match="already acked"):
            third.give_back()
        rest = []
        while (item := q.take()) is not None:
            with item:
                item.progress(item.begin + 1, records=1)
                rest.append(item.index)
        assert sorted(rest) == [2, 3]


def test_input_dataset_acks_each_item_when_the_next_is_requested(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=2) as q:
        ds = q.input_dataset()
        first = next(ds)
        assert first.state == "open"
        assert q.summary()["in_flight"] == 1
        second = next(ds)
        assert first.state == "acked" and second.state == "open"
        rest = list(ds)
        assert second.state == "acked"
        assert all(item.state == "acked" for item in rest)
        assert q.summary()["done"] == 8
        assert len(rest) == 6


def test_input_dataset_gives_back_the_current_item_when_closed(files, qname, notices):
    with open_queue(files, qname, notices, shuffle=False) as q:
        with q.input_dataset() as ds:
            for item in ds:
                break
        assert item.state == "given_back"
        assert q.take().index == item.index


def test_input_producer_feeds_several_threads(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=5, num_slices=20) as q:
        producer = q.input_producer(capacity=3)
        assert producer.capacity == 3
        got = []
        lock = threading.Lock()

        def consume():
            while (item := producer.get(timeout=30)) is not None:
                with item:
                    with lock:
                        got.append((item.epoch, item.index))

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == [(e, i) for e in range(5) for i in range(20)]
        assert producer.get() is None and producer.ended
        producer.close()


def test_input_producer_close_gives_back_buffered_items(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=1) as q:
        producer = q.input_producer(capacity=2)
        deadline = time.time() + 10
        while producer.qsize() < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert producer.qsize() == 2
        producer.close()
        assert q.summary()["clients"][0]["items_given_back"] == 2
        indices = []
        while (item := q.take()) is not None:
            indices.append(item.index)
            item.ack()
        assert sorted(indices) == [0, 1, 2, 3]
        with pytest.raises(tailcut.InvalidArgumentError, match="input_producer.*closed"):
            producer.get(timeout=0.1)


def test_take_with_timeout_raises_empty_and_releases_the_gil(files, qname, notices):
    # Two clients in this process: one holds every item, the other waits.
    with open_queue(files, qname, notices) as holder, open_queue(files, qname, notices) as waiter:
        held = [holder.take() for _ in range(4)]
        counter = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                counter[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        before = counter[0]
        start = time.monotonic()
        with pytest.raises(tailcut.Empty) as raised:
            waiter.take(timeout=0.5)
        waited = time.monotonic() - start
        during = counter[0] - before
        stop.set()
        t.join()
        assert 0.45 <= waited < 5
        assert during > 10000, "the spinning thread did not run while take() blocked"
        assert isinstance(raised.value, tailcut.Error)
        import queue as std_queue
        assert isinstance(raised.value, std_queue.Empty)
        assert qname in str(raised.value)

        # Once the holder acks, the waiter sees the end (not Empty).
        for item in held:
            item.ack()
        assert waiter.take(timeout=0.5) is None


def test_take_wakes_when_another_thread_gives_an_item_back(files, qname, notices):
    with open_queue(files, qname, notices) as holder, open_queue(files, qname, notices) as waiter:
        held = [holder.take() for _ in range(4)]
        threading.Timer(0.2, held[2].give_back).start()
        item = waiter.take(timeout=10)
        assert item.index == held[2].index
        item.ack()
        for h in held:
            if h.state == "open":
                h.ack()


def test_close_gives_back_open_items_and_makes_calls_raise(files, qname, notices):
    q = open_queue(files, qname, notices)
    other = open_queue(files, qname, notices)
    item = q.take()
    q.close()
    q.close()  # idempotent
    assert q.closed
    with pytest.raises(tailcut.InvalidArgumentError, match="is closed"):
        q.take()
    with pytest.raises(tailcut.InvalidArgumentError, match="is closed"):
        item.ack()
    with pytest.raises(tailcut.InvalidArgumentError, match="is closed"):
        q.summary()
    got = []
    while (i := other.take()) is not None:
        got.append(i.index)
        i.ack()
    assert sorted(got) == [0, 1, 2, 3]
    other.close()
    assert not os.path.exists(tailcut.segment_path(qname)), "the last process removes a finished queue"


def test_close_from_another_thread_wakes_a_blocked_take(files, qname, notices):
    with open_queue(files, qname, notices) as holder:
        waiter = open_queue(files, qname, notices)
        held = [holder.take() for _ in range(4)]
        errors = []

        def wait():
            try:
                waiter.take()
            except tailcut.Error as e:
                errors.append(e)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        waiter.close()
        t.join(timeout=10)
        assert not t.is_alive()
        assert errors and "is closed" in str(errors[0])
        for item in held:
            item.ack()


def test_taking_beyond_leases_per_client_raises(files, qname, notices):
    with open_queue(files, qname, notices, leases_per_client=2) as q:
        held = [q.take(), q.take()]
        with pytest.raises(tailcut.InvalidArgumentError) as e:
            q.take()
        assert str(e.value) == (
            f"queue '{qname}': this process already holds 2 open items (leases_per_client); "
            "ack or give one back before taking more, open the queue with auto_ack=True (code "
            "written for PAI, which never acks), or with a larger leases_per_client (in every "
            "process)")
        assert isinstance(e.value, ValueError)
        with pytest.raises(tailcut.InvalidArgumentError, match="below leases_per_client"):
            q.input_producer(capacity=2)
        held[0].ack()
        q.take().ack()
        held[1].ack()


def test_options_errors_and_unknown_keywords(files, qname, notices, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        tailcut.WorkQueue(files, name=qname, bogus=1)
    with pytest.raises(tailcut.InvalidArgumentError, match="num_epochs is 0") as e:
        tailcut.WorkQueue(files, name=qname, num_epochs=0)
    assert isinstance(e.value, ValueError)
    with pytest.raises(tailcut.InvalidArgumentError, match="contains '/'"):
        tailcut.WorkQueue(files, name="a/b")
    with pytest.raises(tailcut.InvalidArgumentError,
                       match="num_slices must be an int >= 0 or None, got -1"):
        tailcut.WorkQueue(files, name=qname, num_slices=-1)
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(tailcut.NotFoundError) as e:
        tailcut.WorkQueue(files + [missing], name=qname)
    assert missing in str(e.value) and isinstance(e.value, FileNotFoundError)
    with pytest.raises(tailcut.InvalidArgumentError, match="is a directory"):
        tailcut.WorkQueue([str(tmp_path)], name=qname)
    with pytest.raises(tailcut.InvalidArgumentError, match="record_bytes needs format='fixed'"):
        tailcut.WorkQueue(files, name=qname, record_bytes=4)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_raises_permission_error(files, qname):
    os.chmod(files[0], 0)
    with pytest.raises(tailcut.PermissionDeniedError) as e:
        tailcut.WorkQueue(files, name=qname)
    assert files[0] in str(e.value)


def test_a_different_configuration_under_the_same_name_is_a_clear_error(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=2):
        with pytest.raises(tailcut.ConfigMismatchError, match="num_epochs") as e:
            open_queue(files, qname, notices, num_epochs=3)
        assert qname in str(e.value)


def test_open_args_reopen_the_same_queue(files, qname, notices):
    with open_queue(files, qname, notices, num_epochs=2, num_slices=6, lease_timeout=None) as q:
        args = q.open_args
        assert args["name"] == qname and args["num_slices"] == 6
        with tailcut.WorkQueue(**args, on_notice=notices.append) as again:
            assert again.seed == q.seed and again.num_items == q.num_items


def run_processes(target, argss, method):
    ctx = multiprocessing.get_context(method)
    procs = [ctx.Process(target=target, args=args) for args in argss]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert not p.is_alive(), "a worker hung"
    return procs


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_each_item_exactly_once_across_processes(files, qname, tmp_path, method):
    n, epochs = 4, 3
    outs = [str(tmp_path / f"out-{i}.json") for i in range(n)]
    # One slow process: the others take more.
    procs = run_processes(_workers.take_all,
                          [(qname, files, epochs, n, outs[i], 0.02 if i == 0 else 0.0)
                           for i in range(n)], method)
    assert all(p.exitcode == 0 for p in procs)
    per_process = [json.load(open(o)) for o in outs]
    seen = collections.Counter(tuple(x) for got in per_process for x in got)
    assert seen == {(e, i): 1 for e in range(epochs) for i in range(24)}
    assert len(per_process[0]) < max(len(g) for g in per_process[1:])
    assert not os.path.exists(tailcut.segment_path(qname)), "the last process removes the queue"


def test_a_killed_process_loses_no_items(files, qname, tmp_path):
    dead_out = str(tmp_path / "dead.json")
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_workers.take_some_then_die, args=(qname, files, 1, 2, dead_out, 5))
    p.start()
    p.join(timeout=60)
    assert p.exitcode == -9
    acked_by_dead = [tuple(x) for x in json.load(open(dead_out))]
    live_out = str(tmp_path / "live.json")
    _workers.take_all(qname, files, 1, 2, live_out)
    got = [tuple(x) for x in json.load(open(live_out))]
    seen = collections.Counter(acked_by_dead + got)
    assert seen == {(0, i): 1 for i in range(24)}


def test_commit_then_progress_then_sigkill_resumes_at_the_commit(files, qname, notices):
    """commit(800), progress(2000), SIGKILL: the item comes back from 800. It came back from
    2000, and the records between were never used: progress says what a process read, commit
    what it handed on, and only the latter survives it."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            q = tailcut.WorkQueue(files[:1], name=qname, shuffle=False, num_clients=2,
                                  on_notice=lambda line: None)
            item = q.take()
            item.commit(800)
            item.progress(2000)
            os.write(ready_w, b"x")
            time.sleep(60)
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    q = open_queue(files[:1], qname, notices, shuffle=False, num_clients=2)
    item = q.take(timeout=10)
    assert (item.begin, item.end) == (800, os.path.getsize(files[0]))
    item.ack()
    q.close()


def test_offsets_inside_a_fixed_size_record_are_refused(tmp_path, qname, notices):
    path = tmp_path / "fixed.bin"
    path.write_bytes(bytes(8 * 1000))
    q = open_queue([str(path)], qname, notices, format="fixed", record_bytes=8, shuffle=False)
    item = q.take()
    for call in (item.commit, item.progress):
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=r"refused: offset 803 is inside a record \(format 'fixed:8': "
                                 r"records start at multiples of 8\); nothing was recorded"):
            call(803)
    item.commit(800)
    item.give_back()
    again = q.take()
    assert again.begin == 800
    again.ack()
    q.close()


def test_a_forked_child_may_not_use_its_parents_queue(files, qname, notices):
    with open_queue(files, qname, notices) as q:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                try:
                    q.take()
                    msg = b"no error"
                except tailcut.InvalidArgumentError as e:
                    msg = str(e).encode()
                os.write(w, msg)
            finally:
                os._exit(0)
        os.close(w)
        msg = os.read(r, 4096).decode()
        os.waitpid(pid, 0)
        assert "a forked child must open its own WorkQueue" in msg
        assert q.take() is not None  # the parent's queue is untouched


def test_an_unfinished_queue_closed_cleanly_is_removed_unless_keep(files, qname, notices):
    q = open_queue(files, qname, notices, num_slices=4)
    q.take().ack()
    q.close()
    assert not os.path.exists(tailcut.segment_path(qname)), "nobody comes back for it"
    assert any(f"queue '{qname}' removed unfinished (1 of 4 items done)" in line
               and "open it with keep_unfinished=True" in line for line in notices), notices

    q = open_queue(files, qname, notices, num_slices=4, keep_unfinished=True)
    q.take().ack()
    q.close()
    listed = {x["name"]: x for x in tailcut.list_queues()}
    assert listed[qname]["kept_reason"] == "keep_unfinished was set"
    resumed = open_queue(files, qname, notices, num_slices=4)  # resumes; keeps it no longer
    got = []
    while (item := resumed.take()) is not None:
        got.append(item.index)
        item.ack()
    assert len(got) == 3
    resumed.close()
    assert not os.path.exists(tailcut.segment_path(qname))


def test_a_backwards_commit_is_refused_naming_both_offsets(files, qname, notices):
    """A commit says "delivered up to here": one before an earlier commit contradicts it. It was
    accepted silently; now it is refused with both offsets, and the item resumes at the first."""
    q = open_queue(files[:1], qname, notices, shuffle=False, num_clients=2)
    item = q.take()
    item.commit(800)
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=r"commit\(500\) of item 0 .* refused: offset 500 is before 800, "
                             r"committed before; commits only move forward"):
        item.commit(500)
    item.commit(800)  # the same point again is fine
    item.give_back()
    again = q.take()
    assert again.begin == 800
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=r"offset 600 is before 800, where the item was handed out"):
        again.commit(600)
    again.ack()
    q.close()
