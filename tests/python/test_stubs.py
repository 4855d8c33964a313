"""The type stubs and __all__ stay complete, and every binding has a docstring."""

import ast
import inspect
import os
import pathlib

import pytest

import tailcut
from tailcut import _core

STUB = pathlib.Path(_core.__file__).with_name("_core.pyi")
# Dunders a stub must declare when the class has them.
CHECKED_DUNDERS = {"__init__", "__iter__", "__next__", "__enter__", "__exit__"}


def stub_tree():
    tree = ast.parse(STUB.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return top, classes


def public_names(module):
    return {n for n in dir(module) if not n.startswith("__") or n == "__version__"} - {
        n for n in dir(module) if n.startswith("__") and n != "__version__"}


def class_members(cls):
    names = set()
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in CHECKED_DUNDERS:
            continue
        if name == "__init__" and type(value).__name__ == "wrapper_descriptor":
            continue  # pybind11's "No constructor defined": not constructible from Python
        names.add(name)
    return names


def test_every_public_name_of_core_is_in_the_stub():
    top, _ = stub_tree()
    missing = {n for n in public_names(_core) if not n.startswith("__")} - top
    assert not missing, f"missing from {STUB.name}: {sorted(missing)}"
    assert "__version__" in top


def test_every_member_of_every_class_is_in_the_stub():
    _, classes = stub_tree()
    problems = []
    for name in public_names(_core):
        cls = getattr(_core, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        if name not in classes:
            problems.append(name)
            continue
        for member in class_members(cls):
            if member not in classes[name]:
                problems.append(f"{name}.{member}")
    assert not problems, f"missing from {STUB.name}: {problems}"


def test_exceptions_in_the_stub_have_the_runtime_bases():
    tree = ast.parse(STUB.read_text())
    stub_bases = {n.name: [ast.unparse(b).split(".")[-1] for b in n.bases]
                  for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in public_names(_core):
        cls = getattr(_core, name)
        if inspect.isclass(cls) and issubclass(cls, BaseException):
            assert stub_bases.get(name) == [b.__name__ for b in cls.__bases__], name


def test_all_lists_the_public_api():
    exported = set(tailcut.__all__)
    assert all(hasattr(tailcut, n) for n in exported)
    public = {n for n in public_names(_core) if not n.startswith("_")}
    assert public - set(tailcut._NOT_STARRED) <= exported
    assert not exported & set(tailcut._NOT_STARRED)
    assert "__version__" in exported


def doc_body(obj):
    """The docstring without pybind11's generated signature line."""
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    if lines and "(" in lines[0] and ")" in lines[0] and len(lines) > 1:
        lines = lines[1:]
    elif lines and lines[0].endswith(")") or (lines and "->" in lines[0] and len(lines) == 1):
        lines = []
    return "\n".join(lines).strip()


def test_every_binding_has_a_docstring():
    missing = []
    for name in public_names(_core):
        obj = getattr(_core, name)
        if name.startswith("__"):
            continue
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
            continue
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                if not doc_body(value):
                    missing.append(f"{name}.{member}")
        elif callable(obj) and not inspect.isclass(obj) and not doc_body(obj):
            missing.append(name)
    assert not missing, f"no docstring: {missing}"


# Keyword-only arguments of records()/batches() that are not reader options.
SHUFFLE_OPTIONS = {"shuffle_buffer", "interleave", "shuffle_seed"}
NOT_READER_OPTIONS = {"records": {"max_epoch"} | SHUFFLE_OPTIONS,
                      "batches": {"max_epoch", "short_at_end", "copy", "drop_last"} | SHUFFLE_OPTIONS}


def stub_keyword_only(cls_name, method):
    tree = ast.parse(STUB.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return [a.arg for a in fn.args.kwonlyargs]


@pytest.mark.parametrize("method", sorted(NOT_READER_OPTIONS))
def test_the_stub_lists_exactly_the_reader_options_of_the_binding(method):
    stub = stub_keyword_only("WorkQueue", method)
    assert len(stub) == len(set(stub))
    assert set(stub) - NOT_READER_OPTIONS[method] == set(_core._reader_options)


def test_records_docstring_lists_the_reader_options_in_table_order():
    doc = inspect.getdoc(_core.WorkQueue.records)
    assert "Reader options: " + ", ".join(_core._reader_options) + " " in doc


def test_every_reader_option_is_accepted(tmp_path, qname):
    # Each name of the table reaches the reader: a wrong type is refused with
    # the option's name, never as an unknown keyword.
    (tmp_path / "a.txt").write_text("x\n")
    with tailcut.WorkQueue([str(tmp_path / "a.txt")], name=qname) as q:
        for name in _core._reader_options:
            with pytest.raises((TypeError, ValueError, RuntimeError)) as e:
                q.records(**{name: object()})
            assert "unexpected keyword" not in str(e.value), name


def stub_typed_dict(name):
    tree = ast.parse(STUB.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_the_stub_documents_exactly_the_stats_fields_of_the_list():
    # tailcut/stats_fields.h is the one list; the stub's TypedDicts must name its fields.
    assert stub_typed_dict("_QueueStats") == [
        name for name, _, _ in _core._stats_fields["queue"]] + ["clients"]
    assert stub_typed_dict("_ClientStats") == [
        name for name, _, _ in _core._stats_fields["client"]]
    for fields in _core._stats_fields.values():
        assert all(series in ("value", "seconds", "none") and doc for _, series, doc in fields)


def test_py_typed_marker_is_shipped():
    assert STUB.with_name("py.typed").exists()
