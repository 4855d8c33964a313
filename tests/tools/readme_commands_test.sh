#!/usr/bin/env bash
# tests/tools/readme_commands_test.sh README BUILD_DIR
#
# The README's fresh-machine commands, as .ci/readme-commands extracts them
# for CI, must still fit the tree: exactly two commands; every script they
# name (.ci/..., tools/...) exists and is executable; a program run from
# DIR/bin/ is one this build makes (it is in BUILD_DIR/bin) and DIR is the
# directory the same command configured with -B and built with --build; every
# -DNAME=VALUE sets a CMAKE_ variable or an option of the project's CMake files
# (CMake only warns about a name it does not know, and the first command would
# quietly build what it means to leave out).
set -u
readme=$1 build=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

mapfile -t commands < <("$root/.ci/readme-commands" "$readme")
((${#commands[@]} == 2)) || fail "expected 2 commands in the first sh block of $readme, found ${#commands[@]}"

for command in "${commands[@]}"; do
  read -ra words <<<"$command"
  configured="" built=""
  for ((i = 0; i < ${#words[@]}; i++)); do
    word=${words[i]}
    next=${words[i + 1]:-}
    case $word in
      -B) configured=$next ;;
      -D*=*)
        name=${word#-D} name=${name%%=*} name=${name%%:*}
        [[ $name == CMAKE_* ]] ||
          grep -rqsE --include=CMakeLists.txt "^[[:space:]]*(option|set)\($name[[:space:]]" "$root" ||
          fail "'$command': -D$name is no option of the project's CMake files" ;;
      --build) built=$next ;;
      .ci/* | tools/* | tests/* | bench/*)
        [[ -f $root/$word && -x $root/$word ]] || fail "'$command': $word is not an executable script" ;;
      */bin/*)
        dir=${word%%/bin/*} program=${word#*/bin/}
        [[ -x $build/bin/$program ]] || fail "'$command': $program is not a program this build makes"
        [[ $dir == "$configured" ]] || fail "'$command': runs $word but configured '-B $configured'"
        [[ $dir == "$built" ]] || fail "'$command': runs $word but built '--build $built'" ;;
    esac
  done
done

if ((failures)); then
  echo "readme_commands_test: $failures check(s) failed" >&2
  exit 1
fi
printf 'readme command: %s\n' "${commands[@]}"
echo "readme_commands_test: all checks passed"
