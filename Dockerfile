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
# With CAYUGA_TLS_CERTFILE the port speaks https only: the probe asks it over TLS without checking the
# certificate (it stays on loopback and sends nothing secret). With CAYUGA_TLS_CLIENT_CA (mutual TLS)
# it has no client certificate: give the container a probe of your own, or use your orchestrator's.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, ssl, sys, urllib.request; tls = bool(os.environ.get('CAYUGA_TLS_CERTFILE')); url = ('https' if tls else 'http') + '://127.0.0.1:8400/livez'; sys.exit(0 if urllib.request.urlopen(url, timeout=2, context=ssl._create_unverified_context() if tls else None).status == 200 else 1)"]
# SIGTERM (docker stop) drains the queue and notifies clients before exiting 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cayuga"]
# the bundled defaults (server/config.yaml, package data); CAYUGA_* variables override them
CMD ["serve"]
