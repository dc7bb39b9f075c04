"""The floor under `increasing` in CPython: the same work with no engine.

`cayuga bench floor` runs the events of :func:`clients.bench.workloads.increasing`
through a minimal hand-written loop that does only what the query needs — one
dict per state mapping a symbol to its ``(first, last, t0)`` tuple, nine moves
per event, no epochs, no generations, no indexes — and reports its throughput
for each K. The loop is no product code: it exists so that the K-dependence of
the engine can be set against what CPython's memory behaviour imposes on any
pure-Python implementation of the same workload (see BENCHMARKS.md). It gives
the same number of matches as the engine (a test checks this).
"""

from __future__ import annotations

import gc
import time

from clients.bench.runner import sweep_summary
from clients.testing.market import increasing_stream


def run_floor(events: list, length: int = 10) -> tuple[int, float]:
    """Feed ``events`` (``Stock`` events: Name, Price, Volume) through the
    minimal loop; return (matches, seconds)."""
    states = [{} for _ in range(length - 1)]  # M1..M{length-1}: symbol -> (first, last, t0)
    last_state = length - 2
    matches = 0
    gc.freeze()
    t_start = time.perf_counter()
    for ev in events:
        name, price = ev.values[0], ev.values[1]
        t = ev.t1
        for j in range(last_state, -1, -1):  # downstream first: an instance moves once per event
            got = states[j].get(name)
            if got is None:
                continue
            del states[j][name]  # the filter (Name) holds: affected, so consumed
            if price > got[1]:
                if j == last_state:
                    matches += 1
                else:
                    states[j + 1][name] = (got[0], price, got[2])
        states[0][name] = (price, price, t)
    seconds = time.perf_counter() - t_start
    gc.unfreeze()
    return matches, seconds


def floor_sweep(ks: list[int], events: int, length: int = 10, seed: int = 1) -> dict:
    runs = []
    for k in ks:
        evs = increasing_stream(k, events, seed)
        gc.collect()
        matches, seconds = run_floor(evs, length)
        runs.append({"subscriptions": k, "events_per_second": round(events / seconds, 1), "matches": matches,
                     "wall_s": round(seconds, 3)})
        del evs
    return sweep_summary("increasing-floor", events, runs)
