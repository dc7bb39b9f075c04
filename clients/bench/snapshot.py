"""Snapshot pause, size and restart time with many live instances (issue 12).

A server runs in this process with one "rise" subscription (a price above
the same symbol's last one, ``NEXT`` on a dynamic equality: one instance per
symbol waits) and optionally ``--subscriptions K`` more per-symbol queries
(clients/bench/loading.py's, registered in batches); ``--instances N`` events of N
distinct symbols are sent over TCP, so N instances are live. The engine
thread then forks a snapshot (``snapshot_events`` = N): the engine's pause
is the fork, the child's time and the file's size follow. Then a graceful
stop (its in-process final snapshot is timed), and a restart on the same data
directory, timed until the engine thread runs with every instance back.

    python -m clients.bench.snapshot --instances 1000000
    python -m clients.bench.snapshot --instances 1000000 --subscriptions 100000 --data-dir D
    python -m clients.bench.snapshot --restart D     # a restart of what that left, in a fresh process

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import tempfile
import time

from clients.bench.runner import peak_rss_mb

RISE = ("SELECT Sym, P1, Price AS P2 FROM (SELECT Name AS Sym, Price AS P1 FROM Stock) "
        "NEXT{$2.Name = Sym AND $2.Price > P1}(Stock) PUBLISH Rise")


def _send(port: int, n: int, block: int = 20_000) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        for start in range(0, n, block):
            lines = "".join(f'{{"Name":"S{i}","Price":1.0,"Volume":1,"t0":{i},"t1":{i}}}\n'
                            for i in range(start, min(n, start + block)))
            s.sendall(lines.encode())


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def _settings(data_dir: str, instances: int = 10 ** 9):
    from server.config import load_settings

    return load_settings(None, http_port=0, tcp_port=0, data_dir=data_dir, time="event", log_level="warning",
                         snapshot_seconds=0, snapshot_events=instances, queue_capacity=200_000)


def restart(data_dir: str) -> dict:
    """Start a server on ``data_dir`` and time it until it is ready."""
    from server.serve import RunningServer

    t = time.perf_counter()
    srv = RunningServer(_settings(data_dir)).start(timeout=600)
    try:
        out = {"restart_s": round(time.perf_counter() - t, 2), "subscriptions": len(srv.daemon.subscriptions),
               "recovered": srv.daemon.recovered}
    finally:
        srv.stop()
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def run(instances: int, subscriptions: int, data_dir: str) -> dict:
    from clients.testing.market import increasing_cel, symbols
    from clients.client import CayugaClient
    from server.serve import RunningServer

    settings = _settings(data_dir, instances)
    out: dict = {"instances": instances, "subscriptions": subscriptions + 1, "machine": platform.machine(),
                 "python": platform.python_version()}
    with RunningServer(settings) as srv, CayugaClient(srv.base_url, timeout=600) as c:
        d = srv.daemon
        out["engine_build"] = c.health().get("engine_build")
        c.subscribe(cel=RISE)
        syms = symbols(subscriptions)
        for k in range(0, subscriptions, 5000):
            c.subscribe_many([{"cel": increasing_cel(s)} for s in syms[k:k + 5000]])
        t = time.perf_counter()
        _send(srv.tcp_port, instances)
        _wait(lambda: d.snapshotter.taken >= 1 or d.snapshotter.failed, 600, "the snapshot")
        out["events_s"] = round(time.perf_counter() - t, 2)
        snap = d.snapshotter
        out.update(fork_pause_ms=round(snap.last_pause * 1000, 1), child_s=round(snap.last_seconds, 2),
                   snapshot_mb=round(snap.last_bytes / 2 ** 20, 1), failed=snap.failed)
        out["live_instances"] = d.submit(lambda eng: eng.instance_count()).result(timeout=600)
        t = time.perf_counter()
    # the with-block's exit drained and wrote the final snapshot in-process
    out["stop_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    srv = RunningServer(settings).start(timeout=600)
    try:
        out["restart_s"] = round(time.perf_counter() - t, 2)
        out["restored_instances"] = srv.daemon.recovered.get("instances")
    finally:
        srv.stop()
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=1_000_000)
    ap.add_argument("--subscriptions", type=int, default=0, help="per-symbol queries besides the rise query")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--restart", metavar="DATA_DIR", default=None, help="only restart what a run left there")
    a = ap.parse_args()
    if a.restart:
        print(json.dumps(restart(a.restart)))
        return
    with tempfile.TemporaryDirectory(prefix="cayuga-snap-") as tmp:
        print(json.dumps(run(a.instances, a.subscriptions, a.data_dir or tmp)))


if __name__ == "__main__":
    main()
