"""The whole server with many subscriptions: registration, listing, events, restart.

Starts a real server on free loopback ports, registers ``--subscriptions`` CEL
queries over REST (one per symbol, as in ``cayuga bench churn``), then times
``GET /subscriptions``, ``GET /metrics``, ``--events`` events sent over one TCP
connection until the engine has processed them all, a graceful stop, and a
restart that restores every subscription from the SQLite store. Prints one JSON
object.

    python -m clients.bench.server_scale --subscriptions 4000 --events 50000
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time

from clients.bench.churn import QUERY
from clients.bench.runner import metric, peak_rss_mb
from clients.client import CayugaClient
from server.config import load_settings
from server.serve import RunningServer


def run(subscriptions: int, events: int, timeout: float = 600.0) -> dict:
    perf = time.perf_counter
    out: dict = {"benchmark": "server_scale", "subscriptions": subscriptions, "events": events}
    with tempfile.TemporaryDirectory() as tmp:
        def settings():
            return load_settings(None, data_dir=tmp, http_port=0, tcp_port=0, log_level="warning")

        srv = RunningServer(settings()).start(timeout=timeout)
        try:
            with CayugaClient(srv.base_url) as c:
                reg = []
                for i in range(subscriptions):
                    t = perf()
                    c.subscribe(cel=QUERY.format(s=f"S{i:05d}"))
                    reg.append(perf() - t)
                sample = max(1, min(1000, subscriptions // 10))
                out["register_first_median_ms"] = round(statistics.median(reg[:sample]) * 1000, 3)
                out["register_last_median_ms"] = round(statistics.median(reg[-sample:]) * 1000, 3)
                out["register_total_s"] = round(sum(reg), 2)
                for path in ("/subscriptions", "/metrics"):
                    t = perf()
                    r = c.http.get(path)
                    out[f"GET {path}"] = {"seconds": round(perf() - t, 3), "bytes": len(r.content)}
                rng = random.Random(1)
                lines = [json.dumps({"stream": "Stock", "Name": f"S{rng.randrange(subscriptions):05d}",
                                     "Price": round(10 + rng.random(), 3), "Volume": 1}) for _ in range(events)]
                base = metric(c, "cayuga_events_processed_total")
                t = perf()
                with c.sender() as s:
                    s.send_many(lines)
                deadline = t + timeout
                while metric(c, "cayuga_events_processed_total") < base + events and perf() < deadline:
                    time.sleep(0.05)
                wall = perf() - t
                out["processed_all"] = metric(c, "cayuga_events_processed_total") >= base + events
                out["events_per_second"] = round(events / wall, 1)
                out["wall_s"] = round(wall, 3)
            t = perf()
        finally:
            srv.stop()
        out["stop_s"] = round(perf() - t, 2)
        t = perf()
        srv = RunningServer(settings()).start(timeout=timeout)
        try:
            out["restart_restore_s"] = round(perf() - t, 2)
            with CayugaClient(srv.base_url) as c:
                out["restored"] = c.health()["subscriptions"]
        finally:
            srv.stop()
    out["peak_rss_mb"] = peak_rss_mb()
    out["python"] = platform.python_version()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscriptions", type=int, default=4000)
    ap.add_argument("--events", type=int, default=50000)
    args = ap.parse_args()
    print(json.dumps(run(args.subscriptions, args.events)))


if __name__ == "__main__":
    main()
