#!/usr/bin/env bash
# Build options for projects that use tailcut's source tree (docs/cpp.md,
# "Building"): configures, in a temporary directory,
#   1. a library-only build (-DTAILCUT_BUILD_TOOLS=OFF and the tests,
#      benchmarks, Python module and cross-host tier off) with CLI11 and
#      nlohmann-json made unfindable: it must configure, offer the library and
#      no program, and build libtailcut;
#   2. tests/install/parent_project, which adds tailcut with add_subdirectory
#      and checks (at configure time) that its own variables and targets are as
#      it set them; then that tailcut's programs and libraries land in the
#      parent's output directories, libtailcut_global beside libtailcut.
# Usage: build_options_test.sh SOURCE_DIR [CMAKE_ARGS...] (e.g. the compiler
# launcher of the build that runs it, so that ccache serves step 1).
set -euo pipefail
src=$1; shift
work=$(mktemp -d /tmp/tailcut-build-options-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "build_options_test: FAILED: $*"; exit 1; }

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# 1. Library only.
if ! cmake -S "$src" -B "$work/libonly" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTAILCUT_BUILD_TOOLS=OFF -DTAILCUT_BUILD_TESTS=OFF -DTAILCUT_BUILD_BENCHMARKS=OFF \
    -DTAILCUT_BUILD_PYTHON=OFF -DTAILCUT_BUILD_GLOBAL=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
    "$@" > "$work/libonly.log" 2>&1; then
  cat "$work/libonly.log"; fail "a library-only build does not configure without CLI11 and nlohmann-json"
fi
cmake --build "$work/libonly" --target help > "$work/targets.txt"
grep -qE '(^|[^_[:alnum:]])tailcut([^_[:alnum:]]|$)' "$work/targets.txt" ||
  fail "the library-only build has no tailcut target"
for program in tailcut_cli tailcut_demo tailcut_trainer_sim; do
  ! grep -q "$program" "$work/targets.txt" || fail "the library-only build has $program"
done
cmake --build "$work/libonly" --target tailcut > "$work/libonly_build.log" 2>&1 ||
  { tail -30 "$work/libonly_build.log"; fail "libtailcut does not build in a library-only build"; }
echo "library-only build: configured without CLI11 and nlohmann-json; libtailcut built, no programs"

# 2. A parent project.
if ! cmake -S "$src/tests/install/parent_project" -B "$work/parent" "${generator[@]}" \
    -DTAILCUT_SOURCE_DIR="$src" "$@" > "$work/parent.log" 2>&1; then
  cat "$work/parent.log"; fail "the parent project does not configure"
fi
dirs=$work/parent/output_dirs.txt
dir_of() { awk -v t="$1" '$1 == t {print $2}' "$dirs"; }
[[ $(dir_of parent_app) == "$work/parent/parent_bin" ]] ||
  fail "the parent's program is in $(dir_of parent_app), not its parent_bin"
[[ $(dir_of tailcut) == "$work/parent/parent_lib" ]] ||
  fail "libtailcut is in $(dir_of tailcut), not the parent's parent_lib"
[[ $(dir_of tailcut_cli) == "$work/parent/parent_bin" ]] ||
  fail "the tailcut CLI is in $(dir_of tailcut_cli), not the parent's parent_bin"
if grep -q '^tailcut_global ' "$dirs"; then
  [[ $(dir_of tailcut_global) == "$(dir_of tailcut)" ]] ||
    fail "libtailcut_global is in $(dir_of tailcut_global), not beside libtailcut in $(dir_of tailcut)"
fi
echo "parent project: its settings kept; tailcut's outputs in its directories ($(wc -l < "$dirs") targets)"
echo "build_options_test: 2 passed, 0 failed"
