"""What the engine's state costs, and expiry (issue 31; air/engine/footprint.py,
air/bounds.py).

- An instance no event can affect any more (its state's filter bounds DUR in
  every clause, and the epoch is past the bound) is dead weight: dropping it
  changes no witness. Checked against the same engine that never expires,
  over queries that bound DUR in every way CEL can (NEXT, FOLD, OR of
  clauses, <, <=, =, two steps) and events with simultaneous epochs,
  expiring after every event, mid-epoch included.
- The estimate of the state's bytes is a pure function of the engine's state
  (the same events give the same figure), counts what ``instance_count``
  counts, and is within a band of what tracemalloc measures for the README's
  query.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.bounds import Horizon, filter_horizon
from air.cel import compile_cel
from air.engine import Engine, Event, footprint
from clients.bench.state_cost import estimate_against_tracemalloc
from clients.testing.market import RISING, STOCK, random_walk

DUR_QUERIES = [
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND $2.Price > $1.Price AND DUR < {d}} Stock",
    "SELECT * FROM Stock NEXT{DUR <= {d} AND $2.Price > 1.05 * $1.Price} Stock",
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND DUR = {d}} Stock",
    "SELECT Name FROM Stock FOLD{$2.Name = $1.Name AND DUR < {d}, $2.Price > $.Price, } Stock",
    "SELECT * FROM Stock NEXT{($1.Name = $2.Name AND DUR < {d}) OR ($2.Price > 2 * $1.Price AND DUR <= {e})} Stock",
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND DUR < {d}} Stock NEXT{$1.Name = $2.Name AND DUR < {e}} Stock",
    # no bound in one clause: nothing may expire there (the other state still does)
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name OR DUR < {d}} Stock NEXT{$2.Price > $1.Price AND DUR < {e}} Stock",
]


def _events(draws) -> list[Event]:
    out, t = [], 0
    for name, price, dt in draws:
        t += dt
        out.append(Event("Stock", (f"S{name}", float(price), 1), t, t))
    return out


def _run(queries: list[str], events: list[Event], expire_every: int | None) -> tuple[list, Engine]:
    eng = Engine()
    eng.declare(STOCK)
    for i, q in enumerate(queries):
        eng.add(compile_cel(q if "PUBLISH" in q else f"{q} PUBLISH P{i}", {"Stock": STOCK}).automata, f"q{i}")
    out = []
    eng.on_emit = lambda em: out.append((em.owner, em.stream, em.event.values, em.event.t0, em.event.t1))
    for k, e in enumerate(events, 1):
        eng.feed(e)
        if expire_every and k % expire_every == 0:
            footprint.expire(eng)
    eng.flush()
    return out, eng


@settings(deadline=None)
@given(draws=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(0, 3)), min_size=1, max_size=80),
       d=st.integers(1, 6), e=st.integers(1, 9), every=st.integers(1, 5))
def test_expiring_changes_no_witness(draws, d, e, every):
    queries = [q.replace("{d}", str(d)).replace("{e}", str(e)) for q in DUR_QUERIES]
    events = _events(draws)
    kept, eng_kept = _run(queries, events, None)
    dropped, eng_dropped = _run(queries, events, every)
    assert dropped == kept
    assert eng_dropped.instance_count() + eng_dropped.stats.expired >= eng_kept.instance_count()
    assert eng_kept.stats.expired == 0


def test_expiry_bounds_the_state_of_a_query_with_a_dur_bound():
    """Rising with ``AND DUR < 2000`` over 20,000 ticks (one a time unit): without
    expiry its state grows with the ticks no later rise clears; with it, only
    the last 2,000 time units' worth stays, and the witnesses are the same."""
    q = RISING.replace("$1.Price}", "$1.Price AND DUR < 2000}")
    events = random_walk(50, 20_000, seed=3, down=0.01, up=0.01)
    kept, eng_kept = _run([q], events, None)
    dropped, eng_dropped = _run([q], events, 256)
    assert dropped == kept and kept
    assert eng_kept.instance_count() > 5_000
    assert eng_dropped.instance_count() <= 2000 + 256  # the horizon's worth, plus the events since the last pass
    assert eng_dropped.stats.expired > 10_000


def test_a_state_without_a_bound_in_every_clause_keeps_its_instances():
    events = random_walk(5, 2_000, seed=4, down=0.01, up=0.01)
    q = "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND $2.Price > 9 * $1.Price OR $2.Name = 'none' AND DUR < 3} Stock"
    _out, eng = _run([q], events, 1)
    assert eng.stats.expired == 0 and eng.instance_count() > 1_000


@pytest.mark.parametrize("pred, horizon", [
    ("NEXT{DUR < 10}", Horizon(10.0, False)),
    ("NEXT{DUR <= 10}", Horizon(10.0, True)),
    ("NEXT{DUR = 10}", Horizon(10.0, True)),
    ("NEXT{DUR < 10 AND DUR <= 4}", Horizon(4.0, True)),
    ("NEXT{DUR < 4 AND DUR <= 4}", Horizon(4.0, False)),
    ("NEXT{DUR < 10 OR DUR <= 20}", Horizon(20.0, True)),
    ("NEXT{DUR < 10 OR $2.Price > 1}", None),
    ("NEXT{DUR > 10}", None),
    ("NEXT{$1.Name = $2.Name}", None),
    ("NEXT{DUR < 1 HOUR}", Horizon(3_600_000.0, False)),
])
def test_the_horizon_of_a_filter(pred, horizon):
    auto = compile_cel(f"SELECT * FROM Stock {pred} Stock", {"Stock": STOCK}).automata[0]
    middle = [s for s in auto.states if not s.is_start and s.input_stream]
    assert [filter_horizon(s.filter) for s in middle] == [horizon]


def test_horizon_expired_is_strict_for_less_than_and_not_for_at_most():
    assert not Horizon(10.0, False).expired(0, 9) and Horizon(10.0, False).expired(0, 10)
    assert not Horizon(10.0, True).expired(0, 10) and Horizon(10.0, True).expired(0, 11)


def test_the_estimate_counts_what_instance_count_counts_and_is_the_same_on_every_run():
    events = random_walk(200, 20_000, seed=5, down=0.01, up=0.01)
    figures = []
    for _ in range(2):
        _out, eng = _run([RISING, "SELECT * FROM Stock NEXT{$2.Price > 1.5 * $1.Price} Stock"], events, None)
        fp = footprint.measure(eng)
        assert fp.instances == eng.instance_count() > 0
        assert footprint.survey(eng).footprint == fp
        per_owner = [footprint.owner_footprint(eng, o) for o in ("q0", "q1")]
        assert sum(n for n, _b in per_owner) == fp.instances
        figures.append((fp, per_owner))
    assert figures[0] == figures[1]


def test_the_estimate_is_near_what_the_instances_take():
    """Rising's instances as tracemalloc sees them (the events' strings fresh, as
    a decoder makes them; ``cayuga bench``'s measurement, BENCHMARKS.md "Memory of
    automaton state"): the estimate is within 30% above or 20% below."""
    got = estimate_against_tracemalloc(60_000)
    assert got["live_instances"] > 20_000
    assert 0.8 <= got["estimate_over_measured"] <= 1.3, got
