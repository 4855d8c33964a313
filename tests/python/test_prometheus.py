"""tailcut.prometheus: one scrape covers the host's queues and batch rings, with job, ring,
host, role and pid labels; during a pooled job the rank's batches and data wait and the
loaders' batches move between scrapes and agree with what the ring itself says."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import tailcut

parser = pytest.importorskip("prometheus_client.parser")
torch = pytest.importorskip("torch")
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, free_port, ids_of, tailcut_cli, write_ids  # noqa: E402


def start_exporter(port):
    env = dict(os.environ, TAILCUT_HOST_ID="node-7")
    proc = subprocess.Popen([sys.executable, "-m", "tailcut.prometheus", "--port", str(port),
                             "--address", "127.0.0.1"], env=env, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stderr.readline()
    assert "serving http://127.0.0.1:" in line, line
    return proc


def scrape(port):
    """{(name, frozenset(labels.items())): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def top_json(queue, ring):
    r = subprocess.run([tailcut_cli(), "top", queue, "--ring", ring, "--once", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def value(samples, name, **labels):
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_a_scrape_during_a_pooled_job_sees_the_rank_and_its_loaders_move(rname, tmp_path,
                                                                        monkeypatch):
    n = 3000
    path = write_ids(tmp_path / "ids.bin", n)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset([path], name=rname, format="fixed", record_bytes=RECORD, num_clients=1,
                         num_slices=60)
    loader = tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0, timeout=60, loaders_per_host=2,
                             batch_size=20, transform=Slow(0.01), slot_bytes=1 << 14,
                             num_slots=4)
    port = free_port()
    exporter = start_exporter(port)
    me = str(os.getpid())
    scrapes, ids = [], []
    try:
        for step, batch in enumerate(loader):
            if step in (10, 60):
                scrapes.append(scrape(port))
                ring = tailcut.inspect_batch_ring(loader.name)  # read after the scrape
                mine = [c for c in ring["clients"] if str(c["pid"]) == me][0]
                popped = value(scrapes[-1], "tailcut_ring_client_batches_total",
                               ring=loader.name, role="trainer", pid=me, host="node-7")
                assert popped <= mine["popped"] and popped >= step, (popped, mine, step)
                published = value(scrapes[-1], "tailcut_ring_batches_published_total",
                                  ring=loader.name)
                assert published <= ring["published"]
                # tailcut top --once --json, read after the scrape, agrees.
                top = top_json(ds.queue.name, loader.name)
                assert top["ring"]["published"] >= published
                row = [c for c in top["ring"]["clients"] if str(c["pid"]) == me][0]
                assert row["role"] == "trainer" and row["batches"] >= popped, (row, popped)
                assert top["queue"]["ranks"] == 1 and top["queue"]["loaders"] == 2, top["queue"]
                assert top["queue"]["num_samples"] == 0
                assert isinstance(top["ring"]["verdict"]["input_bound"], bool)
            ids += ids_of(batch.numpy())
        assert sorted(ids) == list(range(n))
        first, second = scrapes
        for name in ("tailcut_ring_client_batches_total", "tailcut_ring_client_wait_seconds_total"):
            a = value(first, name, ring=loader.name, role="trainer", pid=me)
            b = value(second, name, ring=loader.name, role="trainer", pid=me)
            assert b >= a, name
        assert (value(second, "tailcut_ring_client_batches_total", ring=loader.name,
                      role="trainer", pid=me)
                > value(first, "tailcut_ring_client_batches_total", ring=loader.name,
                        role="trainer", pid=me))
        loader_pids = {str(p.pid) for p in loader.loaders}
        published = {dict(ls)["pid"]: v for (n_, ls), v in second.items()
                     if n_ == "tailcut_ring_client_batches_total"
                     and dict(ls).get("role") == "loader" and dict(ls)["ring"] == loader.name}
        assert set(published) == loader_pids and sum(published.values()) > 0, published
        job = ds.queue.name
        assert (value(second, "tailcut_queue_done", job=job)
                >= value(first, "tailcut_queue_done", job=job))
        assert value(second, "tailcut_queue_total", job=job) == ds.queue.num_items
        assert value(second, "tailcut_ring_slots", ring=loader.name, state="free") >= 0
    finally:
        exporter.terminate()
        exporter.wait(10)
        loader.close()
        ds.close()


def test_the_exporter_says_what_is_wrong_with_a_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "tailcut.prometheus", "--port", str(port),
                            "--address", "127.0.0.1"], capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "pick another --port" in r.stderr
