"""AIR reading and writing: the conformance corpus loads unchanged and
round-trips; malformed documents are refused with the element, line and reason."""

from __future__ import annotations

import pytest

from air.airxml import AirError, dump_air, load_air, load_air_many, load_stream_types
from air.model import DurationAtom, DynamicAtom, Rename, StaticAtom
from tests.conftest import AIR_DIR

ALL = sorted(AIR_DIR.glob("*.xml"))


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_conformance_file_loads_and_round_trips(path):
    auto = load_air(path.read_text(), name=path.stem)
    again = load_air(dump_air(auto), name=path.stem)
    assert again == auto
    assert dump_air(again) == dump_air(auto)


def test_conformance_corpus_is_complete():
    assert len(ALL) == 37


def test_model_of_a_fold_automaton():
    a = load_air((AIR_DIR / "94.xml").read_text())
    fold = a.state("1")
    assert fold.input_stream == "Stock"
    assert fold.filter.clauses[0].atoms == (DynamicAtom("Name", "=", "Name_n"),)
    assert fold.rebind.destination == "1"
    assert fold.rebind.predicate.clauses[0].atoms == (DynamicAtom("Price", ">", "Price_n"),)
    assert fold.forwards[0].predicate.is_true
    assert a.state("5").is_end and a.state("5").outputs[0].type == "RESUB"
    start = a.state("0")
    assert start.forwards[0].predicate.clauses[0].atoms == (StaticAtom("Volume", ">", "10000"),)
    assert start.forwards[0].schema_map[0] == Rename("EV", "Name", "Name_1")
    t34 = load_air((AIR_DIR / "T34.xml").read_text())
    assert DurationAtom("EVENT", ">", 100.0) in t34.state("0").forwards[0].predicate.clauses[0].atoms


def test_several_automata_in_one_document():
    one = (AIR_DIR / "T1.xml").read_text()
    two = (AIR_DIR / "T2.xml").read_text()
    autos = load_air_many("<NFAs>" + one + two + "</NFAs>")
    assert [a.outputs[0][1].name for a in autos] == ["T1", "T2"]


GOOD = """<NFA>
<Node NodeID="0" NodeType="START" InputStreamName="Stock">
<ForwardEdge Destination="1">
<SchemaMap>
<OldNewAttrPair OldAttrSource="EV" OldAttr="Name" NewAttr="n"/>
</SchemaMap>
</ForwardEdge>
</Node>
<Node NodeID="1" NodeType="INTERMEDIATE_OR_END">
<Schema>
<AttrName Name="n" Type="string"/>
</Schema>
<OutputStreamName Name="T2" Type="OUT"/>
</Node>
</NFA>"""


def bad(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


@pytest.mark.parametrize("doc, line, fragment", [
    (bad("<Schema>\n<AttrName", "<Schemo/>\n<Schema>\n<AttrName"), 10, "element <Schemo>: This element is not expected"),
    (bad('Destination="1"', 'Destination="9"'), 3, "<ForwardEdge Destination=\"9\">: no node has NodeID '9'"),
    (bad('<AttrName Name="n" Type="string"/>', '<AttrName Name="n"/>'), 11, "The attribute 'Type' is required"),
    (bad('NewAttr="n"', 'NewAttr="m"'), 3, "does not produce n and produces m, which is not in the schema"),
    (bad('<ForwardEdge Destination="1">', '<FilterEdge/>\n<ForwardEdge Destination="1">'), 3,
     "a START node cannot have a FilterEdge"),
    (bad('<OutputStreamName', '<FilterEdge/>\n<OutputStreamName'), 13,
     "an end node (no InputStreamName) cannot have a FilterEdge"),
    (bad('<ForwardEdge Destination="1">', '<ForwardEdge Destination="1">\n<EvalFunc><PredClause>'
         '<DurationPred Type="COMPOSITE" OP="&gt;" Const="5"/></PredClause></EvalFunc>'), 4,
     "a COMPOSITE duration predicate is not allowed on a START node's edge"),
    (bad('OldAttrSource="EV"', 'OldAttrSource="NODE"'), 3,
     "reads NODE.Name, which node 0 does not have"),
    (bad('NodeID="1" NodeType', 'NodeID="0" NodeType'), 9, "duplicate NodeID '0'"),
    (bad('</NFA>', ''), 15, "not well-formed XML"),
    ('<?xml version="1.0"?>\n<!DOCTYPE NFA [<!ENTITY x "xxxxxxxxxx"><!ENTITY y "&x;&x;&x;&x;">]>\n'
     + GOOD.replace('Name="T2"', 'Name="&y;"'), 2, "DOCTYPE and ENTITY declarations are not allowed"),
    ('<Automaton/>', 1, "root element must be <NFA>"),
])
def test_malformed_air_is_rejected_precisely(doc, line, fragment):
    with pytest.raises(AirError) as info:
        load_air(doc)
    err = info.value
    assert fragment in err.message
    assert err.line == line


def test_rebind_edge_without_schema_map():
    doc = (AIR_DIR / "T9.xml").read_text()
    start = doc.index("<RebindEdge>")
    end = doc.index("</RebindEdge>")
    with pytest.raises(AirError, match="a RebindEdge needs a <SchemaMap>") as info:
        load_air(doc[:start] + "<RebindEdge>\n" + doc[end:])
    assert info.value.line == 25
    assert "<RebindEdge>" in info.value.excerpt


def test_oversized_document_is_refused():
    with pytest.raises(AirError, match="the limit is"):
        load_air("<NFA>" + " " * (5 * 1024 * 1024) + "</NFA>")


def test_bad_expression_is_located():
    doc = bad('<OldNewAttrPair OldAttrSource="EV" OldAttr="Name" NewAttr="n"/>', '<UDF Expr="EV.Name +" Attr="n"/>')
    with pytest.raises(AirError, match=r"<UDF .*bad expression in Expr: expected a value but found end of input"):
        load_air(doc)


def test_original_stream_type_schema_files():
    text = """<?xml version="1.0" encoding="utf-8"?>
<StreamType xmlns="http://tempuri.org/SIR_Schema.xsd" Name="Stock">
  <AttrNameType Name="Name" Type="string"></AttrNameType>
  <AttrNameType Name="Price" Type="float"></AttrNameType>
  <AttrNameType Name="Sym" Type="shortstring"></AttrNameType>
</StreamType>"""
    (s,) = load_stream_types(text)
    assert str(s) == "Stock(Name string, Price float, Sym string)"
