#!/usr/bin/env bash
# The GPU checks in two steps, for a GPU host that lacks the build's packages
# and is lent for minutes: `pack` (here, after `make build`) bundles the GPU
# tests, the daemons and strata-bench with their libraries (bundle.sh) into
# one tarball; `run` (there, from the repository root) unpacks it, runs
# every GPU test and benchmark with a time limit each, and writes each one's
# output and a summary (one line per check: its exit status and seconds)
# into OUT_DIR.
#
#   tools/device/gpu_checks.sh pack TARBALL          (e.g. build-gpu/checks.tgz)
#   tools/device/gpu_checks.sh run TARBALL OUT_DIR [CHECK...]
#
# With CHECK names, `run` runs only those (see `checks` below). Tests that
# start daemons find them where the build put them (STRATA_BIN_DIR, compiled
# in): `run` makes wrappers there that start the bundled ones, if that
# directory does not exist.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tests=(cuda_kernels_test gpu_chunk_test tier_test nvme_placement_test server_restart_test
       collective_test device_test device_worker_test)
daemons=(strata-server strata-coordinator stratactl strata-bench mlp_trainer)

# name | seconds allowed | command (run inside the unpacked bundle)
checks() {
  for t in "${tests[@]}"; do echo "$t|300|./run $t"; done
  echo "gpu-step-fp32|240|./run strata-bench gpu-step --params 268435456 --grad bf16 --json"
  echo "gpu-step-int8|240|./run strata-bench gpu-step --params 268435456 --grad bf16 --state int8 --json"
  echo "gpu-worker|300|./run strata-bench gpu-worker --params 1073741824 --executor_threads 8 --json"
}

pack() {
  local tarball=$1 staging
  staging=$(mktemp -d)
  local binaries=()
  for t in "${tests[@]}"; do binaries+=("$root/build/tests/$t"); done
  for d in "${daemons[@]}"; do binaries+=("$root/build/bin/$d"); done
  "$here/bundle.sh" "$staging/bundle" "${binaries[@]}" >/dev/null || return 1
  echo "$root/build/bin" >"$staging/bundle/bin_dir"  # STRATA_BIN_DIR of the tests
  mkdir -p "$(dirname "$tarball")"
  tar czf "$tarball" -C "$staging" bundle && rm -rf "$staging"
  ls -la "$tarball"
}

# Wrappers at the daemons' compiled-in directory that start the bundled ones.
wrap_daemons() {
  local bundle=$1 bin_dir
  bin_dir=$(cat "$bundle/bin_dir")
  [[ -e $bin_dir ]] && return 0
  mkdir -p "$bin_dir" || return 0
  for d in "${daemons[@]}"; do
    printf '#!/usr/bin/env bash\nexec %q %q "$@"\n' "$bundle/run" "$d" >"$bin_dir/$d"
    chmod +x "$bin_dir/$d"
  done
}

# One line of a check's log worth a glance: a test's totals, a bench's JSON.
result_of() {
  local log=$1
  if grep -q '^\[==========\]' "$log"; then
    # One line per test ends with its time.
    echo "$(grep -c '^\[       OK \].* ms)$' "$log") ok," \
      "$(grep -c '^\[  SKIPPED \].* ms)$' "$log") skipped," \
      "$(grep -c '^\[  FAILED  \].* ms)$' "$log") failed"
  else
    tail -1 "$log" | cut -c1-120
  fi
}

run() {
  local tarball=$1 out=$2
  shift 2
  mkdir -p "$out"
  local unpacked
  unpacked=$(mktemp -d)
  tar xzf "$tarball" -C "$unpacked" || return 1
  local bundle=$unpacked/bundle
  wrap_daemons "$bundle"
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  local summary=$out/summary.txt
  : >"$summary"
  while IFS='|' read -r name limit command; do
    if [[ $# -gt 0 && " $* " != *" $name "* ]]; then continue; fi
    local started=$SECONDS
    (cd "$bundle" && timeout "$limit" bash -c "$command") >"$out/$name.log" 2>&1
    local status=$?
    printf '%-22s exit %3d  %4ds  %s\n' "$name" "$status" $((SECONDS - started)) \
      "$(result_of "$out/$name.log")" | tee -a "$summary"
  done < <(checks)
}

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case ${1:-} in
  pack) [[ $# -eq 2 ]] || usage; pack "$2" ;;
  run) [[ $# -ge 3 ]] || usage; run "${@:2}" ;;
  *) usage ;;
esac
