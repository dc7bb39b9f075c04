"""Stored attributes that are constant per state go into the AN index.

``FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name ...} Stock`` stores
``Name_1 = 'IBM'`` in every instance of its second state, so that state's
filter atom ``Name = NODE.Name_1`` is indexed as ``Name = 'IBM'``
(air/engine/constant_attrs.py). These tests pin which attributes
are derived (and, as important, which are not) and check that results never
change: per-symbol CEL queries under every switch, owners added and removed
while events flow."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.cel import compile_cel
from air.model import (
    Attribute, Automaton, Clause, Computed, DynamicAtom, Edge, OutputStream, Predicate, Rename, State, StaticAtom,
)
from air.engine.constant_attrs import constant_attrs
from air.engine import Engine, Event
from air.expr import Literal
from tests.conftest import STOCK, examples
from tests.engine.test_indexes_support import CONFIGS, witnesses


def consts(auto: Automaton) -> dict:
    by_id = {s.id: s for s in auto.states}
    return constant_attrs(auto, by_id, {s.id: STOCK if s.input_stream == "Stock" else None for s in auto.states})


def cel(q: str) -> Automaton:
    (auto,) = compile_cel(q, [STOCK]).automata
    return auto


def test_next_of_one_symbol_stores_its_name():
    got = consts(cel("SELECT * FROM FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name AND $2.Price > $1.Price} Stock"))
    assert got["1"] == {"Name_1": ("IBM", "string")}


def test_chains_carry_the_constant_through_node_copies():
    got = consts(cel("SELECT * FROM (SELECT * FROM FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name} Stock) "
                     "NEXT{$2.Name = $1.Name} Stock"))
    assert got["1"] == {"Name_1": ("IBM", "string")}
    assert got["2"]["Name_1"] == ("IBM", "string")  # copied NODE -> NODE
    assert set(got) == {"1", "2", "3"}


def test_a_dynamic_atom_on_a_constant_makes_the_event_attribute_constant_too():
    # the NEXT edge requires Name = Name_1 = 'IBM', so the new Name (from EV.Name) is 'IBM'
    got = consts(cel("SELECT * FROM (SELECT * FROM FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name} Stock) "
                     "NEXT{$2.Name = $1.Name} Stock"))
    assert got["3"]["Name"] == ("IBM", "string")  # the end state of the outer NEXT


@pytest.mark.parametrize("query", [
    "SELECT * FROM FILTER{Name = 'IBM' OR Name = 'MSFT'}(Stock) NEXT{$1.Name = $2.Name} Stock",  # OR
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock",  # no constant at all
    "SELECT * FROM FILTER{Price > 10}(Stock) NEXT{$1.Name = $2.Name} Stock",  # not an equality
])
def test_nothing_is_derived_without_a_sure_constant(query):
    assert consts(cel(query)) == {}


def _two_state(first_map, rebind=None, attr_type="string") -> Automaton:
    schema = (Attribute("K", attr_type),)
    return Automaton((
        State("0", True, "Stock", forwards=(Edge("1", Predicate((Clause((StaticAtom("Name", "=", "IBM"),)),)),
                                                 first_map),)),
        State("1", False, "Stock", schema, filter=Predicate((Clause((DynamicAtom("Name", "=", "K"),)),)),
              rebind=rebind, forwards=(Edge("2", Predicate(), (Rename("NODE", "K", "K"),)),)),
        State("2", False, None, schema, outputs=(OutputStream("Out"),)),
    ))


def test_a_rebind_must_keep_the_constant():
    keep = Edge("1", Predicate(), (Rename("NODE", "K", "K"),))
    assert consts(_two_state((Rename("EV", "Name", "K"),), keep))["1"] == {"K": ("IBM", "string")}
    overwrite = Edge("1", Predicate(), (Computed(Literal("x"), "K"),))
    assert consts(_two_state((Rename("EV", "Name", "K"),), overwrite)) == {}
    from_event = Edge("1", Predicate(), (Rename("EV", "Name", "K"),))  # the filter says Name = K: kept
    assert consts(_two_state((Rename("EV", "Name", "K"),), from_event))["1"] == {"K": ("IBM", "string")}


def test_computed_values_and_type_changes_are_not_constants():
    assert consts(_two_state((Computed(Literal("IBM"), "K"),))) == {}
    assert consts(_two_state((Rename("EV", "Name", "K"),), attr_type="int")) == {}
    # the map's last entry for K decides (as when it is compiled): not the constant copy
    assert consts(_two_state((Rename("EV", "Name", "K"), Computed(Literal("x"), "K")))) == {}
    assert consts(_two_state((Computed(Literal("x"), "K"), Rename("EV", "Name", "K"))))["1"] == {
        "K": ("IBM", "string")}


def test_the_derived_key_puts_the_state_in_the_an_index():
    eng = Engine()
    eng.declare(STOCK)
    for sym in ("IBM", "MSFT", "Dell"):
        eng.add(compile_cel(f"SELECT * FROM FILTER{{Name = '{sym}'}}(Stock) NEXT{{$1.Name = $2.Name}} Stock",
                            [STOCK], name_prefix=sym).automata, owner=sym)
    for t, sym in enumerate(("IBM", "MSFT", "Dell"), 1):
        eng.feed(Event("Stock", (sym, 10.0, 1), t, t))
    eng.flush()
    plan = eng.network.plans["Stock"]
    assert plan.an_index.size == 3 and not plan.active_scan  # none is visited by every event


# ------------------------------------------------------------------ results never change

QUERIES = [
    "SELECT * FROM FILTER{{Name = '{s}'}}(Stock) NEXT{{$1.Name = $2.Name AND $2.Price > $1.Price}} Stock",
    "SELECT * FROM FILTER{{Name = '{s}'}}(Stock) FOLD{{$1.Name = $2.Name, $2.Price > $.Price, }} Stock",
    "SELECT * FROM FILTER{{Name = '{s}' AND Volume > 100}}(Stock) NEXT{{$2.Name = $1.Name}} "
    "FILTER{{Name = 'MSFT'}}(Stock)",
    "SELECT * FROM (SELECT * FROM FILTER{{Name = '{s}'}}(Stock) NEXT{{$1.Name = $2.Name}} Stock) "
    "NEXT{{$2.Name = $1.Name AND $2.Price < $1.Price}} Stock",
    "SELECT * FROM FILTER{{Name = '{s}'}}(Stock) FOLD{{$2.Name = $.Name, $2.Price >= $.Price, "
    "$.Volume + $2.Volume AS Volume}} Stock",
]
NAMES = ("IBM", "MSFT", "Dell")

events_st = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from([80.0, 85.0, 90.0, 99.5]),
                               st.sampled_from([50, 500]), st.integers(0, 2)), min_size=1, max_size=30)
subs_st = st.lists(st.tuples(st.integers(0, len(QUERIES) - 1), st.sampled_from(NAMES)), min_size=1, max_size=6)


def _events(raw) -> list[Event]:
    t, out = 0, []
    for name, price, vol, gap in raw:
        t += gap
        out.append(Event("Stock", (name, price, vol), t, t))
    return out


def _run(opts: dict, subs, events, churn_at: int | None) -> Counter:
    eng = Engine(**opts)
    eng.declare(STOCK)
    emitted = []
    eng.on_emit = emitted.append

    def add(i, qi, sym, tag=""):
        q = QUERIES[qi].format(s=sym)
        eng.add(compile_cel(q, eng.stream_view, name_prefix=f"q{i}{tag}").automata, owner=f"q{i}{tag}")

    for i, (qi, sym) in enumerate(subs):
        add(i, qi, sym)
    for k, ev in enumerate(events):
        if k == churn_at:  # the first owner leaves and comes back while events flow
            eng.remove("q0")
            add(0, subs[0][0], subs[0][1], "b")
        eng.feed(ev)
    eng.flush()
    return witnesses(emitted)


@settings(examples(0.6))
@given(subs=subs_st, raw=events_st, churn=st.one_of(st.none(), st.integers(0, 29)))
def test_per_symbol_queries_give_the_same_witnesses_under_every_switch(subs, raw, churn):
    events = _events(raw)
    base = _run({}, subs, events, churn)
    for label, opts in CONFIGS.items():
        assert _run(opts, subs, events, churn) == base, label
