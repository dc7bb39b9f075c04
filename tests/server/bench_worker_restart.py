"""How long a killed engine worker's catch-up takes (BENCHMARKS.md, "Engine workers, stage 3"):
``python -m tests.server.bench_worker_restart [EVENTS]``. A server with one worker (no snapshot
after the start: the catch-up replays the whole journal) takes EVENTS ticks of 40 symbols for a
NEXT and a FOLD query; the worker is killed with SIGKILL, and the time of its catch-up (the
queue waits meanwhile) is printed with the events it replayed."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from clients.client import CayugaClient
from clients.testing import RISING, server_settings, wait_until, write_ticks
from server.serve import RunningServer
from server.workers import restart


def main(n: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ticks = Path(tmp) / "ticks.jsonl"
        write_ticks(ticks, n, 40, seed=3)
        events = [json.loads(line) for line in ticks.read_text().splitlines()]
        s = server_settings(Path(tmp) / "data", time="event", engine_workers=1, snapshot_seconds=0,
                            snapshot_events=10_000_000)
        took: list[tuple[float, int]] = []
        run = restart.CatchUp.run

        def timed(catch_up) -> int:
            start = time.perf_counter()
            replayed = run(catch_up)
            took.append((time.perf_counter() - start, replayed))
            return replayed

        restart.CatchUp.run = timed
        try:
            with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
                c.subscribe(cel=RISING)
                c.subscribe(cel="SELECT Name, Price FROM Stock FOLD{$2.Name = $1.Name, $2.Price > $.Price, } "
                                "Stock PUBLISH Runs")
                d = srv.daemon
                start = time.perf_counter()
                for k in range(0, n, 20_000):
                    c.post_events(events[k:k + 20_000])
                wait_until(lambda: d.events_taken == n, 600, what="every event")
                live = time.perf_counter() - start
                os.kill(d.links[0].process.pid, signal.SIGKILL)
                wait_until(lambda: (w := c.health()["workers"][0])["restarts"] == 1 and w["state"] == "running",
                           600, what="the restart")
        finally:
            restart.CatchUp.run = run
        seconds, replayed = took[0]
        return (f"events={n} live (HTTP POST to witnesses) {live:.2f} s; catch-up {seconds:.2f} s for {replayed} "
                f"events: {replayed / seconds:,.0f} events/s")


if __name__ == "__main__":
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000))
