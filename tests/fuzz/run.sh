#!/usr/bin/env bash
# run.sh SECONDS NAME...: runs each libFuzzer harness build-fuzz/fuzz/NAME for
# SECONDS, starting from its seed corpus (tests/fuzz/corpus/NAME, copied into
# build-fuzz/corpus/NAME, where what it finds accumulates). Stops at the first
# harness that fails, naming the input that made it fail (kept in
# build-fuzz/crashes/): add that input to tests/fuzz/corpus/NAME once fixed,
# so that every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 SECONDS NAME..." >&2; exit 2; }
seconds=$1
shift
mkdir -p build-fuzz/crashes
for name in "$@"; do
  corpus=build-fuzz/corpus/$name
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  log=build-fuzz/$name.log
  echo "fuzz: $name for ${seconds}s"
  # Leaks are checked per input only where the harness keeps no daemons
  # (their threads allocate across inputs).
  leaks=1
  [ "$name" = services_fuzz ] && leaks=0
  if ! build-fuzz/fuzz/"$name" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=3072 \
      -detect_leaks=$leaks -print_final_stats=1 \
      -artifact_prefix=build-fuzz/crashes/"$name"- "$corpus" >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz: $name FAILED; the input is in build-fuzz/crashes/ (log: $log)"
    exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | tr '\n' ' '
  echo
done
echo "fuzz: all passed"
