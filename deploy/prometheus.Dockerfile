# Prometheus from Debian's package, scraping the strata daemons listed in
# STRATA_METRICS_TARGETS (host:port,host:port,...) every 5 s.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/prometheus && chown prometheus /var/lib/prometheus
COPY prometheus-entrypoint.sh /usr/local/bin/
USER prometheus
ENTRYPOINT ["/usr/local/bin/prometheus-entrypoint.sh"]
