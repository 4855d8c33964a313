"""The Python package's imports run one way (docs/design.md, "The Python package in layers").

    package_layers_test.py REPO_ROOT

Each module of bindings/python/tailcut sits in a layer:
  0  tailcut (the WorkQueue face over _core) and tailcut._core
  1  the private helpers at the root: tailcut._args, tailcut._steps, ...; and
     tailcut.prometheus and tailcut.plot, tools over the face
  2  tailcut.torch and its modules (the face re-exports only)
  3  tailcut.pool and its modules
as PyTorch's torch/utils/data keeps _utils/ from importing dataloader.py.
An import of a module of the package, at the top of a file or inside a
function, may not go to a higher layer, and no chain of imports may come back
to where it started (a circle), without exception; `from tailcut.torch import
_x` inside tailcut.torch counts as an import of tailcut.torch too (the name
is looked up in a package whose __init__ may be half run). And `import tailcut`
must not import torch: no module reached from tailcut/__init__.py
by the imports that run when it is imported may import torch.

Exits 1 naming each import that breaks a rule (file and line), 0 otherwise.
"""

import ast
import pathlib
import sys



def layer(module):
    if module in ("tailcut", "tailcut._core"):
        return 0
    if module in ("tailcut.prometheus", "tailcut.plot"):  # tools over the face
        return 1
    for prefix, number in (("tailcut.torch", 2), ("tailcut.pool", 3)):
        if module == prefix or module.startswith(prefix + "."):
            return number
    return 1 if module.count(".") == 1 and module.split(".")[1].startswith("_") else None


def imports(tree, package, modules):
    """(imported module, line, enclosing function or None, runs at import) for each import."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Lambda):
                inner = "<lambda>"
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package of this file
                    parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in child.names:  # a submodule, else the module that holds the name
                    name = f"{base}.{a.name}"
                    found.append((name if name in modules else base, child.lineno, function))
                    if name in modules and base in modules and (package + ".").startswith(base + "."):
                        # `from tailcut.torch import _x` inside tailcut.torch: a name
                        # looked up in the package, whose __init__ may be half run.
                        found.append((base, child.lineno, function))
            visit(child, inner)

    visit(tree, None)
    return [(name, line, function) for name, line, function in found]


def main(root):
    top = pathlib.Path(root) / "bindings/python"
    files = {}
    for path in sorted((top / "tailcut").rglob("*.py")):
        parts = path.relative_to(top).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    modules = set(files) | {"tailcut._core"}
    errors, edges, at_import = [], {m: set() for m in modules}, {m: set() for m in modules}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        where = path.relative_to(root)
        if layer(module) is None:
            errors.append(f"{where}: module {module} has no layer: give it one in {__file__}")
            continue
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError as e:
            errors.append(f"{where}:{e.lineno}: not Python ({e.msg})")
            continue
        for name, line, function in imports(tree, package, modules):
            if function is None:
                at_import[module].add(name)
            if not name.startswith("tailcut"):
                continue
            name = next(m for m in (name, name.rsplit(".", 1)[0], "tailcut") if m in modules)
            edges[module].add(name)
            if name != module and (layer(name) or 0) > layer(module):
                errors.append(f"{where}:{line}: {module} (layer {layer(module)}) imports {name} "
                              f"(layer {layer(name)}), a layer up: move what it needs down")
    # Circles: a depth-first search that reports each back edge with its path.
    state, stack = {}, []

    def search(module):
        state[module] = "open"
        stack.append(module)
        for name in sorted(edges[module] - {module}):
            if state.get(name) == "open":
                circle = stack[stack.index(name):] + [name]
                errors.append(f"import circle: {' -> '.join(circle)}")
            elif name not in state:
                search(name)
        stack.pop()
        state[module] = "done"

    for module in sorted(modules):
        if module not in state:
            search(module)
    # `import tailcut` runs the imports at the top of every module it reaches.
    reached, todo = set(), ["tailcut"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for name in at_import.get(module, ()):
            if name == "torch" or name.startswith("torch."):
                errors.append(f"`import tailcut` imports torch: {module} imports {name} at the top")
            parts = name.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                        if ".".join(parts[:i]) in modules)
    for error in dict.fromkeys(errors):  # once each, in order
        print(error)
    if not errors:
        print(f"the {len(files)} modules of tailcut import one way, and `import tailcut` "
              f"imports no torch")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
