"""The product's SASE on the engine: the paper's examples and one case per
rule of docs/design/sase.md#semantics (tests/sase/cases.py, worked out by
hand), through the compiled automata and through their AIR text; and the
limit docs/design/sase.md#simultaneous-events states, as it states it."""

from __future__ import annotations

import pytest

from air.airxml import dump_air, load_air_many
from air.engine import Engine, Event
from air.model import Attribute, StreamSchema
from air.sase import compile_sase
from tests.sase.cases import ALL, KEYED


def schemas(streams: dict) -> list[StreamSchema]:
    return [StreamSchema(n, tuple(Attribute(a, t) for a, t in attrs)) for n, attrs in streams.items()]


def run(text: str, streams: dict, events: list, time_unit_ms: float = 1.0, through_air: bool = False) -> list:
    q = compile_sase(text, schemas(streams), time_unit_ms=time_unit_ms, name_prefix="q")
    autos = list(q.automata)
    if through_air:
        autos = load_air_many("<NFAs>\n" + "".join(dump_air(a) for a in autos) + "</NFAs>\n")
    eng = Engine()
    for s in schemas(streams):
        eng.declare(s)
    eng.add(autos, owner="q")
    out = eng.run([Event(s, tuple(v), t0, t1) for s, v, t0, t1 in events])
    return sorted((tuple(e.event.values), e.event.t0, e.event.t1) for e in out if e.kind == "OUT")


@pytest.mark.parametrize("through_air", [False, True], ids=["automata", "air"])
@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_the_matches_worked_out_by_hand(case, through_air):
    assert run(case.text, case.streams, case.events, case.time_unit_ms, through_air) == case.matches


def test_every_match_not_only_the_next_unlike_cels_next():
    """CEL's NEXT pairs each A with the first C after it; SASE pairs it with every one."""
    events = [("A", (1, 0), 1, 1), ("C", (1, 1), 2, 2), ("C", (1, 2), 3, 3)]
    assert [m[0] for m in run("EVENT SEQ(A x, C z) WHERE [k] RETURN z.v", KEYED, events)] == [(1,), (2,)]


def test_simultaneous_events_of_different_keys_are_fine():
    events = [("A", (1, 0), 1, 1), ("A", (2, 0), 1, 1), ("B", (1, 0), 2, 2), ("C", (2, 7), 2, 2),
              ("C", (1, 8), 3, 3), ("C", (2, 9), 3, 3)]
    got = run("EVENT SEQ(A x, !(B y), C z) WHERE [k] WITHIN 10 RETURN x.k, z.v", KEYED, events)
    assert got == [((2, 7), 1, 2), ((2, 9), 1, 3)]


def test_the_stated_limit_two_events_extending_one_partial_match_at_one_time():
    """docs/design/sase.md#simultaneous-events: outside the paper's total order, no
    automaton gives the paper's answer. Two C at time 2 each keep the partial match,
    so the C at 3 is reported twice (the paper: once); a B at the time of a C does
    not stop the copy that C keeps (the paper: the C at 6 is not a match)."""
    twice = [("A", (1, 0), 1, 1), ("C", (1, 1), 2, 2), ("C", (1, 2), 2, 2), ("C", (1, 3), 3, 3)]
    got = run("EVENT SEQ(A x, C z) WHERE [k] RETURN z.v", KEYED, twice)
    assert got == [((1,), 1, 2), ((2,), 1, 2), ((3,), 1, 3), ((3,), 1, 3)]
    missed = [("A", (1, 0), 1, 1), ("B", (1, 0), 5, 5), ("C", (1, 1), 5, 5), ("C", (1, 2), 6, 6)]
    got = run("EVENT SEQ(A x, !(B y), C z) WHERE [k] RETURN z.v", KEYED, missed)
    assert got == [((1,), 1, 5), ((2,), 1, 6)]
