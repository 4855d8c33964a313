#!/usr/bin/env bash
# Every C++ file of the project is formatted as .clang-format says (Debian
# 12's clang-format 14). Fix a failure with:
#   clang-format -i $(git ls-files '*.cc' '*.h')
# Usage: format_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 2
if ! command -v clang-format >/dev/null; then
  echo "clang-format is not installed (apt-get install clang-format); skipping"
  exit 77
fi
mapfile -t files < <(find engine io pool global bindings tools tests bench \
                       \( -name '*.cc' -o -name '*.h' \) -not -path '*/corpus/*' | sort)
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "${#bad[@]} of ${#files[@]} files are not formatted ($(clang-format --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix: clang-format -i ${bad[*]}"
  exit 1
fi
echo "${#files[@]} files formatted"
