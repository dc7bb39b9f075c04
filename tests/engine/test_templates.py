"""Staging through templates per automaton shape (air/engine/loader.py:
_Template) never changes what an automaton does.

A template is shared by automata that differ only in the constants of their
StaticAtoms (with the same pattern of equal constants) and their names. These
tests check that automata differing in anything else get templates of their
own, that a template is dropped when a stream it reads changes schema or a
function it calls is registered again, and that loading random automata of a
few shapes with random constants through the cache gives the same network
and the same witnesses as staging each automaton alone
(``cache_templates = False``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.expr import Call, Compare, Literal, Ref
from air.model import (
    Attribute, Automaton, Clause, ComplexAtom, DynamicAtom, Edge, OutputStream, Predicate, Rename, State, StaticAtom,
    StreamSchema,
)
from air.engine import Engine, EngineError, Event
from tests.conftest import examples
from tests.engine.test_indexes_support import CONFIGS, random_automaton, stream, witnesses

STOCK = StreamSchema("Stock", (Attribute("Name", "string"), Attribute("Price", "float"), Attribute("Volume", "int")))
NP = (Attribute("N", "string"), Attribute("P", "float"))


def _p(*atoms) -> Predicate:
    return Predicate((Clause(tuple(atoms)),))


TAKE = (Rename("EV", "Name", "N"), Rename("EV", "Price", "P"))
STEP = (Rename("NODE", "N", "N"), Rename("EV", "Price", "P"))


def two_step(name: str, op: str = "=", out: str = "Out", volume: str | None = None) -> Automaton:
    """FILTER{Name op name [AND Volume = volume]}(Stock) NEXT{$2.Name op name AND $2.Price > $1.P} Stock."""
    first = [StaticAtom("Name", op, name)] + ([StaticAtom("Volume", "=", volume)] if volume is not None else [])
    return Automaton((
        State("0", True, "Stock", forwards=(Edge("1", _p(*first), TAKE),)),
        State("1", False, "Stock", NP, filter=_p(StaticAtom("Name", op, name), DynamicAtom("Price", ">", "P")),
              forwards=(Edge("2", Predicate(), STEP),)),
        State("2", False, None, NP, outputs=(OutputStream(out),)),
    ), out)


def either(first: str, second: str) -> Automaton:
    """Two start edges (Name = first, Name = second) into one state whose filter
    is ``Name = N``: N is a constant (an AN key) only when both are equal."""
    return Automaton((
        State("0", True, "Stock", forwards=(Edge("1", _p(StaticAtom("Name", "=", first)), TAKE),
                                            Edge("1", _p(StaticAtom("Name", "=", second)), TAKE))),
        State("1", False, "Stock", NP, filter=_p(DynamicAtom("Name", "=", "N"), DynamicAtom("Price", ">", "P")),
              forwards=(Edge("2", Predicate(), STEP),)),
        State("2", False, None, NP, outputs=(OutputStream("Out"),)),
    ), "either")


EVENTS = [Event("Stock", (n, float(p), v), t, t) for t, (n, p, v) in enumerate(
    [("A", 1, 1), ("B", 5, 2), ("A", 2, 1), ("B", 6, 1), ("A", 1, 2), ("C", 9, 1), ("B", 7, 2), ("A", 3, 1)])]


def run(loads, cache: bool, events=EVENTS, **opts):
    eng = Engine(**opts)
    eng.network.cache_templates = cache
    eng.declare(STOCK)
    for owner, autos in loads:
        eng.add(autos, owner=owner)
    return eng, witnesses(eng.run(events))


def node_of(eng: Engine, owner: str, sid: str):
    return next(n for _ai, s, n in eng.holding(owner).states if s == sid)


def test_automata_differing_in_a_constant_share_a_template_but_not_constants():
    loads = [(f"q{n}", two_step(n, out=f"Up_{n}")) for n in "ABC"]
    eng, got = run(loads, True)
    _, want = run(loads, False)
    _, ref = run(loads, False, index=False, merge=False)
    assert got == want == ref
    assert {k[0] for k in got} == {"qA", "qB"}  # C never rises
    assert eng.network.template_count == 1
    for n in "ABC":  # each owner's filter and keys hold its own constant
        node = node_of(eng, f"q{n}", "1")
        assert node.an == ((0,), n)
        assert n in node.filter_full.__globals__.values()
        assert eng.holding(f"q{n}").edges[0].eq == ((0,), n)


def test_an_operator_an_extra_atom_or_a_pattern_of_equal_constants_is_part_of_the_shape():
    loads = [("eq", two_step("A")), ("ne", two_step("A", "!=")), ("vol", two_step("A", volume="1")),
             ("vol2", two_step("B", volume="2")), ("same", either("A", "A")), ("diff", either("A", "B")),
             ("same2", either("B", "B"))]
    eng, got = run(loads, True)
    _, ref = run(loads, False, index=False, merge=False)
    assert got == ref
    assert eng.network.template_count == 5
    assert node_of(eng, "same", "1").an == ((0,), "A")
    assert node_of(eng, "same2", "1").an == ((0,), "B")
    assert node_of(eng, "diff", "1").an is None  # Name = N is then no constant
    assert {k[0] for k in got} >= {"same", "diff", "same2"}


def test_a_bad_constant_is_reported_as_when_staged_alone():
    good, bad = two_step("A", volume="1"), two_step("A", volume="x")
    for cache in (True, False):
        eng = Engine()
        eng.network.cache_templates = cache
        eng.declare(STOCK)
        eng.add(good, owner="good")
        with pytest.raises(EngineError, match="constant 'x' is not a valid int"):
            eng.add(bad, owner="bad")
        assert eng.owners == ["good"]
        eng.add(two_step("B", volume="2"), owner="other")  # the template still serves
        assert eng.owners == ["good", "other"]


def publisher(kind: str) -> Automaton:
    """The volume of each Stock event, published on Mid as X of type ``kind``."""
    return Automaton((
        State("0", True, "Stock", forwards=(Edge("1", Predicate(), (Rename("EV", "Volume", "X"),)),)),
        State("1", False, None, (Attribute("X", kind),), outputs=(OutputStream("Mid"),)),
    ), "pub")


def reader(value: str) -> Automaton:
    """FILTER{X = value}(Mid), publishing X as a float."""
    return Automaton((
        State("0", True, "Mid", forwards=(Edge("1", _p(StaticAtom("X", "=", value)), (Rename("EV", "X", "X"),)),)),
        State("1", False, None, (Attribute("X", "float"),), outputs=(OutputStream("R"),)),
    ), "reader")


def test_a_template_is_dropped_when_a_stream_it_reads_changes_schema():
    eng = Engine()
    eng.declare(STOCK)
    eng.add(publisher("int"), owner="pub")
    eng.add(reader("1"), owner="r1")
    assert type(eng.holding("r1").edges[0].eq[1]) is int
    eng.remove("r1")
    eng.remove("pub")
    eng.add(publisher("float"), owner="pub")
    eng.add(reader("2"), owner="r2")  # the same shape: Mid's X is now a float
    assert eng.holding("r2").edges[0].eq == ((0,), 2.0)
    assert type(eng.holding("r2").edges[0].eq[1]) is float


def test_a_template_is_dropped_when_a_function_it_calls_is_registered_again():
    def auto(name: str) -> Automaton:
        atom = ComplexAtom(Compare(">", Call("TWICE", (Ref("Price", "EV"),)), Literal(4)))
        return Automaton((
            State("0", True, "Stock", forwards=(Edge("1", _p(StaticAtom("Name", "=", name), atom),
                                                      (Rename("EV", "Price", "P"),)),)),
            State("1", False, None, (Attribute("P", "float"),), outputs=(OutputStream("O"),)),
        ), "f")

    eng = Engine()
    eng.functions.register("TWICE", lambda x: 2 * x, "float", arity=1)
    eng.declare(STOCK)
    eng.add(auto("B"), owner="one")
    eng.functions.register("TWICE", lambda x: 0 * x, "float", arity=1)
    eng.add(auto("A"), owner="two")  # not "B": that would share one's start edge, as it always did
    got = witnesses(eng.run(EVENTS))
    assert {k[0] for k in got} == {"one"}  # with the first TWICE, "two" would match A at 3.0


# --------------------------------------------------------------------------- random automata

CONSTS = {"Name": ["A", "B", "C"], "Volume": ["1", "2", "3"], "Price": ["2", "3"]}


def with_constants(auto: Automaton, picks: list[int]) -> Automaton:
    """``auto`` with each StaticAtom's constant replaced by a pick among its attribute's values."""
    it = iter(picks * 50)

    def pred(p):
        if p is None:
            return None
        return Predicate(tuple(Clause(tuple(
            replace(a, const=CONSTS[a.event_attr][next(it) % len(CONSTS[a.event_attr])])
            if isinstance(a, StaticAtom) else a for a in cl.atoms)) for cl in p.clauses))

    def edge(e):
        return None if e is None else replace(e, predicate=pred(e.predicate))

    return Automaton(tuple(replace(s, filter=pred(s.filter), rebind=edge(s.rebind),
                                   forwards=tuple(edge(e) for e in s.forwards)) for s in auto.states), auto.name)


SPEC = st.tuples(*[st.integers(0, 6)] * 10)
EVENT = st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2))


@settings(examples(0.4))
@given(shapes=st.lists(SPEC, min_size=1, max_size=3),
       loads=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), min_size=1, max_size=4)),
                      min_size=1, max_size=12),
       events=st.lists(EVENT, min_size=1, max_size=30),
       config=st.sampled_from(sorted(CONFIGS)), batched=st.booleans())
def test_random_automata_of_few_shapes_load_as_when_staged_alone(shapes, loads, events, config, batched):
    autos = [(f"q{i}", with_constants(random_automaton(shapes[k % len(shapes)]), picks))
             for i, (k, picks) in enumerate(loads)]
    evs = stream(events)
    results = []
    for cache in (True, False):
        eng = Engine(**CONFIGS[config])
        eng.network.cache_templates = cache
        eng.declare(STOCK)
        if batched:  # one add of many automata: merging within the stage
            eng.add([a for _o, a in autos], owner="all")
        else:
            for owner, a in autos:
                eng.add(a, owner=owner)
        results.append((eng.plan_stats(), witnesses(eng.run(evs))))
    assert results[0] == results[1]
