#!/usr/bin/env bash
# make hosts-test: strata across emulated hosts (testing/host_network.sh),
# as root. Runs
#   1. the partition tests (tests/hosts/partition_test.cc): each role in its
#      own network namespace on the cluster profile, links cut and healed;
#   2. the elastic and checkpoint tests, unchanged, in a namespace whose
#      loopback has the slow profile (1 Gbit/s, 2 ms one way, 0.1% loss);
#   3. `strata-bench step` on the machine's loopback, then with the
#      coordinator and two shard servers each on a host of its own and the
#      workers on this machine's ("ctl"), cluster profile (10 Gbit/s, 0.1 ms),
#      against iperf3 to a server's host; printing both JSON lines.
# Every namespace, link, qdisc and rule it made is removed when it ends, also
# when interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "hosts-test: needs root (network namespaces)" >&2; exit 1; }
[[ -x build/tests/net_delay ]] || { echo "hosts-test: no build/tests/net_delay (libnetfilter-queue-dev; make build)" >&2; exit 1; }
prefix=h$(($$ % 100000))
export STRATA_NET_PREFIX=$prefix
cleanup() {
  testing/host_network.sh down "$prefix" 2> /dev/null || true
  testing/host_network.sh down "${prefix}l" 2> /dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "hosts-test: partitions (cluster profile)"
build/tests/partition_test

echo "hosts-test: elastic and checkpoint tests on the slow profile"
testing/host_network.sh loopback "${prefix}l" slow
ip netns exec "${prefix}l-lo" build/tests/elastic_test
ip netns exec "${prefix}l-lo" build/tests/checkpoint_test
testing/host_network.sh down "${prefix}l"

echo "hosts-test: strata-bench step, loopback then across hosts (cluster profile)"
build/bin/strata-bench step --json | tail -n 1
testing/host_network.sh up "$prefix" cluster coord s0 s1
address() { testing/host_network.sh address "$prefix" "$1"; }
coordinator=$(address coord):7700
data=$(mktemp -d)
trap 'cleanup; rm -rf "$data"' EXIT
ip netns exec "$prefix-coord" build/bin/strata-coordinator --listen="$coordinator" \
  --data_dir="$data/coordinator" 2> "$data/coordinator.log" &
for server in s0 s1; do
  # 64 Mi parameters: 16 B each (state and copies) over two servers, and room.
  ip netns exec "$prefix-$server" build/bin/strata-server --listen="$(address $server):7701" \
    --coordinator="$coordinator" --data_dir="$data/$server" --checkpoint_root="$data" \
    --host_budget_mib=1024 --pin_host_memory=false --gpu_budget_mib=0 \
    2> "$data/$server.log" &
  for _ in $(seq 1 300); do
    build/bin/stratactl --target="$(address $server):7701" --service=strata.v1.ShardServer \
      health > /dev/null 2>&1 && break
    sleep 0.1
  done
done
ip netns exec "$prefix-s0" iperf3 -s -p 5201 -D
build/bin/strata-bench step --json --coordinator="$coordinator" \
  --iperf3_server="$(address s0):5201" | tail -n 1
echo "hosts-test: passed"
