#!/usr/bin/env bash
# make-secrets.sh NAMESPACE DIR: the certificates and tokens of a strata
# cluster in Kubernetes namespace NAMESPACE (deploy/make-certs.sh and
# deploy/make-tokens.sh, into DIR), and DIR/secrets.yaml with the three
# Secrets the manifests mount, each with only what its pods need:
#   strata-coordinator-tls  ca.pem, coordinator.pem/.key, auth
#   strata-server-tls       ca.pem, server.pem/.key
#   strata-trainer          ca.pem, user.token
# The certificates name strata-coordinator (and .NAMESPACE.svc) and
# *.strata-server.NAMESPACE.svc, the names the pods use, and localhost for
# the probes. DIR keeps ca.key and operator.token (stratactl's): keep DIR
# private. Then: kubectl apply -f DIR/secrets.yaml
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 NAMESPACE DIR" >&2; exit 2; }
namespace=$1
dir=$2
# A namespace is a DNS label (RFC 1123), and it goes into the names below.
if ! [[ $namespace =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  echo "make-secrets: NAMESPACE '$namespace' is not a DNS label ([a-z0-9-], 63 at most)" >&2
  exit 2
fi
deploy=$(cd "$(dirname "$0")/.." && pwd)
bash "$deploy/make-certs.sh" "$dir" strata-coordinator "strata-coordinator.$namespace.svc" \
  "*.strata-server.$namespace.svc"
bash "$deploy/make-tokens.sh" "$dir"

secret() {  # NAME FILE...: a Secret holding the files under their names
  printf '%s\n' "---" "apiVersion: v1" "kind: Secret" "metadata:" "  name: $1" \
    "  namespace: $namespace" "  labels:" "    app.kubernetes.io/part-of: strata" \
    "type: Opaque" "data:"
  shift
  for file in "$@"; do
    printf '  %s: %s\n' "$file" "$(base64 -w0 <"$dir/$file")"
  done
}
umask 077
{
  echo "# strata's Secrets for namespace $namespace (deploy/k8s/make-secrets.sh)"
  secret strata-coordinator-tls ca.pem coordinator.pem coordinator.key auth
  secret strata-server-tls ca.pem server.pem server.key
  secret strata-trainer ca.pem user.token
} >"$dir/secrets.yaml"
echo "make-secrets: $dir/secrets.yaml (kubectl apply -f it before the manifests)"
