# kestreld server image: the package and uvloop, no Spark (the pipeline's extra is not installed).
#
#   docker build -t kestreld .
#   docker run -d --name kestreld -p 22133:22133 -p 9090:9090 \
#       -v kestrel-spool:/var/spool/kestrel kestreld
#
# Queues live in the volume /var/spool/kestrel (production.conf's queue_path).
# Mount another config over /etc/kestreld/production.conf to change settings.
# `docker stop` sends SIGTERM: kestreld gives open reads back, syncs its
# journals, writes checkpoints and exits 0, well within the 10 s stop timeout.

# --- build: wheels for kestreld and its runtime dependencies -----------------------------
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kestreld ./kestreld
RUN pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels .

# --- the server -----------------------------------------------------------------------------
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links /tmp/wheels kestreld \
 && rm -rf /tmp/wheels \
 && python -c "import uvloop, kestreld.server"
# A fixed, unprivileged uid/gid, so that volume permissions are predictable.
RUN groupadd --system --gid 10001 kestrel \
 && useradd --system --uid 10001 --gid kestrel --no-create-home \
        --home-dir /var/spool/kestrel --shell /usr/sbin/nologin kestrel \
 && mkdir -p /var/spool/kestrel /etc/kestreld \
 && chown kestrel:kestrel /var/spool/kestrel
COPY config/production.conf /etc/kestreld/production.conf
USER kestrel
WORKDIR /var/spool/kestrel
VOLUME ["/var/spool/kestrel"]
# memcache protocol, Prometheus /metrics and /stats.json
EXPOSE 22133 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["kestreld", "ping", "--config", "/etc/kestreld/production.conf", "--timeout", "3"]
ENTRYPOINT ["kestreld"]
CMD ["--config", "/etc/kestreld/production.conf"]
