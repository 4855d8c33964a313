#!/usr/bin/env bash
# tests/install/readme_cpp_test.sh BUILD_DIR README
#
# The README's C++ path as a user follows it: installs tailcut from BUILD_DIR
# into a temporary prefix, builds the README's ```cmake and ```cpp blocks
# against it with find_package(tailcut), and starts the program as 2
# processes on one queue over 3 files of lines: together they must count
# every line once, and leave no queue behind. A missing file must be an
# error that names it, and no arguments the usage line.
set -euo pipefail
build=$1 readme=$2
work=$(mktemp -d /tmp/tailcut-readme-cpp-XXXXXX)
trap 'rm -rf "$work"' EXIT

# block LANG: the first ```LANG block of the README.
block() { awk -v lang="$1" '$0 == "```" lang {on = 1; next} on && /^```$/ {exit} on' "$readme"; }
mkdir "$work/src"
block cmake > "$work/src/CMakeLists.txt"
block cpp > "$work/src/count_lines.cc"
grep -q "add_executable(count_lines count_lines.cc)" "$work/src/CMakeLists.txt" ||
  { echo "no count_lines target in the README's cmake block"; exit 1; }
grep -q "int main" "$work/src/count_lines.cc" || { echo "no program in the README's cpp block"; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
program=$work/build/count_lines

expect=0
for f in 0 1 2; do
  for ((i = 0; i < 4000; i++)); do echo "file $f line $i"; done > "$work/part-$f.txt"
  expect=$((expect + 4000))
done
queue="readme_cpp_$$"
"$program" "$queue" "$work"/part-*.txt > "$work/out0" &
first=$!
"$program" "$queue" "$work"/part-*.txt > "$work/out1"
wait "$first"
got=$(($(cat "$work/out0") + $(cat "$work/out1")))
((got == expect)) || { echo "2 processes counted $got lines, not $expect"; exit 1; }
if ls /dev/shm | grep -q "$queue"; then echo "the queue was left behind: $(ls /dev/shm | grep "$queue")"; exit 1; fi

if "$program" "missing_$$" "$work/no-such-file.txt" 2> "$work/err"; then
  echo "a missing file was not an error"; exit 1
fi
grep -q "no-such-file.txt" "$work/err" || { echo "the error does not name the file:"; cat "$work/err"; exit 1; }
if "$program" 2> "$work/err"; then echo "no arguments was not an error"; exit 1; fi
grep -q "^usage: count_lines" "$work/err" || { echo "no usage line:"; cat "$work/err"; exit 1; }
echo "the README's C++ program: 2 processes counted $got lines, each once"
