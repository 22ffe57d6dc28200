#!/usr/bin/env bash
# run.sh SECONDS NAME...: runs each libFuzzer harness build-asan/fuzz/NAME for
# SECONDS, starting from its seed corpus (tests/fuzz/corpus/NAME, copied into
# build-asan/corpus/NAME, where what it finds accumulates), FUZZ_JOBS
# harnesses at a time (default: one per core). Fails if any harness fails,
# naming the input that made it fail (kept in build-asan/crashes/): add that
# input to tests/fuzz/corpus/NAME once fixed, so that every later run
# replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 SECONDS NAME..." >&2; exit 2; }
seconds=$1
shift
jobs_max=${FUZZ_JOBS:-$(nproc)}
mkdir -p build-asan/crashes

# One harness; its exit status.
fuzz() {
  local name=$1 corpus=build-asan/corpus/$1 log=build-asan/$1.log leaks=1
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  # Leaks are checked per input only where the harness keeps no daemons
  # (their threads allocate across inputs).
  [ "$name" = services_fuzz ] && leaks=0
  build-asan/fuzz/"$name" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=3072 \
    -detect_leaks=$leaks -print_final_stats=1 \
    -artifact_prefix=build-asan/crashes/"$name"- "$corpus" >"$log" 2>&1
}

declare -A running=()  # pid -> name
failed=()
# Waits for one harness and records how it ended.
reap() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local name=${running[$pid]}
  unset "running[$pid]"
  if [ $status -ne 0 ]; then
    failed+=("$name")
    tail -60 "build-asan/$name.log"
    echo "fuzz: $name FAILED; the input is in build-asan/crashes/ (log: build-asan/$name.log)"
  else
    echo "fuzz: $name passed: $(grep -a -E "stat::number_of_executed_units|stat::peak_rss_mb" \
      "build-asan/$name.log" | tr '\n' ' ')"
  fi
}
for name in "$@"; do
  while [ ${#running[@]} -ge "$jobs_max" ]; do reap; done
  echo "fuzz: $name for ${seconds}s"
  fuzz "$name" &
  running[$!]=$name
done
while [ ${#running[@]} -gt 0 ]; do reap; done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: FAILED: ${failed[*]}"; exit 1; }
echo "fuzz: all passed"
