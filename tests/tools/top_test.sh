#!/usr/bin/env bash
# tailcut top against a real queue: three holders, one killed with SIGKILL, one
# reading records without acking (as a reader that shuffles), and one that
# leaves cleanly (as a DataLoader worker at its epoch's end).
#   top_test.sh TAILCUT HOLD_QUEUE
set -euo pipefail
tailcut=$1 hold=$2
dir=$(mktemp -d /tmp/tailcut-top-XXXXXX)
name="top_test_$$"
cleanup() {
  kill "${holders[@]}" "${sleeper:-}" 2>/dev/null || true
  "$tailcut" rm --force "$name" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
holders=()
trap cleanup EXIT
fail() { echo "top_test: FAILED: $*"; echo "--- output:"; cat "$dir/out"; exit 1; }

# Holder A takes 3 items and acks 2; holder B takes 2 and acks 0, then dies.
# The holders hold the queue until their stdin ends: feed them from a sleeper
# that cleanup kills (its output must not keep the test's pipes open).
exec 3< <(exec sleep 60 2>/dev/null)
sleeper=$!
"$hold" "$name" "$dir/data" --take 3 --ack 2 <&3 > "$dir/a" & holders+=($!)
"$hold" "$name" "$dir/data" --take 2 --ack 0 <&3 > "$dir/b" & holders+=($!)
"$hold" "$name" "$dir/data" --take 1 --ack 0 --records 500 <&3 > "$dir/c" & holders+=($!)
for f in a b c; do
  for _ in $(seq 100); do grep -q ready "$dir/$f" && break; sleep 0.05; done
  grep -q ready "$dir/$f" || fail "holder $f did not get ready"
done
# Holder d takes and acks one item and leaves at once (stdin is empty). It
# starts last: a client slot freed before another joins is that one's.
"$hold" "$name" "$dir/data" --take 1 --ack 1 < /dev/null > "$dir/d" || fail "holder d failed"
kill -9 "${holders[1]}"; wait "${holders[1]}" 2>/dev/null || true

"$tailcut" top "$name" --once > "$dir/out"
grep -q "queue $name" "$dir/out" || fail "no header"
grep -q "epoch 1/2" "$dir/out" || fail "no epoch"
grep -qE "done 3 +in flight" "$dir/out" || fail "done count"
# Live clients and every join: a count that grows per epoch with DataLoader
# workers is labelled as such, and those that left cleanly are one line.
grep -q "clients 2 live, 4 joined since the start (1 expected)" "$dir/out" || fail "client counts"
grep -q "(1 more gone: closed the queue with nothing open)" "$dir/out" || fail "clean leaver"
# Holder c acked nothing but read 500 records: its rates move all the same.
cpid=$(awk '{print $2}' "$dir/c")
grep -qE "^ +[0-9]+ +$cpid +alive +[0-9]+\.[0-9] +[1-9][0-9]* +[0-9.]+ +0 +1 " "$dir/out" ||
  fail "the reading client shows no items/s and records/s"
grep -qE " alive " "$dir/out" || fail "no live client row"
grep -qE " gone .*items recovered" "$dir/out" || fail "the killed client is not shown as recovered"
grep -qE "recovered 2 " "$dir/out" || fail "its 2 items were not recovered"

# The live view keeps refreshing (frames separated by blank lines off a TTY).
timeout 2.5 "$tailcut" top "$name" > "$dir/out" || true
frames=$(grep -c "^queue $name" "$dir/out")
(( frames >= 2 )) || fail "expected at least 2 frames in 2.5 s, got $frames"

if "$tailcut" top "no_such_queue_$$" --once > "$dir/out" 2>&1; then fail "top of a missing queue succeeded"; fi
grep -q "does not exist" "$dir/out" || fail "missing queue message"
echo "top_test: 1 passed, 0 failed"
