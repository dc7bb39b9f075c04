"""Engine semantics of docs/design/semantics.md#automata, one rule per test, with exact expected witnesses."""

from __future__ import annotations

import pytest

from air.airxml import load_air
from air.engine.functions import contains, similarity
from air.engine import Engine, EngineError, Event, FunctionRegistry, LateEvent
from air.model import parse_stream_decl
from tests.conftest import STOCK, air, engine_with


def S(name, price, vol, t0, t1=None):
    return Event("Stock", (name, float(price), vol), t0, t0 if t1 is None else t1)


def out(emissions):
    return [(e.stream, e.event.values, e.event.t0, e.event.t1) for e in emissions]


def one_edge(pred_xml: str = "", map_xml: str = "", schema_xml: str = "", edge_type: str = "") -> str:
    """A START node with one forward edge into an output node."""
    return f"""<NFA>
<Node NodeID="0" NodeType="START" InputStreamName="Stock">
<ForwardEdge Destination="1"{edge_type}>
<EvalFunc>{pred_xml}</EvalFunc>
<SchemaMap>{map_xml}</SchemaMap>
</ForwardEdge>
</Node>
<Node NodeID="1" NodeType="INTERMEDIATE_OR_END">
<Schema>{schema_xml}</Schema>
<OutputStreamName Name="OUT" Type="OUT"/>
</Node>
</NFA>"""


def run_air(text: str, events, functions=None):
    eng = Engine(functions)
    eng.declare(STOCK)
    eng.add(load_air(text), owner="q")
    return eng, eng.run(events)


def test_next_consumes_the_instance_and_skips_unrelated_events():
    eng = engine_with("T5.xml")
    got = out(eng.run([S("IBM", 1, 100, 1), S("MSFT", 2, 100, 2), S("IBM", 3, 100, 3), S("IBM", 4, 100, 4)]))
    assert got == [
        ("T5", ("IBM", 1.0, 100, "IBM", 3.0, 100), 1, 3),
        ("T5", ("IBM", 3.0, 100, "IBM", 4.0, 100), 3, 4),
    ]


def test_overlapping_event_does_not_affect_the_instance():
    eng = engine_with("T5.xml")
    # the second IBM event starts (t0=3) before the instance ends (t1=5): overlap
    got = out(eng.run([S("IBM", 1, 100, 5), S("IBM", 2, 100, 3, 8), S("IBM", 3, 100, 9)]))
    assert got == [
        ("T5", ("IBM", 1.0, 100, "IBM", 3.0, 100), 5, 9),
        ("T5", ("IBM", 2.0, 100, "IBM", 3.0, 100), 3, 9),
    ]


def test_or_of_clauses_is_honoured():
    eng = engine_with("T4.xml")
    events = [S("IBM", 101, 1, 1), S("IBM", 99, 1, 2), S("MSFT", 150, 1, 3), S("MSFT", 201, 1, 4)]
    assert out(eng.run(events)) == [("T4", ("IBM", 101.0, 1), 1, 1), ("T4", ("MSFT", 201.0, 1), 4, 4)]


def test_event_duration_predicate():
    eng = engine_with("T34.xml")
    events = [S("IBM", 1, 1, 0, 100), S("IBM", 2, 1, 0, 101), S("MSFT", 3, 1, 0, 500)]
    assert out(eng.run(events)) == [("T34", ("IBM", 2.0, 1), 0, 101)]


def test_rebind_failure_blocks_forward_and_deletes_the_instance():
    eng = engine_with("T25.xml")
    # rising run IBM 10, 11 (forward: cnt 2), then 9 (filter holds, rebind fails: run ends)
    got = out(eng.run([S("IBM", 10, 1, 1), S("IBM", 11, 1, 2), S("IBM", 9, 1, 3), S("IBM", 12, 1, 4)]))
    assert got == [
        ("T25", ("IBM", 10.0, 1, 2, "IBM", 11.0, 1), 1, 2),
        # the instance started at 1 died at 3; the ones started at 2 and 3 go on
        ("T25", ("IBM", 9.0, 1, 2, "IBM", 12.0, 1), 3, 4),
    ]


def test_identical_derivations_are_all_reported():
    """Two simultaneous events branch a FOLD into identical instances (T11 keeps
    only Name as the running value); both derivations are reported."""
    eng = engine_with("T11.xml")
    got = out(eng.run([S("IBM", 1, 5, 1), S("IBM", 2, 6, 2), S("IBM", 3, 7, 2), S("IBM", 4, 8, 3)]))
    at3 = [g for g in got if g[3] == 3 and g[2] == 1]
    # the instance from t=1 was rebound twice at t=2 into two identical instances
    assert at3 == [("T11", ("IBM", 1.0, 5, "IBM"), 1, 3)] * 2


def test_delete_type_edge_resets_the_start_time():
    text = one_edge(map_xml='<OldNewAttrPair OldAttrSource="EV" OldAttr="Name" NewAttr="N"/>',
                    schema_xml='<AttrName Name="N" Type="string"/>', edge_type=' Type="DEL"')
    _, ems = run_air(text, [S("IBM", 1, 1, 2, 7)])
    assert out(ems) == [("OUT", ("IBM",), 7, 7)]


def test_arithmetic_follows_the_original():
    m = ('<UDF Expr="(EV.Volume)/(-2)" Attr="a"/><UDF Expr="-7 % 2" Attr="b"/>'
         '<UDF Expr="2 ^ 3 * 2" Attr="c"/><UDF Expr="EV.Price / 2" Attr="d"/><UDF Expr="1 + 2" Attr="e"/>')
    schema = ('<AttrName Name="a" Type="int"/><AttrName Name="b" Type="int"/><AttrName Name="c" Type="int"/>'
              '<AttrName Name="d" Type="float"/><AttrName Name="e" Type="float"/>')
    _, ems = run_air(one_edge(map_xml=m, schema_xml=schema), [S("IBM", 5, 7, 1)])
    assert out(ems) == [("OUT", (-3, -1, 16, 2.5, 3.0), 1, 1)]
    assert isinstance(ems[0].event.values[4], float)


def test_failing_expression_is_counted_not_fatal():
    pred = '<PredClause><ComplexPred Expr="EV.Price / (EV.Volume - 1) &gt; 0"/></PredClause>'
    schema = '<AttrName Name="N" Type="string"/>'
    m = '<OldNewAttrPair OldAttrSource="EV" OldAttr="Name" NewAttr="N"/>'
    eng, ems = run_air(one_edge(pred, m, schema), [S("IBM", 5, 1, 1), S("MSFT", 5, 3, 2)])
    assert out(ems) == [("OUT", ("MSFT",), 2, 2)]
    assert eng.stats.eval_errors == 1
    assert "ZeroDivisionError" in eng.stats.last_eval_error


def test_builtin_functions():
    assert contains("International Business Machines", "Business") == 1
    assert contains("IBM", "MSFT") == 0
    assert similarity("short", "shorter text here") == 0.0
    assert similarity("abcdefghijkl", "abcdefghijkl") == 1.0
    # "abcdefghijXY" has 3 ten-grams; shares 1 ("abcdefghij") with "abcdefghij"
    assert similarity("abcdefghijXY", "abcdefghij") == 1.0
    assert similarity("abcdefghijXY", "abcdefghijZZ") == pytest.approx(1 / 3)
    # multiset: "aaaaaaaaaaaa" has three "a"*10; "aaaaaaaaaa" has one
    assert similarity("a" * 12, "a" * 11) == 1.0


def test_user_defined_function():
    fns = FunctionRegistry.default()
    fns.register("SPREAD", lambda p, v: p * v, "float")
    m = '<UDF Expr="SPREAD(EV.Price, EV.Volume)" Attr="s"/>'
    _, ems = run_air(one_edge(map_xml=m, schema_xml='<AttrName Name="s" Type="float"/>'),
                     [S("IBM", 2, 3, 1)], functions=fns)
    assert out(ems) == [("OUT", (6.0,), 1, 1)]


def test_unknown_function_is_rejected_at_load():
    m = '<UDF Expr="NOPE(EV.Price)" Attr="s"/>'
    eng = Engine()
    eng.declare(STOCK)
    with pytest.raises(EngineError, match="unknown function NOPE"):
        eng.add(load_air(one_edge(map_xml=m, schema_xml='<AttrName Name="s" Type="float"/>')), owner="q")
    assert eng.owners == []


def test_unknown_event_attribute_is_rejected_at_load():
    pred = '<PredClause><StaticPred EventAttr="Prize" OP="=" Const="1"/></PredClause>'
    eng = Engine()
    eng.declare(STOCK)
    with pytest.raises(EngineError, match="no attribute 'Prize'"):
        eng.add(load_air(one_edge(pred)), owner="q")


def test_reading_an_undeclared_stream_is_rejected():
    eng = Engine()
    with pytest.raises(EngineError, match="reads stream 'Stock', which is not declared"):
        eng.add(load_air(one_edge()), owner="q")


def test_late_event_is_refused():
    eng = engine_with("T1.xml")
    eng.feed(S("IBM", 1, 1, 5))
    with pytest.raises(LateEvent):
        eng.feed(S("IBM", 1, 1, 4))
    assert eng.stats.late == 1


def test_what_is_not_an_event_is_refused_and_the_engine_goes_on():
    """``feed`` takes an Event (compiled, a typed argument): None or anything else is a
    TypeError, never a read of fields that are not there, and the engine goes on after it."""
    eng = engine_with("T1.xml")
    for bad in (None, "IBM", ("Stock", ("IBM", 1.0, 1), 1, 1)):
        with pytest.raises((TypeError, AttributeError)):
            eng.feed(bad)
    eng.feed(S("IBM", 1, 1, 5))
    assert eng.stats.events == 1 and eng.stats.late == 0


def test_remove_takes_exactly_the_owners_work_and_new_subscriptions_start_empty():
    eng = engine_with("T5.xml")
    eng.feed(S("IBM", 1, 1, 1))
    eng.close_epoch()
    eng.add(air("T5.xml"), owner="late")
    eng.feed(S("IBM", 2, 1, 2))
    eng.close_epoch()
    assert eng.instance_count("T5") == 1 and eng.instance_count("late") == 1
    emitted = []
    eng.on_emit = emitted.append
    eng.remove("T5")
    eng.feed(S("IBM", 3, 1, 3))
    assert [(e.owner, e.event.values[1], e.event.values[4]) for e in emitted] == [("late", 2.0, 3.0)]
    with pytest.raises(EngineError):
        eng.remove("T5")


def test_static_constant_is_typed_by_the_stream_schema():
    pred = '<PredClause><StaticPred EventAttr="Volume" OP="=" Const="100"/></PredClause>'
    m = '<OldNewAttrPair OldAttrSource="EV" OldAttr="Volume" NewAttr="v"/>'
    _, ems = run_air(one_edge(pred, m, '<AttrName Name="v" Type="int"/>'),
                     [S("IBM", 1, 100, 1), S("IBM", 1, 1000, 2)])
    assert out(ems) == [("OUT", (100,), 1, 1)]


def test_redeclaring_a_stream_differently_is_an_error():
    eng = Engine()
    eng.declare(STOCK)
    eng.declare(STOCK)
    with pytest.raises(EngineError, match="already declared"):
        eng.declare(parse_stream_decl("Stock(Name string)"))
