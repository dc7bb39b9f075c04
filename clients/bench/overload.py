"""Overload: one TCP sender pushes events as fast as the socket lets them,
far faster than the engine runs (20 slow subscriptions make sure of it), for
``seconds``, while ``/health`` and ``/metrics`` are polled.

:func:`overload` runs it on a real in-process server on free ports and
returns the samples and figures; ``cayuga bench overload`` prints the
figures (the timings are judged there and in RELIABILITY.md, never in a
test); tests/fuzz/test_overload.py asserts what does not depend on the
machine's speed: the queue within capacity, every answer a 200, memory
bounded, nothing accepted lost.

    cayuga bench overload --seconds 60
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from pathlib import Path

from clients.client import CayugaClient
from server.observability.counters import Count

CAPACITY = 5_000
#: The workload's unmatched instances grow without end; the limit bounds them.
INSTANCES = 20_000


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def block(n: int, start: int) -> bytes:
    return b"".join(json.dumps({"stream": "Stock", "t1": start + i, "Name": f"S{i % 50}", "Price": float(i % 97),
                                "Volume": i}).encode() + b"\n" for i in range(n))


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def _offered_rate() -> float:
    """Events/s one sender pushes unthrottled into a socket that reads and discards."""
    sink = socket.create_server(("127.0.0.1", 0))
    payload = block(10_000, 0)

    def drain():
        conn, _ = sink.accept()
        with conn:
            while conn.recv(1 << 20):
                pass

    th = threading.Thread(target=drain)
    th.start()
    t = time.monotonic()
    with socket.create_connection(sink.getsockname()) as s:
        for _ in range(20):
            s.sendall(payload)
    rate = 200_000 / (time.monotonic() - t)
    th.join(10)
    sink.close()
    return rate


def drive(srv, seconds: float, capacity: int = CAPACITY) -> dict:
    """The overload against a started server ``srv`` (a RunningServer with
    ``queue_capacity=capacity``): samples of the queue's length, RSS and the
    time /health and /metrics took, and the counts after the queue drained."""
    d = srv.daemon
    samples = {"queue": [], "rss_mb": [], "status": [], "answer_s": []}
    with CayugaClient(srv.base_url) as c:
        for k in range(20):  # a slow engine: 20 subscriptions with instances on every symbol
            c.subscribe(cel=f"SELECT * FROM FILTER{{Price > {k % 10}}}(Stock) NEXT{{$1.Name = $2.Name AND "
                            f"$2.Price > $1.Price + {k}}} Stock PUBLISH O{k}")
        t = time.monotonic()  # the engine's own rate: 5K events through the server, waited for
        with socket.create_connection(("127.0.0.1", srv.tcp_port)) as s:
            s.sendall(block(5_000, 0))
        _wait(lambda: d.engine.stats.events >= 5_000, 120, "5,000 warm-up events processed")
        engine_rate = 5_000 / (time.monotonic() - t)
        offered_rate = _offered_rate()
        base = rss_mb()
        stop, sent = threading.Event(), [0]

        def sender():  # one connection: a second one's interleaved times would be late
            t1 = 1_000_000
            with socket.create_connection(("127.0.0.1", srv.tcp_port)) as s:
                while not stop.is_set():
                    s.sendall(block(2_000, t1))
                    t1 += 2_000
                    sent[0] += 2_000

        th = threading.Thread(target=sender, name="overload-sender")
        th.start()
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for path in ("/health", "/metrics"):
                    t = time.monotonic()
                    samples["status"].append(c.http.get(path, timeout=30).status_code)
                    samples["answer_s"].append(time.monotonic() - t)
                samples["queue"].append(len(d.queue))
                samples["rss_mb"].append(rss_mb())
                time.sleep(0.2)  # the sampling period: the subject is a span of overload, sampled
        finally:
            stop.set()
            th.join(seconds + 60)
        _wait(lambda: len(d.queue) == 0, 300, "the queue to drain")
        _wait(lambda: sum(d.activity()[0].values()) >= d.counters.get(Count.RECEIVED_TCP), 60,
              "every received event processed")
    return {"samples": samples, "base_rss_mb": base, "engine_rate": engine_rate, "offered_rate": offered_rate,
            "sent": sent[0], "received": d.counters.get(Count.RECEIVED_TCP),
            "processed": sum(d.activity()[0].values()), "instances_evicted": d.counters.get(Count.INSTANCES_EVICTED)}


def overload(seconds: float = 60.0) -> dict:
    """``cayuga bench overload``: :func:`drive` on a fresh server; the figures."""
    from server.config import load_settings
    from server.serve import RunningServer

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, data_dir=Path(tmp) / "data", http_port=0, tcp_port=0, log_level="warning",
                                 queue_capacity=CAPACITY, max_instances_per_subscription=INSTANCES)
        with RunningServer(settings) as srv:
            r = drive(srv, seconds)
    s = r["samples"]
    return {"benchmark": "overload", "seconds": seconds, "engine_events_per_s": round(r["engine_rate"]),
            "sender_unthrottled_events_per_s": round(r["offered_rate"]),
            "ratio": round(r["offered_rate"] / r["engine_rate"], 1), "sent": r["sent"],
            "received": r["received"] - 5_000, "lost": r["received"] - r["processed"],
            "instances_evicted": r["instances_evicted"], "queue_max": max(s["queue"]), "queue_capacity": CAPACITY,
            "rss_base_mb": round(r["base_rss_mb"]), "rss_peak_mb": round(max(s["rss_mb"])),
            "slowest_health_or_metrics_s": round(max(s["answer_s"]), 3),
            "non_200_answers": sum(x != 200 for x in s["status"])}
