"""What the state budget costs and how close its estimate is (issue 31):
``python -m clients.bench.state_cost [--events N] [--queries K]``.

1. The README's Rising query over a driftless random walk of 1,000 symbols: the
   engine's estimate of its state (air/engine/footprint.py) against what
   tracemalloc sees the instances take (each instance also keeps its event's
   symbol, a fresh string a decoder made: counted from ``sys.getsizeof``).
2. The budget's pass over the nodes holding instances (``footprint.survey``,
   what server/budget.py runs every CHECK_EVENTS events) with K per-symbol
   queries loaded, in ms, and per event at that interval.

Prints one JSON object."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc

from air.cel import compile_cel
from air.engine import BUILD, Engine, Event, footprint
from clients.testing.market import RISING, STOCK, increasing_query, increasing_stream, random_walk, symbols


def estimate_against_tracemalloc(events: int) -> dict:
    walk = [Event(e.stream, ("".join(list(e.values[0])),) + e.values[1:], e.t0, e.t1)
            for e in random_walk(1000, events, seed=1, down=0.01, up=0.01)]
    symbol_bytes = sys.getsizeof(walk[0].values[0])
    eng = Engine()
    eng.declare(STOCK)
    eng.add(compile_cel(RISING, {"Stock": STOCK}).automata, "rising")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for e in walk:
            eng.feed(e)
        eng.flush()
        del walk, e
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    live = eng.instance_count()
    measured = used + live * symbol_bytes
    est = footprint.measure(eng).bytes
    return {"events": events, "live_instances": live, "measured_bytes_per_instance": round(measured / live, 1),
            "estimated_bytes_per_instance": round(est / live, 1), "estimate_over_measured": round(est / measured, 3)}


def survey_cost(queries: int, events: int, check_events: int) -> dict:
    eng = Engine()
    eng.declare(STOCK)
    names = symbols(1000)
    for i in range(queries):
        eng.add([increasing_query(names[i % 1000], 10)], f"q{i}")
    for e in increasing_stream(1000, events):
        eng.feed(e)
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        found = footprint.survey(eng, expire=True, heavy=500)
        runs.append(time.perf_counter() - t)
    best = min(runs)
    return {"queries": queries, "nodes_holding_instances": found.footprint.nodes, "survey_ms": round(best * 1e3, 3),
            "per_event_us_at_check_interval": round(best / check_events * 1e6, 4), "check_events": check_events}


def main(argv: list[str] | None = None) -> None:
    from server.budget import CHECK_EVENTS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument("--queries", type=int, default=10_000)
    a = p.parse_args(argv)
    print(json.dumps({"engine_build": BUILD, "python": sys.version.split()[0],
                      "estimate": estimate_against_tracemalloc(a.events),
                      "survey": survey_cost(a.queries, 100_000, CHECK_EVENTS)}))


if __name__ == "__main__":
    main()
