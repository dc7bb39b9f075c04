"""The oracle itself, against results worked out by hand from the papers and
the design notes (no engine involved): the system paper's Example 9 (its Figures 3 and 4;
docs/design/semantics.md#the-running-example), its simultaneous e'6, and one small automaton
per rule of docs/design/semantics.md#automata and docs/design/air-format.md."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.oracle import Event, Oracle, OracleAirError, read_air
from tests.oracle.expr import arith, parse, similarity

STOCK = (("Name", "string"), ("Price", "float"), ("Volume", "int"))


def at(hh: int, mm: int) -> int:
    return (hh * 60 + mm) * 60_000


def ev(name, price, volume, t1, t0=None):
    return Event("Stock", (name, float(price), volume), t1 if t0 is None else t0, t1)


def pairs(*triples) -> str:
    return "".join(f'<OldNewAttrPair OldAttrSource="{s}" OldAttr="{o}" NewAttr="{n}"/>' for s, o, n in triples)


def schema(*names_types) -> str:
    return "<Schema>" + "".join(f'<AttrName Name="{n}" Type="{t}"/>' for n, t in names_types) + "</Schema>"


def pred(*atoms) -> str:
    return "<EvalFunc><PredClause>" + "".join(atoms) + "</PredClause></EvalFunc>"


# The system paper's Figure 2 (docs/design/semantics.md#the-running-example), from F1..F6 and
# θ1..θ6 as printed (θ2 is A's filter predicate,
# θ3 the rebind predicate, θ4 the forward predicate; θ5 B's filter, θ6 B's forward).
EXAMPLE_9 = f"""<NFA>
<Node NodeID="Q0" NodeType="START" InputStreamName="Stock">
 <ForwardEdge Destination="A">{pred('<StaticPred EventAttr="Volume" OP="&gt;" Const="10000"/>')}
  <SchemaMap>{pairs(("EV", "Name", "Name_1"), ("EV", "Price", "Price_1"), ("EV", "Name", "Name_n"),
                    ("EV", "Price", "Price_n"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="A" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock">
 {schema(("Name_1", "string"), ("Price_1", "float"), ("Name_n", "string"), ("Price_n", "float"))}
 <FilterEdge>{pred('<DynamicPred EventAttr="Name" OP="=" NodeAttr="Name_n"/>')}</FilterEdge>
 <RebindEdge>{pred('<DynamicPred EventAttr="Price" OP="&lt;" NodeAttr="Price_n"/>')}
  <SchemaMap>{pairs(("NODE", "Name_1", "Name_1"), ("NODE", "Price_1", "Price_1"), ("EV", "Name", "Name_n"),
                    ("EV", "Price", "Price_n"))}</SchemaMap></RebindEdge>
 <ForwardEdge Destination="B">{pred('<DurationPred Type="COMPOSITE" OP="&gt;=" Const="600000"/>')}
  <SchemaMap>{pairs(("EV", "Name", "Name"), ("NODE", "Price_1", "MaxPrice"), ("EV", "Price", "MinPrice"))}</SchemaMap>
 </ForwardEdge></Node>
<Node NodeID="B" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock">
 {schema(("Name", "string"), ("MaxPrice", "float"), ("MinPrice", "float"))}
 <FilterEdge>{pred('<DynamicPred EventAttr="Name" OP="=" NodeAttr="Name"/>')}</FilterEdge>
 <ForwardEdge Destination="C">{pred('<ComplexPred Expr="EV.Price &gt; 1.05 * NODE.MinPrice"/>')}
  <SchemaMap>{pairs(("EV", "Name", "Name"), ("NODE", "MaxPrice", "MaxPrice"), ("NODE", "MinPrice", "MinPrice"),
                    ("EV", "Price", "FinalPrice"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="C" NodeType="INTERMEDIATE_OR_END">
 {schema(("Name", "string"), ("MaxPrice", "float"), ("MinPrice", "float"), ("FinalPrice", "float"))}
 <OutputStreamName Name="Rebound" Type="OUT"/></Node>
</NFA>"""

FIGURE_3 = [ev("IBM", 90, 15000, at(9, 10)), ev("IBM", 85, 7000, at(9, 15)), ev("Dell", 40, 11000, at(9, 17)),
            ev("IBM", 81, 8000, at(9, 21)), ev("MSFT", 25, 6000, at(9, 23)), ev("IBM", 91, 9000, at(9, 24))]


def oracle(*texts: str) -> Oracle:
    o = Oracle()
    o.declare("Stock", STOCK)
    for i, t in enumerate(texts):
        o.add(read_air(t), owner=f"q{i}")
    return o


def instances(o: Oracle, sid: str) -> Counter:
    return Counter((tuple(i.values.values()), i.t0, i.t1) for i in o.final_instances.get((0, sid), []))


def test_example_9_figure_4_row_by_row():
    i1 = lambda price, t1: (("IBM", 90.0, "IBM", float(price)), at(9, 10), t1)  # noqa: E731
    i2 = (("Dell", 40.0, "Dell", 40.0), at(9, 17), at(9, 17))
    i3 = (("IBM", 90.0, 81.0), at(9, 10), at(9, 21))
    # (Figure 4 prints I2 as <Dell, 40, IBM, 40>: a typo, F1 copies the event's Name)
    rows = [([i1(90, at(9, 10))], []), ([i1(85, at(9, 15))], []), ([i1(85, at(9, 15)), i2], []),
            ([i1(81, at(9, 21)), i2], [i3]), ([i1(81, at(9, 21)), i2], [i3]), ([i2], [])]
    for k, (at_a, at_b) in enumerate(rows, start=1):
        o = oracle(EXAMPLE_9)
        ws = o.run(FIGURE_3[:k])
        assert instances(o, "A") == Counter(at_a), f"after e{k}"
        assert instances(o, "B") == Counter(at_b), f"after e{k}"
    assert ws == [("q0", "Rebound", "OUT", ("IBM", 90.0, 81.0, 91.0), at(9, 10), at(9, 24))]


@pytest.mark.parametrize("before", [True, False])
def test_simultaneous_e6_prime_changes_nothing(before):
    """docs/design/semantics.md#simultaneity: e'6 = <IBM, 80, 8000> at 9:24 fails θ6 for I3,
    yet I3 with e6 still matches."""
    e6p = ev("IBM", 80, 8000, at(9, 24))
    events = FIGURE_3[:5] + ([e6p, FIGURE_3[5]] if before else [FIGURE_3[5], e6p])
    ws = oracle(EXAMPLE_9).run(events)
    assert [w.values for w in ws] == [("IBM", 90.0, 81.0, 91.0)]


def two_state(filter_atoms="", rebind=None, forward_atoms="", del_forward=False) -> str:
    """START(Stock) -> S(Stock; N, P) -> E(N, P, P2, output Out)."""
    reb = "" if rebind is None else (f'<RebindEdge>{pred(rebind) if rebind else ""}<SchemaMap>'
                                     f'{pairs(("NODE", "N", "N"), ("EV", "Price", "P"))}</SchemaMap></RebindEdge>')
    return f"""<NFA>
<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="S">
 {pred('<StaticPred EventAttr="Volume" OP="=" Const="1"/>')}
 <SchemaMap>{pairs(("EV", "Name", "N"), ("EV", "Price", "P"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="S" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock">{schema(("N", "string"), ("P", "float"))}
 <FilterEdge>{pred(filter_atoms) if filter_atoms else ""}</FilterEdge>{reb}
 <ForwardEdge Destination="E"{' Type="DEL"' if del_forward else ""}>{pred(forward_atoms) if forward_atoms else ""}
 <SchemaMap>{pairs(("NODE", "N", "N"), ("NODE", "P", "P"), ("EV", "Price", "P2"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="E" NodeType="INTERMEDIATE_OR_END">{schema(("N", "string"), ("P", "float"), ("P2", "float"))}
 <OutputStreamName Name="Out" Type="OUT"/></Node></NFA>"""


SAME_NAME = '<DynamicPred EventAttr="Name" OP="=" NodeAttr="N"/>'


def test_an_overlapping_event_does_not_affect_an_instance():
    ws = oracle(two_state(SAME_NAME)).run([ev("X", 1, 1, 5), ev("X", 2, 2, 7, t0=5), ev("X", 3, 2, 8, t0=6)])
    assert [(w.values, w.t0, w.t1) for w in ws] == [(("X", 1.0, 3.0), 5, 8)]  # 5..7 overlapped (t0 5 <= 5)


def test_a_filtered_instance_survives_and_an_affected_one_is_consumed():
    ws = oracle(two_state(SAME_NAME)).run([ev("X", 1, 1, 1), ev("Y", 2, 2, 2), ev("X", 3, 2, 3), ev("X", 4, 2, 4)])
    assert [w.values for w in ws] == [("X", 1.0, 3.0)]  # Y filtered; the X at 3 consumed it; none left for 4


def test_a_failed_rebind_predicate_blocks_the_forward_edges():
    rising = '<DynamicPred EventAttr="Price" OP="&gt;" NodeAttr="P"/>'
    ws = oracle(two_state(SAME_NAME, rebind=rising)).run([ev("X", 5, 1, 1), ev("X", 4, 2, 2), ev("X", 6, 2, 3)])
    assert ws == []  # 4 < 5: affected, no rebind, so no forward either; the instance is gone
    ws = oracle(two_state(SAME_NAME, rebind=rising)).run([ev("X", 5, 1, 1), ev("X", 6, 2, 2), ev("X", 7, 2, 3)])
    assert [(w.values, w.t0, w.t1) for w in ws] == [(("X", 5.0, 6.0), 1, 2), (("X", 6.0, 7.0), 1, 3)]


def test_a_del_forward_edge_restarts_the_composite_at_the_event():
    ws = oracle(two_state(SAME_NAME, del_forward=True)).run([ev("X", 1, 1, 1), ev("X", 2, 2, 4, t0=3)])
    assert [(w.t0, w.t1) for w in ws] == [(4, 4)]


def test_simultaneous_events_branch_and_equal_witnesses_are_all_kept():
    """Two simultaneous events affect one instance: the rebind makes two
    instances (FOLD branches), each later event then yields two equal witnesses."""
    ws = oracle(two_state("", rebind="")).run([ev("X", 1, 1, 1), ev("X", 2, 2, 2), ev("X", 2, 2, 2),
                                               ev("X", 3, 2, 3)])
    at3 = Counter((w.values, w.t0) for w in ws if w.t1 == 3)
    assert at3 == Counter({(("X", 2.0, 3.0), 1): 2})


def test_resubscription_is_processed_in_the_same_epoch_but_sees_only_installed_instances():
    first = two_state("")  # q0: Out(N, P, P2) for every pair of events
    reader = f"""<NFA>
<Node NodeID="0" NodeType="START" InputStreamName="Out"><ForwardEdge Destination="1">
 <SchemaMap>{pairs(("EV", "N", "N"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="1" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock">{schema(("N", "string"))}
 <ForwardEdge Destination="2"><SchemaMap>{pairs(("NODE", "N", "N"), ("EV", "Price", "P"))}</SchemaMap></ForwardEdge>
</Node>
<Node NodeID="2" NodeType="INTERMEDIATE_OR_END">{schema(("N", "string"), ("P", "float"))}
 <OutputStreamName Name="Then" Type="OUT"/></Node></NFA>"""
    ws = oracle(first, reader).run([ev("X", 1, 1, 1), ev("X", 2, 2, 2), ev("X", 3, 2, 2), ev("X", 4, 2, 3)])
    assert Counter((w.stream, w.t1) for w in ws) == Counter({("Out", 2): 2, ("Then", 3): 2})
    assert [w.t1 for w in ws] == sorted(w.t1 for w in ws)


@pytest.mark.parametrize("text,want", [
    ("7 / 2", 3), ("-7 / 2", -3), ("-7 % 3", -1), ("7 % -3", 1), ("2 ^ 3 ^ 2", 64), ("2 * 3 ^ 2", 18),
    ("1 + 2 * 3", 7), ("10 - 4 - 3", 3), ("7.0 / 2", 3.5), ("2 ^ -1", 0.5)])
def test_arithmetic_as_spec_3_says(text, want):
    from tests.oracle.expr import evaluate
    got = evaluate(parse(text), {}, None, {})
    assert got == want and type(got) is type(want)
    assert arith("/", -1, 3) == 0


def test_similarity_and_contains():
    assert similarity("IBM Corporation International", "IBM Corporation Internationals") == 1.0
    assert similarity("short", "IBM Corporation") == 0.0
    assert similarity("abcdefghijk", "xbcdefghijk") == 0.5  # 2 grams each, 1 in common


@pytest.mark.parametrize("bad,reason", [
    ('<Node NodeID="0" NodeType="START" InputStreamName="Stock"><FilterEdge/></Node>', "START node"),
    ('<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="9"/></Node>', "unknown"),
    ('<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="1"/></Node>'
     '<Node NodeID="1" NodeType="INTERMEDIATE_OR_END"><Schema><AttrName Name="a" Type="int"/></Schema></Node>',
     "does not produce"),
    ('<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="1">'
     '<EvalFunc><PredClause><DurationPred Type="COMPOSITE" OP="&gt;" Const="1"/></PredClause></EvalFunc>'
     '</ForwardEdge></Node><Node NodeID="1" NodeType="INTERMEDIATE_OR_END"/>', "COMPOSITE"),
    ('<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="1"/></Node>'
     '<Node NodeID="1" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock"><RebindEdge/></Node>', "SchemaMap"),
])
def test_load_time_rejections_of_spec_5(bad, reason):
    with pytest.raises(OracleAirError, match=reason):
        read_air(f"<NFA>{bad}</NFA>")
