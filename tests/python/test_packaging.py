"""`pip install .` builds a wheel offline through the in-tree backend, and it imports."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.packaging


def test_pip_install_into_a_target_directory_then_import(tmp_path):
    target = tmp_path / "site"
    build_dir = os.environ.get("TAILCUT_WHEEL_BUILD_DIR", str(ROOT / "build-wheel"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                    "--no-cache-dir", "--disable-pip-version-check", "--target", str(target),
                    "--config-settings", f"build-dir={build_dir}", str(ROOT)],
                   check=True, timeout=1500)
    package = target / "tailcut"
    assert (package / "py.typed").exists() and (package / "_core.pyi").exists()
    assert list(package.glob("_core*.so")) and list(package.glob("libtailcut.so.*"))
    dist_info = list(target.glob("tailcut-*.dist-info"))
    assert dist_info and (dist_info[0] / "RECORD").exists()
    data = tmp_path / "data.txt"
    data.write_text("a\nb\nc\n")
    code = (
        "import os, sys, tailcut\n"
        f"assert tailcut.__file__.startswith({str(target)!r}), tailcut.__file__\n"
        f"q = tailcut.WorkQueue([{str(data)!r}], name='pip-%d' % os.getpid(),"
        " on_notice=lambda line: None)\n"
        "assert [bytes(r) for r in q.records()] == [b'a', b'b', b'c']\n"
        "q.close()\n"
        # The subpackage too (tailcut/pool/), and its __main__.
        "import tailcut.pool\n"
        f"assert tailcut.pool.__file__.startswith({str(target)!r}), tailcut.pool.__file__\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path, timeout=60)
    helped = subprocess.run([sys.executable, "-m", "tailcut.pool", "--help"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "python3 -m tailcut.pool" in helped.stdout, helped.stderr
