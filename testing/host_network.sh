#!/usr/bin/env bash
# host_network.sh: an emulated network of hosts in Linux network namespaces,
# for tests of strata across hosts on one machine (root only).
#
#   host_network.sh up PREFIX PROFILE HOST...   create it
#   host_network.sh down PREFIX                 remove it and everything in it
#   host_network.sh cut PREFIX HOST_A HOST_B    drop every packet between two hosts
#   host_network.sh heal PREFIX HOST_A HOST_B   undo a cut
#   host_network.sh address PREFIX HOST         a host's address
#   host_network.sh loopback PREFIX PROFILE     one namespace, PREFIX-lo, whose
#                                               loopback has the profile's links
#
# Each HOST is a namespace PREFIX-HOST with one link (a veth pair, device
# eth0) to the router namespace PREFIX-net; host number i (from 1, in the
# order given) is 198.18.i.2/24 behind 198.18.i.1 (198.18.0.0/15 is the
# benchmarking range, RFC 2544: it exists only in these namespaces). A host
# has a route to 198.18.0.0/16 and no other: nothing leaves the test network.
# The machine's own namespace is one more host, "ctl" (198.18.250.2, device
# PREFIX-ctl), so that the test driving it reaches every host; removing the
# router removes that link too.
#
# PROFILE shapes every link like a cluster network:
#   cluster  10 Gbit/s each way, 0.1 ms one way, no loss
#   slow     1 Gbit/s each way, 2 ms one way, 0.1% of packets lost
# The rate is tbf on both ends of each link; the latency is net_delay holding
# each forwarded packet in an NFQUEUE (this kernel may lack netem); the loss
# is an nftables numgen rule on the router, with segmentation offloads off so
# that it drops wire-sized packets. Cuts are nftables rules on the router.
#
# Everything lives in the namespaces: `down` (also after an interrupted run)
# kills their processes and deletes them, which removes links, qdiscs and
# rules. NET_DELAY names the net_delay binary (default: beside this script's
# build, build/tests/net_delay).
set -euo pipefail

die() {
  echo "host_network.sh: $*" >&2
  exit 1
}

[[ $# -ge 2 ]] || die "usage: up PREFIX PROFILE HOST... | loopback PREFIX PROFILE | down PREFIX | cut|heal PREFIX A B | address PREFIX HOST"
command=$1
prefix=$2
[[ $prefix =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "PREFIX '$prefix': 1-8 lowercase letters and digits, a letter first"
state=/run/strata-net/$prefix
router=$prefix-net

# The address of host `$1` from the host list of `up`.
address() {
  [[ $1 == ctl ]] && { echo 198.18.250.2; return; }
  local i=1 host
  for host in $(cat "$state/hosts" 2>/dev/null); do
    [[ $host == "$1" ]] && { echo "198.18.$i.2"; return; }
    i=$((i + 1))
  done
  die "no host '$1' in network $prefix"
}

# Shapes device $2 of namespace $1 at rate $3 (Mbit/s).
shape() {
  local rate_mbit=$3
  # Burst (bytes): 1 ms at the rate, and at least two 64 KiB GSO packets.
  local burst=$((rate_mbit * 125))
  [[ $burst -ge 131072 ]] || burst=131072
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate_mbit}mbit" burst "${burst}b" latency 50ms
}

# Sets rate_mbit, delay_us and loss_per_mille for profile $1, checks that
# this machine can build networks, and arranges that a network half brought
# up is removed.
begin() {
  case $1 in
    cluster) rate_mbit=10000 delay_us=100 loss_per_mille=0 ;;
    slow) rate_mbit=1000 delay_us=2000 loss_per_mille=1 ;;
    *) die "PROFILE '$1': cluster or slow" ;;
  esac
  [[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
  [[ ! -e $state ]] || die "network $prefix exists already: 'host_network.sh down $prefix' first"
  net_delay=${NET_DELAY:-$(dirname "$0")/../build/tests/net_delay}
  [[ -x $net_delay ]] || die "no net_delay at $net_delay (build it: make build; set NET_DELAY)"
  for tool in nft iptables-legacy tc ethtool; do
    command -v $tool > /dev/null || die "needs $tool (deploy/install-deps.sh --hosts)"
  done
  trap '[[ $? == 0 ]] || down' EXIT
  mkdir -p "$state"
}

# Starts net_delay in namespace $1 on queue 0.
start_delay() {
  ip netns exec "$1" "$net_delay" --queue=0 --delay_us="$delay_us" > "$state/net_delay.log" 2>&1 &
  for _ in $(seq 100); do
    grep -q "net_delay: queue" "$state/net_delay.log" && return
    sleep 0.05
  done
  die "net_delay did not start: $(cat "$state/net_delay.log")"
}

loopback() {
  begin "$1"
  local ns=$prefix-lo
  ip netns add "$ns"
  ip -n "$ns" link set dev lo up
  if [[ $loss_per_mille -gt 0 ]]; then
    # Wire-sized packets, so that the loss drops what a NIC would send.
    ip -n "$ns" link set dev lo mtu 1500
    ip netns exec "$ns" ethtool -K lo tso off gso off gro off > /dev/null
    ip netns exec "$ns" nft add table inet strata
    ip netns exec "$ns" nft add chain inet strata output "{ type filter hook output priority -10; policy accept; }"
    ip netns exec "$ns" nft add rule inet strata output numgen random mod 1000 "<" "$loss_per_mille" drop
  fi
  shape "$ns" lo "$rate_mbit"
  ip netns exec "$ns" iptables-legacy -A OUTPUT -o lo -j NFQUEUE --queue-num 0
  start_delay "$ns"
}

up() {
  local profile=$1
  shift
  [[ $# -ge 1 && $# -le 200 ]] || die "1 to 200 hosts"
  if ip route show 198.18.0.0/16 | grep -q .; then
    die "this machine routes 198.18.0.0/16 already (another test network is up?)"
  fi
  begin "$profile"
  echo "$*" > "$state/hosts"
  ip netns add "$router"
  ip -n "$router" link set lo up
  ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1
  local i=1 host ns
  for host in "$@"; do
    [[ $host =~ ^[a-z][a-z0-9]{0,9}$ && $host != net && $host != ctl ]] ||
      die "HOST '$host': 1-10 lowercase letters and digits, a letter first, not net or ctl"
    ns=$prefix-$host
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add eth0 netns "$ns" type veth peer name "$host" netns "$router"
    ip -n "$ns" addr add "198.18.$i.2/24" dev eth0
    ip -n "$ns" link set dev eth0 up
    ip -n "$router" addr add "198.18.$i.1/24" dev "$host"
    ip -n "$router" link set dev "$host" up
    ip -n "$ns" route add 198.18.0.0/16 via "198.18.$i.1"
    if [[ $loss_per_mille -gt 0 ]]; then
      ip netns exec "$ns" ethtool -K eth0 tso off gso off gro off > /dev/null
      ip netns exec "$router" ethtool -K "$host" tso off gso off gro off > /dev/null
    fi
    shape "$ns" eth0 "$rate_mbit"
    shape "$router" "$host" "$rate_mbit"
    i=$((i + 1))
  done
  ip link add "$prefix-ctl" type veth peer name ctl netns "$router"
  ip addr add 198.18.250.2/24 dev "$prefix-ctl"
  ip link set dev "$prefix-ctl" up
  ip -n "$router" addr add 198.18.250.1/24 dev ctl
  ip -n "$router" link set dev ctl up
  ip route add 198.18.0.0/16 via 198.18.250.1 dev "$prefix-ctl"
  # Cuts first, then loss (neither for the test's own link), then latency.
  ip netns exec "$router" nft -f - << EOF
table inet strata {
  chain cuts {}
  chain forward {
    type filter hook forward priority -10; policy accept;
    jump cuts
  }
}
EOF
  if [[ $loss_per_mille -gt 0 ]]; then
    ip netns exec "$router" nft add rule inet strata forward iifname != ctl oifname != ctl \
      numgen random mod 1000 "<" "$loss_per_mille" drop
  fi
  ip netns exec "$router" iptables-legacy -A FORWARD -j NFQUEUE --queue-num 0
  start_delay "$router"
}

down() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" || true); do
    ip netns pids "$ns" | xargs -r kill -KILL 2> /dev/null || true
    ip netns del "$ns"
  done
  ip link del "$prefix-ctl" 2> /dev/null || true
  rm -rf "$state"
}

# The nft rule pair of a cut between $1 and $2, one line each direction.
cut_rules() {
  local a b
  a=$(address "$1")
  b=$(address "$2")
  echo "ip saddr $a ip daddr $b drop comment \"$1-$2\""
  echo "ip saddr $b ip daddr $a drop comment \"$1-$2\""
}

case $command in
  up)
    [[ $# -ge 4 ]] || die "usage: up PREFIX PROFILE HOST..."
    shift 2
    up "$@"
    ;;
  down) down ;;
  loopback)
    [[ $# == 3 ]] || die "usage: loopback PREFIX PROFILE"
    loopback "$3"
    ;;
  cut)
    [[ $# == 4 ]] || die "usage: cut PREFIX HOST_A HOST_B"
    cut_rules "$3" "$4" | while read -r rule; do
      eval ip netns exec "$router" nft add rule inet strata cuts "$rule"
    done
    ;;
  heal)
    [[ $# == 4 ]] || die "usage: heal PREFIX HOST_A HOST_B"
    address "$3" > /dev/null
    address "$4" > /dev/null
    for handle in $(ip netns exec "$router" nft -a list chain inet strata cuts |
      grep -E "comment \"($3-$4|$4-$3)\"" | sed 's/.*# handle //'); do
      ip netns exec "$router" nft delete rule inet strata cuts handle "$handle"
    done
    ;;
  address)
    [[ $# == 3 ]] || die "usage: address PREFIX HOST"
    address "$3"
    ;;
  *) die "unknown command '$command'" ;;
esac
