"""Runs every ```python block of docs/python.md, docs/pytorch.md and docs/pooled.md as a
program in an empty directory."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
# doc -> (fewest examples it must have, module the examples need)
PAGES = {"python.md": (8, None), "pytorch.md": (4, "torch"), "pooled.md": (3, "torch")}


def python_blocks(page):
    text = (DOCS / page).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def examples():
    for page, (_, needs) in PAGES.items():
        marks = []
        if needs and importlib.util.find_spec(needs) is None:
            marks.append(pytest.mark.skip(reason=f"docs/{page} needs {needs}"))
        for line, code in python_blocks(page):
            yield pytest.param(code, id=f"{page}:line{line}", marks=marks)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_doc_has_examples(page):
    assert len(python_blocks(page)) >= PAGES[page][0]


@pytest.mark.parametrize("code", examples())
def test_doc_example_runs(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)  # the DDP example starts its own ranks unless under torchrun
    # The example imports tailcut from wherever this test does.
    import tailcut
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(tailcut.__file__).parent.parent)] + env.get("PYTHONPATH", "").split(os.pathsep))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    # Examples name their queues (and rings) after their pid and clean up after themselves.
    left = [p.name for p in pathlib.Path("/dev/shm").glob("tailcut*")
            if f"-{proc.pid}" in p.name]
    assert not left, f"the example left queues, rings or pool descriptions behind: {left}"
