"""In-tree PEP 517 build backend of the tailcut Python package (standard library only).

`pip install .` (offline, e.g. `python3 -m pip install --no-build-isolation --no-deps
--target DIR .`) calls build_wheel(), which configures and builds the CMake project
(target `_core`, see bindings/CMakeLists.txt) and zips the assembled package directory
<build>/python/tailcut (the extension, libtailcut next to it, the pure-Python files, the
stubs and py.typed) into a wheel with its dist-info files.

Settings (pip --config-settings KEY=VALUE, or the environment):
  build-dir  / TAILCUT_WHEEL_BUILD_DIR   the CMake build directory; default <repo>/build-wheel,
                                         kept between builds so that rebuilding is incremental
  build-type / TAILCUT_WHEEL_BUILD_TYPE  CMAKE_BUILD_TYPE; default Release
  jobs       / CMAKE_BUILD_PARALLEL_LEVEL parallel build jobs; default 2
"""

import base64
import hashlib
import io
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAME = "tailcut"
SUMMARY = "One shared-memory work queue per host for data-parallel training, with io_uring readers"


def _project():
    """The [project] table of pyproject.toml (static fields), with fallbacks."""
    project = {}
    try:
        import tomllib  # Python 3.11+

        with open(ROOT / "pyproject.toml", "rb") as f:
            project = tomllib.load(f).get("project", {})
    except (ImportError, OSError):
        pass
    return project


def _version():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*tailcut\s+VERSION\s+([0-9][0-9.]*)", text)
    if not match:
        raise RuntimeError("cannot find project(tailcut VERSION x.y.z) in CMakeLists.txt")
    return match.group(1)


def _setting(config_settings, key, env, default):
    value = (config_settings or {}).get(key)
    if value is None:
        value = os.environ.get(env)
    return value if value else default


def _wheel_tag():
    impl = {"cpython": "cp"}.get(sys.implementation.name, sys.implementation.name[:2])
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    abi = f"{impl}{version}{getattr(sys, 'abiflags', '')}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}{version}-{abi}-{platform}"


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _metadata():
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {project.get('description', SUMMARY)}",
        f"Requires-Python: {project.get('requires-python', '>=3.9')}",
    ]
    for dep in project.get("dependencies", ["numpy"]):
        lines.append(f"Requires-Dist: {dep}")
    readme = ROOT / "README.md"
    if readme.exists():
        lines.append("Description-Content-Type: text/markdown")
        return "\n".join(lines) + "\n\n" + readme.read_text()
    return "\n".join(lines) + "\n"


def _run(cmd):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def _build(config_settings):
    build_dir = pathlib.Path(_setting(config_settings, "build-dir", "TAILCUT_WHEEL_BUILD_DIR",
                                      ROOT / "build-wheel"))
    build_type = _setting(config_settings, "build-type", "TAILCUT_WHEEL_BUILD_TYPE", "Release")
    jobs = _setting(config_settings, "jobs", "CMAKE_BUILD_PARALLEL_LEVEL", "2")
    _run(["cmake", "-S", ROOT, "-B", build_dir,
          f"-DCMAKE_BUILD_TYPE={build_type}",
          "-DTAILCUT_BUILD_PYTHON=ON", "-DTAILCUT_BUILD_TESTS=OFF",
          "-DTAILCUT_BUILD_BENCHMARKS=OFF", "-DTAILCUT_INSTALL=OFF",
          f"-DPython_EXECUTABLE={sys.executable}"])
    _run(["cmake", "--build", build_dir, "--target", "_core", "-j", jobs])
    package = build_dir / "python" / NAME
    if not list(package.glob("_core*.so")):
        raise RuntimeError(f"the build did not produce {package}/_core*.so")
    return package


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write(zf, records, arcname, data, mode=0o644):
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    records.append(_record_line(arcname, data))


# ---- PEP 517 hooks --------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = pathlib.Path(metadata_directory) / _dist_info()
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata())
    return dist_info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    package = _build(config_settings)
    tag = _wheel_tag()
    wheel_name = f"{NAME}-{_version()}-{tag}.whl"
    dist_info = _dist_info()
    records = []
    path = pathlib.Path(wheel_directory) / wheel_name
    with zipfile.ZipFile(path, "w") as zf:
        for src in sorted(package.rglob("*")):  # subpackages (tailcut/pool/) too
            rel = src.relative_to(package)
            if "__pycache__" in rel.parts or src.suffix == ".pyc" or not src.is_file():
                continue
            mode = 0o755 if src.suffix == ".so" or ".so." in src.name else 0o644
            _write(zf, records, f"{NAME}/{rel.as_posix()}", src.read_bytes(), mode)
        _write(zf, records, f"{dist_info}/METADATA", _metadata().encode())
        wheel = ("Wheel-Version: 1.0\nGenerator: tailcut build_backend\n"
                 f"Root-Is-Purelib: false\nTag: {tag}\n")
        _write(zf, records, f"{dist_info}/WHEEL", wheel.encode())
        _write(zf, records, f"{dist_info}/top_level.txt", f"{NAME}\n".encode())
        records.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | 0o644) << 16
        zf.writestr(info, "\n".join(records) + "\n")
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    """A source archive of the tree (without build directories and VCS data)."""
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    skip_dirs = {".git", "__pycache__", "out"}

    def keep(rel):
        parts = rel.parts
        return not (parts[0].startswith("build") or any(p in skip_dirs for p in parts))

    with tarfile.open(pathlib.Path(sdist_directory) / name, "w:gz") as tar:
        for src in sorted(ROOT.rglob("*")):
            rel = src.relative_to(ROOT)
            if src.is_file() and not src.is_symlink() and keep(rel):
                tar.add(src, arcname=f"{base}/{rel}", recursive=False)
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
