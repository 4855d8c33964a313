#!/usr/bin/env bash
# tests/tools/clean_test.sh TAILCUT HOLD_QUEUE HOLD_RING
#
# `tailcut clean` against real queues and batch rings: what no live process
# uses is removed (with the pool files of a removed ring: description,
# failure record, status, a temporary file), what a live process holds is
# left alone, --dry-run removes nothing, and only names under the PREFIX
# given are touched. Also the KEPT column of `tailcut ls`
# for a later torchrun attempt's queue. Exits 0 when every check passed.

set -u
if [[ $# -ne 3 ]]; then
  echo "usage: $0 TAILCUT HOLD_QUEUE HOLD_RING" >&2
  exit 2
fi
TAILCUT=$1
HOLD_QUEUE=$2
HOLD_RING=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tailcut_clean_test.XXXXXX")
p="cleantest_$$"
other="cleantestother_$$"
attempt="torchrun-cleantest$$-0123456789ab-1"
pool="/dev/shm/tailcut-pool.$(id -u)"
pids=()
failures=0
cleanup() {
  local pid
  for pid in "${pids[@]}"; do [[ -n $pid ]] && { kill -9 "$pid"; wait "$pid"; } 2>/dev/null; done
  for q in "${p}_live" "${p}_dead" "$other" "$attempt"; do "$TAILCUT" rm --force "$q" >/dev/null 2>&1; done
  for r in "${p}_live.pool" "${p}_dead.pool"; do "$TAILCUT" ring --rm "$r" >/dev/null 2>&1; done
  rm -f "$pool.${p}"_* "$pool.$other".*
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; out=$(<"$tmp/out"); err=$(<"$tmp/err"); }
expect() {  # expect RC REGEX WHAT: the last run exited RC and printed a line matching REGEX
  [[ $rc -eq $1 ]] || fail "$3: exit $rc, want $1 (out '$out', err '$err')"
  grep -Eq -- "$2" <<<"$out$err" || fail "$3: no line matches /$2/ in: $out$err"
}
absent() {  # absent REGEX WHAT: no line of the last run's output matches REGEX
  ! grep -Eq -- "$1" <<<"$out$err" || fail "$2: a line matches /$1/ in: $out$err"
}
# hold INDEX PROGRAM ARGS...: a holder with a pipe on stdin, waited for until ready.
hold() {
  local i=$1
  shift
  mkfifo "$tmp/in$i"
  "$@" <"$tmp/in$i" >"$tmp/hold$i.out" 2>"$tmp/hold$i.err" &
  pids[$i]=$!
  eval "exec {fd$i}>\"$tmp/in$i\""
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    grep -q '^ready ' "$tmp/hold$i.out" 2>/dev/null && return 0
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "FATAL: holder $i: $(<"$tmp/hold$i.err")" >&2; exit 1; }
    sleep 0.05
  done
  echo "FATAL: holder $i not ready" >&2
  exit 1
}
kill_holder() { { kill -9 "${pids[$1]}"; wait "${pids[$1]}"; } 2>/dev/null; pids[$1]=; }

hold 0 "$HOLD_QUEUE" "${p}_live" "$tmp/data"
hold 1 "$HOLD_QUEUE" "${p}_dead" "$tmp/data"
hold 2 "$HOLD_QUEUE" "$other" "$tmp/data"
hold 3 "$HOLD_QUEUE" "$attempt" "$tmp/data"
hold 4 "$HOLD_RING" "${p}_live.pool" trainer 0
hold 5 "$HOLD_RING" "${p}_dead.pool" loader 2
kill_holder 1
kill_holder 2
kill_holder 3
kill_holder 5
for r in "${p}_live.pool" "${p}_dead.pool" "${p}_gone.pool"; do
  echo '{}' >"$pool.$r.json"
done
echo '{}' >"$pool.${p}_dead.pool.error"
echo '{}' >"$pool.${p}_dead.pool.status"
echo '{}' >"$pool.${p}_live.pool.status"
echo '{' >"$pool.${p}_gone.pool.status.4242.tmp"

run "$TAILCUT" ls
expect 0 "^$attempt .* a process of it died; a rerun starts at attempt 0 and removes it\$" \
  "ls: a later attempt's queue is not resumed by a rerun"
expect 0 "^${p}_dead .* a process of it died, so a rerun resumes it\$" "ls: other queues keep the reason"

run "$TAILCUT" clean --dry-run "$p"
expect 0 "^would remove queue ${p}_dead \\(no live process, unfinished\\)" "dry run: the dead queue"
expect 0 "^would remove batch ring ${p}_dead.pool \\(no live process\\)" "dry run: the dead ring"
expect 0 "^would remove pool description $pool.${p}_gone.pool.json" "dry run: a description without ring"
[[ -e /dev/shm/tailcut.$(id -u).${p}_dead && -e /dev/shm/tailcut-ring.$(id -u).${p}_dead.pool ]] ||
  fail "--dry-run removed something"

run "$TAILCUT" clean "$p"
expect 0 "^removed queue ${p}_dead " "the dead queue"
expect 0 "^removed batch ring ${p}_dead.pool " "the dead ring"
expect 0 "^removed pool description $pool.${p}_dead.pool.json " "the dead ring's description"
expect 0 "^removed pool failure record $pool.${p}_dead.pool.error " "the dead ring's failure record"
expect 0 "^removed pool status $pool.${p}_dead.pool.status " "the dead ring's status"
expect 0 "^removed pool temporary file of its status $pool.${p}_gone.pool.status.4242.tmp " \
  "a status half written by a process killed"
expect 0 "^removed pool description $pool.${p}_gone.pool.json " "a description without ring"
expect 0 "^removed 7 objects; 2 in use by live processes left alone\$" "the summary"
absent "${p}_live" "nothing live is named"
absent "$other|$attempt" "nothing outside the prefix"
[[ -e /dev/shm/tailcut.$(id -u).${p}_live ]] || fail "the live queue was removed"
[[ -e /dev/shm/tailcut-ring.$(id -u).${p}_live.pool && -e "$pool.${p}_live.pool.json" &&
   -e "$pool.${p}_live.pool.status" ]] || fail "the live ring, its description or status was removed"
[[ -e /dev/shm/tailcut.$(id -u).$other ]] || fail "a queue outside the prefix was removed"
[[ ! -e /dev/shm/tailcut.$(id -u).${p}_dead && ! -e /dev/shm/tailcut-ring.$(id -u).${p}_dead.pool ]] ||
  fail "the dead queue or ring is still there"

if ((failures)); then
  echo "clean test: $failures failed" >&2
  exit 1
fi
echo "clean test: all checks passed"
