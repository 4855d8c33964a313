"""Reading a pool description (tailcut.pool writes it; `python3 -m
tailcut.pool` and --list read it), with every field checked.

A file that is not what PooledLoader wrote (damaged, truncated, edited, of
another tailcut, a directory in its place) raises a tailcut.Error that names
the file and what to do -- never a KeyError, TypeError or JSONDecodeError from
deep inside the loader.
"""

import errno
import json
import os
import stat

import tailcut
from tailcut import _args

VERSION = 1
# A description holds paths and pickled callables: a few KiB, rarely more.
_MAX_BYTES = 64 << 20

# The WorkQueue keywords a description may carry (WorkQueue.open_args).
_QUEUE_KEYS = {"works", "num_epochs", "shuffle", "seed", "prefix", "num_slices", "num_clients",
               "name", "format", "record_bytes", "max_clients", "keep_unfinished", "auto_ack",
               "leases_per_client", "attach_timeout", "lease_timeout", "coordinator", "host_id",
               "global_ttl", "global_block_size", "num_samples", "samples_id", "min_split_bytes",
               "split_multiple"}
_QUEUE_COUNTS = {"num_samples": 1, "num_epochs": 1, "num_clients": 1, "max_clients": 1, "leases_per_client": 1,
                 "seed": 0, "num_slices": 1, "record_bytes": 1, "global_block_size": 0,
                 "min_split_bytes": 1, "split_multiple": 1}
_QUEUE_FLAGS = ("shuffle", "keep_unfinished", "auto_ack")
_QUEUE_SECONDS = ("attach_timeout", "lease_timeout", "global_ttl")
_QUEUE_TEXTS = ("format", "coordinator", "host_id", "samples_id")
_CALLABLES = ("collate_fn", "transform", "record_transform")


class _Damaged(Exception):
    pass


def read(path, ring_name):
    """The checked description at `path` (a dict). Raises NotFoundError when
    there is none, PermissionDeniedError unless it is a private file of this
    user (it may name code to run), ConfigMismatchError for another version,
    CorruptError when it is not a pool description."""
    fix = (f"remove it (rm {path}) and restart the job's PooledLoader, whose local rank 0 "
           f"writes it again")
    try:
        # O_NONBLOCK: a FIFO in its place must not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise tailcut.NotFoundError(
            f"no pool description for ring '{ring_name}' ({path}): is the job running, and has "
            f"its local rank 0 started iterating its PooledLoader (it writes the file then)? "
            f"`python3 -m tailcut.pool --list` lists the pools of this host") from None
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise tailcut.PermissionDeniedError(
            f"pool description {path} cannot be opened ({why}); {fix}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise tailcut.CorruptError(f"pool description {path}: it is {kind}; {fix}")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise tailcut.PermissionDeniedError(
                f"pool description {path} is not a private file of user {os.geteuid()} "
                f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): refusing to use it")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        if len(data) > _MAX_BYTES:
            raise _Damaged(f"it is larger than {_MAX_BYTES >> 20} MiB")
        if not data.strip():
            raise _Damaged("it is empty")
        try:
            spec = json.loads(data)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
            raise _Damaged(f"it is not JSON ({type(e).__name__}: {e})") from None
        if not isinstance(spec, dict):
            kind = {type(None): "null", list: "array", str: "string", bool: "true/false"}.get(
                type(spec), "number")
            raise _Damaged(f"it holds a JSON {kind}, not an object")
        if "version" not in spec:
            raise _Damaged("it has no field 'version'")
        if spec["version"] != VERSION:
            raise tailcut.ConfigMismatchError(
                f"pool description {path} has version {spec['version']!r}; this tailcut reads "
                f"version {VERSION} (use the same tailcut as the job)")
        _check(spec)
    except _Damaged as e:
        raise tailcut.CorruptError(f"pool description {path}: {e}; {fix}") from None
    return spec


def _field(spec, key, check, within=""):
    """check(name, value) on spec[key]; its TypeError/ValueError becomes _Damaged."""
    if key not in spec:
        raise _Damaged(f"it has no field '{within}{key}'")
    try:
        return check(f"field '{within}{key}'", spec[key])
    except (TypeError, ValueError) as e:
        raise _Damaged(str(e)) from None


def _check(spec):
    def str_list(name, value):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{name} must be a list of str, got {value!r:.80}")

    def path(name, value, allow_none=False):
        if not isinstance(value, str) and not (allow_none and value is None):
            raise TypeError(f"{name} must be a str, got {value!r:.80}")

    def str_dict(name, value):
        if not isinstance(value, dict):
            raise TypeError(f"{name} must be a JSON object, got {value!r:.80}")
        return value

    _field(spec, "ring", _args.text)
    _field(spec, "slot_bytes", lambda n, v: _args.count(n, v, minimum=1))
    _field(spec, "num_slots", lambda n, v: _args.count(n, v, minimum=1, maximum=2**32 - 1))
    _field(spec, "max_clients", lambda n, v: _args.count(n, v, minimum=1, maximum=2**32 - 1))
    _field(spec, "poll", _args.seconds)
    _field(spec, "format", lambda n, v: _args.text(n, v, allow_none=True))
    _field(spec, "batch_size", lambda n, v: _args.count(n, v, minimum=1))
    _field(spec, "tensors", _args.flag)
    _field(spec, "cwd", path)
    _field(spec, "sys_path", str_list)
    queue = _field(spec, "queue", str_dict)
    for key in queue:
        if key not in _QUEUE_KEYS:
            raise _Damaged(f"field 'queue' has the unknown key {key!r}")
    _field(queue, "name", _args.text, "queue.")
    if queue.get("num_samples") is None or queue.get("works") is not None:  # else an index work
        _field(queue, "works", str_list, "queue.")
    for key in set(queue) & set(_QUEUE_COUNTS):
        _field(queue, key,
               lambda n, v: _args.count(n, v, _QUEUE_COUNTS[key], allow_none=True), "queue.")
    for key in set(queue) & set(_QUEUE_FLAGS):
        _field(queue, key, _args.flag, "queue.")
    for key in set(queue) & set(_QUEUE_SECONDS):
        _field(queue, key, lambda n, v: _args.seconds(n, v, allow_none=True), "queue.")
    if "prefix" in queue:
        _field(queue, "prefix", lambda n, v: path(n, v, allow_none=True), "queue.")
    for key in set(queue) & set(_QUEUE_TEXTS):
        _field(queue, key, lambda n, v: _args.text(n, v, allow_none=True), "queue.")
    callables = _field(spec, "callables", str_dict)
    for key in _CALLABLES:
        ref = callables.get(key)
        if ref is None:
            continue
        if (not isinstance(ref, dict) or not isinstance(ref.get("describe"), str)
                or not isinstance(ref.get("error", ref.get("pickle")), str)):
            raise _Damaged(f"field 'callables' has a damaged entry for {key}")
