"""The layout of ``Engine.export_state`` across versions: an engine state
saved by an older build (version 1, written by the code of commit fa713a8
into ``saved/engine_state_v1.pickle`` by running this file as a script there)
still loads, and the restored engine goes on exactly as an uninterrupted one,
under every index switch; the current layout names its fields."""

from __future__ import annotations

import pickle
import random
import sys
from pathlib import Path

import pytest

from air.engine import Engine, EngineError
from tests.conftest import STOCK
from tests.engine.test_indexes_sorted import sorted_automaton
from tests.engine.test_indexes_support import CONFIGS, random_automaton, stream

V1 = Path(__file__).parent / "saved" / "engine_state_v1.pickle"


def scenario() -> tuple[list, list, int]:
    """Owners (plain, merged copies and sorted-index automata), events with
    many sharing a ``t1``, and a cut in the middle of an epoch."""
    rnd = random.Random(24)
    specs = [tuple(rnd.randrange(7) for _ in range(10)) for _ in range(5)]
    specs.append(specs[0])  # merges with o0
    loads = [(f"o{i}", random_automaton(s)) for i, s in enumerate(specs)]
    loads += [("s0", sorted_automaton(0, 0, 1, True)), ("s1", sorted_automaton(4, 2, 2, False)),
              ("s2", sorted_automaton(2, 1, 0, True))]
    values = [(rnd.randrange(3), rnd.randrange(1, 6), rnd.randrange(1, 4), rnd.choice([0, 0, 1, 2]),
               rnd.choice([0, 0, 0, 1, 3])) for _ in range(120)]
    events = stream(values)
    cut = next(i for i in range(len(events) // 2, len(events)) if events[i].t1 == events[i - 1].t1)
    return loads, events, cut


def _engine(opts: dict, loads) -> Engine:
    eng = Engine(**opts)
    eng.declare(STOCK)
    for owner, auto in loads:
        eng.add(auto, owner=owner)
    return eng


def _key(em) -> tuple:
    return (em.owner, em.stream, em.kind, em.event.values, em.event.t0, em.event.t1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_state_saved_by_version_1_loads_and_the_engine_goes_on_as_uninterrupted(config):
    loads, events, cut = scenario()
    saved = pickle.loads(V1.read_bytes())
    assert saved["engine"]["version"] == 1
    expected = _engine(CONFIGS[config], loads).run(events)
    first = expected[:saved["emitted"]]  # what the saving engine had emitted before the cut
    eng = _engine(CONFIGS[config], loads)
    counts = eng.import_state(saved["engine"])
    assert counts == {"instances": saved["instances"], "skipped": 0, "clashes": 0, "dropped": 0}
    assert eng.instance_count() == saved["instance_count"]
    assert {o: eng.instances(o, pending=True) for o in eng.owners} == saved["instances_by_owner"]
    got = list(first)
    eng.on_emit = got.append
    for ev in events[cut:]:
        eng.feed(ev)
    eng.flush()
    assert [_key(e) for e in got] == [_key(e) for e in expected]
    assert eng.stats.events == len(events)


def test_the_current_layout_names_its_fields_and_round_trips():
    loads, events, cut = scenario()
    eng = _engine({}, loads)
    for ev in events[:cut]:
        eng.feed(ev)
    state = pickle.loads(pickle.dumps(eng.export_state()))
    assert state["version"] == 2
    assert state["instance_fields"] == ["values", "t0", "t1", "born", "affected"]
    assert state["nodes"] and all(set(n) == {"states", "installed", "pending"} for n in state["nodes"])
    assert any(i[4] for n in state["nodes"] for i in n["installed"])  # the cut is mid-epoch: some affected
    assert any(n["pending"] for n in state["nodes"])
    again = _engine({}, loads)
    again.import_state(state)
    assert {o: again.instances(o, pending=True) for o in again.owners} == \
        {o: eng.instances(o, pending=True) for o in eng.owners}


def test_an_unknown_version_is_refused_with_what_it_is():
    eng = _engine({}, scenario()[0])
    with pytest.raises(EngineError, match="version 3"):
        eng.import_state({"version": 3})


def _write_v1() -> None:  # pragma: no cover - run by hand under the old code
    loads, events, cut = scenario()
    eng = _engine({}, loads)
    out: list = []
    eng.on_emit = out.append
    for ev in events[:cut]:
        eng.feed(ev)
    state = eng.export_state()
    assert state["version"] == 1
    V1.parent.mkdir(exist_ok=True)
    V1.write_bytes(pickle.dumps({
        "engine": state, "emitted": len(out), "instance_count": eng.instance_count(),
        "instances": sum(len(n[1]) + len(n[2]) for n in state["nodes"]),
        "instances_by_owner": {o: eng.instances(o, pending=True) for o in eng.owners}}))
    print(f"wrote {V1}: {len(state['nodes'])} nodes, {eng.instance_count()} instances", file=sys.stderr)


if __name__ == "__main__":
    _write_v1()
