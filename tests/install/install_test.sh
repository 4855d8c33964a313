#!/usr/bin/env bash
# Installs tailcut from BUILD_DIR into a temporary prefix, runs the installed
# `tailcut` from there with no LD_LIBRARY_PATH (it finds libtailcut.so.0
# through its RUNPATH, $ORIGIN/../lib), builds the trainer
# that docs/cpp.md shows (its ```cmake and ```cpp blocks, extracted from the
# page) against it with find_package(tailcut), and runs it as 3 processes on
# one queue: together they must read every line once. Then the same for the
# pooled loaders and trainers over a batch ring that docs/cpp.md shows (its
# second ```cmake block and the ```cpp block that starts "// ring_pipeline"):
# 2 trainers, then 2 loaders; the trainers together must get every line once.
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tailcut-install-XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/tailcut" || { echo "the CLI was not installed"; exit 1; }
for header in work_queue reader batch_ring version; do
  test -f "$work/prefix/include/tailcut/$header.h" || { echo "tailcut/$header.h was not installed"; exit 1; }
done

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
# block LANG N: the Nth ```LANG block of the page.
block() { awk -v lang="$1" -v want="$2" '$0 == "```" lang {n++; if (n == want) {on = 1; next}} on && /^```$/ {exit} on' "$doc"; }
# block_starting LANG FIRST_LINE: the ```LANG block whose first line is FIRST_LINE...
block_starting() {
  awk -v lang="$1" -v first="$2" '$0 == "```" lang {start = 1; next}
    start {start = 0; if (index($0, first) == 1) on = 1}
    on && /^```$/ {exit} on' "$doc"
}
block cmake 1 > "$work/src/CMakeLists.txt"
block cpp 1 > "$work/src/trainer.cc"
grep -q "int main" "$work/src/trainer.cc" || { echo "no program in docs/cpp.md"; exit 1; }
block cmake 2 >> "$work/src/CMakeLists.txt"
block_starting cpp "// ring_pipeline" > "$work/src/ring_pipeline.cc"
grep -q "add_executable(ring_pipeline" "$work/src/CMakeLists.txt" || { echo "no ring_pipeline target in docs/cpp.md"; exit 1; }
grep -q "int main" "$work/src/ring_pipeline.cc" || { echo "no ring_pipeline program in docs/cpp.md"; exit 1; }
# tailcut/version.h says the version the package says (tailcutConfigVersion.cmake).
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$(find "$work/prefix" -name tailcutConfigVersion.cmake)")
IFS=. read -r major minor patch <<< "$version"
printf '#include <tailcut/version.h>\nstatic_assert(TAILCUT_VERSION_MAJOR == %s && TAILCUT_VERSION_MINOR == %s && TAILCUT_VERSION_PATCH == %s);\nstatic_assert(sizeof(TAILCUT_VERSION_STRING) == sizeof("%s"));\n' \
  "$major" "$minor" "$patch" "$version" > "$work/version_check.cc"
c++ -std=c++20 -fsyntax-only -I"$work/prefix/include" "$work/version_check.cc" ||
  { echo "the installed tailcut/version.h does not say version $version"; exit 1; }
echo "tailcut/version.h: $version"
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

# Pooled: 2 trainers join the ring first (a ring that every process left
# closed is gone, and a late trainer would make a new one), then 2 loaders.
ring="install_ring_$$"
rqueue="install_pool_$$"
pids=()
cleanup_ring() {
  local pid
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  "$work/prefix/bin/tailcut" ring --rm "$ring" >/dev/null 2>&1 || true
  "$work/prefix/bin/tailcut" rm --force "$rqueue" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup_ring EXIT
for t in 0 1; do
  "$work/trainer/ring_pipeline" trainer "$ring" > "$work/ring_out$t" 2> "$work/ring_err$t" & pids+=($!)
done
for _ in $(seq 200); do
  trainers=$("$work/prefix/bin/tailcut" ring "$ring" 2>/dev/null | grep -c " trainer " || true)
  [[ $trainers == 2 ]] && break
  sleep 0.05
done
[[ $trainers == 2 ]] || { echo "the ring_pipeline trainers did not join: $(cat "$work"/ring_err*)"; exit 1; }
for l in 0 1; do
  "$work/trainer/ring_pipeline" loader "$ring" "$rqueue" 2 "$work"/data*.txt 2> "$work/loader_err$l" & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
pids=()
if (( status != 0 )); then
  echo "a ring_pipeline process failed:"; cat "$work"/ring_err* "$work"/loader_err*; exit 1
fi
grep -q "^trainer: arena: 2 MiB (8 slots of 256 KiB)" "$work/ring_err0" ||
  { echo "the trainer did not say its memory state: $(cat "$work/ring_err0")"; exit 1; }
read -r lines bytes < <(awk '{l += $1; b += $2} END {print l, b}' "$work"/ring_out*)
echo "2 loaders fed 2 trainers $lines lines ($bytes bytes) through the ring; expected $expect_lines ($expect_bytes)"
if [[ "$lines" != "$expect_lines" || "$bytes" != "$expect_bytes" ]]; then
  echo "install_test: FAILED"; exit 1
fi
for name in "$ring" "$rqueue"; do
  if ls /dev/shm | grep -q "\.$name\$"; then echo "install_test: $name left in /dev/shm"; exit 1; fi
done
echo "install_test: 2 passed, 0 failed"
