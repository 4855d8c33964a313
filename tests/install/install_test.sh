#!/usr/bin/env bash
# Installs tailcut from BUILD_DIR into a temporary prefix, runs the installed
# `tailcut` from there with no LD_LIBRARY_PATH (it finds libtailcut.so.0
# through its RUNPATH, $ORIGIN/../lib), builds the trainer
# that docs/cpp.md shows (its ```cmake and ```cpp blocks, extracted from the
# page) against it with find_package(tailcut), and runs it as 3 processes on
# one queue: together they must read every line once.
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tailcut-install-XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/tailcut" || { echo "the CLI was not installed"; exit 1; }
test -f "$work/prefix/include/tailcut/work_queue.h" || { echo "headers were not installed"; exit 1; }

# The installed programs start from a prefix the dynamic loader does not
# search: `tailcut --help` and `tailcut ls`, and every other program there
# with --help.
run_installed() {
  if ! env -u LD_LIBRARY_PATH "$@" > "$work/run.out" 2>&1; then
    echo "the installed '${*#"$work/prefix/"}' failed:"; cat "$work/run.out"; exit 1
  fi
}
run_installed "$work/prefix/bin/tailcut" --help
grep -q '^usage: tailcut' "$work/run.out" || { echo "installed tailcut --help: no usage"; exit 1; }
run_installed "$work/prefix/bin/tailcut" ls
for program in "$work/prefix/bin"/*; do
  [[ $program == */tailcut ]] || run_installed "$program" --help
done
echo "installed programs start: $(cd "$work/prefix/bin" && echo *)"

doc="$here/../../docs/cpp.md"
mkdir -p "$work/src"
awk '/^```cmake$/ {on=1; next} /^```$/ {if (on) exit} on' "$doc" > "$work/src/CMakeLists.txt"
awk '/^```cpp$/ {on=1; next} /^```$/ {if (on) exit} on' "$doc" > "$work/src/trainer.cc"
grep -q "int main" "$work/src/trainer.cc" || { echo "no program in docs/cpp.md"; exit 1; }
cmake -S "$work/src" -B "$work/trainer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/trainer" >/dev/null

# Data: 4 files of numbered lines.
expect_lines=0; expect_bytes=0
for f in 0 1 2 3; do
  for ((i = 0; i < 5000; i++)); do echo "file $f line $i"; done > "$work/data$f.txt"
  expect_lines=$((expect_lines + 5000))
  expect_bytes=$((expect_bytes + $(wc -c < "$work/data$f.txt") - 5000))
done

queue="install_test_$$"
export LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}"
for p in 0 1 2; do
  "$work/trainer/tiny_trainer" "$queue" "$work"/data*.txt > "$work/out$p" &
done
wait
read -r lines bytes < <(awk '{l += $1; b += $2} END {print l, b}' "$work"/out*)
echo "3 processes read $lines lines ($bytes bytes); expected $expect_lines ($expect_bytes)"
if [[ "$lines" != "$expect_lines" || "$bytes" != "$expect_bytes" ]]; then
  echo "install_test: FAILED"; exit 1
fi
echo "install_test: 1 passed, 0 failed"
