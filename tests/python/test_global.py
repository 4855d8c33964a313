"""WorkQueue across hosts from Python: simulated hosts (a host_id each) of forked processes,
a redis-server of the test's own on 127.0.0.1. Every line of the data must be read exactly
once per epoch across all hosts, with the coordinator given as a keyword or through
TAILCUT_COORDINATOR, and a checkpoint of the job must restore into the rest of it."""

import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import tailcut

from _pool_helpers import tailcut_cli

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")


@pytest.fixture
def redis_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="tailcut-redis-")
    proc = subprocess.Popen(
        [REDIS, "--bind", "127.0.0.1", "--port", str(port), "--dir", workdir, "--save", "",
         "--appendonly", "yes", "--logfile", os.path.join(workdir, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.01)
    yield f"redis://127.0.0.1:{port}/0"
    proc.kill()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def data(tmp_path):
    """Four files of numbered lines; returns (paths, number of lines)."""
    paths, n = [], 0
    for f in range(4):
        path = tmp_path / f"part-{f}.txt"
        with open(path, "wb") as out:
            for _ in range(500 + 100 * f):
                out.write(b"%08d\n" % n)
                n += 1
        paths.append(str(path))
    return paths, n


def _read_all(paths, name, host, url, epochs, out, use_env, opened=None):
    if use_env:
        os.environ["TAILCUT_COORDINATOR"] = url
        os.environ["TAILCUT_HOST_ID"] = host
        kwargs = {}
    else:
        kwargs = {"coordinator": url, "host_id": host}
    q = tailcut.WorkQueue(paths, num_epochs=epochs, num_slices=40, num_clients=2, name=name,
                          format="lines", global_ttl=3, global_block_size=2,
                          on_notice=lambda line: None, **kwargs)
    if opened is not None:
        # Every host's feeder claims blocks as its queue opens: without this a
        # host that starts late (a loaded machine) may find the job done.
        opened.wait(60)
    seen = [bytes(r) for r in q.records()]
    q.close()
    out.put((host, seen))


def test_two_hosts_of_two_processes_read_every_line_once_per_epoch(redis_url, data, qname):
    paths, n = data
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    opened = ctx.Barrier(4)
    procs = [ctx.Process(target=_read_all,
                         args=(paths, qname, host, redis_url, 2, out, host == "b", opened))
             for host in ("a", "a", "b", "b")]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    counts = {}
    per_host = {"a": 0, "b": 0}
    for host, seen in results:
        per_host[host] += len(seen)
        for line in seen:
            counts[line] = counts.get(line, 0) + 1
    assert len(counts) == n
    assert set(counts.values()) == {2}, "every line once in each of the 2 epochs"
    assert per_host["a"] > 0 and per_host["b"] > 0
    for host in ("a", "b"):
        assert not os.path.exists(tailcut.segment_path(f"{qname}.{host}"))


def test_a_checkpoint_of_the_job_restores_into_the_rest_of_it(redis_url, data, qname):
    paths, n = data
    args = dict(num_slices=40, coordinator=redis_url, host_id="a", format="lines",
                global_ttl=3, global_block_size=2, on_notice=lambda line: None)
    first = []
    with tailcut.WorkQueue(paths, name=qname, **args) as q:
        for _ in range(10):
            with q.take() as item:
                first.append(item.index)
        time.sleep(1.0)  # the host's feeder acks finished items to Redis every 20 ms
        state = q.state_dict()
    assert state["state"].startswith(b"tailcut-global-state")
    rest = []
    with tailcut.WorkQueue(paths, name=qname + "-restored", restore_state=state, **args) as q:
        while (item := q.take()) is not None:
            with item:
                rest.append(item.index)
    assert sorted(first + rest) == list(range(40)), "every item once, before or after the save"


def _lost_message(url, name):
    return (f"the coordinator {url} lost job '{name}' (its keys are gone: Redis restarted "
            "without persistence, or they were deleted); restart the job from a checkpoint "
            "(restore_state), and enable appendonly on that Redis; to start it over from the "
            f"beginning instead, delete the key tailcut:{{{name}}}:lost there")


def _use_until_lost(paths, name, host, url, how, out, opened):
    """Takes items (`how`: take, producer) or reads records, with no timeout, until the job
    ends or is lost."""
    q = tailcut.WorkQueue(paths, num_epochs=20, num_slices=40, num_clients=2, name=name,
                          format="lines", coordinator=url, host_id=host, global_ttl=3,
                          global_block_size=2, on_notice=lambda line: None)
    opened.wait(60)
    try:
        if how == "records":
            for _ in q.records():
                time.sleep(0.0005)
        elif how == "producer":
            producer = q.input_producer()
            while (item := producer.get()) is not None:
                with item:
                    time.sleep(0.02)
        else:
            while (item := q.take()) is not None:
                with item:
                    time.sleep(0.02)
        out.put((host, "ended", time.monotonic()))
    except tailcut.CorruptError as e:
        out.put((host, str(e), time.monotonic()))
    finally:
        q.close()


def test_a_flushed_redis_makes_every_process_raise_that_the_job_is_lost(redis_url, data, qname):
    paths, _ = data
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    opened = ctx.Barrier(5)
    # Host a takes items (take(), input_producer()), host b reads records (the Reader's path).
    procs = [ctx.Process(target=_use_until_lost,
                         args=(paths, qname, host, redis_url, how, out, opened))
             for host, how in (("a", "take"), ("a", "producer"), ("b", "records"),
                               ("b", "records"))]
    for p in procs:
        p.start()
    try:
        opened.wait(60)
        time.sleep(1.0)
        port = redis_url.rsplit(":", 1)[1].split("/")[0]
        subprocess.run(["redis-cli", "-p", port, "FLUSHALL"], check=True, capture_output=True)
        flushed = time.monotonic()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    expected = _lost_message(redis_url, qname)
    for host, said, when in results:
        assert said == expected, host
        # The bound: the host's feeder asks Redis at least every global_ttl / 3
        # (renewals), at once when its takers run dry.
        assert when - flushed < 3 * 3, f"host {host} learnt of the loss {when - flushed:.1f} s late"
    for host in ("a", "b"):
        assert not os.path.exists(tailcut.segment_path(f"{qname}.{host}"))
    # A host opening the job afterwards is refused with the same words.
    with pytest.raises(tailcut.CorruptError) as raised:
        tailcut.WorkQueue(paths, num_epochs=20, num_slices=40, name=qname, format="lines",
                          coordinator=redis_url, host_id="c", global_block_size=2,
                          on_notice=lambda line: None)
    assert str(raised.value) == expected
    assert not os.path.exists(tailcut.segment_path(f"{qname}.c"))


def test_notices_of_the_tier_say_tailcut_once(redis_url, data, qname):
    paths, _ = data
    program = ("import sys, tailcut\n"
               "q = tailcut.WorkQueue(sys.argv[2:], name=sys.argv[1], format='lines',\n"
               "                      coordinator=%r, host_id='h1')\n"
               "q.close()\n" % redis_url)
    run = subprocess.run([sys.executable, "-c", program, qname, *paths], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines()[0] == (
        f"tailcut: global job '{qname}' created on {redis_url} as host h1")
    assert "tailcut: tailcut:" not in run.stderr


def test_top_with_a_coordinator_shows_the_job_across_hosts(redis_url, data, qname):
    paths, n = data
    with tailcut.WorkQueue(paths, name=qname, num_slices=40, coordinator=redis_url,
                           host_id="trainer-7", format="lines", global_block_size=4,
                           on_notice=lambda line: None) as q:
        for _ in range(5):
            with q.take():
                pass
        time.sleep(0.5)  # the host's feeder acks finished items every 20 ms
        out = subprocess.run([tailcut_cli(), "top", "--coordinator", redis_url, qname, "--once"],
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"job {qname} on {redis_url}" in out.stdout
    assert "done 5/40" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("trainer-7"))
    claims, reowned, acked = row.split()[1:4]
    assert int(claims) >= 2 and reowned == "0" and acked == "5"
    missing = subprocess.run([tailcut_cli(), "top", "--coordinator", redis_url, qname + "-none",
                              "--once"], capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0
    assert missing.stderr.startswith(f"tailcut: no job '{qname}-none' on {redis_url}")
