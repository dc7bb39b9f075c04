"""Adding and removing one subscription costs its own size, not the
network's (issue 6). ``cayuga bench scaling`` times remove + add of one
subscription against a network of ``small`` and of ``large`` subscriptions
(each publishing its own stream and sharing the start node) and reports the
ratio of the medians, the best of ``rounds``. A cost that did not grow with
the network gives a ratio near 1 (the figures, before and after issue 6:
BENCHMARKS.md, "Round 3"). A wall-clock ratio is measured here, by command,
not asserted in a test: on a busy machine it is no evidence.

    cayuga bench scaling --small 200 --large 8000
"""

from __future__ import annotations

import statistics
import time

from air.engine import Engine
from clients.testing.market import STOCK, increasing_query, symbols


def network(n: int) -> Engine:
    """n subscriptions, each publishing its own stream and sharing the start node."""
    eng = Engine()
    eng.declare(STOCK)
    for s in symbols(n):
        eng.add(increasing_query(s, 3), owner=s)
    return eng


def median_remove_and_add(eng: Engine, owners: list[str]) -> float:
    times = []
    for s in owners:
        auto = increasing_query(s, 3)
        t = time.perf_counter()
        eng.remove(s)
        eng.add(auto, owner=s)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def scaling(small: int = 200, large: int = 8000, rounds: int = 3) -> dict:
    eng_small, eng_large = network(small), network(large)
    runs = []
    for _ in range(rounds):  # the best round: a busy machine only makes the large case look worse
        big = median_remove_and_add(eng_large, symbols(large)[:small])
        little = median_remove_and_add(eng_small, symbols(small))
        runs.append({"small_s": little, "large_s": big, "ratio": big / little})
    best = min(runs, key=lambda r: r["ratio"])
    return {"benchmark": "remove_and_add_scaling", "small": small, "large": large,
            "median_small_us": round(best["small_s"] * 1e6, 1), "median_large_us": round(best["large_s"] * 1e6, 1),
            "ratio": round(best["ratio"], 2), "ratios": [round(r["ratio"], 2) for r in runs]}
