"""How a pooled loader makes a batch of a map-style dataset's samples, and how
the rank gets its structure back (pool/_map_source.py): small, with no
import of tailcut.torch, so that a loader started with `python3 -m
tailcut.pool` unpickles these from the pool's description cheaply."""

import base64
import importlib
import json

import numpy as np

from tailcut import _map_style


class LoadSample:
    """index -> (index, dataset[index]), in a loader; an exception names the index."""

    def __init__(self, dataset):
        self.dataset = dataset
        # How the pool's description names it (tailcut.pool._description).
        self.__module__ = type(dataset).__module__
        self.__qualname__ = f"{type(dataset).__qualname__} (the dataset)"

    def __call__(self, index):
        try:
            return index, self.dataset[index]
        except Exception as e:
            _map_style.add_note(e, f"tailcut: raised by dataset[{index}] "
                                   f"({type(self.dataset).__name__}, in a pooled loader)")
            raise

    def __reduce__(self):
        return LoadSample, (self.dataset,)


class Collate:
    """[(index, sample)] -> the flat arrays of collate_fn(samples), then
    transform; a batch that does not collate names the index and the field
    that differ."""

    def __init__(self, collate_fn, transform):
        self.collate_fn, self.transform = collate_fn, transform

    def __call__(self, records):
        indices = [i for i, _ in records]
        samples = [s for _, s in records]
        if self.collate_fn is None:
            from torch.utils.data import default_collate as collate
        else:
            collate = self.collate_fn
        try:
            batch = collate(samples)
        except Exception as e:
            where = _first_difference(samples, indices)
            _map_style.add_note(e, "tailcut: the samples of a batch do not collate: " +
                                (where or f"dataset[{indices[0]}] .. dataset[{indices[-1]}]"))
            raise
        if self.transform is not None:
            batch = self.transform(batch)
        leaves, paths = [], []
        samples = (f"the batch of dataset[{indices[0]}] .. dataset[{indices[-1]}] "
                   f"({len(indices)} samples)")
        try:
            tree = _flatten(batch, leaves, "batch", paths)
        except TypeError as e:
            _map_style.add_note(e, f"tailcut: in {samples}")
            raise
        leaves.append(np.frombuffer(json.dumps(tree).encode("utf-8"), dtype=np.uint8))
        return Leaves(leaves, [f"field {p} of {samples}" for p in paths] +
                      [f"the structure of {samples}"])


class Leaves(tuple):
    """The arrays of a collated batch; what(i) names array i's field and
    samples (tailcut._batch_layout names it when the batch does not fit)."""

    def __new__(cls, leaves, names):
        self = super().__new__(cls, leaves)
        self.names = names
        return self

    def what(self, i):
        return self.names[i]


# torch dtypes numpy has not, and the dtype of the same size whose bits carry them.
_CARRIED = {"bfloat16": "int16", "complex32": "int32"}


def _flatten(x, leaves, path, paths):
    numpy = getattr(x, "numpy", None)
    if isinstance(x, np.ndarray) or numpy is not None:
        node = {"a": len(leaves)}
        name = str(getattr(x, "dtype", "")).replace("torch.", "")
        if numpy is not None and name in _CARRIED:  # its bits, in a dtype numpy has
            import torch
            x = x.contiguous().view(getattr(torch, _CARRIED[name]))
            node["t"] = name
        elif numpy is not None and getattr(x, "is_quantized", False):
            raise TypeError(f"{path} is a quantized tensor ({x.dtype}), which a pooled batch "
                            f"cannot carry: dequantize it in collate_fn or transform")
        leaves.append(x)
        paths.append(path)
        return node
    if isinstance(x, dict):
        for k in x:
            if not isinstance(k, str):
                raise TypeError(f"a pooled batch's dict keys are str; {path} has {k!r}")
        node = {"d": [[k, _flatten(v, leaves, f"{path}[{k!r}]", paths)] for k, v in x.items()]}
        if type(x) is not dict:  # an OrderedDict, say: default_collate keeps the type
            node["k"] = [type(x).__module__, type(x).__qualname__]
        return node
    if isinstance(x, tuple) and hasattr(type(x), "_fields"):  # a namedtuple, as collated
        kind = type(x)
        return {"n": [kind.__module__, kind.__qualname__, list(kind._fields)],
                "t": [_flatten(v, leaves, f"{path}.{f}", paths)
                      for f, v in zip(kind._fields, x)]}
    if isinstance(x, (tuple, list)):
        kind = "l" if isinstance(x, list) else "t"
        return {kind: [_flatten(v, leaves, f"{path}[{i}]", paths) for i, v in enumerate(x)]}
    if isinstance(x, bytes):
        return {"b": base64.b64encode(x).decode("ascii")}
    if x is None or isinstance(x, (str, int, float, bool)):
        return {"v": x}
    raise TypeError(f"a pooled batch holds tensors, arrays, dicts, tuples, lists and plain "
                    f"values (str, bytes, int, float, bool, None); {path} is a "
                    f"{type(x).__name__}: convert it in collate_fn")


def _collated_type(module, qualname, base, fields=None):
    """The class a loader collated into (imported as the loader had it) when
    it is a `base` (of these namedtuple `fields`), else None."""
    try:
        kind = importlib.import_module(module)
        for part in qualname.split("."):
            kind = getattr(kind, part)
    except Exception:
        return None
    if not isinstance(kind, type) or not issubclass(kind, base):
        return None
    if fields is not None and list(getattr(kind, "_fields", ())) != fields:
        return None
    return kind


def _namedtuple(module, qualname, fields):
    """The namedtuple class a loader collated, else one of the same name and fields."""
    import collections
    return (_collated_type(module, qualname, tuple, fields)
            or collections.namedtuple(qualname.rsplit(".", 1)[-1], fields))


def unflatten(tree, leaves):
    if "a" in tree:
        leaf = leaves[tree["a"]]
        if "t" in tree:  # bits of a torch dtype numpy has not
            import torch
            leaf = leaf.view(getattr(torch, tree["t"]))
        return leaf
    if "d" in tree:
        items = {k: unflatten(v, leaves) for k, v in tree["d"]}
        kind = _collated_type(*tree["k"], dict) if "k" in tree else None
        if kind is not None:
            try:
                return kind(items)
            except TypeError:  # as default_collate: a type it cannot make is a dict
                pass
        return items
    if "n" in tree:
        return _namedtuple(*tree["n"])(*(unflatten(v, leaves) for v in tree["t"]))
    if "l" in tree:
        return [unflatten(v, leaves) for v in tree["l"]]
    if "t" in tree:
        return tuple(unflatten(v, leaves) for v in tree["t"])
    if "b" in tree:
        return base64.b64decode(tree["b"])
    return tree["v"]


def _describe(x):
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"a {type(x).__name__} of shape {tuple(shape)} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


def _differ(a, b, path):
    """The path of the first field where samples a and b differ in kind, keys,
    length or shape, with what each holds; None when they match."""
    if type(a) is not type(b):
        return path, _describe(b), _describe(a)
    if isinstance(a, dict):
        if set(a) != set(b):
            return path, f"keys {sorted(map(str, b))}", f"keys {sorted(map(str, a))}"
        for k in a:
            found = _differ(a[k], b[k], f"{path}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, (tuple, list)):
        if len(a) != len(b):
            return path, f"{len(b)} fields", f"{len(a)} fields"
        for i, (u, v) in enumerate(zip(a, b)):
            found = _differ(u, v, f"{path}[{i}]")
            if found:
                return found
        return None
    if getattr(a, "shape", None) is not None:
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return path, _describe(b), _describe(a)
    return None


def _first_difference(samples, indices):
    """Names the first sample that differs from the batch's first, or the first
    sample itself where it is the odd one (the sample found agrees with another)."""
    for k in range(1, len(samples)):
        found = _differ(samples[0], samples[k], "")
        if found:
            path, theirs, first = found
            odd, usual = (k, theirs), (0, first)
            if any(not _differ(samples[k], s, "") for s in samples[k + 1:]):
                odd, usual = usual, odd
            return (f"field {path or '(the sample)'} of dataset[{indices[odd[0]]}] is {odd[1]}, "
                    f"that of dataset[{indices[usual[0]]}] {usual[1]}")
    return None
