"""Blocking calls from Python: Ctrl-C is answered promptly whatever they wait for, timeouts
of any size wait as asked, and a reader whose item was reassigned says so."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tailcut
from conftest import SMALL_READER, another_process_holding, write_lines

# How long after SIGINT the reading process must be gone. The promise is 100 ms per slice;
# the margin covers interpreter exit on a loaded machine. The item stays held for 60 s.
SIGINT_LIMIT_S = 1.5

READER = textwrap.dedent("""
    import sys, tailcut
    name, mode, works = sys.argv[1], sys.argv[2], sys.argv[3:]
    q = tailcut.WorkQueue(works, name=name, shuffle=False, on_notice=lambda line: None)
    n = 0
    try:
        source = q.records() if mode == "records" else q.batches(1)
        for _ in source:
            n += 1
            print(n, flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        q.close()
        sys.exit(3)
""")


def two_files(tmp_path):
    return [write_lines(tmp_path / f"{c}.txt", [f"{c}{i}".encode() for i in range(10)])
            for c in "ab"]


@pytest.mark.parametrize("mode", ["records", "batches"])
def test_sigint_interrupts_a_reader_waiting_for_an_item_another_process_holds(
        tmp_path, qname, mode):
    files = two_files(tmp_path)
    with another_process_holding(qname, files, tmp_path, shuffle=False):
        reader = subprocess.Popen([sys.executable, "-c", READER, qname, mode] + files,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # It reads the 10 records of the item nobody holds, then waits for the held one.
            for line in reader.stdout:
                if line.strip() == "10":
                    break
            time.sleep(0.3)
            assert reader.poll() is None, "the reader did not wait for the held item"
            sent = time.monotonic()
            reader.send_signal(signal.SIGINT)
            rc = reader.wait(30)
            elapsed = time.monotonic() - sent
            rest = reader.stdout.read()
        finally:
            reader.kill()
            reader.wait()
        assert rc == 3 and "interrupted" in rest, reader.stderr.read()
        assert elapsed < SIGINT_LIMIT_S, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"


# Each blocking call in a state that waits for others, in a process of its own: it prints
# "waiting" just before the call and the time.monotonic() of its KeyboardInterrupt.
BLOCKED = textwrap.dedent("""
    import sys, threading, time, tailcut
    name, call, works = sys.argv[1], sys.argv[2], sys.argv[3:]
    entered, release = threading.Event(), threading.Event()

    def slow_notice(line):
        # The notice of the queue removed at close: held until released.
        if "removed unfinished" in line:
            entered.set()
            release.wait(60)

    q = tailcut.WorkQueue(works, name=name, shuffle=False, on_notice=slow_notice)
    closer = None
    try:
        if call == "take":
            q.take().ack()  # the item nobody holds; the other is held by another process
            print("waiting", flush=True)
            q.take()
        elif call == "get":
            producer = q.input_producer(capacity=1)
            producer.get().ack()
            print("waiting", flush=True)
            producer.get()
        elif call == "agree_step":
            print("waiting", flush=True)
            q.agree_step(0, 2, 0, True)  # rank 1 of 2 never comes
        elif call == "close":
            q.take().ack()  # unfinished: the last close removes it, with a notice
            closer = threading.Thread(target=q.close)
            closer.start()
            entered.wait(60)
            print("waiting", flush=True)
            q.close()  # waits for the other thread's close, held in on_notice
        print("returned", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic():.6f}", flush=True)
        release.set()
        if closer is not None:
            closer.join(60)
        sys.exit(3)
""")

# SIGINT to KeyboardInterrupt: a correctness bound, not a benchmark (the promise is one
# 100 ms slice; the margin covers a loaded machine).
INTERRUPT_LIMIT_S = 2.0


def interrupt_blocked(qname, call, files):
    """Runs BLOCKED for `call`, sends SIGINT once it waits; the seconds until
    KeyboardInterrupt."""
    child = subprocess.Popen([sys.executable, "-c", BLOCKED, qname, call] + files,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting", child.stderr.read()
        time.sleep(0.3)  # in the call by now
        assert child.poll() is None, f"{call} did not wait: {child.stderr.read()}"
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        said = child.stdout.readline().split()
        rc = child.wait(30)
    finally:
        child.kill()
        child.wait()
    assert rc == 3 and said and said[0] == "interrupted", (rc, said, child.stderr.read())
    return float(said[1]) - sent


@pytest.mark.parametrize("call", ["take", "get"])
def test_sigint_interrupts_a_call_waiting_for_an_item_another_process_holds(tmp_path, qname, call):
    files = two_files(tmp_path)
    with another_process_holding(qname, files, tmp_path, shuffle=False):
        elapsed = interrupt_blocked(qname, call, files)
    assert elapsed < INTERRUPT_LIMIT_S, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"


def test_sigint_interrupts_agree_step_waiting_for_an_absent_rank(tmp_path, qname):
    elapsed = interrupt_blocked(qname, "agree_step", two_files(tmp_path))
    assert elapsed < INTERRUPT_LIMIT_S, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"


def test_sigint_interrupts_close_waiting_for_another_threads_close(tmp_path, qname):
    # close() waits while another thread closes the same queue (here held up in on_notice).
    elapsed = interrupt_blocked(qname, "close", two_files(tmp_path))
    assert elapsed < INTERRUPT_LIMIT_S, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"


LARGE_TIMEOUTS = [1e10, 1e300, float("inf"), None, 10**400]


@pytest.mark.parametrize("timeout", LARGE_TIMEOUTS)
def test_take_with_a_huge_timeout_waits_for_the_item(tmp_path, qname, timeout):
    (f,) = two_files(tmp_path)[:1]
    with tailcut.WorkQueue([f], name=qname) as q:
        held = q.take()
        threading.Timer(0.3, held.give_back).start()
        start = time.monotonic()
        item = q.take(timeout=timeout)  # old code: Empty at once (the deadline overflowed)
        assert item is not None and item.index == held.index
        assert time.monotonic() - start >= 0.25
        item.ack()


@pytest.mark.parametrize("timeout", LARGE_TIMEOUTS)
def test_input_producer_get_with_a_huge_timeout_waits(tmp_path, qname, timeout):
    (f,) = two_files(tmp_path)[:1]
    with tailcut.WorkQueue([f], name=qname) as q:
        producer = q.input_producer(capacity=1)
        item = producer.get(timeout=10)
        threading.Timer(0.3, item.ack).start()
        start = time.monotonic()
        assert producer.get(timeout=timeout) is None  # the end, once the item is acked
        assert time.monotonic() - start >= 0.25
        producer.close()


@pytest.mark.parametrize("bad", [float("nan"), -1, -1e-9, float("-inf")])
def test_nan_and_negative_timeouts_are_refused(tmp_path, qname, bad):
    (f,) = two_files(tmp_path)[:1]
    with tailcut.WorkQueue([f], name=qname) as q:
        expected = "timeout must be a number of seconds >= 0, or None"
        with pytest.raises(tailcut.InvalidArgumentError, match=expected.replace("(", r"\(")):
            q.take(timeout=bad)
        with pytest.raises(tailcut.InvalidArgumentError, match="timeout must be"):
            q.input_producer().get(timeout=bad)
        with pytest.raises(tailcut.InvalidArgumentError, match="timeout must be"):
            q.agree_step(0, 1, 0, True, timeout=bad)
        with pytest.raises(tailcut.InvalidArgumentError, match="timeout must be"):
            q.batches(1).read(1, timeout=bad)
        with pytest.raises(TypeError, match=r"^timeout must be a number of seconds >= 0, or None "
                                            r"\(or float\(.inf.\)\) to wait without a limit, "
                                            r"got '1' \(str\)$"):
            q.take(timeout="1")


def test_a_zero_timeout_read_raises_empty_while_another_process_holds_the_last_item(
        tmp_path, qname):
    files = two_files(tmp_path)
    with another_process_holding(qname, files, tmp_path, shuffle=False):
        with tailcut.WorkQueue(files, name=qname, shuffle=False) as q:
            it = q.batches(100)
            data, offsets = it.read(100, timeout=0)
            assert len(offsets) == 11  # the item nobody holds, whole
            start = time.monotonic()
            with pytest.raises(tailcut.Empty):
                it.read(100, timeout=0.2)
            assert 0.15 < time.monotonic() - start < 5
            assert it.stats()["items_taken"] == it.stats()["items_acked"]  # holds nothing


def test_short_at_end_hands_out_a_short_batch_instead_of_waiting_for_others(tmp_path, qname):
    files = two_files(tmp_path)
    with another_process_holding(qname, files, tmp_path, shuffle=False):
        with tailcut.WorkQueue(files, name=qname, shuffle=False) as q:
            it = q.batches(16, short_at_end=True)
            start = time.monotonic()
            data, offsets = next(it)  # 10 records, not a wait for 6 more held elsewhere
            assert len(offsets) == 11 and time.monotonic() - start < 5


def test_a_reader_whose_items_were_reassigned_counts_them_and_warns(tmp_path, qname):
    import multiprocessing

    import _workers
    files = [write_lines(tmp_path / f"{c}.txt", [b"%c%05d" % (ord(c), i) for i in range(2000)])
             for c in "ab"]
    opts = dict(num_slices=8, lease_timeout=0.2, shuffle=False)
    with tailcut.WorkQueue(files, name=qname, on_notice=lambda line: None, **opts) as q:
        it = q.records(**SMALL_READER)
        for _ in range(10):
            next(it)
        assert it.stats()["stale_items"] == 0
        # Stalled past the lease timeout: another process takes (and acks) every item.
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_workers.ack_all, args=(qname, files, opts))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        with pytest.warns(RuntimeWarning, match="reassigned to another process"):
            rest = sum(1 for _ in it)
        assert it.stats()["stale_items"] >= 1
        assert rest < 4000 - 10


@pytest.mark.parametrize("mode", ["records", "batches"])
def test_close_from_another_thread_ends_a_reader_waiting_for_a_held_item(tmp_path, qname, mode):
    files = two_files(tmp_path)
    with another_process_holding(qname, files, tmp_path, shuffle=False):
        q = tailcut.WorkQueue(files, name=qname, shuffle=False, on_notice=lambda line: None)
        it = q.records() if mode == "records" else q.batches(1)
        outcome = []

        def read():
            try:
                outcome.append(sum(1 for _ in it))
            except tailcut.InvalidArgumentError as e:
                outcome.append(str(e))

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(1.0)  # it has read the free item and waits for the held one
        assert reader.is_alive()
        start = time.monotonic()
        q.close()
        reader.join(5)
        assert not reader.is_alive() and time.monotonic() - start < 1.0
        assert outcome == [f"queue '{qname}' was closed while it was being read"]


# ---- Opening a queue, and stale items in batches() -------------------------------------------

OPENER = textwrap.dedent("""
    import sys, tailcut
    name, timeout, works = sys.argv[1], sys.argv[2], sys.argv[3:]
    print("opening", flush=True)
    try:
        tailcut.WorkQueue(works, name=name, attach_timeout=None if timeout == "None" else
                          float(timeout), on_notice=lambda line: None)
        print("opened", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
""")


@pytest.mark.parametrize("timeout", ["None", "inf", "3600"])
def test_sigint_interrupts_opening_a_queue_whose_creator_never_sets_it_up(
        tmp_path, qname, timeout):
    """A creator stopped (SIGSTOP) before it sized its segment leaves it empty: an attacher
    waits for it to grow, up to attach_timeout (None, inf: without a limit). Ctrl-C ends
    the wait promptly, whatever it is."""
    files = two_files(tmp_path)
    path = tailcut.segment_path(qname)
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))  # what the creator made
    opener = subprocess.Popen([sys.executable, "-c", OPENER, qname, timeout] + files,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert opener.stdout.readline().strip() == "opening"
        time.sleep(1.0)
        assert opener.poll() is None, "the open did not wait for the segment"
        sent = time.monotonic()
        opener.send_signal(signal.SIGINT)
        rc = opener.wait(30)
        elapsed = time.monotonic() - sent
        rest = opener.stdout.read()
    finally:
        opener.kill()
        opener.wait()
        os.unlink(path)
    assert rc == 3 and "interrupted" in rest, opener.stderr.read()
    assert elapsed < SIGINT_LIMIT_S, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"


def test_a_short_attach_timeout_replaces_a_segment_its_creator_never_set_up(tmp_path, qname):
    files = two_files(tmp_path)
    path = tailcut.segment_path(qname)
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    notices = []
    with tailcut.WorkQueue(files, name=qname, attach_timeout=0.2, on_notice=notices.append) as q:
        assert sum(1 for _ in q.records()) == 20
    assert any("removed an empty segment" in line for line in notices), notices


def test_a_batch_reader_whose_items_were_reassigned_counts_them_and_warns(tmp_path, qname):
    import multiprocessing

    import _workers
    files = [write_lines(tmp_path / f"{c}.txt", [b"%c%05d" % (ord(c), i) for i in range(2000)])
             for c in "ab"]
    opts = dict(num_slices=8, lease_timeout=0.2, shuffle=False)
    with tailcut.WorkQueue(files, name=qname, on_notice=lambda line: None, **opts) as q:
        it = q.batches(5, **SMALL_READER)
        for _ in range(2):
            next(it)
        assert it.stats()["stale_items"] == 0
        # Stalled past the lease timeout: another process takes (and acks) every item.
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_workers.ack_all, args=(qname, files, opts))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        with pytest.warns(RuntimeWarning, match="reassigned to another process"):
            rest = sum(len(offsets) - 1 for _, offsets in it)
        assert it.stats()["stale_items"] >= 1
        assert rest < 4000 - 10
