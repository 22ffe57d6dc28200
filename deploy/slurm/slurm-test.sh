#!/usr/bin/env bash
# make slurm-test: runs deploy/slurm/strata.sbatch on a real one-machine
# Slurm cluster -- munged, slurmctld and slurmd started here as root with a
# key, sockets, ports and a slurm.conf of their own in a temporary
# directory (nothing under /etc is touched) -- twice: plaintext with one
# shard server and two trainers, then with TLS and tokens from files
# (deploy/make-certs.sh, deploy/make-tokens.sh) and two shard servers.
# Each job must complete with exit code 0, its trainers must have trained
# (the summary's last loss below its first) and its daemons must have shut
# down on SIGTERM. Stops Slurm and removes everything it made, also when it
# fails or is interrupted.
#
#   deploy/slurm/slurm-test.sh     (root; STRATA_BIN, default build/bin)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
BIN=$(realpath "${STRATA_BIN:-build/bin}")
STEPS=30
if [ "$(id -u)" -ne 0 ]; then
  echo "slurm-test: run as root (it starts munged, slurmctld and slurmd)" >&2
  exit 1
fi

WORK=$(mktemp -d /tmp/strata-slurm-XXXXXX)
chmod 755 "$WORK"
pids=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -s "$WORK/munged.pid" ]; then kill -TERM "$(cat "$WORK/munged.pid")" 2>/dev/null || true; fi
  for _ in $(seq 1 50); do
    [ -e "$WORK/munge.socket" ] || break
    sleep 0.1
  done
  if [ "$status" != 0 ]; then
    echo "slurm-test: FAILED; the logs:" >&2
    tail -n 20 "$WORK"/*.log "$WORK"/*.out >&2 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# munge, with its own key and socket.
dd if=/dev/urandom of="$WORK/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge.key"
munged --key-file="$WORK/munge.key" --socket="$WORK/munge.socket" \
  --pid-file="$WORK/munged.pid" --log-file="$WORK/munged.log" --seed-file="$WORK/munge.seed" \
  --force

# One node: this machine, all its CPUs, its memory less 1 GiB.
host=$(hostname -s)
memory_mib=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
mkdir -p "$WORK/state" "$WORK/spool"
cat >"$WORK/slurm.conf" <<EOF
ClusterName=strata-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$WORK/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mib State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF="$WORK/slurm.conf"
slurmctld -D >"$WORK/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$WORK/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
  sleep 0.1
done
[ "$(sinfo -h -o %T)" = idle ] || { echo "slurm-test: the node never became idle" >&2; exit 1; }

# Submits strata.sbatch with the environment given and checks the job.
run_job() {
  local name=$1
  shift
  local out="$WORK/$name.out"
  (cd "$WORK" && env "$@" STRATA_BIN="$BIN" STRATA_DATA="$WORK/data-$name" STRATA_PORT=17700 \
    sbatch --wait --parsable --job-name="strata-$name" --nodes=1 --ntasks=2 --output="$out" \
    "$REPO/deploy/slurm/strata.sbatch" --steps="$STEPS" --chunk_params=1024 >"$WORK/$name.jobid")
  local job
  job=$(cat "$WORK/$name.jobid")
  scontrol show job "$job" | grep -q "JobState=COMPLETED" ||
    { echo "slurm-test: job $name did not complete" >&2; exit 1; }
  local summary
  summary=$(grep '^{"workers"' "$out")
  python3 - "$summary" "$STEPS" <<'EOF'
import json, sys
s = json.loads(sys.argv[1])
assert s["workers"] == 2 and s["steps"] == int(sys.argv[2]), s
assert s["loss_last"] < s["loss_first"], s
EOF
  for daemon in coordinator server; do
    grep -q "$daemon: received Terminated; shutting down" "$out" ||
      { echo "slurm-test: job $name: the $daemon did not shut down on SIGTERM" >&2; exit 1; }
  done
  echo "slurm-test: job $name ($job): $summary"
}

run_job plaintext STRATA_SERVER_NODES=1 STRATA_WORKERS=2
bash deploy/make-certs.sh "$WORK/tls" "$host" >/dev/null
bash deploy/make-tokens.sh "$WORK/tls" >/dev/null
run_job tls STRATA_SERVER_NODES=2 STRATA_WORKERS=2 STRATA_TLS_DIR="$WORK/tls" \
  STRATA_AUTH_FILE="$WORK/tls/auth" STRATA_TOKEN_FILE="$WORK/tls/user.token"
echo "slurm-test: passed"
