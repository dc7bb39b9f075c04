# Cayuga for Python: a slim, non-root image with the `cayuga` command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md config.yaml ./
COPY air ./air
COPY server ./server
COPY clients ./clients
COPY examples ./examples
RUN pip install . && useradd --system --uid 10001 --home-dir /app cayuga && mkdir -p /data \
    && chown cayuga /data
USER cayuga
VOLUME ["/data"]

# The image runs the bundled example by default; pass other arguments to run
# your own queries, e.g. `docker run -v $PWD:/work IMAGE run --query /work/q.xml ...`.
HEALTHCHECK --interval=30s --timeout=5s CMD ["cayuga", "--version"]
ENTRYPOINT ["cayuga"]
CMD ["run", "--config", "/app/config.yaml", "--query", "/app/examples/example9.xml", "--events", "/app/examples/example9.jsonl"]
