"""What the pooled-loader tests share: their data (16-byte records that carry their ids) and
transforms, in a module so that a loader started with `python3 -m tailcut.pool` can import them
by reference (the job's main script cannot be)."""

import os
import pathlib
import signal
import socket
import time

import numpy as np

RECORD = 16


def write_ids(path, n, first=0):
    """A fixed-format file of n RECORD-byte records; record i starts with first + i (u64)."""
    a = np.zeros((n, RECORD), np.uint8)
    a[:, :8] = np.arange(first, first + n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    a.tofile(path)
    return str(path)


def ids_of(batch):
    """The ids of a batch of such records (a numpy array of rows)."""
    return np.ascontiguousarray(batch[:, :8]).view(np.uint64).ravel().tolist()


class Slow:
    """Sleeps `seconds` per batch, so that a test can act while loaders are mid-epoch."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return batch


def identity(batch):
    return batch


def fork(fn):
    """Runs fn() in a forked child that exits 0 if it returned, 1 if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def wait_ok(pid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            assert os.waitstatus_to_exitcode(status) == 0, f"process {pid} failed"
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    import pytest
    pytest.fail(f"process {pid} did not finish in {timeout} s")


def tailcut_cli():
    """The tailcut command built beside the package under test (<build>/bin/tailcut, found from
    $PYTHONPATH); the test is skipped where it is not built."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        cli = os.path.join(os.path.dirname(os.path.abspath(entry)), "bin", "tailcut")
        if os.path.exists(cli):
            return cli
    import pytest
    pytest.skip("the tailcut command is not built beside the package")


def jsonl_lines(path):
    """The lines of a job's step log (_pooled_ckpt_train.py, _pooled_nodes_job.py), parsed.
    A SIGKILL may tear the last line a run wrote: a write that crosses a page of the file is
    two copies, and a fatal signal between them ends it short. The writers start each line
    with a newline, so a torn line stands alone; it is skipped here, only as the last line of
    its run (the next line is another run's, or there is none)."""
    import json
    lines, torn = [], None
    for text in pathlib.Path(path).read_text().splitlines():
        if not text:
            continue
        try:
            line = json.loads(text)
        except ValueError:
            assert torn is None, f"{path}: two torn lines in a row: {torn!r}, {text!r}"
            torn = text
            continue
        if torn is not None:
            assert not lines or line["run"] != lines[-1]["run"], \
                f"{path}: a torn line {torn!r} inside run {line['run']}"
            torn = None
        lines.append(line)
    return lines


def free_port():
    """A TCP port free now on the loopback: a torchrun rendezvous or an exporter of its own
    (torchrun --standalone always takes 29400, which another job of the host may hold)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
