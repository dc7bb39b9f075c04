"""Events/s the README's Rising query gets beside a runaway FOLD (its rebind
always true: an instance per event, each visited by every later event), for
several max_instances_per_subscription values; the shipped config.yaml
otherwise. Its figures, behind the default (config.yaml), are in BENCHMARKS.md,
"Runaway queries and max_instances_per_subscription" (issue 19).

    python clients/bench/runaway.py 1000000,10000,3000,1000,300 [RUNAWAY_CEL]

For each limit: a server in-process, both queries registered, quotes sent over
TCP as fast as the engine takes them (at most 2,000 queued); once the runaway
has been at the limit for a while (or after 30 s), the events processed in
the next 8 s.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time

from clients.client import CayugaClient
from server.config import load_settings
from server.serve import RunningServer
from server.observability.counters import Count

RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
          "$2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")
RUNAWAY = "SELECT * FROM Stock FOLD{$2.Price < 0, true, } Stock"


def run(limit: int, runaway: str = RUNAWAY, warmup: float = 30.0, window: float = 8.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="cayuga-runaway-") as tmp:
        settings = load_settings(data_dir=f"{tmp}/data", http_port=0, tcp_port=0,
                                 log_level="error", shutdown_timeout=60, max_instances_per_subscription=limit)
        srv = RunningServer(settings).start()
        d = srv.daemon
        stop = threading.Event()
        try:
            with CayugaClient(srv.base_url) as c:
                c.subscribe(cel=RISING)
                c.subscribe(cel=runaway)
                rnd = random.Random(1)
                names = [f"S{i}" for i in range(100)]
                price = dict.fromkeys(names, 100.0)

                def send() -> None:
                    with c.sender() as snd:
                        i = 0
                        while not stop.is_set():
                            batch = []
                            for _ in range(500):
                                n = rnd.choice(names)
                                price[n] = max(1.0, price[n] * rnd.uniform(0.97, 1.035))
                                batch.append({"stream": "Stock", "Name": n, "Price": round(price[n], 2), "Volume": i})
                                i += 1
                            snd.send_many(batch)
                            while len(d.queue) > 2000 and not stop.is_set():
                                time.sleep(0.005)

                sender = threading.Thread(target=send, daemon=True)
                sender.start()
                t0 = time.monotonic()
                while time.monotonic() - t0 < warmup and d.events_taken < 2 * limit + 20_000:
                    time.sleep(0.2)
                f0, w0 = d.events_taken, time.monotonic()
                time.sleep(window)
                f1, w1 = d.events_taken, time.monotonic()
                stop.set()
                sender.join(30)
                return {"limit": limit, "events_per_second": round((f1 - f0) / (w1 - w0)),
                        "instances": d.instance_counts(), "evictions": d.counters.get(Count.INSTANCE_EVICTIONS)}
        finally:
            stop.set()
            srv.stop()


if __name__ == "__main__":
    for lim in (int(x) for x in sys.argv[1].split(",")):
        print(run(lim, *sys.argv[2:3]), flush=True)
