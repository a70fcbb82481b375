# kestreld server image: the package, uvloop and kazoo (the `zookeeper` extra, so that a
# [zookeeper] section joins a server set); no Spark (the pipeline's extra is not installed).
#
#   docker build -t kestreld .
#   docker run -d --name kestreld -p 22133:22133 -p 2222:2222 -p 2229:2229 -p 127.0.0.1:9090:9090 \
#       -v kestrel-spool:/var/spool/kestrel kestreld
#
# Queues live in the volume /var/spool/kestrel (production.conf's queue_path).
# Mount another config over /etc/kestreld/production.conf to change settings.
# `docker stop` sends SIGTERM: kestreld gives open reads back, syncs its
# journals, writes checkpoints and exits 0, well within the 10 s stop timeout.

# BASE: the image both stages start from.  The default is the official Python image;
# any image with python (3.11+), its C headers, pip, groupadd and useradd on PATH will do, e.g. a
# local Debian base where no registry is reachable (tests/deploy/test_image_podman.py builds one):
#   docker build --build-arg BASE=localhost/debian-python:bookworm -t kestreld .
ARG BASE=python:3.12-slim

# --- build: wheels for kestreld and its runtime dependencies -----------------------------
FROM ${BASE} AS build
# gcc compiles the hot path with Cython (setup.py); the server stage needs no compiler.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY kestreld ./kestreld
# The profile-guided build's training run (setup.py runs it; without it the compile is plain).
COPY scripts/build ./scripts/build
# Profile-guided (setup.py): two compiles with a training run between, worth it in an image.
RUN KESTRELD_PGO=1 pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels ".[zookeeper]"

# --- the server -----------------------------------------------------------------------------
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links /tmp/wheels "kestreld[zookeeper]" \
 && rm -rf /tmp/wheels \
 && python -c "import uvloop, kazoo.client, kestreld.server"
# A fixed, unprivileged uid/gid, so that volume permissions are predictable.
RUN groupadd --system --gid 10001 kestrel \
 && useradd --system --uid 10001 --gid kestrel --no-create-home \
        --home-dir /var/spool/kestrel --shell /usr/sbin/nologin kestrel \
 && mkdir -p /var/spool/kestrel /etc/kestreld \
 && chown kestrel:kestrel /var/spool/kestrel
COPY config/production.conf /etc/kestreld/production.conf
# The hot path was compiled in the build stage: fail the build if it is plain Python.
RUN kestreld --version | grep -q "(compiled)"
USER kestrel
WORKDIR /var/spool/kestrel
VOLUME ["/var/spool/kestrel"]
# memcache protocol, Prometheus /metrics and /stats.json
EXPOSE 22133 2222 2229 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["kestreld", "ping", "--config", "/etc/kestreld/production.conf", "--timeout", "3"]
ENTRYPOINT ["kestreld"]
CMD ["--config", "/etc/kestreld/production.conf"]
