"""CEL -> automata: structure compared with the original compiler's AIR, the
placement of FILTERs, DUR kinds, resubscription splits and naming."""

from __future__ import annotations

from dataclasses import replace

import pytest

from air.airxml import dump_air, load_air
from air.cel import CelSchemaError, compile_cel
from air.cel.compiler import MAX_CLAUSES
from air.expr import Binary, Call, Compare, Literal, Ref
from air.model import (TRUE, Automaton, ComplexAtom, Computed, DurationAtom, DynamicAtom, Rename,
                       StaticAtom)
from tests.cel.corpus import STREAMS, UNKNOWN_SCHEMA, cel_files, cel_text, pairs

COMPILABLE = [p for p in cel_files() if p.stem not in UNKNOWN_SCHEMA]


def canonical(a: Automaton) -> list:
    """States in breadth-first order from the start, ids renamed to that order,
    schema maps as sets, positions and index hints dropped."""
    order: list[str] = []
    todo = [s for s in a.states if s.is_start]
    while todo:
        s = todo.pop(0)
        if s.id not in order:
            order.append(s.id)
            todo += [a.state(e.destination) for e in ([s.rebind] if s.rebind else []) + list(s.forwards)]
    ids = {old: str(i) for i, old in enumerate(order)}

    def edge(e):
        return e and replace(e, destination=ids[e.destination], schema_map=frozenset(e.schema_map))
    return [replace(s, id=ids[s.id], rebind=edge(s.rebind), forwards=tuple(map(edge, s.forwards)),
                    index_hints=(), line=None) for s in map(a.state, order)]


def compiled(name: str):
    return compile_cel(cel_text(name), STREAMS)


@pytest.mark.parametrize("path", COMPILABLE, ids=lambda p: p.stem)
def test_conformance_query_compiles_to_well_formed_automata(path):
    q = compile_cel(path.read_text(), STREAMS)
    assert q.outputs and q.outputs[-1] in q.schemas
    for auto in q.automata:
        # the AIR reader's load-time checks accept it, and AIR round-trips it unchanged
        assert canonical(load_air(dump_air(auto))) == canonical(auto)
        for s in auto.states:
            edges = ([s.rebind] if s.rebind else []) + list(s.forwards)
            if s.is_start:
                assert s.filter is None and s.rebind is None
                kinds = {a.kind for e in edges for c in e.predicate.clauses for a in c.atoms
                         if isinstance(a, DurationAtom)}
                assert "COMPOSITE" not in kinds
            elif s.is_end:
                assert not edges and s.outputs
            else:
                assert s.filter is not None and s.forwards


@pytest.mark.parametrize("name,paths", [p for p in pairs() if p[0] != "test206"], ids=lambda x: str(x))
def test_same_automaton_as_the_original_compiler(name, paths):
    (mine,) = compiled(name).automata
    (orig,) = [load_air(p.read_text()) for p in paths]
    assert canonical(mine) == canonical(orig)


def test_filter_on_fold_output_is_a_forward_conjunct_not_a_second_automaton():
    # test206 / 000 Example 7: the original split FILTER{cnt > 10} into a second automaton
    # reading an internal RESUB stream (94.xml + LONG_MONOTONIC_INC.xml); pushing it onto the
    # FOLD state's forward edge is equivalent (test_equivalence checks it on events)
    (mine,) = compiled("test206").automata
    orig = canonical(load_air(dict(pairs())["test206"][0].read_text()))
    got = canonical(mine)
    fold = got[1]
    (fwd,) = fold.forwards
    (clause,) = fwd.predicate.clauses
    assert clause.atoms == (ComplexAtom(Compare(">", Binary("+", Ref("cnt_n", "NODE"), Literal(1)), Literal(10))),)
    assert fold.filter == orig[1].filter  # the filter predicate is untouched
    assert [replace(s, forwards=(), outputs=()) for s in got] == \
        [replace(s, forwards=(), outputs=()) for s in orig]


def atoms_of(pred):
    (clause,) = pred.clauses
    return clause.atoms


def test_filter_on_next_output_goes_to_the_forward_edge():
    # test41: FILTER{Price_1 < 10}(Stock NEXT{...} Stock) must not change which event consumes
    (auto,) = compiled("test41").automata
    nxt = auto.states[1]
    assert atoms_of(nxt.filter) == (DynamicAtom("Name", "=", "Name_1"),)
    assert atoms_of(nxt.forwards[0].predicate) == (ComplexAtom(Compare("<", Ref("Price_1", "NODE"), Literal(10))),)


def test_right_hand_select_and_filter_are_pushed_into_the_state():
    # test36: the right operand's FILTER joins the filter predicate; $2.n3 is EV.Name
    (auto,) = compiled("test36").automata
    last = auto.states[2]
    assert atoms_of(last.filter) == (DynamicAtom("Name", "=", "Name"), StaticAtom("Name", "=", "IBM"))
    assert Rename("EV", "Name", "n3") in last.forwards[0].schema_map


def test_static_atoms_are_normalised_and_constants_rendered_as_air():
    (auto,) = compile_cel("FILTER{100 > Price AND Name = 'IBM' AND Volume >= -3 AND 60.5 = Price}(Stock)",
                          STREAMS).automata
    assert atoms_of(auto.states[0].forwards[0].predicate) == (
        StaticAtom("Price", "<", "100"), StaticAtom("Name", "=", "IBM"), StaticAtom("Volume", ">=", "-3"),
        StaticAtom("Price", "=", "60.5"))


def test_dynamic_atoms_are_flipped_to_put_the_event_first_and_the_rest_is_complex():
    (auto,) = compile_cel("Stock NEXT{$1.Price < $2.Price AND $2.Price > $2.Volume AND $1.Price > 10 AND 1 = 1}"
                          " Stock", STREAMS).automata
    assert atoms_of(auto.states[1].filter) == (
        DynamicAtom("Price", ">", "Price_1"),
        ComplexAtom(Compare(">", Ref("Price", "EV"), Ref("Volume", "EV"))),
        ComplexAtom(Compare(">", Ref("Price_1", "NODE"), Literal(10))),
        ComplexAtom(Compare("=", Literal(1), Literal(1))))


def test_predicates_are_put_in_dnf():
    (auto,) = compile_cel("FILTER{(Name = 'A' OR Name = 'B') AND (Price > 1 OR Volume > 2)}(Stock)",
                          STREAMS).automata
    clauses = [c.atoms for c in auto.states[0].forwards[0].predicate.clauses]
    a, b = StaticAtom("Name", "=", "A"), StaticAtom("Name", "=", "B")
    p, v = StaticAtom("Price", ">", "1"), StaticAtom("Volume", ">", "2")
    assert clauses == [(a, p), (a, v), (b, p), (b, v)]


def test_dnf_explosion_is_refused_with_a_position():
    text = "FILTER{" + " AND ".join(f"(Price = {i} OR Volume = {i})" for i in range(9)) + "}(Stock)"
    assert 2 ** 9 > MAX_CLAUSES
    with pytest.raises(CelSchemaError, match="disjunctive normal form") as info:
        compile_cel(text, STREAMS)
    assert info.value.line == 1 and info.value.column > 1


def test_duration_kinds():
    # on a base stream: the event's duration, on the start edge (T34)
    (a,) = compile_cel("FILTER{DUR > 100}(Stock)", STREAMS).automata
    assert atoms_of(a.states[0].forwards[0].predicate) == (DurationAtom("EVENT", ">", 100.0),)
    # in a NEXT predicate: the composite's duration, in the filter predicate
    (a,) = compile_cel("Stock NEXT{DUR < 1 SEC} Stock", STREAMS).automata
    assert atoms_of(a.states[1].filter) == (DurationAtom("COMPOSITE", "<", 1000.0),)
    # $2.DUR and a FILTER on the right operand: the event's duration
    (a,) = compile_cel("Stock NEXT{$2.DUR < 5} FILTER{DUR > 1}(Stock)", STREAMS).automata
    assert atoms_of(a.states[1].filter) == (DurationAtom("EVENT", "<", 5.0), DurationAtom("EVENT", ">", 1.0))
    # a FILTER on a FOLD output (000 Example 9): composite, on the forward edge
    (a,) = compile_cel("FILTER{DUR >= 10 MIN}(Stock FOLD{$2.Name = $.Name, $2.Price < $.Price,} Stock)",
                       STREAMS, time_unit_ms=1000).automata
    assert atoms_of(a.states[1].forwards[0].predicate) == (DurationAtom("COMPOSITE", ">=", 600.0),)
    assert atoms_of(a.states[1].rebind.predicate) == (DynamicAtom("Price", "<", "Price_n"),)


def test_fold_aggregates_update_running_values_on_rebind_and_forward():
    (a,) = compiled("test27").automata
    fold = a.states[1]
    assert Computed(Binary("+", Ref("cnt_n", "NODE"), Literal(1)), "cnt_n") in fold.rebind.schema_map
    assert Computed(Binary("+", Ref("sumPrice_n", "NODE"), Ref("Price", "EV")), "sumPrice_n") in fold.rebind.schema_map
    fwd = fold.forwards[0].schema_map
    assert Computed(Binary("+", Ref("cnt_n", "NODE"), Literal(1)), "cnt") in fwd
    assert Computed(Binary("+", Ref("sumPrice_n", "NODE"), Ref("Price", "EV")), "sumPrice") in fwd
    assert [x.name for x in a.states[2].schema] == [
        "Name_1", "Price_1", "Volume_1", "cnt", "sumPrice", "Name", "Price", "Volume"]


def test_fold_aggregate_on_a_shared_attribute_replaces_the_event_value():
    (a,) = compile_cel("Stock FOLD{,, $.Price + $2.Price AS Price} Stock", STREAMS).automata
    fold = a.states[1]
    assert Computed(Binary("+", Ref("Price_n", "NODE"), Ref("Price", "EV")), "Price_n") in fold.rebind.schema_map
    assert Computed(Binary("+", Ref("Price_n", "NODE"), Ref("Price", "EV")), "Price") in fold.forwards[0].schema_map


def test_right_nested_expression_is_split_through_an_internal_resub_stream():
    text = ("SELECT * FROM Stock NEXT{$1.Name = $2.N} "
            "(SELECT Name AS N, Price AS P FROM Stock NEXT{$1.Name = $2.Name} Stock) PUBLISH Pairs")
    q = compile_cel(text, STREAMS)
    inner, outer = q.automata
    (_, out), = inner.outputs
    assert (out.name, out.type) == ("Pairs__1", "RESUB")
    assert outer.start_states[0].input_stream == "Stock"
    assert outer.states[1].input_stream == "Pairs__1"
    assert q.outputs == ("Pairs",)
    assert [a.name for a in q.schemas["Pairs__1"].attributes] == ["N", "P"]
    assert list(q.schemas) == ["Pairs__1", "Pairs"]


def test_fold_over_a_composite_right_operand_is_split_too():
    q = compile_cel("(SELECT Name, Price FROM Stock) FOLD{,,} (SELECT Name, Price FROM Stock NEXT Stock)",
                    STREAMS, name_prefix="q7")
    assert [a.name for a in q.automata] == ["q7__1", "q7"]
    assert q.outputs == ("q7",)


def test_nested_publish_is_an_output_of_its_own_and_is_read_back():
    q = compile_cel("SELECT Name FROM (SELECT Name FROM FILTER{Price > 1}(Stock) PUBLISH Cheap) "
                    "NEXT{$1.Name = $2.Name} Stock PUBLISH Out", STREAMS)
    first, second = q.automata
    assert [(o.name, o.type) for _, o in first.outputs] == [("Cheap", "OUT")]
    assert second.start_states[0].input_stream == "Cheap"
    assert q.outputs == ("Cheap", "Out")
    assert set(q.schemas) == {"Cheap", "Out"}


def test_unpublished_query_gets_a_generated_name():
    q = compile_cel("Stock NEXT Stock", STREAMS)
    assert q.outputs == ("Q",) and q.automata[0].name == "Q"
    q = compile_cel("IBMStock NEXT (Stock NEXT Stock)", STREAMS, name_prefix="sub42")
    assert q.outputs == ("sub42",) and [a.name for a in q.automata] == ["sub42__1", "sub42"]


def test_select_on_left_spine_becomes_a_schema_map_with_computed_entries():
    (a,) = compiled("test12").automata
    assert a.states[0].forwards[0].schema_map == (
        Computed(Binary("+", Literal(1), Literal(2)), "Number"), Computed(Literal("myName"), "Name"),
        Computed(Call("CONTAINS", (Ref("Name", "EV"), Literal("IBM"))), "isIBM"),
        Computed(Literal("SIM QUERY"), "subject"))


def test_forward_predicate_is_true_when_nothing_filters_the_output():
    (a,) = compiled("test5").automata
    assert a.states[1].forwards[0].predicate == TRUE
    assert a.states[0].forwards[0].predicate == TRUE
