#!/usr/bin/env bash
# Builds the record-parser, segment, batch ring and batch layout fuzzers with
# clang (libFuzzer, ASan, UBSan) in a build directory of their own and runs
# each for a bounded time.
#
#   tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]    (default 60)
#
# Environment: BUILD_DIR (default <repo>/build-fuzz), JOBS (default 2).
# Inputs libFuzzer finds go to $BUILD_DIR/corpus, never into the seed corpus
# in the tree; a crashing input goes to $BUILD_DIR/artifacts. Exits non-zero
# if any target crashed, leaked, timed out or failed a check.
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
targets=(fuzz_record_parser_fixed fuzz_record_parser_lines fuzz_record_parser_tfrecord
         fuzz_record_parser_file fuzz_segment_attach fuzz_batch_ring_attach fuzz_batch_layout)

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTAILCUT_BUILD_FUZZERS=ON \
  -DTAILCUT_BUILD_BENCHMARKS=OFF -DTAILCUT_BUILD_PYTHON=OFF -DTAILCUT_INSTALL=OFF
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]}"

failed=()
for target in "${targets[@]}"; do
  mkdir -p "$build/corpus/$target" "$build/artifacts"
  echo "== $target: ${seconds}s"
  if ! "$build/bin/$target" "$build/corpus/$target" "$root/tests/fuzz/corpus/$target" \
      -max_total_time="$seconds" -max_len=8192 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$target-"; then
    failed+=("$target")
  fi
  # An input that crashed the segment fuzzer left its segment behind.
  rm -f /dev/shm/tailcut."$(id -u)".fuzz-* /dev/shm/tailcut-ring."$(id -u)".fuzz-*
done

if (( ${#failed[@]} )); then
  echo "FAILED: ${failed[*]} (inputs in $build/artifacts)" >&2
  exit 1
fi
echo "all ${#targets[@]} fuzzers ran ${seconds}s each without a crash"
