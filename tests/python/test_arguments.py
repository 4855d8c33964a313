"""Every input checked, every error clear: files the tools read, user strings
with NUL and control characters, the ring's bad arguments, and the types of
the arguments of every public entry point (tailcut/_args.py).

The rows of docs/reliability.md ("Inputs") point here.
"""

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

import tailcut
from tailcut.pool import loader as pool_loader

_names = itertools.count()


def exact(message):
    return "^" + re.escape(message) + "$"


# ---- Files the tools read: the pool description --------------------------------------------


def _valid_spec(ring):
    """What PooledLoader._publish_spec writes, field for field."""
    return dict(
        version=1, ring=ring, slot_bytes=65536, num_slots=4, max_clients=64, poll=0.005,
        queue=dict(works=["/nonexistent/a.txt"], num_epochs=1, shuffle=False, seed=None,
                   prefix=None, num_slices=None, num_clients=1, name=f"{ring}-q"),
        format="lines", batch_size=8, tensors=False,
        callables=dict(collate_fn=None, transform=None, record_transform=None),
        cwd="/", sys_path=[], pid=1, written=0.0)


def _damaged(ring, form):
    """The bytes of a damaged description (None: a directory in its place)."""
    spec = _valid_spec(ring)
    if form == "directory":
        return None
    raw = {"not json": b"{slot_bytes: 4", "null": b"null", "a list": b"[1, 2]",
           "a number": b"42", "a string": b'"pool"', "binary": bytes(range(256)) * 4,
           "empty": b"", "blank": b"  \n", "deeply nested": b"[" * 100000 + b"]" * 100000}
    if form in raw:
        return raw[form]
    field, _, value = form.partition("=")
    target = spec
    if field.startswith("queue."):
        target, field = spec["queue"], field[len("queue."):]
    if form.startswith("no "):
        field = form[3:]
        target = spec["queue"] if field.startswith("queue.") else spec
        del target[field.removeprefix("queue.")]
    else:
        target[field] = json.loads(value)
    return json.dumps(spec).encode()


_FORMS = ["not json", "null", "a list", "a number", "a string", "binary", "empty", "blank",
          "deeply nested", "directory", "no version", "no queue", "no slot_bytes",
          "no callables", "no queue.name", "no queue.works", 'slot_bytes="4"', "slot_bytes=0",
          "slot_bytes=true", "num_slots=1.5", "num_slots=4294967296", "poll=-1", 'poll="x"',
          "batch_size=null", "tensors=1", "cwd=7", 'sys_path="/"', "sys_path=[1]",
          "queue=[]", 'queue.works="a.txt"', "queue.name=5", 'queue.name="a\\u0000b"',
          'queue.num_epochs="2"', "queue.shuffle=3", 'queue.lease_timeout="x"',
          "queue.bogus=1", 'callables={"transform": 5}',
          'callables={"transform": {"describe": "m.f"}}', 'format=["lines"]', "ring=null"]


@pytest.fixture
def ring_name():
    name = f"pytest-args-{os.getpid()}-{next(_names)}"
    yield name
    path = pool_loader.pool_spec_path(name)
    if os.path.isdir(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _write(path, data):
    if data is None:
        os.mkdir(path, 0o700)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _join(ring, *more):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "tailcut.pool", "--ring", ring, *more],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("form", _FORMS)
def test_a_damaged_pool_description_is_exit_1_naming_the_file_without_a_traceback(
        ring_name, form):
    path = pool_loader.pool_spec_path(ring_name)
    _write(path, _damaged(ring_name, form))
    run = _join(ring_name)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert f"pool description {path}" in run.stderr
    assert run.stderr.count("\n") == 1, run.stderr  # one line
    with pytest.raises(tailcut.CorruptError, match=re.escape(f"pool description {path}: ")):
        pool_loader.read_pool_spec(ring_name)
    # --list shows it as stale rather than failing.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    listed = subprocess.run([sys.executable, "-m", "tailcut.pool", "--list"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert re.search(rf"^{re.escape(ring_name)} +stale: pool description", listed.stdout, re.M)


@pytest.mark.parametrize("form, message", [
    ("empty", "it is empty"),
    ("null", "it holds a JSON null, not an object"),
    ("a list", "it holds a JSON array, not an object"),
    ("no queue.name", "it has no field 'queue.name'"),
    ('slot_bytes="4"', "field 'slot_bytes' must be an int >= 1, got '4' (str)"),
    ("num_slots=1.5", "field 'num_slots' must be an int in [1, 4294967295], got 1.5 (float)"),
    ('queue.name="a\\u0000b"', "field 'queue.name' 'a\\x00b' contains the control character "
                               "'\\x00'; remove it"),
    ("directory", None),
])
def test_a_damaged_pool_description_says_what_is_wrong_and_the_fix(ring_name, form, message):
    path = pool_loader.pool_spec_path(ring_name)
    _write(path, _damaged(ring_name, form))
    fix = (f"remove it (rm {path}) and restart the job's PooledLoader, whose local rank 0 "
           f"writes it again")
    if form == "directory":
        expected = f"pool description {path}: it is a directory; {fix}"
    else:
        expected = f"pool description {path}: {message}; {fix}"
    with pytest.raises(tailcut.CorruptError, match=exact(expected)):
        pool_loader.read_pool_spec(ring_name)


def test_a_valid_pool_description_passes_the_checks(ring_name):
    # The baseline the damaged forms start from: the checks pass it, and the
    # loader goes on to look for the job's ring.
    _write(pool_loader.pool_spec_path(ring_name), json.dumps(_valid_spec(ring_name)).encode())
    assert pool_loader.read_pool_spec(ring_name)["slot_bytes"] == 65536
    run = _join(ring_name)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"batch ring '{ring_name}' does not exist" in run.stderr


def test_a_symlinked_or_foreign_pool_description_is_refused_without_a_traceback(
        ring_name, tmp_path):
    path = pool_loader.pool_spec_path(ring_name)
    target = tmp_path / "spec.json"
    target.write_text(json.dumps(_valid_spec(ring_name)))
    os.symlink(target, path)
    run = _join(ring_name)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert (f"PermissionDeniedError: pool description {path} cannot be opened (it is a "
            f"symbolic link)") in run.stderr
    os.unlink(path)
    _write(path, json.dumps(_valid_spec(ring_name)).encode())
    os.chmod(path, 0o644)
    with pytest.raises(tailcut.PermissionDeniedError, match="is not a private file"):
        pool_loader.read_pool_spec(ring_name)


def test_a_missing_working_directory_of_the_job_is_exit_1_without_a_traceback(
        ring_name, tmp_path):
    # Past the description: the job's ring must be live for the loader to
    # reach its cwd, so a ring and a queue stand in for the job.
    data = tmp_path / "a.txt"
    data.write_bytes(b"x\n" * 100)
    spec = _valid_spec(ring_name)
    spec["queue"]["works"] = [str(data)]
    spec["cwd"] = str(tmp_path / "gone")
    _write(pool_loader.pool_spec_path(ring_name), json.dumps(spec).encode())
    with tailcut.WorkQueue(**spec["queue"]), \
            tailcut.BatchRing(ring_name, 65536, 4, "trainer", max_clients=64):
        try:
            run = _join(ring_name)
        finally:
            tailcut.remove_batch_ring(ring_name)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert (f"the job's working directory {str(tmp_path / 'gone')!r} (from "
            f"{pool_loader.pool_spec_path(ring_name)}): No such file or directory") in run.stderr


# ---- User strings: NUL refused, control characters shown escaped --------------------------


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"x\n" * 100)
    return str(path)


@pytest.fixture
def uniq():
    return f"pytest-args-{os.getpid()}-{next(_names)}"


def _queue(data_file, uniq, **kwargs):
    return lambda: tailcut.WorkQueue([data_file], name=uniq, **kwargs).close()


# (entry point, the call, exception, the whole message). The C++ library
# checks each where the value enters; these show it from Python.
_NUL_CASES = [
    ("WorkQueue name", lambda d, u: tailcut.WorkQueue([d], name="job\0x"),
     tailcut.InvalidArgumentError,
     "queue name 'job\\x00x' contains '\\x00'; use only ASCII letters, digits, '.', '_' and '-'"),
    ("WorkQueue works", lambda d, u: tailcut.WorkQueue([d + "\0.bak"], name=u),
     tailcut.InvalidArgumentError,
     "queue '{u}': work file '{d}\\x00.bak' (works[0]) contains a NUL byte; no file has such "
     "a name"),
    ("WorkQueue prefix", lambda d, u: tailcut.WorkQueue(["a.txt"], prefix="/tmp/\0", name=u),
     tailcut.InvalidArgumentError,
     "queue '{u}': prefix '/tmp/\\x00' contains a NUL byte; no path has one"),
    ("WorkQueue format", lambda d, u: tailcut.WorkQueue([d], format="lines\0", name=u),
     tailcut.InvalidArgumentError,
     "unknown record format 'lines\\x00' (expected fixed, lines, tfrecord, file or tar)"),
    ("WorkQueue coordinator",
     lambda d, u: tailcut.WorkQueue([d], coordinator="redis://127.0.0.1\0.evil:6379/0", name=u),
     tailcut.InvalidArgumentError,
     "coordinator URL 'redis://127.0.0.1\\x00.evil:6379/0': it contains the control "
     "character '\\x00'; remove it; expected redis://[user[:password]@]HOST:PORT/DB"),
    ("WorkQueue host_id",
     lambda d, u: tailcut.WorkQueue([d], coordinator="redis://127.0.0.1:1/0", host_id="h\0x",
                                    name=u),
     tailcut.InvalidArgumentError,
     "queue '{u}': the host id 'h\\x00x' from host_id may only hold letters, digits, '.', '_' "
     "and '-'; set host_id (TAILCUT_HOST_ID)"),
    ("inspect_queue", lambda d, u: tailcut.inspect_queue("q\0"), tailcut.InvalidArgumentError,
     "queue name 'q\\x00' contains '\\x00'; use only ASCII letters, digits, '.', '_' and '-'"),
    ("remove_queue", lambda d, u: tailcut.remove_queue("q\0"), tailcut.InvalidArgumentError,
     "queue name 'q\\x00' contains '\\x00'; use only ASCII letters, digits, '.', '_' and '-'"),
    ("segment_path", lambda d, u: tailcut.segment_path("q\0"), tailcut.InvalidArgumentError,
     "queue name 'q\\x00' contains '\\x00'; use only ASCII letters, digits, '.', '_' and '-'"),
    ("BatchRing name", lambda d, u: tailcut.BatchRing("r\0x", 4096, 2, "trainer"),
     tailcut.InvalidArgumentError,
     "batch ring name 'r\\x00x' contains '\\x00'; use only ASCII letters, digits, '.', '_' and "
     "'-'"),
    ("inspect_batch_ring", lambda d, u: tailcut.inspect_batch_ring("r\n"),
     tailcut.InvalidArgumentError,
     "batch ring name 'r\\x0a' contains '\\x0a'; use only ASCII letters, digits, '.', '_' and "
     "'-'"),
    ("remove_batch_ring", lambda d, u: tailcut.remove_batch_ring("r\0"),
     tailcut.InvalidArgumentError,
     "batch ring name 'r\\x00' contains '\\x00'; use only ASCII letters, digits, '.', '_' and "
     "'-'"),
    ("pool_spec_path", lambda d, u: pool_loader.pool_spec_path("r\n"), tailcut.InvalidArgumentError,
     "batch ring name 'r\\n': use only A-Z a-z 0-9 . _ -"),
]


@pytest.mark.parametrize("entry, call, error, message", _NUL_CASES,
                         ids=[c[0] for c in _NUL_CASES])
def test_a_nul_or_control_character_in_a_user_string_is_refused_and_shown_escaped(
        data_file, uniq, entry, call, error, message):
    with pytest.raises(error, match=exact(message.format(d=data_file, u=uniq))):
        call(data_file, uniq)
    assert not os.path.exists(tailcut.segment_path(uniq))


# Host ids become parts of shared-memory names, Redis keys and command lines: '', only dots, or
# a leading '-' would be a silent default, a directory or an option.
_HOST_ID_CASES = [
    ("WorkQueue host_id ..",
     lambda d, u: tailcut.WorkQueue([d], coordinator="redis://127.0.0.1:1/0", host_id="..",
                                    name=u),
     tailcut.InvalidArgumentError,
     "queue '{u}': the host id '..' from host_id may not be only dots or start with '-'; set "
     "host_id (TAILCUT_HOST_ID) to a name such as 'node-0'"),
    ("WorkQueue host_id -x",
     lambda d, u: tailcut.WorkQueue([d], coordinator="redis://127.0.0.1:1/0", host_id="-x",
                                    name=u),
     tailcut.InvalidArgumentError,
     "queue '{u}': the host id '-x' from host_id may not be only dots or start with '-'; set "
     "host_id (TAILCUT_HOST_ID) to a name such as 'node-0'"),
    ("WorkQueue host_id ''",
     lambda d, u: tailcut.WorkQueue([d], coordinator="redis://127.0.0.1:1/0", host_id="",
                                    name=u),
     tailcut.InvalidArgumentError,
     "host_id='' is empty: pass a name such as 'node-0', or None for TAILCUT_HOST_ID or the "
     "hostname"),
]


@pytest.mark.parametrize("entry, call, error, message", _HOST_ID_CASES,
                         ids=[c[0] for c in _HOST_ID_CASES])
def test_a_host_id_that_reads_as_a_path_an_option_or_nothing_is_refused(
        data_file, uniq, entry, call, error, message):
    with pytest.raises(error, match=exact(message.format(d=data_file, u=uniq))):
        call(data_file, uniq)
    assert not os.path.exists(tailcut.segment_path(uniq))


# ---- The ring's bad arguments: named with their limit ---------------------------------------


@pytest.fixture
def rings(uniq):
    loader = tailcut.BatchRing(uniq, 65536, 2, "loader")
    trainer = tailcut.BatchRing(uniq, 65536, 2, "trainer")
    yield loader, trainer
    loader.close()
    trainer.close()
    tailcut.remove_batch_ring(uniq)


def test_publish_of_more_than_slot_bytes_names_nbytes_and_the_limit(rings, uniq):
    loader, trainer = rings
    slot = loader.acquire(timeout=1)
    with pytest.raises(tailcut.InvalidArgumentError, match=exact(
            f"batch ring '{uniq}': publish: nbytes 70000 is more than the ring's slot_bytes "
            f"65536; make the batch smaller or open the ring with a larger slot_bytes")):
        loader.publish(slot, 0, 1, 70000)
    with pytest.raises(tailcut.InvalidArgumentError, match=exact(
            f"batch ring '{uniq}': publish: epoch must be below 2**64-1 (that value means "
            f"every epoch), got 18446744073709551615")):
        loader.publish(slot, 2**64 - 1, 1, 10)
    assert slot.open  # still the loader's: it can publish it right
    assert loader.publish(slot, 0, 1, 65536)
    batch = trainer.pop(timeout=1)
    assert len(batch.data) == 65536
    trainer.release(batch)


def test_a_batch_the_segment_says_is_larger_than_its_slot_is_a_corrupt_error(rings, uniq):
    # A hostile or damaged segment: the published size of a batch grown past
    # the slot after publish. Found by the epoch and records written just
    # before it in the slot's header (word, epoch, records, bytes, loader).
    import mmap
    import struct
    loader, trainer = rings
    epoch, records = 0x5A17C0DE5A17, 0x0BADC0FFEE0B
    slot = loader.acquire(timeout=1)
    assert loader.publish(slot, epoch, records, 10)
    with open(tailcut.inspect_batch_ring(uniq)["segment_path"], "r+b") as f, \
            mmap.mmap(f.fileno(), 0) as m:
        at = m.find(struct.pack("<QQQ", epoch, records, 10))
        assert at > 0 and m.find(struct.pack("<QQ", epoch, records), at + 1) == -1
        m[at + 16:at + 24] = struct.pack("<Q", 65537)
    # The status's name (RingStatusName) between the call and the fix.
    pattern = (re.escape(f"batch ring '{uniq}': pop refused: ") + "[a-z ]+" + re.escape(
        f" (the ring's shared memory holds values no process of it writes: stop the job, "
        f"remove the ring with `tailcut ring {uniq} --rm`, and start again)"))
    with pytest.raises(tailcut.CorruptError, match=f"^{pattern}$"):
        trainer.pop(timeout=1)


@pytest.mark.parametrize("call, role, needs", [
    ("acquire", "trainer", "loader"), ("publish", "trainer", "loader"),
    ("abandon", "trainer", "loader"), ("pop", "loader", "trainer"),
    ("release", "loader", "trainer")])
def test_a_ring_call_in_the_wrong_role_names_the_role(rings, uniq, call, role, needs):
    loader, trainer = rings
    ring = loader if role == "loader" else trainer
    slot = loader.acquire(timeout=1)
    loader.publish(slot, 0, 1, 1)
    batch = trainer.pop(timeout=1)
    args = {"acquire": (), "pop": (), "publish": (slot, 0, 1, 1), "abandon": (slot,),
            "release": (batch,)}[call]
    with pytest.raises(tailcut.InvalidArgumentError, match=exact(
            f"batch ring '{uniq}': {call} is for a {needs}, and this BatchRing was opened as a "
            f"{role}; open one with role='{needs}' for it")):
        getattr(ring, call)(*args)
    trainer.release(batch)


# ---- Argument types: one rule, one message shape, across the whole API ---------------------


def _rule_cases(entry, arg, rule, minimum=0, none_ok=False, numbers=True):
    """The bad values of a count or a number of seconds: (entry, arg, value,
    exception, message). A bool is not a count, a str not a number, a float
    not a count; below the minimum is out of range; None where not allowed."""
    count = rule.startswith("an int")
    cases = [(True, TypeError), ("2", TypeError), (minimum - 1, tailcut.InvalidArgumentError)]
    if count:
        cases.append((2.0, TypeError))
    if not none_ok:
        cases.append((None, TypeError))
    return [(entry, arg, value, error,
             f"{arg} must be {rule}, got {value!r} ({type(value).__name__})")
            for value, error in cases]


def _named(entry, cases):
    """The cases with the message prefixed by the entry's name."""
    return [(e, arg, value, error, f"{entry}: {message}")
            for e, arg, value, error, message in cases]


def _flag_cases(entry, arg):
    return [(entry, arg, value, TypeError,
             f"{arg} must be True or False, got {value!r} ({type(value).__name__})")
            for value in (1, "no", None)]


_SECONDS_OR_NONE = "a number of seconds >= 0 or None"
_WAIT = "a number of seconds >= 0, or None (or float('inf')) to wait without a limit"
_TYPE_CASES = (
    _rule_cases("WorkQueue", "num_epochs", "an int >= 0")
    + _rule_cases("WorkQueue", "num_clients", "an int in [0, 4294967295]")
    + _rule_cases("WorkQueue", "seed", "an int >= 0 or None", none_ok=True)
    + _rule_cases("WorkQueue", "num_slices", "an int >= 0 or None", none_ok=True)
    + _rule_cases("WorkQueue", "max_clients", "an int in [0, 4294967295]")
    + _rule_cases("WorkQueue", "leases_per_client", "an int in [0, 4294967295]")
    + _rule_cases("WorkQueue", "global_block_size", "an int >= 0")
    + _rule_cases("WorkQueue", "lease_timeout", _SECONDS_OR_NONE, none_ok=True)
    + _rule_cases("WorkQueue", "global_ttl", "a number of seconds >= 0")
    + _rule_cases("WorkQueue", "attach_timeout", _WAIT, none_ok=True)
    + _flag_cases("WorkQueue", "shuffle") + _flag_cases("WorkQueue", "keep_unfinished")
    + _flag_cases("WorkQueue", "auto_ack")
    + [("WorkQueue", key, 5, TypeError, f"{key} must be a str, got 5 (int)")
       for key in ("name", "format", "coordinator", "host_id")]
    + _rule_cases("take", "timeout", _WAIT, none_ok=True)
    + _rule_cases("agree_step", "step", "an int >= 0") + _flag_cases("agree_step", "has_batch")
    # records(): None is no default of interleave or shuffle_buffer (docs/python.md); it is
    # shuffle_seed's (the queue's seed) and queue_depth's (automatic).
    + _rule_cases("records", "interleave", "an int >= 1", minimum=1)
    + _rule_cases("records", "shuffle_buffer", "an int >= 0")
    + _rule_cases("records", "shuffle_seed", "an int >= 0 or None", none_ok=True)
    + _rule_cases("records", "queue_depth", "an int in [0, 4294967295] or None", none_ok=True)
    + _rule_cases("records", "prefetch_items", "an int in [0, 4294967295]")
    + _rule_cases("records", "pread_threads", "an int in [0, 4294967295]")
    # The reader keeps these in 32 bits: 2**32 is refused, not cut to 0.
    + [("records", key, 2**32, tailcut.InvalidArgumentError,
        f"{key} must be {rule}, got 4294967296 (int)")
       for key, rule in (("queue_depth", "an int in [0, 4294967295] or None"),
                         ("prefetch_items", "an int in [0, 4294967295]"),
                         ("pread_threads", "an int in [0, 4294967295]"))]
    + _flag_cases("records", "direct") + _flag_cases("records", "uring_async_buffered")
    + _flag_cases("records", "cuda_register")
    + _rule_cases("batches", "batch_size", "an int >= 1", minimum=1)
    + _flag_cases("batches", "copy") + _flag_cases("batches", "drop_last")
    + _flag_cases("batches", "short_at_end")
    + _rule_cases("BatchRing", "slot_bytes", "an int >= 1", minimum=1)
    + _rule_cases("BatchRing", "num_slots", "an int in [1, 4294967295]", minimum=1)
    + _rule_cases("BatchRing", "max_clients", "an int in [1, 4294967295]", minimum=1)
    + _rule_cases("BatchRing", "attach_timeout", "a number of seconds >= 0")
    + _flag_cases("BatchRing", "cuda_register")
    + [("BatchRing", "role", 1, TypeError, "role must be 'loader' or 'trainer', got 1 (int)"),
       ("BatchRing", "role", "reader", tailcut.InvalidArgumentError,
        "role must be 'loader' or 'trainer', got 'reader' (str)")]
    + _rule_cases("QueueDataset", "batch_size", "an int >= 1 or None", minimum=1, none_ok=True)
    + _rule_cases("QueueDataset", "shuffle_buffer", "an int >= 0")
    + _rule_cases("QueueDataset", "interleave", "an int >= 1", minimum=1)
    + _flag_cases("QueueDataset", "copy") + _flag_cases("QueueDataset", "drop_last")
    + _rule_cases("EqualSteps", "local_rank", "an int >= 0 or None", none_ok=True)
    + _rule_cases("EqualSteps", "local_world_size", "an int >= 1 or None", minimum=1,
                  none_ok=True)
    + _flag_cases("EqualSteps", "carry_over")
    # PooledLoader's messages name it: "PooledLoader: <the argument's rule>".
    + _named("PooledLoader",
             _rule_cases("PooledLoader", "num_workers", "an int >= 0")
             + _rule_cases("PooledLoader", "batch_size", "an int >= 1 or None", minimum=1,
                           none_ok=True)
             + _rule_cases("PooledLoader", "slot_bytes", "an int >= 1 or None", minimum=1,
                           none_ok=True)
             + _rule_cases("PooledLoader", "num_slots", "an int >= 1 or None", minimum=1,
                           none_ok=True)
             + _rule_cases("PooledLoader", "prefetch_factor", "an int >= 1", minimum=1,
                           none_ok=True)
             + _rule_cases("PooledLoader", "rank", "an int >= 0 or None", none_ok=True)
             + _rule_cases("PooledLoader", "world_size", "an int >= 1 or None", minimum=1,
                           none_ok=True)
             + _rule_cases("PooledLoader", "local_rank", "an int >= 0 or None", none_ok=True)
             + _rule_cases("PooledLoader", "local_world_size", "an int >= 1 or None",
                           minimum=1, none_ok=True)
             + _rule_cases("PooledLoader", "timeout", "a number of seconds >= 0 or None",
                           none_ok=True)
             + _flag_cases("PooledLoader", "carry_over") + _flag_cases("PooledLoader", "drop_last")
             + _flag_cases("PooledLoader", "pin_memory") + _flag_cases("PooledLoader", "zero_copy")
             + _flag_cases("PooledLoader", "persistent_workers"))
    + _rule_cases("run_loader", "batch_size", "an int >= 1 or None", minimum=1, none_ok=True)
    + _rule_cases("run_loader", "slot_bytes", "an int >= 1", minimum=1)
    + _rule_cases("run_loader", "poll", "a number of seconds >= 0")
    + _rule_cases("start_loaders", "num_workers", "an int >= 0")
    + _rule_cases("start_loaders", "num_slots", "an int >= 1", minimum=1)
)
# EqualSteps: timeout must be > 0 (a wait of 0 ends every step); PooledLoader's is
# DataLoader's, where 0 waits for ever.
_TYPE_CASES += [
    (entry, "timeout", value, error,
     f"timeout must be a number of seconds > 0 or None, got {value!r} ({type(value).__name__})")
    for entry in ("EqualSteps",)
    for value, error in ((True, TypeError), ("2", TypeError), (0, tailcut.InvalidArgumentError),
                         (-1.0, tailcut.InvalidArgumentError))]


@pytest.fixture(scope="module")
def torch_api():
    return pytest.importorskip("tailcut.torch")


def _call(entry, arg, value, data_file, uniq, tt):
    """Calls `entry` with arg=value and every other argument valid."""
    kw = {arg: value}
    if entry == "WorkQueue":
        if arg in ("host_id",):
            kw["coordinator"] = "redis://127.0.0.1:1/0"
        tailcut.WorkQueue([data_file], **{"name": uniq, **kw}).close()
        return
    if entry in ("take", "agree_step", "records", "batches"):
        with tailcut.WorkQueue([data_file], name=uniq, format="lines") as q:
            if entry == "take":
                q.take(**kw)
            elif entry == "agree_step":
                q.agree_step(**{"rank": 0, "ranks": 1, "step": 0, "has_batch": True, **kw})
            elif entry == "records":
                q.records(**kw)
            elif arg == "batch_size":
                q.batches(value)
            else:
                q.batches(8, **kw)
        return
    if entry == "BatchRing":
        args = dict(name=uniq, slot_bytes=4096, num_slots=2, role="trainer")
        if arg in args:
            args[arg] = value
            tailcut.BatchRing(**args).close()
        else:
            tailcut.BatchRing(**args, **kw).close()
        tailcut.remove_batch_ring(uniq)
        return
    if entry == "QueueDataset":
        tt.QueueDataset([data_file], **{"name": uniq, "format": "lines", **kw}).close()
        return
    with tt.QueueDataset([data_file], name=uniq, format="lines") as ds:
        if entry == "EqualSteps":
            tt.EqualSteps(ds, **kw)
        elif entry == "PooledLoader":
            tailcut.pool.PooledLoader(ds, **kw).close()
        elif entry == "run_loader":
            pool_loader.run_loader(ds, uniq, **{"slot_bytes": 4096, "num_slots": 2, **kw})
        elif entry == "start_loaders":
            args = {"slot_bytes": 4096, "num_slots": 2, **kw}
            num_workers = args.pop("num_workers", 1)
            pool_loader.start_loaders(ds, uniq, num_workers, **args)


@pytest.mark.parametrize("entry, arg, value, error, message", _TYPE_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]!r}" for c in _TYPE_CASES])
def test_every_entry_point_checks_its_arguments_with_one_message_shape(
        data_file, uniq, torch_api, entry, arg, value, error, message):
    with pytest.raises(error, match=exact(message)):
        _call(entry, arg, value, data_file, uniq, torch_api)
    assert not os.path.exists(tailcut.segment_path(uniq))
    assert not os.path.exists(pool_loader.pool_spec_path(uniq))


@pytest.mark.parametrize("value", [3, "numpy"])
def test_numpy_integers_and_int_subclasses_are_counts(data_file, uniq, value):
    np = pytest.importorskip("numpy")
    count = np.int64(3) if value == "numpy" else value
    with tailcut.WorkQueue([data_file], name=uniq, num_epochs=count, num_clients=np.uint8(1),
                           seed=np.int32(7)) as q:
        assert q.num_epochs == 3 and q.seed == 7
    from tailcut import _args
    assert _args.count("n", np.int16(4), minimum=1) == 4
    with pytest.raises(TypeError, match=exact("n must be an int >= 1, got True (bool_)")):
        _args.count("n", np.bool_(True), minimum=1)
