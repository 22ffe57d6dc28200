#!/usr/bin/env bash
# Installs the Debian 12 packages that strata needs to build, test and run its
# demo; with --deploy also a Docker engine, debootstrap and curl for
# `make deploy-test`, with --slurm Slurm and munge for `make slurm-test`,
# with --hosts the network tools of `make hosts-test`. Idempotent: installs
# only what is missing. Run as root (or via sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev liburing-dev libabsl-dev libgloo-dev libxxhash-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev prometheus-cpp-dev
  clang-format iperf3 fio procps openssl
  pybind11-dev python3-dev python3-venv python3-pip python3-setuptools libjemalloc2
  clang-14 libclang-rt-14-dev lld libnetfilter-queue-dev
)
# Installed without recommends: docker-compose would otherwise pull in a whole
# container runtime (only `docker-compose config` is needed to validate), and
# torch and scikit-learn (the Python package's tests and example: the digits
# data set) some hundred packages nothing here uses; the Kubernetes client's
# models are the API schema deploy/k8s/check.py validates against.
packages_no_recommends=(docker-compose python3-torch python3-sklearn python3-kubernetes
  python3-yaml)
if [ "${1:-}" = --deploy ]; then
  packages+=(debootstrap curl)
  packages_no_recommends+=(docker.io)
fi
# Without recommends: the daemons, srun/sbatch and munge, no MPI stack.
if [ "${1:-}" = --slurm ]; then
  packages_no_recommends+=(slurmctld slurmd slurm-client munge)
fi
# Namespaces, links and shaping (iproute2), loss and cuts (nftables), the
# latency queue's rule (iptables), offloads off (ethtool).
if [ "${1:-}" = --hosts ]; then
  packages+=(iproute2 nftables iptables ethtool)
fi

missing=()
for p in "${packages[@]}" "${packages_no_recommends[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# iperf3 asks whether to start a daemon; answer no.
echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections
$SUDO apt-get install -y -qq "${packages[@]}" >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${packages_no_recommends[@]}" >/dev/null
