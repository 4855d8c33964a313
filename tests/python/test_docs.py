"""Runs every ```python block of the README and of the docs pages below as a program in an
empty directory, and checks that every test the docs name as a promise's evidence exists."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# page, from the repository's root -> (fewest examples it must have, module the examples need)
PAGES = {"README.md": (2, "torch"), "docs/python.md": (8, None), "docs/pytorch.md": (4, "torch"),
         "docs/queue_dataset.md": (6, "torch"), "docs/pooled.md": (3, "torch"),
         "docs/checkpoints.md": (1, "torch"), "docs/balance.md": (1, "torch"),
         "docs/metrics.md": (1, "torch")}


def python_blocks(page):
    text = (ROOT / page).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def examples():
    for page, (_, needs) in PAGES.items():
        marks = []
        if needs and importlib.util.find_spec(needs) is None:
            marks.append(pytest.mark.skip(reason=f"{page} needs {needs}"))
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


def _named_tests(text):
    """The tests a doc names: Python test functions (test_name, also after
    `file.py::`; a name ending in "_" is a prefix, as in `test_killed_after_...`)
    and GoogleTest cases (SuiteTest.CaseName)."""
    python = set(re.findall(r"(?<![\w./-])(test_\w+)(?![\w/]|\.py)", text))
    cpp = set(re.findall(r"\b([A-Z]\w*Test)\.([A-Z]\w+)", text))
    return python, cpp


def test_every_test_the_docs_name_exists():
    # The reliability tables name the test behind each promise: a test renamed or removed
    # must take its row along, or the row says what nothing checks any more.
    python, cpp = set(), set()
    for path in list((ROOT / "tests").rglob("*.py")) + list((ROOT / "bench").rglob("*.py")):
        python |= set(re.findall(r"^\s*def (test_\w+)", path.read_text(), re.M))
    for path in list((ROOT / "tests").rglob("*.cc")) + list((ROOT / "bench").rglob("*.cc")):
        cpp |= set(re.findall(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", path.read_text()))
    assert len(python) > 100 and len(cpp) > 100  # the patterns still find the tests
    missing = []
    for doc in sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        named_python, named_cpp = _named_tests(doc.read_text())
        for name in sorted(named_python):
            if name not in python and not (name.endswith("_") and
                                           any(t.startswith(name) for t in python)):
                missing.append(f"{doc.name}: {name}")
        missing += [f"{doc.name}: {suite}.{case}" for suite, case in sorted(named_cpp)
                    if (suite, case) not in cpp]
    assert not missing, "the docs name tests that do not exist:\n" + "\n".join(missing)
