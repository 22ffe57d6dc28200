#!/bin/sh
# Writes Prometheus's configuration from STRATA_METRICS_TARGETS, then runs it.
set -eu
targets=$(echo "${STRATA_METRICS_TARGETS}" | sed "s/[^,][^,]*/'&'/g")
cat > /tmp/prometheus.yml <<CONFIG
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: strata
    static_configs:
      - targets: [${targets}]
CONFIG
exec prometheus --config.file=/tmp/prometheus.yml --storage.tsdb.path=/var/lib/prometheus \
  --web.listen-address="${STRATA_PROMETHEUS_LISTEN:-127.0.0.1:9090}"
