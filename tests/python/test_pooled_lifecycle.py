"""PooledLoader jobs under torchrun (c10d rendezvous) that live, fail and end cleanly: a rank
SIGKILLed (elastic restart), the whole job SIGKILLed and rerun, loaders that
raise, the only loader killed, a clean exit without close(). Each checks the
records trained, equal steps, that no process of the job is alive 3 s after
it ends, and that nothing of it is left in /dev/shm. The job is
tests/python/_pooled_job.py.
"""

import collections
import glob
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import tailcut
from tailcut.pool import loader as pool_loader

pytest.importorskip("torch", reason="tailcut.torch needs PyTorch (python3-torch)")

from _pool_helpers import free_port  # noqa: E402
from _torch_workers import write_records  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
RANKS = 2
BATCH = 16
NUM_SLOTS = 4
RECORDS = 1200


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    start = 0
    for i, n in enumerate([500, 400, 300]):
        write_records(d / f"part-{i}.bin", range(start, start + n))
        start += n
    assert start == RECORDS
    return d


@pytest.fixture
def out(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    yield d
    # A failed test leaves nothing running: kill what is left of its jobs' sessions.
    for job in Job.started:
        for pid in job.processes():
            os.kill(pid, signal.SIGKILL)
    Job.started.clear()


class Job:
    """One torchrun invocation (its own session, so that its processes can be found)."""

    started = []

    def __init__(self, data, out, epochs, *extra, restarts=0, run=0):
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TEST_RUN=str(run),
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        # The form docs/pooled.md uses: c10d without --rdzv_id, so the job's name must not
        # depend on the port (a rerun gets another). Not --standalone: its fixed port 29400
        # would collide with any other standalone job of the host.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--rdzv_backend", "c10d",
               "--rdzv_endpoint", f"localhost:{free_port()}", f"--nproc_per_node={RANKS}",
               "--redirects", "1", "--tee", "2",
               f"--max_restarts={restarts}", "--monitor_interval=0.2",
               str(HERE / "_pooled_job.py"), str(data), str(out), str(epochs), *extra]
        self.out, self.run = out, run
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        Job.started.append(self)
        self.log = ""
        self.exits = {}  # rank pid -> time.time() it was seen gone
        self._reader = threading.Thread(target=self._read)
        self._reader.start()

    def _read(self):
        watcher = threading.Thread(target=self._watch_ranks)
        watcher.start()
        self.log = self.proc.stdout.read()
        watcher.join()

    def _watch_ranks(self):
        while self.proc.poll() is None:
            for path in self.out.glob(f"pid-*-{self.run}.*"):
                text = path.read_text()
                if text and int(text) not in self.exits and not alive(int(text)):
                    self.exits[int(text)] = time.time()
            time.sleep(0.02)

    def wait(self, timeout=120):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self._reader.join()
            pytest.fail(f"the job did not end in {timeout} s:\n{self.log[-4000:]}")
        self.ended = time.monotonic()
        self._reader.join()
        return self.proc.returncode

    def processes(self):
        """Pids of the job's session still alive (zombies do not count)."""
        pids = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[3]) == self.proc.pid and fields[0] != "Z":
                pids.append(int(stat.split("/")[2]))
        return pids

    def pid(self, rank, attempt=0):
        path = self.out / f"pid-{rank}-{self.run}.{attempt}"
        return wait_for(lambda: path.exists() and path.read_text() and int(path.read_text()))

    def loaders(self, attempt=0):
        path = self.out / f"loaders-{self.run}.{attempt}"
        return wait_for(lambda: path.exists() and [int(p) for p in path.read_text().split()])

    def steps(self, rank, attempt=0):
        path = self.out / f"ids-{rank}-{self.run}.{attempt}"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def check_gone(self, queue_kept=False):
        """No process of the job alive 3 s after it ended, nothing of it in /dev/shm. With
        queue_kept, the queue of a job one of whose processes died is kept by design (a rerun
        resumes it): checked, then removed. queue_kept=None: it may be kept or not."""
        while self.processes() and time.monotonic() < self.ended + 3.0:
            time.sleep(0.05)
        assert self.processes() == [], f"alive 3 s after the job: {self.processes()}"
        left = shm_of(self.out)
        queues = [p for p in left if os.path.basename(p).startswith("tailcut.")]
        if queue_kept or (queue_kept is None and queues):  # None: whether one died is a race
            assert len(queues) == 1, left
            tailcut.remove_queue(os.path.basename(queues[0]).split(".", 2)[2], force=True)
            left.remove(queues[0])
        assert left == [], f"left in /dev/shm: {left}"

    def check_every_rank_stopped(self, since, raised_type, text):
        """Every rank raised `raised_type` with `text` within 2 s of `since`, or was stopped
        by torchrun once another rank had raised it (torchrun ends the others at once)."""
        first = None
        for rank in range(RANKS):
            path = self.out / f"raised-{rank}-{self.run}.0.json"
            if path.exists():
                raised = json.loads(path.read_text())
                assert raised["type"] == raised_type and text in raised["text"], raised
                print(f"rank {rank} raised {raised['time'] - since:.3f} s after the fault")
                late = raised["time"] - since
                assert late <= 2.0, f"rank {rank} raised {late:.2f} s after the fault"
                first = min(first or raised["time"], raised["time"])
            else:
                gone = self.exits[self.pid(rank)]
                print(f"rank {rank} stopped {gone - since:.3f} s after the fault")
                assert gone - since <= 2.0, f"rank {rank} ran {gone - since:.2f} s on"
        assert first is not None, "no rank raised"
        return raised


def wait_for(fn, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def shm_of(out):
    """What the job (every attempt and run) has in /dev/shm: queue, ring, descriptions."""
    names = {json.loads(p.read_text())["queue"] for p in out.glob("names-*")}
    assert names and all(n.startswith("torchrun-") for n in names), names
    job = next(iter(names)).rpartition("-")[0]
    return glob.glob(f"/dev/shm/*{job}-*")


def trained(out, tag):
    """{epoch: Counter(id)} and {rank: {epoch: steps}} of the ids files of runs/attempts `tag`."""
    by_epoch, steps = collections.defaultdict(collections.Counter), {}
    for path in out.glob(f"ids-*-{tag}"):
        rank = int(path.name.split("-")[1])
        steps[rank] = collections.Counter()
        text = path.read_text()
        for line in text[:text.rfind("\n") + 1].splitlines():  # not a line cut by SIGKILL
            epoch, *ids = line.split()
            by_epoch[int(epoch)].update(int(i) for i in ids)
            steps[rank][int(epoch)] += 1
    return by_epoch, steps


def check_complete_run(out, tag, epochs):
    """Every record once per epoch (carried over, so counted over all epochs), apart from
    the last epoch's leftovers, which are reported; equal steps at every rank."""
    by_epoch, steps = trained(out, tag)
    assert len(steps) == RANKS
    assert len({tuple(sorted(s.items())) for s in steps.values()}) == 1, f"unequal {steps}"
    total = collections.Counter()
    for c in by_epoch.values():
        total.update(c)
    assert max(total.values()) <= epochs, "a record trained on more often than once per epoch"
    dropped = 0
    for path in out.glob(f"done-*-{tag}.json"):
        reports = json.loads(path.read_text())["reports"]
        assert all(r["dropped_records"] == 0 for r in reports[:-1])  # carried over
        dropped += reports[-1]["dropped_records"]
    missing = sum(epochs - total[i] for i in range(RECORDS))
    assert missing == dropped, (missing, dropped)
    assert dropped < RANKS * BATCH * (NUM_SLOTS + 1)


def test_clean_exit_without_close_leaves_nothing(data, out):
    job = Job(data, out, 2, "--no-close")
    assert job.wait() == 0, job.log[-4000:]
    check_complete_run(out, "0.0", 2)
    assert "not writable" not in job.log  # read-only batches, without torch's warning
    job.check_gone()


def test_an_autoscaled_pool_under_torchrun_adds_loaders_and_trains_every_record(data, out,
                                                                                monkeypatch):
    # 20 ms per batch in one loader starves two ranks: local rank 0 adds loaders (up to 3),
    # the other rank starts none; every record once per epoch, nothing left behind.
    monkeypatch.setenv("TAILCUT_LOADER_CPUS", "3")  # sleeping loaders: past 2 CPUs less 2 ranks
    job = Job(data, out, 2, "--workers", "1:3", "--slow", "0.02")
    assert job.wait() == 0, job.log[-4000:]
    check_complete_run(out, "0.0", 2)
    started = {path.name: json.loads(path.read_text())["loaders"]
               for path in out.glob("done-*-0.0.json")}
    assert started["done-1-0.0.json"] == 0 and 1 < started["done-0-0.0.json"] <= 3, started
    # Every rank of the starved job sees its data wait in metrics().
    for path in out.glob("done-*-0.0.json"):
        m = json.loads(path.read_text())["metrics"]
        assert m["steps"] > 0 and m["samples_per_s"] > 0, (path.name, m)
        assert m["data_wait_p99_s"] >= m["data_wait_mean_s"] > 0, (path.name, m)
    job.check_gone()


def test_loaders_that_raise_reach_every_rank(data, out):
    job = Job(data, out, 1, "--fail-after", "3")
    assert job.wait() != 0
    failed = min(float(p.read_text()) for p in out.glob("failed-*"))
    raised = job.check_every_rank_stopped(failed, "ValueError", "transform: bad batch 4 in loader")
    assert "of batch ring" in raised["traceback"] and "in __call__" in raised["traceback"], (
        f"the loader's traceback is not the cause: {raised['traceback']}")
    job.check_gone(queue_kept=True)


def test_loaders_that_raise_leave_nothing_when_torchrun_ends_their_rank_first(data, out):
    # Local rank 0 started the loaders and removes the pool at its exit, but torchrun ends it
    # as soon as the other rank raised (here: 3 s before rank 0 would leave). The failed
    # loaders, which stay until then, see their parent gone and remove it.
    job = Job(data, out, 1, "--fail-after", "3", "--slow-exit", "3")
    assert job.wait() != 0
    failed = min(float(p.read_text()) for p in out.glob("failed-*"))
    job.check_every_rank_stopped(failed, "ValueError", "transform: bad batch 4 in loader")
    job.check_gone(queue_kept=True)


def test_a_loader_started_from_another_shell_that_raises_reaches_every_rank(data, out):
    # No loader of the job's own: one `python3 -m tailcut.pool` whose transform raises.
    job = Job(data, out, 1, "--workers", "0")
    ring = wait_for(lambda: (out / "names-0-0.0").exists()
                    and json.loads((out / "names-0-0.0").read_text())["ring"])
    wait_for(lambda: os.path.exists(pool_loader.pool_spec_path(ring)))
    env = dict(os.environ, TEST_OUT_DIR=str(out))
    loader = subprocess.run(
        [sys.executable, "-m", "tailcut.pool", "--ring", ring, "-q", "--transform",
         f"{HERE / '_pooled_job.py'}:failing_transform"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert loader.returncode == 1, loader.stdout
    assert "every rank raises this" in loader.stdout, loader.stdout
    assert job.wait() != 0
    failed = min(float(p.read_text()) for p in out.glob("failed-*"))
    raised = job.check_every_rank_stopped(failed, "ValueError", "transform: bad batch 4 in loader")
    assert "of batch ring" in raised["traceback"] and "in failing_transform" in raised["traceback"], (
        f"the loader's traceback is not the cause: {raised['traceback']}")
    job.check_gone(queue_kept=None)


def test_the_only_loader_killed_reaches_every_rank(data, out):
    job = Job(data, out, 1, "--workers", "1", "--slow", "0.02")
    [loader] = job.loaders()
    wait_for(lambda: job.steps(0) >= 3)
    os.kill(loader, signal.SIGKILL)
    killed = time.time()
    assert job.wait() != 0
    job.check_every_rank_stopped(killed, "Error", "has no live loader process")
    job.check_gone(queue_kept=True)


def test_sigkill_of_one_rank_restarts_cleanly(data, out):
    job = Job(data, out, 2, "--slow", "0.01", restarts=1)
    old_loaders = job.loaders()
    victim = job.pid(1)
    at = random.randrange(1, 30)
    wait_for(lambda: job.steps(1) >= at or job.proc.poll() is not None)
    os.kill(victim, signal.SIGKILL)
    assert job.wait() == 0, job.log[-4000:]
    assert (out / "done-0-0.1.json").exists(), "no restart happened"
    check_complete_run(out, "0.1", 2)  # the restart's fresh queue, read from the start
    assert not any(alive(p) for p in old_loaders)
    job.check_gone()


def test_sigkill_of_the_whole_job_then_rerun(data, out):
    job = Job(data, out, 1, "--slow", "0.01")
    loaders = job.loaders()
    ranks = [job.pid(r) for r in range(RANKS)]
    at = random.randrange(1, 20)
    wait_for(lambda: job.steps(0) >= at)
    for pid in [job.proc.pid] + ranks:  # torchrun and the ranks; the loaders are orphaned
        os.kill(pid, signal.SIGKILL)
    job.wait()
    # The orphaned loaders leave within 2 s and remove the ring no trainer uses.
    deadline = time.monotonic() + 3.0
    while any(alive(p) for p in loaders) and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"orphaned loaders gone {time.monotonic() - job.ended:.3f} s after the job")
    assert not any(alive(p) for p in loaders)
    rings = [json.loads(p.read_text())["ring"] for p in out.glob("names-*")]
    assert not any(os.path.exists(f"/dev/shm/tailcut-ring.{os.geteuid()}.{r}") for r in rings)
    before, _ = trained(out, "0.0")
    rerun = Job(data, out, 1, "--slow", "0.01", run=1)
    assert rerun.wait() == 0, rerun.log[-4000:]
    after, _ = trained(out, "1.0")
    # Without a checkpoint a rerun starts over (a fresh model must see every record: see
    # "Restarts and checkpoints" in docs/pooled.md), so its own epoch is every record once:
    # none of the dead run's batches (fenced: never popped), none twice, none lost but the
    # last epoch's reported leftover (an odd number of batches for 2 ranks leaves one).
    twice = sum(c - 1 for c in after[0].values() if c > 1)
    lost = RECORDS - len(after[0])
    print(f"killed after {at} steps: {sum(before[0].values())} records trained, then "
          f"{sum(after[0].values())} in the rerun; {twice} twice, {lost} never in the rerun")
    check_complete_run(out, "1.0", 1)
    rerun.check_gone()
