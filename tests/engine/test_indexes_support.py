"""Helpers (no tests) for the index and merging tests: engine configurations, a random
automaton generator over Stock, and witness multisets."""

from __future__ import annotations

from collections import Counter

from air.model import (
    Attribute, Automaton, Clause, DurationAtom, DynamicAtom, Edge, OutputStream, Predicate, Rename, State,
    StaticAtom,
)
from air.engine import Engine, Event
from tests.conftest import STOCK

#: Every switch combination that must give the same witnesses.
CONFIGS = {
    "all": {},
    "no-index": {"index": False},
    "no-merge": {"merge": False},
    "no-mqo": {"index": False, "merge": False},
    "no-fr": {"fr_index": False},
    "no-instance": {"instance_index": False},
    "an-only": {"instance_index": False, "an_index": True, "fr_index": False},
    "no-sorted": {"sorted_index": False},
}


def witnesses(emissions) -> Counter:
    return Counter((em.owner, em.stream, em.kind, em.event.values, em.event.t0, em.event.t1) for em in emissions)


def run_config(opts: dict, loads: list[tuple[str, object]], events: list[Event], streams=(STOCK,)):
    eng = Engine(**opts)
    for s in streams:
        eng.declare(s)
    for owner, autos in loads:
        eng.add(autos, owner=owner)
    ems = eng.run(events)
    return eng, ems


# --------------------------------------------------------------------------- random automata

NAMES = ("A", "B", "C")
NPV = (Attribute("N", "string"), Attribute("P", "float"), Attribute("V", "int"))
KEEP = (Rename("NODE", "N", "N"), Rename("NODE", "P", "P"), Rename("NODE", "V", "V"))
TAKE = (Rename("EV", "Name", "N"), Rename("EV", "Price", "P"), Rename("EV", "Volume", "V"))
STEP = (Rename("NODE", "N", "N"), Rename("EV", "Price", "P"), Rename("NODE", "V", "V"))


def _p(*clauses) -> Predicate:
    return Predicate(tuple(Clause(tuple(c)) for c in clauses))


START_PREDS = (
    Predicate(),
    _p([StaticAtom("Name", "=", "A")]),
    _p([StaticAtom("Name", "=", "B"), StaticAtom("Price", ">", "2")]),
    _p([StaticAtom("Volume", "=", "1"), StaticAtom("Name", "=", "A")]),
    _p([StaticAtom("Name", "=", "C")], [StaticAtom("Volume", "=", "2")]),
    _p([StaticAtom("Name", "=", "A"), StaticAtom("Name", "=", "B")]),  # contradictory: never true
)
FILTERS = (
    Predicate(),
    _p([DynamicAtom("Name", "=", "N")]),
    _p([DynamicAtom("Name", "=", "N"), StaticAtom("Volume", "=", "1")]),
    _p([StaticAtom("Name", "=", "B")]),
    _p([DynamicAtom("Name", "=", "N")], [StaticAtom("Volume", "=", "3")]),
    _p([DynamicAtom("Price", ">", "P")]),
    _p([StaticAtom("Name", "=", "A"), DynamicAtom("Volume", "=", "V"), DynamicAtom("Name", "=", "N")]),
)
REBINDS = (
    None,
    Edge("_", _p([DynamicAtom("Price", ">", "P")]), STEP),
    Edge("_", Predicate(), KEEP),
    Edge("_", _p([DurationAtom("COMPOSITE", "<=", 3.0)]), STEP, resets_start=True),
)
FORWARD_PREDS = (
    Predicate(),
    _p([DynamicAtom("Price", ">", "P")]),
    _p([StaticAtom("Volume", "=", "2")]),
    _p([StaticAtom("Name", "=", "A"), StaticAtom("Price", ">=", "3")]),
    _p([DurationAtom("COMPOSITE", "<=", 3.0)]),
    _p([StaticAtom("Name", "=", "C")], [DynamicAtom("Price", "<", "P")]),
)


def random_automaton(spec: tuple[int, ...], out: str = "Out") -> Automaton:
    """An automaton of 2 or 3 states from a tuple of small choice indexes;
    equal specs give equal automata (so merging has something to merge)."""
    sp, f1, r1, fp1, reset1, depth, f2, r2, fp2, extra = spec
    out_state = State("E", False, None, NPV, outputs=(OutputStream(out, "OUT"),))

    def middle(sid: str, f: int, r: int, fwd: tuple[Edge, ...]) -> State:
        rb = REBINDS[r % len(REBINDS)]
        if rb is not None:
            rb = Edge(sid, rb.predicate, rb.schema_map, resets_start=rb.resets_start)
        return State(sid, False, "Stock", NPV, filter=FILTERS[f % len(FILTERS)], rebind=rb, forwards=fwd)

    to_end = (Edge("E", FORWARD_PREDS[fp2 % len(FORWARD_PREDS)], STEP),)
    if extra % 3 == 0:  # a second forward edge
        to_end += (Edge("E", FORWARD_PREDS[(fp2 + 1) % len(FORWARD_PREDS)], KEEP, resets_start=True),)
    if depth % 2:
        b = middle("B", f2, r2, to_end)
        a = middle("A", f1, r1, (Edge("B", FORWARD_PREDS[fp1 % len(FORWARD_PREDS)], STEP,
                                      resets_start=bool(reset1 % 2)),))
        states = [a, b]
    else:
        states = [middle("A", f1, r1, to_end)]
    start = State("0", True, "Stock", forwards=(Edge("A", START_PREDS[sp % len(START_PREDS)], TAKE),))
    return Automaton(tuple([start] + states + [out_state]), "random")


def stream(values: list[tuple[int, int, int, int, int]]) -> list[Event]:
    """Events from (name, price, volume, time step, duration) choices; many share t1."""
    t, out = 0, []
    for n, p, v, gap, dur in values:
        t += gap
        out.append(Event("Stock", (NAMES[n % 3], float(p), v), t - dur, t))
    return out
