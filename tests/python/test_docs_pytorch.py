"""Runs every ```python block of docs/pytorch.md as a program in an empty directory."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="docs/pytorch.md needs PyTorch (python3-torch)")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "pytorch.md"


def python_blocks():
    text = DOC.read_text()
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(pytest.param(match.group(1), id=f"line{line}"))
    return blocks


def test_the_doc_has_examples():
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("code", python_blocks())
def test_doc_example_runs(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)  # the DDP example starts its own ranks unless under torchrun
    import tailcut
    package_root = str(pathlib.Path(tailcut.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    # Examples name their queues after their pid and leave none behind.
    left = [p.name for p in pathlib.Path("/dev/shm").glob(f"tailcut.{os.geteuid()}.*")
            if f"-{proc.pid}" in p.name]
    assert not left, f"the example left queues behind: {left}"
