# Cayuga for Python: the server in a slim, non-root image.
# (Images cannot be built on the development machine: there is no container
# daemon there. Keep this file simple enough to check by reading.)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    CAYUGA_HOST=0.0.0.0 CAYUGA_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml setup.py README.md LICENSE ./
COPY air ./air
COPY server ./server
COPY clients ./clients
COPY examples ./examples
# pip compiles the engine (setup.py); a C compiler only while building. The image is the
# server: Spark (`pip install '.[spark]'`) is not in it.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install . \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app cayuga \
    && mkdir -p /data && chown cayuga /data
USER cayuga
VOLUME ["/data"]
EXPOSE 8400 8401

# /livez fails (503) only when the engine thread is gone: a restart helps. /readyz (503 while
# starting, draining or degraded) is for load balancers and orchestrators' readiness checks.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8400/livez', timeout=2).status == 200 else 1)"]
# SIGTERM (docker stop) drains the queue and notifies clients before exiting 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cayuga"]
# the bundled defaults (server/config.yaml, package data); CAYUGA_* variables override them
CMD ["serve"]
