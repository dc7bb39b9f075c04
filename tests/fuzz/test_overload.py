"""Overload: TCP senders push events as fast as the socket lets them, far
faster than the engine runs (a slow subscription set makes sure of it), for
OVERLOAD_SECONDS. The queue stays within its capacity, memory stays bounded
(the queue by its capacity, the subscriptions' instances by
max_instances_per_subscription),
/health and /metrics answer within a second, and nothing accepted is lost:
after the senders stop, everything accepted is processed."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from clients.client import CayugaClient
from tests.fuzz.conftest import LONG, OVERLOAD_SECONDS

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


@pytest.fixture
def overload_server(fuzz_server):
    return fuzz_server(queue_capacity=CAPACITY, max_instances_per_subscription=INSTANCES)


def test_overload_keeps_memory_and_answers_bounded(overload_server):
    srv = overload_server
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        for k in range(20):  # a slow engine: 20 subscriptions with instances on every symbol
            c.subscribe(cel=f"SELECT * FROM FILTER{{Price > {k % 10}}}(Stock) NEXT{{$1.Name = $2.Name AND "
                            f"$2.Price > $1.Price + {k}}} Stock PUBLISH O{k}")
        # the engine's own rate, measured: 5K events through the server, waited for
        warm = block(5_000, 0)
        t = time.monotonic()
        with socket.create_connection(("127.0.0.1", srv.tcp_port)) as s:
            s.sendall(warm)
        while d.engine.stats.events < 5_000:
            time.sleep(0.01)
        engine_rate = 5_000 / (time.monotonic() - t)
        # what one sender can push unthrottled, into a socket that reads and discards
        sink = socket.create_server(("127.0.0.1", 0))
        payload = block(10_000, 0)

        def drain_sink():
            conn, _ = sink.accept()
            with conn:
                while conn.recv(1 << 20):
                    pass

        th = threading.Thread(target=drain_sink)
        th.start()
        t = time.monotonic()
        with socket.create_connection(sink.getsockname()) as s:
            for _ in range(20):
                s.sendall(payload)
        offered_rate = 200_000 / (time.monotonic() - t)
        th.join(10)
        sink.close()

        base = rss_mb()
        peak, slowest, stop = base, 0.0, threading.Event()
        sent = [0]

        def sender(k: int):  # one connection: a second one's interleaved times would be late
            t1 = 1_000_000 * (k + 1)
            with socket.create_connection(("127.0.0.1", srv.tcp_port)) as s:
                while not stop.is_set():
                    s.sendall(block(2_000, t1))
                    t1 += 2_000
                    sent[k] += 2_000

        senders = [threading.Thread(target=sender, args=(0,))]
        for t in senders:
            t.start()
        end = time.monotonic() + OVERLOAD_SECONDS
        while time.monotonic() < end:
            for path in ("/health", "/metrics"):
                t = time.monotonic()
                assert c.http.get(path, timeout=10).status_code == 200
                slowest = max(slowest, time.monotonic() - t)
            assert len(d.queue) <= CAPACITY
            peak = max(peak, rss_mb())
            time.sleep(0.2)
        stop.set()
        for t in senders:
            t.join(OVERLOAD_SECONDS + 60)
        deadline = time.monotonic() + 120
        while len(d.queue) and time.monotonic() < deadline:
            time.sleep(0.05)
        received = d.counters.get("received_tcp")
        processed_inputs = sum(d.activity()[0].values())
        evicted = d.counters.get("instances_evicted")
    figures = {"engine_events_per_s": round(engine_rate), "sender_unthrottled_events_per_s": round(offered_rate),
               "ratio": round(offered_rate / engine_rate, 1), "sent": sum(sent), "received": received - 5_000,
               "instances_evicted": evicted, "rss_base_mb": round(base), "rss_peak_mb": round(peak),
               "slowest_health_or_metrics_s": round(slowest, 3)}
    print("overload:", json.dumps(figures))
    assert received == processed_inputs  # nothing accepted was lost
    assert peak - base < 300, figures
    assert slowest < 1.0, figures
    if LONG:
        assert offered_rate >= 10 * engine_rate, figures
