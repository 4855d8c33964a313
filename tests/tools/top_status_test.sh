#!/usr/bin/env bash
# tests/tools/top_status_test.sh TAILCUT HOLD_QUEUE HOLD_RING
#
# `tailcut top` with a pool's status file (/dev/shm/tailcut-pool.<uid>.
# RING.status, what a PooledLoader's local rank 0 writes): the autoscale
# line with its last decisions and the shares line, from good files; one
# "unreadable" line, never a crash, for damaged ones (truncated, not JSON,
# binary, too large, a missing or mistyped field, a symbolic link, a file
# others may read); nothing extra when there is no status or it holds
# neither part. The queue and its ring are held by real processes. Exits 0
# when every check passed; otherwise lists the failed ones.
set -u
if [[ $# -ne 3 ]]; then
  echo "usage: $0 TAILCUT HOLD_QUEUE HOLD_RING" >&2
  exit 2
fi
TAILCUT=$1
HOLD_QUEUE=$2
HOLD_RING=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tailcut_top_status.XXXXXX")
name="topstatus_$$"
ring="$name.pool"
status="/dev/shm/tailcut-pool.$(id -u).$ring.status"
pids=()
failures=0
cleanup() {
  local pid
  for pid in "${pids[@]}"; do { kill -9 "$pid"; wait "$pid"; } 2>/dev/null; done
  "$TAILCUT" ring --rm "$ring" >/dev/null 2>&1
  "$TAILCUT" rm --force "$name" >/dev/null 2>&1
  rm -f "$status"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; out=$(<"$tmp/out"); err=$(<"$tmp/err"); }
expect() {  # expect RC REGEX WHAT: the last run exited RC and printed a line matching REGEX
  [[ $rc -eq $1 ]] || fail "$3: exit $rc, want $1 (out '$out', err '$err')"
  grep -Eq -- "$2" <<<"$out$err" || fail "$3: no line matches /$2/ in: $out$err"
}
refute() {  # refute REGEX WHAT: no line of the last run's output matches REGEX
  if grep -Eq -- "$1" <<<"$out$err"; then fail "$2: a line matches /$1/ in: $out$err"; fi
}
# hold INDEX PROGRAM ARGS...: a holder with a pipe on stdin, waited for until ready.
hold() {
  local index=$1
  shift
  mkfifo "$tmp/in$index"
  "$@" <"$tmp/in$index" >"$tmp/hold$index.out" 2>"$tmp/hold$index.err" &
  pids[index]=$!
  eval "exec {fd$index}>\"$tmp/in$index\""
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    grep -q '^ready ' "$tmp/hold$index.out" 2>/dev/null && return 0
    kill -0 "${pids[index]}" 2>/dev/null || { echo "FATAL: holder $index: $(<"$tmp/hold$index.err")" >&2; exit 1; }
    sleep 0.05
  done
  echo "FATAL: holder $index not ready" >&2
  exit 1
}
# put TEXT: the status file holds TEXT, private to this user as a pool writes it.
put() { rm -f "$status"; (umask 077; printf '%s' "$1" >"$status"); }
top_once() { run env TZ=UTC "$TAILCUT" top "$name" --once; }

hold 0 "$HOLD_QUEUE" "$name" "$tmp/data"
hold 1 "$HOLD_RING" "$ring" loader 1

# No status: the ring's part as before, nothing more.
top_once
expect 0 "^ring $ring " "the ring is shown"
refute "^(autoscale|shares|pool status)" "nothing extra without a status file"

# Autoscale: 12:00:01 UTC is 1767268801 (2026-01-01); the last decision on
# the first line, the earlier ones newest first below it.
decisions='[{"time": 1767268790.5, "action": "add", "before": 1, "after": 2, "why": "trainers waited 88% of the last 0.27 s"},
            {"time": 1767268795.0, "action": "remove", "before": 2, "after": 1, "why": "the ring stayed full for 2.0 s"},
            {"time": 1767268801.2, "action": "add", "before": 1, "after": 3, "why": "trainers waited 34% of the last 0.25 s"}]'
put "{\"version\": 1, \"pid\": 1, \"ring\": \"$ring\", \"autoscale\": {\"min\": 1, \"max\": 8, \"loaders\": 3, \"decisions\": $decisions}}"
top_once
expect 0 "^autoscale 3 loaders \(min 1, max 8\): last \+2 at 12:00:01 \(1 -> 3\), trainers waited 34% of the last 0.25 s$" \
  "the autoscale line: loaders, bounds, the last decision and why"
expect 0 "^  earlier: -1 at 11:59:55 \(2 -> 1\), the ring stayed full for 2.0 s$" "the decision before it"
expect 0 "^  earlier: \+1 at 11:59:50 \(1 -> 2\), trainers waited 88%" "the first decision"
refute "^shares" "no shares line without balance"
[[ $(grep -n "^autoscale" <<<"$out" | cut -d: -f1) -gt $(grep -n "^ring $ring" <<<"$out" | cut -d: -f1) ]] ||
  fail "the autoscale line is under the ring: $out"

put "{\"version\": 1, \"autoscale\": {\"min\": 2, \"max\": 4, \"loaders\": 2, \"decisions\": []}}"
top_once
expect 0 "^autoscale 2 loaders \(min 2, max 4\): no decision yet$" "autoscale before its first decision"

# Shares, with speeds, and before any speed was measured.
put '{"version": 1, "balance": {"records": [40, 40, 32, 16], "speeds": [1250.4, 1240, 990, 500], "step": 16, "time": 1767268803}}'
top_once
expect 0 "^shares  r0 40  r1 40  r2 32  r3 16 records/step \(speeds r0 1250  r1 1240  r2 990  r3 500 records/s, decided at step 16, 12:00:03\)$" \
  "the shares line"
refute "^autoscale" "no autoscale line without autoscale"
put '{"version": 1, "balance": {"records": [32, 32], "speeds": [0, 0], "step": 0, "time": 1767268803}}'
top_once
expect 0 "^shares  r0 32  r1 32 records/step \(equal: no speeds measured yet\)$" "equal shares before a decision"

# Many ranks: the first 64 shown, the rest counted.
put "{\"version\": 1, \"balance\": {\"records\": [$(seq -s, 1 70)], \"speeds\": [$(seq -s, 101 170)], \"step\": 8, \"time\": 1767268803}}"
top_once
expect 0 "^shares  r0 1  r1 2 .*  r63 64 \.\.\. 6 more ranks records/step \(speeds r0 101 .*  r63 164 \.\.\. 6 more ranks records/s" \
  "64 ranks shown of 70"

# Neither part: nothing.
put '{"version": 1, "pid": 1, "ring": "x"}'
top_once
refute "^(autoscale|shares|pool status)" "a status with neither part shows nothing"

# Damaged files: one line each, exit 0, the ring still shown.
unreadable() {  # unreadable WHY WHAT: top shows the ring and says the status is unreadable
  top_once
  expect 0 "^ring $ring " "$2: the ring is still shown"
  expect 0 "^pool status $status: unreadable \($1" "$2"
  [[ $(grep -c "pool status" <<<"$out") -eq 1 ]] || fail "$2: not one line: $out"
}
good="{\"version\": 1, \"autoscale\": {\"min\": 1, \"max\": 8, \"loaders\": 3, \"decisions\": $decisions}}"
put "${good:0:60}"
unreadable "not JSON" "a truncated status"
put "not json at all"
unreadable "not JSON" "a status that is not JSON"
rm -f "$status"; (umask 077; head -c 3000 /dev/urandom >"$status")
unreadable "not JSON" "a binary status"
put '[1, 2, 3]'
unreadable "not a JSON object" "a JSON list"
rm -f "$status"; (umask 077; { printf '{"version": 1, "pad": "'; head -c 70000 /dev/zero | tr '\0' x; printf '"}'; } >"$status")
unreadable "more than the 65536 bytes" "a huge status"
put '{"version": 2, "autoscale": {}}'
unreadable "version 2, this top reads 1" "a status of another version"
put '{"version": 1, "autoscale": {"min": 1, "max": 8, "decisions": []}}'
unreadable "no field 'loaders'" "a missing field"
put '{"version": 1, "autoscale": {"min": -1, "max": 8, "loaders": 1, "decisions": []}}'
unreadable "'min' is not a count" "a negative count"
put '{"version": 1, "autoscale": {"min": 1, "max": 8, "loaders": 1, "decisions": [{"time": 1, "action": "add", "before": 3, "after": 2, "why": ""}]}}'
unreadable "a decision to add that does not" "a decision that contradicts itself"
put '{"version": 1, "autoscale": {"min": 1, "max": 8, "loaders": 1, "decisions": [{"time": 1e300, "action": "add", "before": 1, "after": 2, "why": ""}]}}'
unreadable "a time past" "a time out of range"
put '{"version": 1, "balance": {"records": [8, 8], "speeds": [1], "step": 0, "time": 1}}'
unreadable "'records' and 'speeds' are not one per rank" "speeds and records of different ranks"
put '{"version": 1, "balance": {"records": [8, "x"], "speeds": [1, 1], "step": 0, "time": 1}}'
unreadable "a rank's records are not a count" "a rank's records that are text"
# A reason with terminal escapes is shown with them made harmless.
put "{\"version\": 1, \"autoscale\": {\"min\": 1, \"max\": 8, \"loaders\": 2, \"decisions\": [{\"time\": 1, \"action\": \"add\", \"before\": 1, \"after\": 2, \"why\": \"\\u001b[2Jgone\"}]}}"
top_once
expect 0 "^autoscale 2 loaders .*, \?\[2Jgone$" "control bytes in a reason are replaced"
# Not a private file of this user, or not a file at all.
put "$good"
chmod 644 "$status"
unreadable "not a private file of user $(id -u)" "a status others may read"
rm -f "$status"
ln -s "$tmp/out" "$status"
unreadable "a symbolic link" "a symbolic link"
rm -f "$status"
mkfifo -m 600 "$status"
unreadable "not a regular file" "a fifo (top must not block on it)"
rm -f "$status"

if ((failures)); then
  echo "top status test: $failures failed" >&2
  exit 1
fi
echo "top status test: all checks passed"
