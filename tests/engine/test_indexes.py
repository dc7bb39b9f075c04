"""Indexes and state merging never change results (docs/design/semantics.md#indexes-and-state-merging).

Every switch combination must produce the same witness multiset, per owner,
as the plain engine, on the conformance AIR files, on random automata over
random streams, and on the generated benchmark templates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.engine import Engine, Event
from clients.bench import workloads as wl
from clients.testing import STOCK, increasing_query, increasing_stream, random_walk, rise_query, runup_query, symbols
from tests.conftest import AIR_DIR, PUBLISHERS, air, examples, stock_stream
from tests.engine.test_indexes_support import (
    CONFIGS, random_automaton, run_config, stream, witnesses,
)

AIR_FILES = sorted(p.name for p in AIR_DIR.glob("*.xml") if p.name not in ("T15.xml", "T9.xml"))
STREAM = stock_stream(seed=77, n=40, long_names=True, max_dur=20)


def _loads(name: str):
    return [(Path(d).stem, air(d)) for d in PUBLISHERS.get(name, [])] + [(Path(name).stem, air(name))]


@pytest.mark.parametrize("name", AIR_FILES)
def test_conformance_file_gives_the_same_witnesses_under_every_switch(name):
    baseline = None
    for label, opts in CONFIGS.items():
        eng, ems = run_config(opts, _loads(name), STREAM)
        assert eng.stats.eval_errors == 0, eng.stats.last_eval_error
        got = witnesses(ems)
        if baseline is None:
            baseline = got
            assert label == "all"
        else:
            assert got == baseline, f"{name}: {label} differs from the default engine"


def test_all_conformance_files_loaded_together_match_each_run_alone():
    """One engine holding every file (duplicated, so merging applies) gives
    each owner exactly what that owner gets alone, unindexed and unmerged."""
    loads = []
    for name in AIR_FILES:
        if name in ("LONG_MONOTONIC_INC.xml", "IBM_MSFT_PAIR.xml", "IBM_OTHER_PAIR.xml"):
            continue  # they read another file's output stream; covered above
        loads += [(Path(name).stem, air(name)), (Path(name).stem + "#2", air(name))]
    eng, ems = run_config({}, loads, STREAM)
    together = witnesses(ems)
    assert eng.plan_stats()["nodes"] < eng.plan_stats()["states"]  # something was merged
    for owner, auto in loads:
        _, alone = run_config({"index": False, "merge": False}, [(owner, auto)], STREAM)
        want = witnesses(alone)
        assert {k: v for k, v in together.items() if k[0] == owner} == want, owner


SPEC = st.tuples(*[st.integers(0, 6)] * 10)
EVENTS = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5), st.integers(1, 3), st.sampled_from([0, 0, 1, 2]),
                            st.sampled_from([0, 0, 0, 1, 3])), min_size=1, max_size=30)


@settings(examples(1.5))
@given(specs=st.lists(SPEC, min_size=1, max_size=6), extra=st.lists(st.integers(0, 5), max_size=4), values=EVENTS)
def test_random_automata_give_the_same_witnesses_under_every_switch(specs, extra, values):
    specs = specs + [specs[i % len(specs)] for i in extra]  # duplicates: merging must not double or lose
    loads = [(f"o{i}", random_automaton(s)) for i, s in enumerate(specs)]
    events = stream(values)
    results = {}
    for label, opts in CONFIGS.items():
        eng, ems = run_config(opts, loads, events)
        results[label] = (witnesses(ems), eng.stats.eval_errors,
                          {o: sorted(map(repr, sum(eng.instances(o).values(), []))) for o, _ in loads},
                          {o: eng.instance_count(o) for o, _ in loads})
    base = results["all"]
    for label, got in results.items():
        assert got == base, f"{label} differs from the default engine"


@pytest.mark.parametrize("template", wl.TEMPLATES)
def test_benchmark_templates_give_the_same_witnesses_indexed_and_not(template):
    w = wl.edbt(template, subscriptions=60, events=400, seed=5, domain=3)
    loads = [(f"q{i}", a) for i, a in enumerate(w.automata)]
    base = None
    for label in ("all", "no-mqo", "no-merge", "no-fr"):
        eng, ems = run_config(CONFIGS[label], loads, w.events, streams=w.streams)
        assert eng.stats.eval_errors == 0, eng.stats.last_eval_error
        got = witnesses(ems)
        if base is None:
            base = got
            assert sum(base.values()) > 0, "the small domain should give matches"
        assert got == base, label


@pytest.mark.parametrize("maker", [lambda: [rise_query()], lambda: [runup_query(3)],
                                   lambda: [increasing_query(s, 4) for s in symbols(5)]])
def test_stock_benchmark_queries_give_the_same_witnesses_indexed_and_not(maker):
    events = random_walk(5, 600, seed=3, down=0.03, up=0.05)
    loads = [(f"q{i}", a) for i, a in enumerate(maker())]
    base = None
    for label in ("all", "no-mqo"):
        _, ems = run_config(CONFIGS[label], loads, events)
        got = witnesses(ems)
        base = base or got
        assert sum(got.values()) > 0 and got == base


def test_increasing_query_matches_every_event_after_the_warm_up():
    w = wl.increasing(queries=3, events=300, length=10)
    eng, ems = run_config({}, [(f"q{i}", a) for i, a in enumerate(w.automata)], w.events)
    per_symbol = {s: sum(1 for e in w.events if e.values[0] == s) for s in symbols(3)}
    assert len(ems) == sum(max(0, n - 9) for n in per_symbol.values())
    assert all(em.event.values[0] < em.event.values[1] for em in ems)


def test_switches_are_reported():
    eng = Engine(index=False)
    assert (eng.options.an_index, eng.options.instance_index, eng.options.fr_index) == (False, False, False)
    eng = Engine(instance_index=False)
    assert (eng.options.an_index, eng.options.instance_index, eng.options.fr_index) == (False, False, True)
    assert Engine(merge=False).options.merge is False


def test_identical_subscriptions_share_every_state():
    eng = Engine()
    eng.declare(STOCK)
    for i in range(50):
        eng.add(increasing_query("S00001"), owner=f"q{i}")
    plan = eng.plan_stats()
    assert plan["states"] == 50 * 11 and plan["nodes"] == 11 and plan["edges"] == 10
    eng.run(increasing_stream(2, 60))
    for i in range(49):
        eng.remove(f"q{i}")
    assert eng.plan_stats()["nodes"] == 11
    eng.remove("q49")
    assert eng.plan_stats() == {"nodes": 0, "edges": 0, "states": 0, "automaton_edges": 0, "active_nodes": 0}


def test_an_event_on_an_unread_stream_is_ignored():
    eng = Engine()
    eng.declare(STOCK)
    eng.add(rise_query(), owner="q")
    assert eng.run([Event("DUAL", (), 1, 1)]) == []
