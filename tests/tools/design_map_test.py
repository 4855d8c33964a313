"""docs/design.md's map names every source file of the product, and only files that exist.

    design_map_test.py REPO_ROOT

The product is what ships: the library's folders (engine/, io/, pool/,
global/), the Python package and its bindings (bindings/), and the CLI and
demo (tools/). bench/ is left out: benchmarks are not shipped, and
docs/benchmarks.md describes them. A source file is a .h, .cc, .py or .pyi
file under those folders.

The map is the table under "## Map": a row whose first cell is bold names a
folder; the first cell of every other row names files in it, in backquotes,
relative to the folder, with {a,b} for alternatives (`config.{h,cc}`).
Exits 1 naming each file missing from the map, each map entry that names no
file, and each file named twice; 0 when the map and the tree agree.
"""

import os
import re
import sys

FOLDERS = ("engine", "io", "pool", "global", "bindings", "tools")
SOURCE_SUFFIXES = (".h", ".cc", ".py", ".pyi")
SKIPPED_DIRS = {"__pycache__"}


def expand(entry):
    """`config.{h,cc}` -> ["config.h", "config.cc"] (one brace group at most)."""
    m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", entry)
    if not m:
        return [entry]
    return [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")]


def map_entries(design_text):
    """(path, line number) for every file the map names."""
    entries = []
    in_map = False
    folder = None
    for number, line in enumerate(design_text.splitlines(), 1):
        if line.startswith("## "):
            in_map = line.strip() == "## Map"
            continue
        if not in_map or not line.startswith("|"):
            continue
        first = line.split("|")[1].strip()
        bold = re.fullmatch(r"\*\*`?([^*`]+?)`?\*\*", first)
        if bold:
            folder = bold.group(1).rstrip("/")
            continue
        if folder is None:
            continue  # the header row and its rule
        for token in re.findall(r"`([^`]+)`", first):
            for name in expand(token):
                entries.append((folder + "/" + name, number))
    return entries


def source_files(root):
    found = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    design = os.path.join(root, "docs", "design.md")
    with open(design, encoding="utf-8") as f:
        entries = map_entries(f.read())
    if not entries:
        print(f"{design}: no map found (a table under '## Map' with bold folder rows)")
        return 1
    problems = []
    seen = {}
    for path, number in entries:
        if path in seen:
            problems.append(f"docs/design.md:{number}: `{path}` is named twice (first on line "
                            f"{seen[path]}); a file has one job and one row")
        seen.setdefault(path, number)
        if not os.path.isfile(os.path.join(root, path)):
            problems.append(f"docs/design.md:{number}: the map names `{path}`, which does not "
                            f"exist; remove or rename its entry")
    for path in source_files(root):
        if path not in seen:
            problems.append(f"{path}: missing from the map in docs/design.md; add it to its "
                            f"folder's rows with its one job")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) between docs/design.md's map and the tree")
        return 1
    print(f"docs/design.md's map names all {len(seen)} source files of {', '.join(FOLDERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
