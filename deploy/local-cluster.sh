#!/usr/bin/env bash
# Starts a local strata cluster on loopback -- 1 coordinator and 2 shard
# servers -- then 2 trainer processes (examples/mlp_trainer) that train an MLP
# through it. Prints the loss of every step and the placement table, stops
# everything it started (also when interrupted) and ends with one JSON line.
#
#   deploy/local-cluster.sh [DATA_DIR]
#
# DATA_DIR (default: a fresh temporary directory, removed afterwards) holds
# the daemons' RocksDB data and logs. Environment: STRATA_BIN (default
# build/bin), STEPS (default 100), WORKERS (2), SERVERS (2), DEVICE (cpu;
# cuda:N trains on that GPU, one worker per GPU), STATE (fp32; int8: the
# servers store Adam's moments 8-bit).
set -euo pipefail

BIN=${STRATA_BIN:-build/bin}
STEPS=${STEPS:-100}
WORKERS=${WORKERS:-2}
SERVERS=${SERVERS:-2}
DEVICE=${DEVICE:-cpu}
STATE=${STATE:-fp32}
if [ $# -ge 1 ]; then
  DATA=$1
  mkdir -p "$DATA"
  REMOVE_DATA=0
else
  DATA=$(mktemp -d "${TMPDIR:-/tmp}/strata-demo-XXXXXX")
  REMOVE_DATA=1
fi

pids=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$REMOVE_DATA" = 1 ]; then rm -rf "$DATA"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits for a daemon's ready file and prints the address in it.
wait_ready() {
  local file=$1 pid=$2
  for _ in $(seq 1 300); do
    if [ -s "$file" ]; then cat "$file"; return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "local-cluster: a daemon exited during start-up; see $DATA/*.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "local-cluster: timed out waiting for $file" >&2
  return 1
}

"$BIN/strata-coordinator" --listen=127.0.0.1:0 --data_dir="$DATA/coordinator" \
  --ready_file="$DATA/coordinator.addr" 2>"$DATA/coordinator.log" &
pids+=($!)
COORDINATOR=$(wait_ready "$DATA/coordinator.addr" $!)
echo "coordinator at $COORDINATOR"

for i in $(seq 0 $((SERVERS - 1))); do
  "$BIN/strata-server" --listen=127.0.0.1:0 --coordinator="$COORDINATOR" \
    --data_dir="$DATA/server$i" --checkpoint_root="$DATA" --host_budget_mib=256 --checkpoint_buffer_mib=64 \
    --ready_file="$DATA/server$i.addr" 2>"$DATA/server$i.log" &
  pids+=($!)
  echo "shard server $i at $(wait_ready "$DATA/server$i.addr" $!)"
done

trainers=()
for w in $(seq 0 $((WORKERS - 1))); do
  # Only rank 0 (whichever worker joins first) prints and writes the summary.
  "$BIN/mlp_trainer" --coordinator="$COORDINATOR" --job=mlp-demo --workers="$WORKERS" \
    --worker_id="worker-$w" --steps="$STEPS" --chunk_params=1024 --device="$DEVICE" \
    --state_precision="$STATE" --summary_file="$DATA/summary.json" \
    2>"$DATA/trainer$w.log" &
  trainers+=($!)
  pids+=($!)
done
failed=0
for pid in "${trainers[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" != 0 ]; then
  echo "local-cluster: a trainer failed:" >&2
  tail -n 5 "$DATA"/trainer*.log >&2
  exit 1
fi

echo
"$BIN/stratactl" --coordinator="$COORDINATOR" --job=mlp-demo placement
echo
cat "$DATA/summary.json"
