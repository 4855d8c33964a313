"""PooledLoader.metrics(): the rank's data wait per window as a flat dict of floats, high when
the loaders are the bottleneck and low when the step is; the ring and loaders beside it."""

import time

import pytest

torch = pytest.importorskip("torch")
import tailcut  # noqa: E402
import tailcut.torch as tt  # noqa: E402
import tailcut.pool  # noqa: E402

from _pool_helpers import RECORD, Slow, ids_of, write_ids  # noqa: E402

KEYS = {"steps", "window_s", "data_wait_mean_s", "data_wait_p99_s", "data_wait_max_s",
        "data_wait_share", "batches_per_s", "samples_per_s", "loaders", "ring_ready",
        "ring_slots", "ring_fill", "loader_wait_share", "weight", "leftover_records",
        "carried_out", "dropped_records"}


def one_rank(path, name, monkeypatch, transform):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = tt.QueueDataset([path], name=name, format="fixed", record_bytes=RECORD, num_clients=1,
                         num_slices=40)
    loader = tailcut.pool.PooledLoader(ds, rank=0, world_size=1, local_rank=0, timeout=60, num_workers=1,
                             batch_size=20, transform=transform, slot_bytes=1 << 14,
                             num_slots=4)
    return ds, loader


@pytest.mark.parametrize("bound", ["input", "step"])
def test_metrics_tell_an_input_bound_rank_from_a_step_bound_one(rname, tmp_path, monkeypatch,
                                                               bound):
    n = 2000
    path = write_ids(tmp_path / "ids.bin", n)
    # Input-bound: the one loader spends 30 ms a batch and the step none. Step-bound: the
    # other way round.
    ds, loader = one_rank(path, rname, monkeypatch, Slow(0.03 if bound == "input" else 0))
    ids, seen = [], []
    try:
        for step, batch in enumerate(loader):
            if bound == "step":
                time.sleep(0.03)
            ids += ids_of(batch.numpy())
            if step >= 5 and step % 10 == 0:
                seen.append(loader.metrics(window=1.0))
        last = loader.metrics()
    finally:
        loader.close()
        ds.close()
    assert sorted(ids) == list(range(n))
    m = seen[-1]
    assert set(m) == KEYS and all(isinstance(v, float) for v in m.values()), m
    assert m["steps"] > 0 and m["samples_per_s"] == pytest.approx(20 * m["batches_per_s"])
    assert m["data_wait_p99_s"] >= m["data_wait_mean_s"] > 0
    assert m["loaders"] == 1 and m["ring_slots"] == 4
    shares = sorted(x["data_wait_share"] for x in seen)
    median = shares[len(shares) // 2]
    if bound == "input":
        assert median > 0.5, shares  # the rank waits for most of each 30 ms batch
    else:
        assert median < 0.5, shares  # the batch is ready when the 30 ms step ends
    assert set(last) == KEYS  # since the last call


def test_metrics_window_must_be_positive(rname, tmp_path, monkeypatch):
    path = write_ids(tmp_path / "ids.bin", 200)
    ds, loader = one_rank(path, rname, monkeypatch, None)
    try:
        with pytest.raises(tailcut.InvalidArgumentError, match="window must be a number of "
                                                              "seconds > 0"):
            loader.metrics(window=0)
        with pytest.raises(TypeError, match="window must be"):
            loader.metrics(window="1s")
    finally:
        loader.close()
        ds.close()


def test_the_plot_draws_a_jobs_data_wait_and_loaders_over_time(rname, tmp_path, monkeypatch):
    import subprocess
    import sys
    path = write_ids(tmp_path / "ids.bin", 2000)
    ds, loader = one_rank(path, rname, monkeypatch, Slow(0.01))
    out = tmp_path / "wait.png"
    plot = None
    try:
        for step, batch in enumerate(loader):
            if step == 3:
                plot = subprocess.Popen([sys.executable, "-m", "tailcut.plot", loader.name,
                                         str(out), "--seconds", "2", "--interval", "0.1"],
                                        stderr=subprocess.PIPE, text=True)
            time.sleep(0.01)
        _, err = plot.communicate(timeout=60)
    finally:
        loader.close()
        ds.close()
    assert plot.returncode == 0, err
    assert f"{out}:" in err and "readings over" in err, err
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_the_plot_names_a_ring_that_does_not_exist(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "tailcut.plot", "no-such-ring-here",
                        str(tmp_path / "x.png")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no-such-ring-here" in r.stderr, r.stderr
