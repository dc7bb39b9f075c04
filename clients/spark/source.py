"""Spark as a bulk event source: read a file with Spark and stream it to a server.

The events are sorted by detection time (``t1``, then input position) with a
range-partitioned sort, so partition *k* holds earlier events than partition
*k+1*; the driver then pulls partitions one at a time
(``toLocalIterator``) and writes them to the server's TCP port as JSON lines
over one connection. The server therefore sees every stream in detection-time
order and its T-delayed queue drops nothing as late. Progress is a tqdm bar
(events) and the return value says what was sent and what the server refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from air.model import StreamSchema
from clients.client import TcpSender
from clients.spark import executors as X
from clients.spark.io import ColumnMapping, read_events

#: Bytes buffered before one ``sendall`` (lines are never split across writes' meaning).
SEND_CHUNK = 1 << 16


@dataclass
class SourceResult:
    sent: int = 0
    rejected_input: int = 0
    rejected_samples: list = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    partitions: int = 0


def stream_to_server(spark, path: str, schemas: Sequence[StreamSchema], host: str, port: int,
                     fmt: str | None = None, *, mapping: ColumnMapping | None = None,
                     partitions: int | None = None, progress: bool = True, time_unit_ms: float = 1.0,
                     close_timeout: float = 10.0, token: str | None = None, ssl_context=None) -> SourceResult:
    """Send the events at ``path`` to the server at ``host:port`` in
    detection-time order (``token``: the server's ``#token`` line, when it has auth_tokens;
    ``ssl_context``: TLS, for a server with tls_certfile: ``CayugaClient.tcp_ssl_context``)."""
    inp = read_events(spark, path, list(schemas), fmt, mapping=mapping, time_unit_ms=time_unit_ms)
    n_parts = partitions or spark.sparkContext.defaultParallelism
    ordered = inp.rdd.sortBy(X.event_order, ascending=True, numPartitions=n_parts)
    ordered.persist(_level())
    try:
        total = ordered.count()
        lines = ordered.map(X.EventJson(list(schemas)))
        res = SourceResult(partitions=ordered.getNumPartitions())
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="ev", desc="sending", leave=False)
        sender = TcpSender(host, port, token=token, ssl_context=ssl_context)
        try:
            buf: list[bytes] = []
            size = 0
            for line in lines.toLocalIterator():
                data = line.encode("utf-8") + b"\n"
                buf.append(data)
                size += len(data)
                res.sent += 1
                if size >= SEND_CHUNK:
                    sender.sock.sendall(b"".join(buf))
                    if bar is not None:
                        bar.update(len(buf))
                    buf, size = [], 0
            if buf:
                sender.sock.sendall(b"".join(buf))
                if bar is not None:
                    bar.update(len(buf))
            sender.sent = res.sent
        finally:
            res.server_errors = sender.close(timeout=close_timeout)
            if bar is not None:
                bar.close()
        res.rejected_input, res.rejected_samples = inp.rejected
        return res
    finally:
        ordered.unpersist()


def _level():
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK
