#!/bin/bash
# Smoke test of straggler_bench: 3 trainer processes (one 4x slower) over a
# few thousand records, each strategy; the benchmark itself checks, per
# epoch, that the id checksums of all trained records match ids 0..N-1
# (exactly once) and exits non-zero otherwise. Here we also check the
# per-process CSV: 3 rows whose record counts add up to N.
# usage: straggler_smoke.sh path/to/straggler_bench
set -euo pipefail
bench=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
records=3000
for args in "--strategy static" "--strategy elastic" "--strategy split --slices 3" \
            "--strategy split --epochs 2 --format tfrecord"; do
  data="$tmp/data-${args//[^a-z0-9]/_}"
  out=$("$bench" $args --processes 3 --slowdown 4 --records $records --files 4 --record-bytes 48 \
        --cost-us 20 --data-dir "$data" --csv "$tmp/procs.csv" --json "$tmp/run.json") || {
    echo "FAIL: straggler_bench $args"; exit 1; }
  echo "$out"
  grep -q "exactly_once=yes" <<<"$out" || { echo "FAIL: not exactly once: $args"; exit 1; }
  epochs=1; [[ $args == *"--epochs 2"* ]] && epochs=2
  sum=$(awk -F, 'NR > 1 { n++; s += $10 } END { print n " " s }' "$tmp/procs.csv")
  [[ $sum == "3 $((records * epochs))" ]] || { echo "FAIL: procs.csv rows/records '$sum' for: $args"; exit 1; }
  grep -q '"exactly_once":true' "$tmp/run.json" || { echo "FAIL: json: $args"; exit 1; }
done
"$bench" --help | grep -q -- "--strategy" || { echo "FAIL: --help"; exit 1; }
echo "PASS"
