#!/usr/bin/env bash
# tests/tools/top_ring_test.sh TAILCUT HOLD_QUEUE HOLD_RING
#
# `tailcut top` with a batch ring: a queue held by hold_queue and its
# pooled loaders' ring (QUEUE.pool) held by hold_ring processes. Checks the
# fill level, a loader's batches/s over its lifetime (--once) and since the
# last refresh (live frames), a trainer waiting for batches flagged as
# starving, --ring alone, a ring removed under a ring-only view, and the
# errors. Exits 0 when every check passed; otherwise lists the failed ones.
set -u
if [[ $# -ne 3 ]]; then
  echo "usage: $0 TAILCUT HOLD_QUEUE HOLD_RING" >&2
  exit 2
fi
TAILCUT=$1
HOLD_QUEUE=$2
HOLD_RING=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tailcut_top_ring.XXXXXX")
name="topring_$$"
ring="$name.pool"
pids=()
failures=0
cleanup() {
  local pid
  for pid in "${pids[@]}" ${top_pid:-}; do { kill -9 "$pid"; wait "$pid"; } 2>/dev/null; done
  "$TAILCUT" ring --rm "$ring" >/dev/null 2>&1
  "$TAILCUT" rm --force "$name" >/dev/null 2>&1
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
  if grep -Eq -- "$1" <<<"$out"; then fail "$2: a line matches /$1/ in: $out"; fi
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
# The 5th column (batches/s) of the rows of ROLE in the last output, one per line.
rates_of() { awk -v role="$1" '$3 == role {print $5}' <<<"$out"; }

run "$TAILCUT" top --once
expect 2 "^tailcut: top needs a queue NAME, or --ring RING" "top with neither a queue nor a ring"
run "$TAILCUT" top --ring "no_such_ring_$$" --once
expect 1 "^tailcut: .*no_such_ring_$$" "a named ring that does not exist is an error naming it"

hold 0 "$HOLD_QUEUE" "$name" "$tmp/data" --take 1 --ack 0
run "$TAILCUT" top "$name" --once
expect 0 "^queue $name" "the queue alone"
refute "^ring " "no ring section while the queue has no ring"

# A loader published 3 batches into 4 slots: the ring is 3/4 full.
hold 1 "$HOLD_RING" "$ring" loader 3
run "$TAILCUT" top "$name" --once
expect 0 "^queue $name" "the queue is still shown"
expect 0 "^ring $ring +4 slots x 0.1 MiB +fill \[###############\.\.\.\.\.\] 3/4 ready +0 filling +0 popped +1 free" \
  "the ring QUEUE.pool is found and its fill level shown"
expect 0 "^batches 3 published +0 released .*state flowing" "its counters and state"
expect 0 "^ +[0-9]+ +[0-9]+ +loader +alive +[0-9.]+ +3 " "the loader's row"
[[ $(rates_of loader) != 0.0 ]] || fail "--once: a loader's batches/s over its lifetime is not 0 (got '$(rates_of loader)')"
refute "starving" "nobody starves without a trainer"

# A trainer pops all 3 and waits for more: starving.
hold 2 "$HOLD_RING" "$ring" trainer 3 --wait
for ((tries = 0; tries < 100; tries++)); do
  run "$TAILCUT" top "$name" --once
  grep -q "<- starving" <<<"$out" && break
  sleep 0.1
done
expect 0 "fill \[\.{20}\] 0/4 ready +0 filling +3 popped +1 free" "an empty ring"
expect 0 "state STARVING" "the ring's state"
expect 0 "^ +[0-9]+ +[0-9]+ +trainer +alive +[0-9.]+ +3 +[0-9]+ +[0-9.]+ +<- starving$" \
  "the waiting trainer is flagged as starving"

# Live: the first frame has lifetime rates, the next ones the change since
# the frame before. Nobody publishes now: the loader's rate drops to 0.0 and
# the trainer waits all the time.
timeout 2.5 "$TAILCUT" top "$name" >"$tmp/out" 2>"$tmp/err"
out=$(<"$tmp/out")
frames=$(grep -c "^ring $ring" <<<"$out")
((frames >= 2)) || fail "live: expected at least 2 frames with the ring in 2.5 s, got $frames"
mapfile -t loader_rates < <(rates_of loader)
[[ ${loader_rates[0]:-0.0} != 0.0 ]] || fail "live: first frame, loader rate over its lifetime (got '${loader_rates[*]}')"
[[ ${loader_rates[-1]:-} == 0.0 ]] || fail "live: later frame, loader rate since the last frame is 0.0 (got '${loader_rates[*]}')"
last_trainer=$(grep " trainer " <<<"$out" | tail -1)
[[ $last_trainer =~ " 100 ".*"<- starving" ]] || fail "live: the trainer waited 100% of the interval: '$last_trainer'"

# --ring alone: only the ring.
run "$TAILCUT" top --ring "$ring" --once
expect 0 "^ring $ring " "--ring shows the ring"
refute "^queue " "--ring without NAME shows no queue"
# `tailcut ring` still reads the same ring.
run "$TAILCUT" ring "$ring"
expect 0 "^state +STARVING" "tailcut ring agrees"

# A ring-only view ends when the ring is removed.
: >"$tmp/live"
"$TAILCUT" top --ring "$ring" >"$tmp/live" 2>&1 &
top_pid=$!
for ((tries = 0; tries < 100; tries++)); do grep -q "^ring $ring" "$tmp/live" && break; sleep 0.05; done
"$TAILCUT" ring --rm "$ring" >/dev/null
for ((tries = 0; tries < 100; tries++)); do kill -0 "$top_pid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$top_pid" 2>/dev/null; then
  fail "top --ring did not end when the ring was removed"
else
  wait "$top_pid" || fail "top --ring exited with status $? when the ring was removed"
  grep -q "^ring $ring is gone" "$tmp/live" || fail "top --ring did not say the ring is gone: $(<"$tmp/live")"
fi
top_pid=
run "$TAILCUT" top "$name" --once
expect 0 "^queue $name" "the queue outlives its ring"
refute "^ring " "a removed ring is not shown"

if ((failures)); then
  echo "top ring test: $failures failed" >&2
  exit 1
fi
echo "top ring test: all checks passed"
