#!/usr/bin/env bash
# tests/tools/ring_cli_test.sh TAILCUT HOLD_RING
#
# Drives `tailcut ring` against a real batch ring held by hold_ring
# processes: a loader that published three batches, then a trainer that
# popped them all (the ring is then STARVING), --json, a killed trainer
# whose batch is redelivered, --rm, and the errors for a missing ring.
# Exits 0 when every check passed; otherwise lists the failed ones.
set -u
if [[ $# -ne 2 ]]; then
  echo "usage: $0 TAILCUT HOLD_RING" >&2
  exit 2
fi
TAILCUT=$1
HOLD=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tailcut_ring_cli.XXXXXX")
name="ringcli_$$"
pids=()
failures=0
cleanup() {
  local pid
  for pid in "${pids[@]}"; do { kill -9 "$pid"; wait "$pid"; } 2>/dev/null; done
  "$TAILCUT" ring --rm "$name" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; out=$(<"$tmp/out"); err=$(<"$tmp/err"); }
expect() {  # expect RC REGEX WHAT: the last run exited RC and printed a line matching REGEX
  [[ $rc -eq $1 ]] || fail "$3: exit $rc, want $1 (out '$out', err '$err')"
  grep -Eq -- "$2" <<<"$out$err" || fail "$3: no line matches /$2/ in: $out$err"
}
# hold INDEX ROLE COUNT: a holder with a pipe on stdin, waited for until ready.
hold() {
  mkfifo "$tmp/in$1"
  "$HOLD" "$name" "$2" "$3" <"$tmp/in$1" >"$tmp/hold$1.out" 2>"$tmp/hold$1.err" &
  pids[$1]=$!
  eval "exec {fd$1}>\"$tmp/in$1\""
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    grep -q '^ready ' "$tmp/hold$1.out" 2>/dev/null && return 0
    kill -0 "${pids[$1]}" 2>/dev/null || { echo "FATAL: holder $1: $(<"$tmp/hold$1.err")" >&2; exit 1; }
    sleep 0.05
  done
  echo "FATAL: holder $1 not ready" >&2
  exit 1
}

run "$TAILCUT" ring "$name"
expect 1 "^tailcut: .*$name" "a missing ring is an error naming it"
run "$TAILCUT" ring --rm "$name"
expect 1 "^tailcut: no batch ring '$name'" "removing a missing ring"
run "$TAILCUT" ring
expect 2 "^tailcut: " "ring without a name is a usage error"

hold 0 loader 3
run "$TAILCUT" ring "$name"
expect 0 "^slots +4 x 0.1 MiB: 1 free, 0 filling, 3 ready, 0 popped" "three batches ready"
expect 0 "^state +flowing" "no trainer yet: flowing"
expect 0 "loader +alive +3 " "the loader's row counts its batches"

hold 1 trainer 3
run "$TAILCUT" ring "$name"
expect 0 "0 ready, 3 popped" "the trainer holds all three"
expect 0 "^state +STARVING" "a live trainer with nothing ready is flagged"
expect 0 "trainer +alive +3 " "the trainer's row counts its pops"

run "$TAILCUT" ring "$name" --json
expect 0 '"published": 3' "--json has the counters"
python3 -c 'import json,sys; d=json.load(sys.stdin); assert {c["role"] for c in d["clients"]} == {"loader","trainer"}, d' \
  <"$tmp/out" || fail "--json parses and names the roles"

{ kill -9 "${pids[1]}"; wait "${pids[1]}"; } 2>/dev/null; pids[1]=
run "$TAILCUT" ring "$name"
expect 0 "3 ready, 0 popped" "a killed trainer's batches are ready again"
expect 0 "3 redelivered" "and counted as redelivered"

run "$TAILCUT" ring --rm "$name"
expect 0 "^removed batch ring $name" "--rm removes the ring"
run "$TAILCUT" ring "$name"
expect 1 "^tailcut: " "it is gone"

if ((failures)); then
  echo "ring cli test: $failures failed" >&2
  exit 1
fi
echo "ring cli test: all checks passed"
