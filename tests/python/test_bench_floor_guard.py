"""The pool's regression guard (bench/pool/floor_guard.py, docs/benchmarks.md) runs
as documented, on a case small enough for a test: one version, one round, two
ranks under torchrun. What it measures is a benchmark's business; that it still
runs, parses its runs and prints its table is this test's."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from _pool_helpers import free_port  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_floor_guard_runs_a_version_and_prints_its_table(tmp_path):
    import tailcut
    package = pathlib.Path(tailcut.__file__).resolve().parents[1]
    out = tmp_path / "guard"
    # 64 batches an epoch, more than the ring holds: the loaders work in every epoch.
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/pool/floor_guard.py"), "--version",
         f"this={package}", "--rounds", "1", "--epochs", "2", "--ranks", "2",
         "--workers-per-rank", "1", "--records", "2048", "--mean-ms", "2", "--step-ms", "1",
         "--port", str(free_port()), "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "round 0 this" in done.stderr and "loaders in the transform" in done.stderr
    assert "targets: pooled/floor <= 1.10" in done.stderr, done.stderr[-3000:]
    runs = json.loads((out / "floor_guard.json").read_text())["runs"]["this"]
    (run,) = runs
    assert run["floor"] > 0 and run["pooled"] > 0 and run["per_rank"] > 0
    assert 0 < run["loaders_busy"] <= 1
