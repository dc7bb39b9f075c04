"""The floors under `increasing` and `rise` in CPython: the same work with no engine.

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
import platform
import time
from bisect import bisect_right

from clients.bench.runner import sweep_summary
from clients.testing.market import increasing_stream, random_walk


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


def run_rise_floor(events: list, factor: float = 1.05) -> tuple[list, float]:
    """The rise query (``clients.testing.market.rise_query``: the next quote of
    the same symbol at least ``factor`` times higher) by a minimal loop: per
    symbol, the waiting quotes as two lists sorted by ``factor * price`` (the
    keys, bisected) and ``(price, t0)``; an event takes the prefix whose key it
    reaches as witnesses ``(name, before, after, t0, t1)`` and then waits
    itself. No epochs, generations, indexes or witness events. Returns the
    witnesses and the seconds the loop took."""
    books: dict = {}
    out: list = []
    emit = out.append
    gc.freeze()
    t_start = time.perf_counter()
    for ev in events:
        values = ev.values
        name, price = values[0], values[1]
        book = books.get(name)
        if book is None:
            book = books[name] = ([], [])
        keys, waiting = book
        i = bisect_right(keys, price)
        if i:
            t1 = ev.t1
            for before, t0 in waiting[:i]:
                emit((name, before, price, t0, t1))
            del keys[:i], waiting[:i]
        key = factor * price
        j = bisect_right(keys, key)
        keys.insert(j, key)
        waiting.insert(j, (price, ev.t0))
    seconds = time.perf_counter() - t_start
    gc.unfreeze()
    return out, seconds


def rise_floor(symbols: list[int], events: int, seed: int = 1, rounds: int = 3) -> dict:
    """For each number of symbols, the engine (:func:`clients.bench.runner.run_workload`,
    the rise query) and :func:`run_rise_floor` over the same random walk, in turn
    ``rounds`` times (best of each): how the engine compares with a minimal
    CPython loop, and how both slow down as the waiting quotes spread over more
    symbols (the same work per event, colder memory)."""
    from air.engine import BUILD
    from clients.bench import workloads as wl
    from clients.bench.runner import engine_options, run_workload
    from clients.testing import STOCK
    from clients.testing.market import rise_query

    runs = []
    for n in symbols:
        evs = random_walk(n, events, seed)
        w = wl.Workload("rise", (STOCK,), [rise_query()], evs)
        engine_best = floor_best = 0.0
        for _ in range(rounds):
            gc.collect()
            r = run_workload(w, engine_options())
            engine_best = max(engine_best, r["events_per_second"])
            gc.collect()
            witnesses, seconds = run_rise_floor(evs)
            floor_best = max(floor_best, events / seconds)
            if len(witnesses) != r["matches"]:
                raise RuntimeError(f"the floor loop found {len(witnesses)} witnesses, the engine {r['matches']}")
            del witnesses
        runs.append({"symbols": n, "engine_events_per_second": round(engine_best), "waiting_at_end": r["instances_at_end"],
                     "floor_events_per_second": round(floor_best), "witnesses": r["matches"],
                     "engine_over_floor": round(engine_best / floor_best, 2)})
        del w, evs
    return {"workload": "rise-floor", "events": events, "rounds": rounds, "runs": runs, "engine_build": BUILD,
            "python": platform.python_version()}
