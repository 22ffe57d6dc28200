#!/usr/bin/env bash
# make deploy-test: the docker-compose deployment on a real Docker engine.
# Starts dockerd if none is running (without bridge or firewall rules: the
# services use the host's network), makes the debian:bookworm-slim base image
# with debootstrap when it is missing (no registry is needed), builds the
# images (from this host's build/bin: deploy/Dockerfile's STRATA_PREBUILT,
# so that the compiler's work is not done twice), starts the coordinator, two shard servers (state on their NVMe
# tiers) and Prometheus with TLS and tokens on (certificates and tokens from
# the compose file's certs service), waits for their health checks, checks
# that a plaintext client and one without a token are refused, trains the
# example
# trainer on this host for 20 steps while one server container is restarted,
# checks placement on both servers and one metric through Prometheus's HTTP
# API, then removes its containers and volumes and stops the daemon it
# started. Needs root, and build/bin (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/sbin:/usr/bin:$PATH  # Debian's docker client and compose, not /usr/local/bin's
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

project=strata-deploy-test
prebuilt=.docker-prebuilt  # in the build context; .gitignore'd
work=$(mktemp -d /tmp/strata-deploy-test.XXXXXX)
# Ports away from the defaults, so that a cluster running here is not disturbed.
export STRATA_COORDINATOR_PORT=17700 STRATA_SERVER0_PORT=17701 STRATA_SERVER1_PORT=17702
export STRATA_COORDINATOR_METRICS_PORT=19100 STRATA_SERVER0_METRICS_PORT=19101
export STRATA_SERVER1_METRICS_PORT=19102 STRATA_PROMETHEUS_PORT=19090
# 1 MiB of host memory per server holds the parameter copies (4 bytes per
# parameter) and the staging buffers of two NVMe executor threads (three of
# 48 KiB) of the trainer's job below (440 K parameters in chunks of 4 Ki),
# not its state: every chunk is on NVMe and survives a restart (state in
# host memory does not).
export STRATA_HOST_BUDGET_MIB=1 STRATA_NVME_BUDGET_MIB=64 STRATA_NVME_EXECUTOR_THREADS=2
export STRATA_WORKER_LEASE_MS=3000
# Containers cannot raise the memlock limit above this machine's own.
memlock_kib=$(ulimit -l)
if [ "$memlock_kib" != unlimited ]; then
  export STRATA_MEMLOCK_BYTES=$((memlock_kib * 1024)) STRATA_PIN_HOST_MEMORY=false
fi
coordinator=127.0.0.1:$STRATA_COORDINATOR_PORT
# The cluster makes its CA, certificates and tokens here (the certs
# service); the trainer and stratactl below verify the daemons with its CA
# and present the user's token.
export STRATA_TLS_DIR=$work/tls
tls=(--tls_ca="$STRATA_TLS_DIR/ca.pem" --token_file="$STRATA_TLS_DIR/user.token")

log() { echo "deploy-test: $*"; }
compose() { docker-compose -p "$project" --profile metrics "$@"; }

started_dockerd=
cleanup() {
  local status=$?
  if docker info >/dev/null 2>&1; then
    if [ $status -ne 0 ]; then compose logs --no-color --tail=50 || true; fi
    compose down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  fi
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null || true
    wait "$started_dockerd" 2>/dev/null || true
  fi
  rm -rf "$work" "$prebuilt"
  if [ $status -eq 0 ]; then log "passed"; else log "FAILED"; fi
  exit $status
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  dockerd --iptables=false --ip-forward=false --bridge=none \
    --pidfile="$work/dockerd.pid" >"$work/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { cat "$work/dockerd.log"; exit 1; }
fi

if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
  mirror=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')
  mirror=${mirror:-$(grep -hs '^deb ' /etc/apt/sources.list | head -1 | awk '{print $2}')}
  mirror=${mirror:-http://deb.debian.org/debian}
  log "making debian:bookworm-slim with debootstrap from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -c . | docker import - debian:bookworm-slim >/dev/null
fi

# The daemons the image runs are this host's (same Debian release), with the
# libraries they load that Debian's packages do not provide (CUDA's runtime).
log "building images"
rm -rf "$prebuilt"
mkdir -p "$prebuilt/bin" "$prebuilt/lib"
for binary in strata-server strata-coordinator stratactl; do
  strip --strip-debug -o "$prebuilt/bin/$binary" "build/bin/$binary"
  ldd "build/bin/$binary" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case $(readlink -f "$lib") in
      /lib/* | /usr/lib/*) ;;
      *) cp -Ln "$lib" "$prebuilt/lib/" ;;
    esac
  done
done
export STRATA_PREBUILT=$prebuilt
compose build --quiet
log "starting the cluster"
compose up -d
for service in coordinator server-0 server-1; do
  for _ in $(seq 150); do
    health=$(docker inspect -f '{{.State.Health.Status}}' "$(compose ps -q $service)")
    [ "$health" = healthy ] && break
    sleep 0.2
  done
  [ "$health" = healthy ] || { log "$service is $health"; exit 1; }
done
build/bin/stratactl --target=$coordinator "${tls[@]}" health
if build/bin/stratactl --target=$coordinator health >"$work/plaintext.log" 2>&1; then
  log "the coordinator answered a plaintext client"; exit 1
fi
log "TLS on: a plaintext client is refused ($(tail -1 "$work/plaintext.log"))"
if build/bin/stratactl --coordinator=$coordinator --tls_ca="$STRATA_TLS_DIR/ca.pem" jobs \
  >"$work/no-token.log" 2>&1; then
  log "the coordinator answered a client without a token"; exit 1
fi
grep -q UNAUTHENTICATED "$work/no-token.log" || { cat "$work/no-token.log"; exit 1; }
log "authentication on: a client without a token is refused"

log "training 20 steps; server-1 restarts on the way"
build/bin/mlp_trainer --coordinator=$coordinator "${tls[@]}" --job=deploy-test --workers=1 --steps=20 \
  --input_dim=256 --hidden_dim=1664 --chunk_params=4096 --lr=1e-3 --step_delay_ms=100 \
  --summary_file="$work/summary.json" >"$work/trainer.log" 2>&1 &
trainer=$!
for _ in $(seq 300); do grep -q '^step    5 ' "$work/trainer.log" && break; sleep 0.1; done
grep -q '^step    5 ' "$work/trainer.log" || { cat "$work/trainer.log"; exit 1; }
compose restart --timeout 10 server-1
wait $trainer || { cat "$work/trainer.log"; exit 1; }
cat "$work/trainer.log"
grep -q '"steps":20' "$work/summary.json"

placement=$(build/bin/stratactl --coordinator=$coordinator "${tls[@]}" --job=deploy-test --json placement)
for port in $STRATA_SERVER0_PORT $STRATA_SERVER1_PORT; do
  echo "$placement" | grep -q "127.0.0.1:$port" || { log "no chunk on :$port"; exit 1; }
done
echo "$placement" | grep -q '"tier":"nvme"' || { log "no chunk on NVMe"; exit 1; }

build/bin/stratactl --coordinator=$coordinator --tls_ca="$STRATA_TLS_DIR/ca.pem" \
  --token_file="$STRATA_TLS_DIR/operator.token" jobs | grep -q deploy-test ||
  { log "the operator does not see the user's job"; exit 1; }

log "saving a checkpoint into the volume the daemons share"
checkpoint=$(build/bin/stratactl --coordinator=$coordinator "${tls[@]}" --job=deploy-test --json checkpoint save)
echo "$checkpoint"
echo "$checkpoint" | grep -q '"step":20' || { log "no checkpoint of step 20"; exit 1; }
build/bin/stratactl --coordinator=$coordinator "${tls[@]}" --job=deploy-test --json checkpoint list |
  grep -q '"path":"/var/lib/strata/checkpoints/deploy-test/step-0000000020"' ||
  { log "the checkpoint is not listed"; exit 1; }

log "reading strata_pushed_bytes_total through Prometheus"
query="http://127.0.0.1:$STRATA_PROMETHEUS_PORT/api/v1/query?query=sum(strata_pushed_bytes_total)"
for _ in $(seq 100); do
  answer=$(curl -fsS "$query" 2>/dev/null || true)
  echo "$answer" | grep -q '"result":\[{' && break
  sleep 0.3
done
echo "$answer"
echo "$answer" | grep -q '"result":\[{' || { log "Prometheus has no strata metric"; exit 1; }
