"""Bad arguments and misuse from Python: which exception, with which message.

The rows of docs/reliability.md ("Python and PyTorch") point here; each test
checks the whole message, or the part of it that names the thing and the fix.
"""

import builtins
import os
import queue as std_queue
import re
import time

import pytest

import tailcut
from conftest import write_lines


@pytest.fixture
def files(tmp_path):
    return [write_lines(tmp_path / f"part-{i}.txt",
                        [b"file %d line %d" % (i, j) for j in range(50)])
            for i in range(4)]


def exact(message):
    """A pytest.raises(match=...) pattern for exactly this message."""
    return "^" + re.escape(message) + "$"


# The C++ tailcut::ErrorKind of each class (bindings/errors.cc, ExceptionFor), and
# the built-in exception it also is, so that generic handlers catch it.
@pytest.mark.parametrize("cls, builtin", [
    (tailcut.InvalidArgumentError, ValueError),           # kInvalidArgument
    (tailcut.NotFoundError, FileNotFoundError),           # kNotFound
    (tailcut.PermissionDeniedError, PermissionError),     # kPermission
    (tailcut.NoSpaceError, OSError),                      # kNoSpace
    (tailcut.ConfigMismatchError, None),                  # kConfigMismatch
    (tailcut.CorruptError, None),                         # kCorrupt
    (tailcut.TimeoutError, builtins.TimeoutError),        # kTimeout
    (tailcut.IoError, OSError),                           # kIo
    (tailcut.StaleItemError, None),                       # the bindings: a refused ack
    (tailcut.Empty, std_queue.Empty),                     # the bindings: take(timeout)
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_error_class_is_a_tailcut_error_and_its_builtin(cls, builtin):
    assert issubclass(cls, tailcut.Error) and cls is not tailcut.Error
    assert cls.__module__ == "tailcut"
    if builtin is not None:
        assert issubclass(cls, builtin)


def test_a_star_import_leaves_the_builtin_timeout_error_alone():
    # `from tailcut import *` must not rebind TimeoutError: an `except TimeoutError` after it
    # would stop catching every other library's timeouts (a socket's, asyncio's).
    names = {}
    exec("from tailcut import *", names)
    assert "TimeoutError" not in names and "WorkQueue" in names
    caught = []
    for error in (tailcut.TimeoutError("the library's"), builtins.TimeoutError("anyone's")):
        try:
            raise error
        except TimeoutError as e:  # the built-in catches both
            caught.append(e)
    assert caught[0].args == ("the library's",) and caught[1].args == ("anyone's",)


def test_arguments_of_the_wrong_type_are_type_errors_naming_the_argument(files, qname):
    cases = [
        (dict(num_epochs="2"), "num_epochs must be an int >= 0, got '2' (str)"),
        (dict(num_slices=True), "num_slices must be an int >= 0 or None, got True (bool)"),
        (dict(attach_timeout="soon"), "attach_timeout must be a number of seconds >= 0, or None "
                                      "(or float('inf')) to wait without a limit, got 'soon' "
                                      "(str)"),
        (dict(restore_state=5), "restore_state must be bytes, got 5 (int)"),
        (dict(on_notice=5), "on_notice must be callable or None, got 5 (int)"),
        (dict(bogus=1), "WorkQueue() got an unexpected keyword argument 'bogus'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(TypeError, match=exact(message)):
            tailcut.WorkQueue(files, name=qname, **kwargs)
    assert not os.path.exists(tailcut.segment_path(qname))


def test_out_of_range_queue_options_are_invalid_argument_errors(files, qname):
    cases = [
        (dict(num_epochs=-1), "num_epochs must be an int >= 0, got -1 (int)"),
        (dict(num_clients=0), f"queue '{qname}': num_clients is 0; it must be at least 1"),
        (dict(num_slices=0),
         f"queue '{qname}': num_slices is 0; pass None (one item per file) or >= 1"),
        (dict(max_clients=0), f"queue '{qname}': max_clients must be 1..4096"),
        (dict(attach_timeout=-1), "attach_timeout must be a number of seconds >= 0, or None (or "
                                  "float('inf')) to wait without a limit, got -1 (int)"),
        (dict(attach_timeout=float("nan")), "attach_timeout must be a number of seconds >= 0, or "
                                            "None (or float('inf')) to wait without a limit, "
                                            "got nan (float)"),
        (dict(attach_timeout=8 * 86400),
         f"queue '{qname}': attach_timeout is 691200000 ms; it must be 0..604800000 ms (7 days)"),
        (dict(lease_timeout=float("nan")),
         "lease_timeout must be a number of seconds >= 0 or None, got nan (float)"),
        (dict(restore_state={"seed": 1}),
         "restore_state: a dict must be what state_dict() returned (no 'state' key)"),
        (dict(format="csv"),
         "unknown record format 'csv' (expected fixed, lines, tfrecord, file or tar)"),
        (dict(format="fixed"),
         "record format 'fixed' needs record_bytes > 0 (the size of one record)"),
        (dict(format="lines", record_bytes=4),
         "record_bytes (4) is only allowed with record format 'fixed', not 'lines'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(tailcut.InvalidArgumentError, match=exact(message)):
            tailcut.WorkQueue(files, name=qname, **kwargs)
    empty = (f"queue '{qname}': works is empty; pass at least one file path (or num_samples "
             f"for a data set of samples by index)")
    with pytest.raises(tailcut.InvalidArgumentError, match=exact(empty)):
        tailcut.WorkQueue([], name=qname)
    assert not os.path.exists(tailcut.segment_path(qname))


def test_counts_kept_in_32_bits_are_refused_above_2_to_the_32(files, qname, notices):
    for key in ("num_clients", "max_clients", "leases_per_client"):
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact(f"{key} must be an int in [0, 4294967295], "
                                       f"got 4294967296 (int)")):
            tailcut.WorkQueue(files, name=qname, on_notice=notices.append, **{key: 2**32})


def test_bad_arguments_to_take_items_and_producers(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, shuffle=False, on_notice=notices.append) as q:
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("timeout must be a number of seconds >= 0, or None (or "
                                       "float('inf')) to wait without a limit, got -1 (int)")):
            q.take(timeout=-1)
        with pytest.raises(TypeError, match=exact(
                "timeout must be a number of seconds >= 0, or None (or float('inf')) to wait "
                "without a limit, got '1' (str)")):
            q.take(timeout="1")
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("capacity must be an int >= 1, got 0 (int)")):
            q.input_producer(capacity=0)
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("item_at: epoch or position out of range")):
            q.item_at(1, 0)
        item = q.take()
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("offset must be an int >= 0, got -1 (int)")):
            item.progress(-1)
        for past_end in (item.end + 500, 10**15, 2**64 - 1):
            with pytest.raises(tailcut.InvalidArgumentError, match=exact(
                    f"progress of item 0 (epoch 0, '{files[0]}' [0, {item.end})) of queue "
                    f"'{qname}' refused: the offset is outside the item's byte range "
                    f"(begin <= offset <= end); nothing was recorded")):
                item.progress(past_end)
        item.progress(item.end)
        item.ack()
        with pytest.raises(tailcut.InvalidArgumentError, match=exact(
                f"cannot report progress of item 0 (epoch 0, '{files[0]}' [0, {item.end})) of "
                f"queue '{qname}': it is already acked")):
            item.progress(item.end)
        while (item := q.take()) is not None:
            item.ack()


def test_bad_reader_options_name_the_option_and_the_fix(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, format="lines", on_notice=notices.append) as q:
        cases = [
            (dict(buffer_budget_bytes=0), "buffer_budget_bytes must be an int >= 1, got 0 (int)"),
            (dict(chunk_bytes=2 << 30), "reader: chunk_bytes (2147483648) must be at most 1 GiB"),
            (dict(buffer_budget_bytes=8192, chunk_bytes=4096),
             "reader: buffer_budget_bytes (8192) must hold at least 3 chunks of chunk_bytes "
             "(4096); raise the budget or lower chunk_bytes"),
            (dict(max_record_bytes=0), "max_record_bytes must be an int >= 1, got 0 (int)"),
            (dict(backend="spdk"), "backend 'spdk' is not 'uring', 'pread' or None"),
            (dict(format="tfrecord"),
             f"queue '{qname}' was opened with format 'lines', not 'tfrecord': every process "
             "must read a queue's items the same way; leave format out or open the queue with "
             "the format you read"),
        ]
        for kwargs, message in cases:
            with pytest.raises(tailcut.InvalidArgumentError, match=exact(message)):
                q.records(**kwargs)
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("batch_size must be an int >= 1, got 0 (int)")):
            q.batches(0)
        with pytest.raises(tailcut.InvalidArgumentError,
                           match=exact("max_records must be an int >= 1, got 0 (int)")):
            q.batches(1).read(0)
        with pytest.raises(TypeError,
                           match=exact("batches() got an unexpected keyword argument 'bogus'")):
            q.batches(10, bogus=1)
        # More address space than a process has: the arena cannot be mapped.
        with pytest.raises(tailcut.NoSpaceError, match=exact(
                "reader: cannot map 1024 TiB of chunk buffers: Cannot allocate memory; lower "
                "buffer_budget_bytes")):
            q.records(buffer_budget_bytes=1 << 50, chunk_bytes=1 << 30)
        # None of these took an item.
        assert q.summary()["handed_out"] == 0
        assert len(list(q.records())) == 200


def test_a_reassigned_item_raises_stale_item_error(files, qname, notices):
    # Two clients of one queue in this process: the holder stops making
    # progress, so after lease_timeout the taker gets its item.
    kwargs = dict(name=qname, shuffle=False, lease_timeout=0.2, on_notice=notices.append)
    with tailcut.WorkQueue(files, **kwargs) as holder, tailcut.WorkQueue(files, **kwargs) as taker:
        held = holder.take()
        for _ in range(3):
            taker.take().ack()
        again = taker.take(timeout=10)
        assert (again.index, again.epoch) == (held.index, held.epoch)
        with pytest.raises(tailcut.StaleItemError, match=exact(
                f"ack of item 0 (epoch 0, '{files[0]}' [0, {held.end})) of queue '{qname}' "
                "refused: the item was reassigned to another process after a lease timeout "
                "(its records may be read twice); stop reading it")):
            held.ack()
        assert held.state == "stale"
        again.ack()
        assert taker.summary()["stale_acks"] == 1


def test_a_closed_queue_refuses_every_call_naming_the_queue(files, qname, notices):
    q = tailcut.WorkQueue(files, name=qname, on_notice=notices.append)
    ds = q.input_dataset()
    q.close()
    closed = exact(f"queue '{qname}' is closed")
    for call in (q.take, lambda: next(ds), q.records, lambda: q.batches(10), q.state_dict,
                 q.summary, lambda: q.agree_step(0, 1, 0, True), q.input_producer):
        with pytest.raises(tailcut.InvalidArgumentError, match=closed):
            call()
    assert not os.path.exists(tailcut.segment_path(qname)), "removed though unfinished"


def test_a_take_that_waits_too_long_raises_empty_naming_the_queue(files, qname, notices):
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as holder, \
            tailcut.WorkQueue(files, name=qname, on_notice=notices.append) as waiter:
        held = [holder.take() for _ in range(4)]
        start = time.monotonic()
        with pytest.raises(tailcut.Empty, match=exact(
                f"queue '{qname}': no item within the timeout; other processes still hold open "
                "items, which come back if they die or give them back")):
            waiter.take(timeout=0.1)
        assert time.monotonic() - start < 5
        for item in held:
            item.ack()


def test_names_and_paths_with_unprintable_bytes_are_escaped_in_messages(files, tmp_path):
    # A non-ASCII name once gave an empty message, a NUL cut it short.
    suffix = "; use only ASCII letters, digits, '.', '_' and '-'"
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=exact("queue name 'café' contains 'é'" + suffix)):
        tailcut.WorkQueue(files, name="café")
    with pytest.raises(tailcut.InvalidArgumentError,
                       match=exact("queue name 'a\\x00b' contains '\\x00'" + suffix)):
        tailcut.WorkQueue(files, name="a\0b")
    # ELOOP is a bad path, not a permission problem.
    a, b = tmp_path / "loop-a", tmp_path / "loop-b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(tailcut.InvalidArgumentError, match="Too many levels of symbolic links"):
        tailcut.WorkQueue([str(a)], name="loop")


# Each phrase in which the libraries name a value as a C++ caller writes it
# ("unset", "on", "off"), and what Python says (bindings/errors.cc).
LIBRARY_TO_PYTHON = [
    ("queue 'q': num_slices is 0; leave it unset (one item per file) or give 1 or more",
     "queue 'q': num_slices is 0; pass None (one item per file) or >= 1"),
    ("num_slices differs: unset here, 4 in segment", "num_slices differs: None here, 4 in segment"),
    ("num_slices differs: 4 here, unset in segment", "num_slices differs: 4 here, None in segment"),
    ("shuffle differs: on here, off in segment", "shuffle differs: True here, False in segment"),
    ("shuffle differs: off here, on in segment", "shuffle differs: False here, True in segment"),
    ("seed differs: unset here, 7 in segment", "seed differs: None here, 7 in segment"),
    ("seed differs: 7 here, unset (drawn by the creator: 9) in segment",
     "seed differs: 7 here, None (drawn by the creator: 9) in segment"),
    ("reader: io_uring was asked for (backend 'uring') but is unavailable: x; use backend "
     "'pread', or leave the backend unset to fall back to pread threads",
     "reader: io_uring was asked for (backend 'uring') but is unavailable: x; use backend "
     "'pread', or pass backend=None to fall back to pread threads"),
    ("queue 'q' removed unfinished (1 of 4 items done): every process closed it; open it with "
     "keep_unfinished to resume it later",
     "queue 'q' removed unfinished (1 of 4 items done): every process closed it; open it with "
     "keep_unfinished=True to resume it later"),
]


@pytest.mark.parametrize("library, python", LIBRARY_TO_PYTHON)
def test_library_messages_are_worded_for_python(library, python):
    from tailcut import _core
    assert _core._python_wording(library) == python
    assert _core._python_wording(python) == python  # worded once, never twice


def test_words_in_names_and_other_messages_are_left_alone():
    from tailcut import _core
    for text in ("queue 'unset' does not exist (no /dev/shm/tailcut.0.unset)",
                 "file '/data/on/off/unset here' changed",
                 "works[0] differs: '/data/unset' here, '/data/on' in segment",
                 "reader: unset TAILCUT_IO to fall back to pread threads",
                 "num_epochs differs: 3 here, 2 in segment"):
        assert _core._python_wording(text) == text


@pytest.mark.parametrize("first, second, said", [
    (dict(shuffle=True), dict(shuffle=False), "shuffle differs: False here, True in segment"),
    (dict(num_slices=8), dict(num_slices=None), "num_slices differs: None here, 8 in segment"),
    (dict(seed=5), dict(seed=None), "seed differs: None here, 5 in segment"),
    (dict(seed=None), dict(seed=5), "seed differs: 5 here, None (drawn by the creator: "),
])
def test_a_configuration_mismatch_names_values_as_python_writes_them(
        files, qname, notices, first, second, said):
    with tailcut.WorkQueue(files, name=qname, on_notice=notices.append, **first):
        with pytest.raises(tailcut.ConfigMismatchError) as e:
            tailcut.WorkQueue(files, name=qname, on_notice=notices.append, **second)
    assert said in str(e.value), str(e.value)
    assert f"queue '{qname}' exists with a different configuration: " in str(e.value)
