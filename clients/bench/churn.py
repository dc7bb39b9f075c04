"""Subscriptions that come and go while events flow (issue 6, deliverable 2).

`cayuga bench churn` compiles and loads ``--subscriptions`` CEL queries the way
the server does (``compile_cel`` against the engine's live stream view, then
``Engine.add``), one per stock symbol::

    SELECT Name, Price_1 AS First, Price AS Second
    FROM FILTER{Name = 'SYM'}(Stock) NEXT{$1.Name = $2.Name AND $2.Price > 1.02 * $1.Price} Stock
    PUBLISH Up_SYM

then feeds a random walk over those symbols and, every ``--every`` events,
removes one subscription and registers a fresh one. It reports the cost of
registering (compile + add) at the start and at the end of loading — equal if
a registration costs its own size — and of the removals and registrations made
while events flow.
"""

from __future__ import annotations

import gc
import random
import statistics
import time

from air.cel import compile_cel
from air.engine import Engine
from clients.bench.runner import peak_rss_mb, percentile
from clients.testing.market import STOCK, random_walk, symbols

QUERY = ("SELECT Name, Price_1 AS First, Price AS Second FROM FILTER{{Name = '{s}'}}(Stock) "
         "NEXT{{$1.Name = $2.Name AND $2.Price > 1.02 * $1.Price}} Stock PUBLISH Up_{s}")


def _ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 4), "p99_ms": round(percentile(xs, 99) * 1000, 4)}


def churn(subscriptions: int, events: int, every: int, seed: int = 1) -> dict:
    rng = random.Random(seed)
    names = symbols(subscriptions)
    eng = Engine()
    eng.declare(STOCK)
    perf = time.perf_counter
    load = []
    t_load = perf()
    for s in names:
        t = perf()
        eng.add(compile_cel(QUERY.format(s=s), eng.stream_view, name_prefix=s).automata, owner=s)
        load.append(perf() - t)
    load_s = perf() - t_load
    evs = random_walk(subscriptions, events, seed)
    live = list(names)
    fresh = 0
    removes, adds = [], []
    gc.freeze()
    t0 = perf()
    for i, ev in enumerate(evs, 1):
        eng.feed(ev)
        if i % every == 0:
            j = rng.randrange(len(live))
            gone = live[j]
            t = perf()
            eng.remove(gone)
            removes.append(perf() - t)
            fresh += 1
            owner = f"{gone}_{fresh}"  # a new subscriber to the same symbol, under a new id
            t = perf()
            eng.add(compile_cel(QUERY.format(s=gone).replace(f"Up_{gone}", f"Up_{owner}"), eng.stream_view,
                                name_prefix=owner).automata, owner=owner)
            adds.append(perf() - t)
            live[j] = owner
    eng.flush()
    wall = perf() - t0
    gc.unfreeze()
    sample = max(1, min(1000, subscriptions // 10))
    return {
        "workload": "churn", "events": events, "subscriptions": subscriptions, "matches": eng.stats.witnesses,
        "events_per_second": round(events / wall, 1), "wall_s": round(wall, 3), "load_s": round(load_s, 3),
        "peak_rss_mb": peak_rss_mb(),
        "register_first": _ms(load[:sample]), "register_last": _ms(load[-sample:]),
        "churn": {"every": every, "removed": len(removes), "remove": _ms(removes) if removes else None,
                  "register": _ms(adds) if adds else None},
        "network": eng.plan_stats(), "eval_errors": eng.stats.eval_errors,
    }
