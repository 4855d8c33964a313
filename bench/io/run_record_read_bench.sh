#!/usr/bin/env bash
# run_record_read_bench.sh: ReadRecords' paths (global shuffle reads) on a
# cold and a hot page cache against fio random reads of the same sizes and
# queue depth, on the same file, in the same run. See --help.
set -euo pipefail

usage() {
  cat <<'TEXT'
usage: run_record_read_bench.sh --dir DIR [options]

Writes one file of random bytes in DIR and, for each record size, reads the
same random records (no repeats) with record_read_bench (bench/io) and fio:

  map_cold           copies from a mapping, the file's pages evicted first
  uring_cold         batched io_uring reads, buffered, pages evicted first
  uring_direct_cold  batched io_uring reads, O_DIRECT
  pread_cold         the same reads by 2 pread threads (TAILCUT_IO=pread), buffered
  map_hot, uring_hot, pread_hot  the same with every page cached
  fio buffered       fio ioengine=io_uring direct=0 invalidate=1, bs = record size
  fio direct         fio ioengine=io_uring direct=1, bs = the record size rounded
                     up to 4 KiB (what an O_DIRECT read of one record reads)

and prints records/s (fio: IOPS), each path's ratio to the mapping's and
io_uring's ratio to fio's. Pages are evicted per file (POSIX_FADV_DONTNEED,
checked with mincore; fio: invalidate=1), not by dropping the machine's caches.

Options:
  --dir DIR            where the data file goes (required)
  --size SIZE          the file's size (default 512M)
  --sizes LIST         record sizes in bytes (default 128,4096)
  --records N          records read per run (default 20000)
  --batch N            records per ReadRecords call (default 256)
  --depth N            io_uring queue depth, and fio's iodepth (default 64)
  --reps N             runs per case, median taken (default 3)
  --bench PATH         the record_read_bench binary (default build/bin/record_read_bench)
  --keep               keep the data file

Needs fio in PATH (Debian's fio package).
TEXT
}

DIR="" SIZE="512M" SIZES="128,4096" RECORDS=20000 BATCH=256 DEPTH=64 REPS=3 KEEP=0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH="$HERE/../../build/bin/record_read_bench"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --size) SIZE="$2"; shift 2 ;;
    --sizes) SIZES="$2"; shift 2 ;;
    --records) RECORDS="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --depth) DEPTH="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --bench) BENCH="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_record_read_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$DIR" && -d "$DIR" ]] || { echo "run_record_read_bench.sh: --dir DIR is required" >&2; exit 2; }
command -v fio >/dev/null || { echo "run_record_read_bench.sh: fio not found (Debian: apt-get install fio)" >&2; exit 2; }
[[ -x "$BENCH" ]] || { echo "run_record_read_bench.sh: no record_read_bench at '$BENCH'" >&2; exit 2; }

FILE="$DIR/tailcut_record_read_bench.bin"
cleanup() { [[ $KEEP == 1 ]] || rm -f "$FILE"; }
trap cleanup EXIT
[[ -f "$FILE" ]] || "$BENCH" --generate "$SIZE" --file "$FILE"

# fio's median IOPS over --reps runs: random reads of bs bytes, RECORDS of them.
fio_iops() {
  local bs=$1 direct=$2 runs=()
  for _ in $(seq "$REPS"); do
    runs+=("$(fio --name=tailcut_baseline --filename="$FILE" --rw=randread --bs="$bs" \
      --direct="$direct" --iodepth="$DEPTH" --ioengine=io_uring --invalidate=1 \
      --number_ios="$RECORDS" --size="$SIZE" --randrepeat=0 --output-format=json 2>/dev/null |
      python3 -c 'import json, sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')")
  done
  printf '%s\n' "${runs[@]}" | sort -n | sed -n "$(((REPS + 1) / 2))p"
}

echo "# $(uname -r), $(nproc) cores, $(stat -f -c %T "$DIR") on $(df --output=source "$DIR" | tail -1)," \
  "file $SIZE, $RECORDS records per run, batches of $BATCH, depth $DEPTH, median of $REPS;" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -ra sizes <<<"$SIZES"
for bytes in "${sizes[@]}"; do
  declare -A rate=()
  while read -r line; do
    name=$(sed -n 's/.*case=\([a-z_]*\).*/\1/p' <<<"$line")
    rate[$name]=$(sed -n 's/.*records_s=\([0-9]*\).*/\1/p' <<<"$line")
    echo "$line"
  done < <("$BENCH" --file "$FILE" --record-bytes "$bytes" --records "$RECORDS" --batch "$BATCH" \
    --depth "$DEPTH" --reps "$REPS")
  direct_bs=$(((bytes + 4095) / 4096 * 4096))
  fio_buffered=$(fio_iops "$bytes" 0)
  fio_direct=$(fio_iops "$direct_bs" 1)
  echo "fio record_bytes=$bytes buffered_bs=$bytes iops=$fio_buffered direct_bs=$direct_bs iops=$fio_direct"
  python3 - "$bytes" "${rate[uring_cold]}" "$fio_buffered" "${rate[uring_direct_cold]}" "$fio_direct" <<'PY'
import sys
b, uc, fb, ud, fd = sys.argv[1], *map(float, sys.argv[2:])
print(f"ratio record_bytes={b} uring_cold/fio_buffered={uc / fb:.2f} uring_direct_cold/fio_direct={ud / fd:.2f}")
PY
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
