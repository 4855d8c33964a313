#!/usr/bin/env bash
# Every C++ file of the project is formatted as .clang-format says (Debian
# 12's clang-format 14). Fix a failure with:
#   clang-format -i $(git ls-files '*.cc' '*.h')
# Usage: format_test.sh SOURCE_DIR
#
# clang-format checks many files per call, one call per core at a time
# (xargs -P): a process per file, one after another, took 33 s on 2 cores
# and timed out beside the other tests.
set -uo pipefail
cd "$1" || exit 2
if ! command -v clang-format >/dev/null; then
  echo "clang-format is not installed (apt-get install clang-format); skipping"
  exit 77
fi
mapfile -t files < <(find engine io pool global bindings tools tests bench \
                       \( -name '*.cc' -o -name '*.h' \) -not -path '*/corpus/*' | sort)
# --dry-run -Werror names each unformatted file in lines
# "FILE:LINE:COL: error: code should be clang-formatted [...]" and goes on
# to the next file; anything else it says (an unreadable file, a bad
# .clang-format) is an error of its own.
report=$(printf '%s\0' "${files[@]}" |
         xargs -0 -P "$(nproc)" -n 32 clang-format --dry-run -Werror 2>&1 >/dev/null)
status=$?
mapfile -t bad < <(sed -nE 's/^(.+):[0-9]+:[0-9]+: error: code should be clang-formatted.*/\1/p' \
                     <<<"$report" | sort -u)
if ((${#bad[@]})); then
  echo "${#bad[@]} of ${#files[@]} files are not formatted ($(clang-format --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix: clang-format -i ${bad[*]}"
  exit 1
fi
if ((status != 0)); then
  echo "clang-format failed (xargs exit status $status):"
  echo "$report"
  exit 1
fi
echo "${#files[@]} files formatted"
