"""The pool's description, for loaders that join from elsewhere: local rank 0
writes it when it starts its loaders (write), `python3 -m tailcut.pool` reads
it (read_pool_spec, every field checked by tailcut.pool._spec), and the
process that wrote it removes it at the end (remove)."""

import base64
import json
import os
import pickle
import re
import sys
import time

import tailcut
from tailcut import _private_files
import tailcut.pool._spec as _spec

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


def pool_spec_path(ring_name):
    """Where a pool's description lives while its job runs:
    /dev/shm/tailcut-pool.<euid>.<ring name>.json, beside the ring's segment
    (every process that can open the ring sees the same /dev/shm)."""
    if not isinstance(ring_name, str) or not _NAME_RE.fullmatch(ring_name):
        raise tailcut.InvalidArgumentError(
            f"batch ring name {ring_name!r}: use only A-Z a-z 0-9 . _ -")
    return f"/dev/shm/tailcut-pool.{os.geteuid()}.{ring_name}.json"


def _callable_ref(fn):
    """How another process gets `fn`: a pickle (a module-level function or
    class, or an instance of one) or, when there is none, why not."""
    if fn is None:
        return None
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    ref = dict(describe=f"{module}.{qualname}")
    if module == "__main__":
        ref["error"] = "is defined in the job's main script, which another process cannot import"
        return ref
    try:
        ref["pickle"] = base64.b64encode(pickle.dumps(fn)).decode("ascii")
    except Exception as e:  # lambdas, closures, objects holding them
        ref["error"] = f"cannot be pickled ({type(e).__name__}: {e})"
    return ref


def write(ring_name, queue, recipe, slot_bytes, num_slots, max_clients, poll):
    """Writes the pool's description (mode 0600, replaced atomically); returns its path."""
    path = pool_spec_path(ring_name)
    args = {k: v for k, v in queue.open_args.items() if k not in ("on_notice", "restore_state")}
    if args.get("prefix") is not None:
        args["prefix"] = os.fsdecode(args["prefix"])
    spec = dict(
        version=_spec.VERSION, ring=ring_name, slot_bytes=slot_bytes, num_slots=num_slots,
        max_clients=max_clients, poll=poll, queue=args, format=queue.format,
        batch_size=recipe.batch_size, tensors=recipe.tensors,
        callables={k: _callable_ref(getattr(recipe, k))
                   for k in ("collate_fn", "transform", "record_transform")},
        cwd=os.getcwd(), sys_path=[p for p in sys.path if isinstance(p, str)],
        pid=os.getpid(), written=time.time())
    write_json(path, spec, "pool description", default=os.fspath)  # a PathLike option; anything else raises
    return path


# What to do when /dev/shm is full as a pool writes one of its files.
NO_SPACE_FIX = ("free space in /dev/shm (`tailcut clean` removes what stopped jobs left there) "
                "or use fewer or smaller batch slots (num_slots, slot_bytes)")


def write_json(path, content, what, default=None):
    """Replaces the file at `path` by `content` as JSON, mode 0600, at once:
    readers see the old file or the new one, never a part (a private
    temporary file renamed over it: tailcut._private_files). Raises
    PermissionDeniedError when another user's file, a FIFO or a link is at
    `path`, NoSpaceError when /dev/shm is full."""
    data = json.dumps(content, default=default).encode("utf-8")
    _private_files.write(path, data, what, NO_SPACE_FIX)


def read_pool_spec(ring_name):
    """The description of the pool of ring `ring_name` (a dict), written by
    the job's PooledLoader, every field checked (tailcut/pool/_spec.py).
    Raises NotFoundError when there is none, PermissionDeniedError unless the
    file is this user's and private to it (it may name code to run),
    CorruptError when it is not a pool description."""
    return _spec.read(pool_spec_path(ring_name), ring_name)


def remove(ring_name, writer_pid):
    """Removes the description, in the process that wrote it only (a forked
    child that exits normally must not remove its parent's)."""
    if os.getpid() != writer_pid:
        return
    _private_files.remove(pool_spec_path(ring_name))

