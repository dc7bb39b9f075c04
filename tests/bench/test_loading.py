"""clients/bench/loading.py: its CEL query is the `increasing` workload's automaton,
and its runs load every query and report what they measured."""

from __future__ import annotations

from collections import Counter

from air.cel import compile_cel
from air.engine import Engine
from clients.bench.loading import offline
from clients.testing import STOCK, increasing_cel, increasing_query, increasing_stream, symbols


def _witnesses(automata, events) -> Counter:
    eng = Engine()
    eng.declare(STOCK)
    eng.add(automata, owner="q")
    return Counter((em.stream, em.event.t0, em.event.t1, em.event.values) for em in eng.run(events))


def test_the_cel_query_behaves_as_the_increasing_workloads_automaton():
    events = increasing_stream(3, 400, seed=2)
    for s in symbols(3):
        cel = compile_cel(increasing_cel(s, 4), [STOCK]).automata
        assert len(cel) == 1 and len(cel[0].states) == 5
        assert _witnesses(cel, events) == _witnesses([increasing_query(s, 4)], events) != Counter()


def test_offline_loading_builds_the_network_and_reports_its_per_query_cost():
    """Every query loaded, and the per-query cost of the first and last 1%
    reported. Whether that cost stays flat is a wall-clock comparison of 30
    queries against 30 (flaky on a busy 2-core machine): `python -m
    clients.bench.loading offline` measures it (BENCHMARKS.md), this test does not
    judge it."""
    r = offline(1000, length=5)
    assert r["network"]["states"] == 1000 * 6
    assert r["per_query"]["first_ms"] > 0 and r["per_query"]["last_ms"] > 0


def test_engine_add_command_loads_every_query():
    from clients.bench.loading import engine_add

    r = engine_add(50, length=3)
    assert r["network"]["states"] == 50 * 4 and r["network"]["nodes"] == 50 * 3 + 1
    assert r["add_cpu_ms_per_query"] > 0
