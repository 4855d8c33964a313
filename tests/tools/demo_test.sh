#!/usr/bin/env bash
# tests/tools/demo_test.sh DEMO
#
# tailcut-demo (the README's first command) at a small scale: 16384 records
# of 256 bytes, one epoch, both acts; 400 us per record so that the tailcut
# run lasts long enough (about a second) for the kill part-way. Every run must end with its
# exactly-once check passed: static sharding and tailcut (with the SIGKILL),
# then the synchronous trainers with per-trainer loaders and with one pool,
# where every record is in exactly one released batch. The run must leave
# nothing of its own in /dev/shm. No timing is checked: CI machines are
# shared, and the full demo is run as the README spells it.
set -u
demo=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$demo" --records 16384 --record-bytes 256 --files 4 --epochs 1 --cost-us 400 --dir "$dir/data" \
  --plot "$dir/demo.png" >"$dir/out" 2>"$dir/err" &
pid=$!
wait "$pid"
rc=$?
cat "$dir/out"
((rc == 0)) || fail "tailcut-demo exited with $rc: $(cat "$dir/err")"

expect() { grep -qE -- "$1" "$dir/out" || fail "no line matching '$1'"; }
# The first act.
expect '^  static   epoch 0: 16384 of 16384 records trained on, id checksum matches -> every record exactly once$'
expect '^  tailcut  epoch 0: 16384 of 16384 records trained on, id checksum matches -> every record exactly once$'
expect 'killing process 0 \(pid [0-9]+\) with SIGKILL'
# The second act: its table, and both runs' checks.
expect '^  per-trainer loaders +[0-9.]+ s +[0-9]+ +[0-9.]+ ms +[0-9.]+ ms +[0-9.]+x$'
expect '^  one pool \(BatchRing\) +[0-9.]+ s +[0-9]+ +[0-9.]+ ms +[0-9.]+ ms +[0-9.]+x$'
expect '^  per-trainer / pool +[0-9.]+x'
for run in per-rank pooled; do
  line=$(grep -A1 "^  $(printf '%-8s' "$run") epoch 0: " "$dir/out")
  grep -qE 'trained on \+ [0-9]+ left over by equal steps = 16384 of 16384 records,' <<<"$line" ||
    fail "$run: records trained on and left over do not add up to 16384"
  grep -q 'id checksum matches -> every record in exactly one released batch$' <<<"$line" ||
    fail "$run: not every record in exactly one released batch"
  expect "^  $(printf '%-8s' "$run") ([0-9]+) batches published, \\1 released"
done
# A pool runs dry for every trainer at once: the ones that still got a batch
# hold the only leftovers, at most trainers - 1 = 3 batches.
left=$(sed -nE 's/^  pooled   [0-9]+ batches published, [0-9]+ released \(([0-9]+) of them.*/\1/p' "$dir/out")
[[ -n $left && $left -le 3 ]] || fail "pooled: $left batches left over, expected at most 3"
expect '^  exactly once per epoch, every run: yes$'

if ls /dev/shm | grep -q "tailcut-demo\.$pid\."; then
  fail "left in /dev/shm: $(ls /dev/shm | grep "tailcut-demo\.$pid\.")"
fi

if ((failures)); then
  echo "demo_test: $failures check(s) failed" >&2
  exit 1
fi
echo "demo_test: all checks passed"
