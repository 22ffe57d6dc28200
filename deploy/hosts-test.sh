#!/usr/bin/env bash
# make hosts-test: strata across emulated hosts (testing/host_network.sh),
# as root. Runs
#   1. the partition tests (tests/hosts/partition_test.cc): each role in its
#      own network namespace on the cluster profile, links cut and healed;
#   2. the elastic and checkpoint tests, unchanged, in a namespace whose
#      loopback has the slow profile (1 Gbit/s, 2 ms one way, 0.1% loss);
#   3. `strata-bench step` on the machine's loopback and on a cluster-profile
#      loopback (10 Gbit/s, 0.1 ms), printing both JSON lines.
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

echo "hosts-test: strata-bench step, loopback then the cluster profile"
build/bin/strata-bench step --json | tail -n 1
testing/host_network.sh loopback "${prefix}l" cluster
ip netns exec "${prefix}l-lo" build/bin/strata-bench step --json | tail -n 1
echo "hosts-test: passed"
