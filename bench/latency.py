"""End-to-end latency through the whole server: TCP in -> WebSocket out.

Starts a real server on free loopback ports, registers one CEL subscription
that matches every event (``SELECT * FROM FILTER{Volume >= 0}(Stock)``),
connects a WebSocket client, and sends events at a fixed rate over TCP with
timestamps from the sender's clock. Each witness carries its event's
``Volume`` field as a sequence number; latency is receive time minus send
time of that event. Prints one JSON object.

    python -m bench.latency --rate 2000 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import threading
import time

from bench.runner import percentile
from clients.client import CayugaClient
from server.config import load_settings
from server.serve import RunningServer


def run(rate: float, seconds: float, delay: float = 0.0) -> dict:
    n = int(rate * seconds)
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, data_dir=tmp, http_port=0, tcp_port=0, log_level="warning",
                                 delay=delay, client_buffer=max(10_000, n))
        with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
            sub = c.subscribe(cel="SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH All")
            sent_at = [0.0] * n
            recv_at = [0.0] * n
            with c.watch(sub["id"], timeout=30) as matches:
                def reader() -> None:
                    got = 0
                    for w in matches:
                        recv_at[w["Volume"]] = time.perf_counter()
                        got += 1
                        if got == n:
                            return

                t = threading.Thread(target=reader, daemon=True)
                t.start()
                with c.sender() as s:
                    start = time.perf_counter()
                    for i in range(n):
                        target = start + i / rate
                        while (now := time.perf_counter()) < target:
                            time.sleep(min(target - now, 0.001))
                        sent_at[i] = time.perf_counter()
                        s.send({"stream": "Stock", "Name": "IBM", "Price": 1.0, "Volume": i})
                t.join(60)
            lat = sorted((r - s) * 1000 for s, r in zip(sent_at, recv_at) if r)
    return {
        "benchmark": "latency_tcp_to_websocket",
        "rate_events_per_s": rate,
        "events": n,
        "received": len(lat),
        "delay_T_ms": delay,
        "p50_ms": round(percentile(lat, 50), 3),
        "p90_ms": round(percentile(lat, 90), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "max_ms": round(lat[-1], 3) if lat else None,
        "python": platform.python_version(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="events per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--delay", type=float, default=0.0, help="the server's T in ms")
    args = ap.parse_args()
    print(json.dumps(run(args.rate, args.seconds, args.delay)))


if __name__ == "__main__":
    main()
