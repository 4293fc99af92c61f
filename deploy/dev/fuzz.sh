#!/usr/bin/env bash
# Builds Airlock's fuzz targets (fuzz/: cargo-fuzz over libFuzzer) and runs each for a while.
#
#   deploy/dev/fuzz.sh [--seconds N | --runs N] [target ...]
#
#   --seconds N  run each target for N seconds (default 60; AIRLOCK_FUZZ_SECONDS)
#   --runs N     run each target for N executions instead (10000000 for a release check)
#   target       decode, canonical, arguments, partition (default: all four)
#
# AIRLOCK_FUZZ_JOBS targets run at once (default 2, the machine's cores). cargo-fuzz is
# installed once into $AIRLOCK_CACHE/cargo-fuzz; the targets build, with libFuzzer's coverage
# instrumentation, into $AIRLOCK_CACHE/fuzz-target (apart from the workspace's builds, which
# the instrumentation would otherwise rebuild every time). Each target reads the seeds kept in
# fuzz/corpus/<target> and grows its own corpus in $AIRLOCK_CACHE/fuzz-corpus/<target>, kept
# between runs. A crash, a panic, a leak of the limits or a hang (over 10 s on one input)
# stops the script: the input is in $AIRLOCK_CACHE/fuzz-artifacts/<target>/ and the script
# prints how to replay it. The toolchain is the stable one (no sanitizer: Rust code cannot
# corrupt memory outside `unsafe`, which Airlock does not use; panics and hangs are what the
# targets look for).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$here/env.sh"

seconds="${AIRLOCK_FUZZ_SECONDS:-60}"
runs=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ "${#targets[@]}" -gt 0 ] || targets=(decode canonical arguments partition)
jobs="${AIRLOCK_FUZZ_JOBS:-2}"

cargo_fuzz_version="0.13.2"
tools="$AIRLOCK_CACHE/cargo-fuzz"
if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $cargo_fuzz_version\$"; then
  echo "fuzz.sh: installing cargo-fuzz $cargo_fuzz_version into $tools"
  CARGO_TARGET_DIR="$AIRLOCK_CACHE/cargo-fuzz-build" \
    cargo install --quiet --locked --root "$tools" --version "$cargo_fuzz_version" cargo-fuzz
  rm -rf "$AIRLOCK_CACHE/cargo-fuzz-build"
fi
export PATH="$tools/bin:$PATH"
export CARGO_TARGET_DIR="$AIRLOCK_CACHE/fuzz-target"

cd "$root"
mkdir -p "$AIRLOCK_CACHE/fuzz-logs"
build_log="$AIRLOCK_CACHE/fuzz-logs/build.log"
echo "fuzz.sh: building the targets (the first build takes several minutes)"
if ! cargo fuzz build --release --sanitizer none >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  echo "fuzz.sh: building the fuzz targets failed; log $build_log" >&2
  exit 1
fi

# libFuzzer's options per target: the largest input it makes. A partition batch may carry a
# record past the 16 KiB payload limit the target sets, and libFuzzer's length control (which
# grows inputs from a few bytes) would not get there in a minute: it is off for that target.
length_options() {
  case "$1" in
    partition) echo "-max_len=65536 -len_control=0" ;;
    *) echo "-max_len=8192" ;;
  esac
}

run_one() {
  local target="$1"
  local corpus="$AIRLOCK_CACHE/fuzz-corpus/$target"
  local artifacts="$AIRLOCK_CACHE/fuzz-artifacts/$target/"
  local log="$AIRLOCK_CACHE/fuzz-logs/$target.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")" "fuzz/corpus/$target"
  local limit=("-max_total_time=$seconds")
  [ -z "$runs" ] || limit=("-runs=$runs")
  if cargo fuzz run --release --sanitizer none "$target" "$corpus" "fuzz/corpus/$target" -- \
      "${limit[@]}" $(length_options "$target") -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    local execs
    execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
    echo "fuzz.sh: $target: $execs executions, no failure (corpus $(ls "$corpus" | wc -l) inputs)"
  else
    tail -n 40 "$log" >&2
    echo "fuzz.sh: $target FAILED; input in $artifacts; log $log" >&2
    echo "fuzz.sh: replay: CARGO_TARGET_DIR=$CARGO_TARGET_DIR cargo fuzz run --release --sanitizer none $target <input>" >&2
    return 1
  fi
}

failed=0
pids=()
for target in "${targets[@]}"; do
  run_one "$target" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
exit "$failed"
