#!/usr/bin/env bash
# run_io_bench.sh: tailcut's read path against fio on the same files, same
# block size and depth, in the same run. See --help.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: run_io_bench.sh --dir DIR [options]

Measures tailcut's per-process Reader (bench/io/io_bench) and fio on the same
files, with the same block size and queue depth, and prints GiB/s of both and
their ratio (tailcut / fio) for each case:

  cold     O_DIRECT reads: tailcut --direct vs fio ioengine=io_uring direct=1
  hot      page-cache-hot buffered reads: tailcut (io_uring + IOSQE_ASYNC, and
           the pread backend) vs the best of fio psync numjobs=1,2,4 and fio
           io_uring buffered, and fio psync with a buffer as large as the
           Reader's budget (psync's own buffer stays in the CPU cache)
  records  records/s of tailcut for 64-byte lines and 1 KiB TFRecords (hot)
  rss      peak RSS (VmHWM) of each tailcut process vs buffer budget + 16 MiB

Each measurement runs --reps times; the best run of each side is compared.

Options:
  --dir DIR          directory on the storage to measure (required)
  --size SIZE        total size of the raw data files (default 1G)
  --files N          number of raw data files (default 4)
  --bs SIZE          block size: fio bs and tailcut chunk_bytes (default 1M)
  --depth N          fio iodepth and tailcut queue_depth (default 8)
  --budget SIZE      tailcut buffer budget per process (default 64M; raised to
                     hold depth + 4 blocks)
  --records-size S   size of each record data set (default 256M)
  --hot-loops N      times the hot cases read the data per run (default 4)
  --reps N           runs per measurement (default 3)
  --generate         write the data files first (else they must exist:
                     DIR/tailcut_bench_{raw,lines,tfrecord}_I)
  --cases LIST       comma-separated subset of cold,hot,records (default all)
  --io-bench PATH    the io_bench binary (default: $IO_BENCH, then
                     build/bin/io_bench next to the source tree, then PATH)
  --cleanup          remove the generated files at the end
  -h, --help         this text

Sizes take K, M, G suffixes (powers of 1024). Needs fio (with io_uring) in
PATH. The hot case needs enough free memory to keep --size in the page cache.
Example:
  bench/io/run_io_bench.sh --dir /mnt/nvme/tmp --generate --size 4G --bs 1M --depth 16
EOF
}

DIR="" SIZE="1G" FILES=4 BS="1M" DEPTH=8 BUDGET="64M" RECORDS_SIZE="256M" HOT_LOOPS=4 REPS=3
GENERATE=0 CASES="cold,hot,records" IO_BENCH="${IO_BENCH:-}" CLEANUP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --size) SIZE="$2"; shift 2 ;;
    --files) FILES="$2"; shift 2 ;;
    --bs) BS="$2"; shift 2 ;;
    --depth) DEPTH="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --records-size) RECORDS_SIZE="$2"; shift 2 ;;
    --hot-loops) HOT_LOOPS="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --generate) GENERATE=1; shift ;;
    --cases) CASES="$2"; shift 2 ;;
    --io-bench) IO_BENCH="$2"; shift 2 ;;
    --cleanup) CLEANUP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_io_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$DIR" ]] || { echo "run_io_bench.sh: --dir is required (see --help)" >&2; exit 2; }
[[ -d "$DIR" ]] || { echo "run_io_bench.sh: '$DIR' is not a directory" >&2; exit 2; }
command -v fio >/dev/null || { echo "run_io_bench.sh: fio not found in PATH" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "$IO_BENCH" ]]; then
  for candidate in "$HERE/../../build/bin/io_bench" "$(command -v io_bench || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then IO_BENCH="$candidate"; break; fi
  done
fi
[[ -n "$IO_BENCH" && -x "$IO_BENCH" ]] ||
  { echo "run_io_bench.sh: io_bench not found; build it (TAILCUT_BUILD_BENCHMARKS=ON) or pass --io-bench" >&2; exit 2; }

to_bytes() {  # 1M -> 1048576
  local v="$1" n unit
  n="${v%[KkMmGgTt]}"; unit="${v:${#n}}"
  case "$unit" in
    K|k) echo $((n << 10)) ;; M|m) echo $((n << 20)) ;; G|g) echo $((n << 30)) ;;
    T|t) echo $((n << 40)) ;; "") echo "$n" ;;
  esac
}
BS_BYTES=$(to_bytes "$BS")
BUDGET_BYTES=$(to_bytes "$BUDGET")
MIN_BUDGET=$((BS_BYTES * (DEPTH + 4)))
(( BUDGET_BYTES >= MIN_BUDGET )) || BUDGET_BYTES=$MIN_BUDGET
RSS_LIMIT_KIB=$(((BUDGET_BYTES >> 10) + 16384))

files_of() { ls "$DIR"/tailcut_bench_"$1"_* 2>/dev/null | sort; }

if (( GENERATE )); then
  echo "# generating data in $DIR"
  rm -f "$DIR"/tailcut_bench_raw_* "$DIR"/tailcut_bench_lines_* "$DIR"/tailcut_bench_tfrecord_*
  "$IO_BENCH" --generate --dir "$DIR" --kind raw --files "$FILES" --size "$SIZE" >/dev/null
  "$IO_BENCH" --generate --dir "$DIR" --kind lines --record-bytes 64 --files 2 --size "$RECORDS_SIZE" >/dev/null
  "$IO_BENCH" --generate --dir "$DIR" --kind tfrecord --record-bytes 1024 --files 2 --size "$RECORDS_SIZE" >/dev/null
  sync
fi
mapfile -t RAW < <(files_of raw)
(( ${#RAW[@]} > 0 )) || { echo "run_io_bench.sh: no data files in $DIR; pass --generate" >&2; exit 2; }
FIO_FILES=$(printf '%s:' "${RAW[@]//:/\\:}"); FIO_FILES="${FIO_FILES%:}"

# fio's read bandwidth in GiB/s (terse v3: field 7 is KiB/s).
fio_gibs() {
  fio --name=tailcut_baseline --filename="$FIO_FILES" --rw=read --bs="$BS" --group_reporting \
      --output-format=terse --terse-version=3 "$@" | awk -F';' 'NR==1 {printf "%.3f", $7 / 1048576}'
}
# One io_bench run: prints "gib_s records_s peak_rss_kib"; the full line goes to the log.
LOG="$(mktemp /tmp/run_io_bench.XXXXXX.log)"
tailcut_run() {
  local line
  line=$("$IO_BENCH" --budget "$BUDGET_BYTES" "$@" 2>>"$LOG") || { echo "io_bench failed, see $LOG" >&2; return 1; }
  echo "$line" >>"$LOG"
  sed -E 's/.* gib_s=([0-9.]+) .* records_s=([0-9]+) peak_rss_kib=([0-9]+) .*/\1 \2 \3/' <<<"$line"
}
best() { sort -g | tail -1; }    # the largest of the numbers on stdin
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# Best value per measurement. The runs of tailcut and fio alternate within
# each repetition, so that neither side profits alone from a warmer device
# cache (virtual disks often sit on the host's page cache) or a quieter moment.
declare -A BEST
record() {
  local key="$1" value="$2"
  if [[ -z "${BEST[$key]:-}" ]] || awk -v a="$value" -v b="${BEST[$key]}" 'BEGIN { exit !(a > b) }'; then
    BEST[$key]="$value"
  fi
}
field() { cut -d' ' -f"$1"; }
warm() { cat "$@" >/dev/null; }

echo "# tailcut vs fio on $DIR ($(stat -f -c %T "$DIR")): ${#RAW[@]} files, $SIZE, bs=$BS depth=$DEPTH," \
     "budget=$((BUDGET_BYTES >> 20)) MiB, best of $REPS alternating runs; $(nproc) CPUs, kernel $(uname -r)"
echo "# io_bench: $IO_BENCH; log: $LOG"
printf '%-44s %10s %10s %7s\n' "case (GiB/s)" "tailcut" "fio" "ratio"
row() { printf '%-44s %10s %10s %7s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }

if [[ ",$CASES," == *,cold,* ]]; then
  for ((rep = 0; rep < REPS; rep++)); do
    record cold_uring "$(tailcut_run --mode chunks --direct --chunk "$BS" --depth "$DEPTH" --backend uring "${RAW[@]}" | field 1)"
    record cold_fio "$(fio_gibs --ioengine=io_uring --direct=1 --iodepth="$DEPTH")"
    record cold_pread "$(tailcut_run --mode chunks --direct --chunk "$BS" --depth "$DEPTH" --backend pread \
                           --pread-threads "$DEPTH" "${RAW[@]}" | field 1)"
  done
  row "cold O_DIRECT, io_uring (fio io_uring direct=1)" "${BEST[cold_uring]}" "${BEST[cold_fio]}"
  row "cold O_DIRECT, pread backend, $DEPTH threads" "${BEST[cold_pread]}" "${BEST[cold_fio]}"
fi

if [[ ",$CASES," == *,hot,* ]]; then
  warm "${RAW[@]}"
  hot=(--mode chunks --chunk "$BS" --depth "$DEPTH" --epochs "$HOT_LOOPS")
  psync=(--ioengine=psync --invalidate=0 --loops="$HOT_LOOPS")
  for ((rep = 0; rep < REPS; rep++)); do
    record hot_async "$(tailcut_run "${hot[@]}" --backend uring "${RAW[@]}" | field 1)"
    record hot_psync1 "$(fio_gibs "${psync[@]}" --numjobs=1)"
    record hot_inline "$(tailcut_run "${hot[@]}" --backend uring --no-async "${RAW[@]}" | field 1)"
    record hot_psync2 "$(fio_gibs "${psync[@]}" --numjobs=2)"
    record hot_pread "$(tailcut_run "${hot[@]}" --backend pread "${RAW[@]}" | field 1)"
    record hot_psync4 "$(fio_gibs "${psync[@]}" --numjobs=4)"
    record hot_fio_uring "$(fio_gibs --ioengine=io_uring --invalidate=0 --loops="$HOT_LOOPS" --iodepth="$DEPTH")"
    # psync copies into one bs-sized buffer that stays in the CPU cache; the
    # Reader cycles through its whole arena. Same-sized buffers, for fairness:
    record hot_psync_dram "$(fio_gibs "${psync[@]}" --numjobs=2 --bs="$BUDGET_BYTES")"
  done
  fbest=$(printf '%s\n' "${BEST[hot_psync1]}" "${BEST[hot_psync2]}" "${BEST[hot_psync4]}" \
            "${BEST[hot_fio_uring]}" | best)
  row "hot, io_uring + IOSQE_ASYNC vs best fio" "${BEST[hot_async]}" "$fbest"
  row "hot, pread backend (2 threads) vs best fio" "${BEST[hot_pread]}" "$fbest"
  row "hot, io_uring inline copy vs fio io_uring" "${BEST[hot_inline]}" "${BEST[hot_fio_uring]}"
  row "hot, io_uring + IOSQE_ASYNC vs fio psync x1" "${BEST[hot_async]}" "${BEST[hot_psync1]}"
  row "hot, io_uring + IOSQE_ASYNC vs psync x2, bs=budget" "${BEST[hot_async]}" "${BEST[hot_psync_dram]}"
  echo "#   fio hot: psync numjobs=1 ${BEST[hot_psync1]}, numjobs=2 ${BEST[hot_psync2]}," \
       "numjobs=4 ${BEST[hot_psync4]}, io_uring buffered ${BEST[hot_fio_uring]} GiB/s;" \
       "psync numjobs=2 with bs = budget (a DRAM-sized buffer) ${BEST[hot_psync_dram]} GiB/s"
fi

if [[ ",$CASES," == *,records,* ]]; then
  for kind in lines tfrecord; do
    mapfile -t SET < <(files_of "$kind")
    (( ${#SET[@]} > 0 )) || { echo "# no $kind files; pass --generate"; continue; }
    warm "${SET[@]}"
    for ((rep = 0; rep < REPS; rep++)); do
      out=$(tailcut_run --mode records --format "$kind" --epochs "$HOT_LOOPS" "${SET[@]}")
      record "rec_$kind" "$(field 2 <<<"$out")"
      record "recgib_$kind" "$(field 1 <<<"$out")"
    done
    label="64 B lines"; [[ $kind == tfrecord ]] && label="1 KiB TFRecords (CRC checked)"
    printf '%-44s %10s records/s (%s GiB/s of records)\n' "records, $label" "${BEST[rec_$kind]}" \
           "${BEST[recgib_$kind]}"
  done
fi

# The largest VmHWM of any tailcut process in any run (from the log).
PEAK_RSS=$(grep -o 'peak_rss_kib=[0-9]*' "$LOG" | cut -d= -f2 | sort -n | tail -1)
PEAK_RSS=${PEAK_RSS:-0}
verdict="within"; (( PEAK_RSS <= RSS_LIMIT_KIB )) || verdict="OVER"
echo "peak RSS per process: $((PEAK_RSS / 1024)) MiB; budget + 16 MiB = $((RSS_LIMIT_KIB / 1024)) MiB ($verdict)"

if (( CLEANUP )); then
  rm -f "$DIR"/tailcut_bench_raw_* "$DIR"/tailcut_bench_lines_* "$DIR"/tailcut_bench_tfrecord_*
fi
