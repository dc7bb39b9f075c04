"""bench/loading.py: its CEL query is the `increasing` workload's automaton,
and loading costs the same per query at the end as at the start."""

from __future__ import annotations

from collections import Counter

from air.cel import compile_cel
from bench.loading import increasing_cel, offline
from bench.workloads import STOCK, increasing_query, increasing_stream, symbols
from server.engine import Engine


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


def test_per_query_load_cost_is_flat():
    """A ratio within one run, not a wall-clock threshold: the last 1% of
    3000 queries cost no more than three times the first 1%."""
    r = offline(3000, length=5)
    assert r["network"]["states"] == 3000 * 6
    assert r["per_query"]["last_ms"] < 3 * r["per_query"]["first_ms"]


def test_engine_add_command_loads_every_query():
    from bench.loading import engine_add

    r = engine_add(50, length=3)
    assert r["network"]["states"] == 50 * 4 and r["network"]["nodes"] == 50 * 3 + 1
    assert r["add_cpu_ms_per_query"] > 0
