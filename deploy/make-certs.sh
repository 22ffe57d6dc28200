#!/usr/bin/env bash
# make-certs.sh DIR [HOST...]: a CA and the certificates a strata cluster
# uses for TLS, made with openssl into DIR:
#   ca.pem                       the CA (trainers and stratactl: --tls_ca)
#   coordinator.pem/.key         the coordinator's certificate
#   server.pem/.key              the shard servers' certificate (one for all)
# Both certificates name localhost, 127.0.0.1 and each HOST (an IP address
# or a DNS name: the addresses the daemons advertise), and serve as client
# certificates too (mutual TLS between coordinator and shard servers). The
# CA's key stays in DIR/ca.key: keep it, or delete it once done. Does
# nothing when DIR/ca.pem exists (delete DIR to make new ones). With
# STRATA_CERT_OWNER=UID, the keys are made readable by that user only (the
# image's daemons run as uid 10001).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [HOST...]" >&2; exit 2; }
dir=$1
shift
if [ -e "$dir/ca.pem" ]; then
  echo "make-certs: $dir/ca.pem exists; keeping the certificates there"
  exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

names="DNS:localhost,IP:127.0.0.1"
for host in "$@"; do
  [ -n "$host" ] || continue
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then
    names="$names,IP:$host"
  else
    names="$names,DNS:$host"
  fi
done

ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$work/ca.key" -out "$work/ca.pem" -days 3650 \
  -subj "/CN=strata cluster CA" 2>/dev/null
for role in coordinator server; do
  openssl req "${ec[@]}" -keyout "$work/$role.key" -out "$work/$role.csr" \
    -subj "/CN=strata-$role" 2>/dev/null
  printf '%s\n' "subjectAltName=$names" "extendedKeyUsage=serverAuth,clientAuth" \
    >"$work/$role.ext"
  openssl x509 -req -in "$work/$role.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 825 -extfile "$work/$role.ext" -out "$work/$role.pem" 2>/dev/null
done

install -m 0644 "$work/ca.pem" "$work/coordinator.pem" "$work/server.pem" "$dir/"
install -m 0600 "$work/ca.key" "$dir/"
owner=()
[ -n "${STRATA_CERT_OWNER:-}" ] && owner=(-o "$STRATA_CERT_OWNER")
install -m 0600 "${owner[@]}" "$work/coordinator.key" "$work/server.key" "$dir/"
echo "make-certs: a CA and certificates for $names in $dir"
