"""The AIR loader under mutated documents and random bytes. What it proves,
for every input:

- the outcome is a list of automata or a CayugaError with a message, never
  another exception;
- a document that the standard library's XML parser (expat, independent of
  the loader's lxml) finds not well-formed is refused;
- a document with a DOCTYPE (entities, external DTDs) is refused, saying so
  (lxml is hardened: no entities, no network, bounded size);
- a document whose root is neither <NFA> nor <NFAs> is refused;
- what loads is one automaton per <NFA> (the root, or each child of <NFAs>),
  and each writes out as AIR that reads back equal;
- a document is refused exactly when it is not valid AIR by a judge that shares
  nothing with the loader's code: well-formed for expat, no DOCTYPE, its <NFA>s
  valid under the documented schema (air/air.xsd, validated here with lxml),
  every name by the documented rule (air/names.py: letters, digits,
  underscores, at most 200), and each <NFA> read by the independent oracle
  (tests/oracle/air.py). A refused valid document fails, as does a loaded
  invalid one.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from air.airxml import AirError, dump_air, load_air, load_air_many
from air.errors import CayugaError
from tests.conftest import AIR_DIR, ROOT
from tests.fuzz.conftest import FUZZ
from tests.oracle import OracleAirError, read_air
from tests.oracle.expr import OracleExprError

CORPUS = [p.read_text() for p in sorted(AIR_DIR.glob("*.xml"))]
PIECES = ["<", ">", "/>", "</Node>", "<Node NodeID=\"9\" NodeType=\"START\">", "NodeID=\"1\"", "\"", "&amp;",
          "&lt;", "<!DOCTYPE x [<!ENTITY e \"ee\">]>", "&e;", "Expr=\"EV.Price >\"", "Type=\"float\"",
          "Destination=\"99\"", "<ForwardEdge>", "</ForwardEdge>", "OP=\"=\"", "Const=\"1e999\"", "\x00", "é"]


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(CORPUS))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        text = text[:i] + draw(st.sampled_from(["", *PIECES])) + text[j:]
    return text


def _expat_root(text: str | bytes):
    """The root element by the standard library's parser, or None if it finds the text not well-formed."""
    try:
        return ET.fromstring(text)
    except (ET.ParseError, ValueError):  # ValueError: NUL or unpaired surrogates in a str
        return None


def _has_doctype(text: str | bytes) -> bool:
    return (b"<!DOCTYPE" if isinstance(text, bytes) else "<!DOCTYPE") in text


#: The documented schema and name rule (docs/design/air-format.md, air/names.py).
XSD = etree.XMLSchema(etree.parse(str(ROOT / "air" / "air.xsd")))
NAME = re.compile(r"[A-Za-z0-9_]{1,200}")
NAMED = {"Node": ("NodeID", "InputStreamName"), "AttrName": ("Name",), "OutputStreamName": ("Name",),
         "ForwardEdge": ("Destination",), "OldNewAttrPair": ("OldAttr", "NewAttr"), "UDF": ("Attr",),
         "StaticPred": ("EventAttr",), "DynamicPred": ("EventAttr", "NodeAttr")}


def _invalid(text: str | bytes) -> str | None:
    """Why ``text`` is not valid AIR, by the independent judge of the module
    docstring; None when it is valid."""
    root = _expat_root(text)
    if root is None:
        return "not well-formed XML"
    if _has_doctype(text):
        return "a DOCTYPE"
    if root.tag not in ("NFA", "NFAs"):
        return f"the root <{root.tag}>"
    try:  # (no DOCTYPE: nothing for lxml to resolve)
        lx = etree.fromstring(text.encode() if isinstance(text, str) else text)
    except etree.XMLSyntaxError as exc:
        return f"lxml: {exc}"
    for nfa in [lx] if lx.tag == "NFA" else list(lx):
        if not XSD.validate(etree.ElementTree(nfa)):
            return f"air.xsd: {XSD.error_log.last_error}"
    nfas = [root] if root.tag == "NFA" else list(root)
    for el in root.iter():
        for attr in NAMED.get(el.tag, ()):
            if el.get(attr) is not None and not NAME.fullmatch(el.get(attr)):
                return f"the name {el.get(attr)!r}"
    for nfa in nfas:
        try:
            read_air(ET.tostring(nfa, encoding="unicode"))
        except (OracleAirError, OracleExprError) as exc:
            return f"the oracle: {exc}"
    return None


def _check(text: str | bytes) -> None:
    why = _invalid(text)
    try:
        autos = load_air_many(text)
    except CayugaError as exc:
        assert exc.message.strip(), "a refusal without a reason"
        assert why is not None, f"a valid document was refused: {exc.message}"
        return
    assert why is None, f"an invalid document loaded ({why})"
    root = _expat_root(text)
    assert root.tag in ("NFA", "NFAs"), root.tag
    assert len(autos) == (1 if root.tag == "NFA" else len(root))
    for auto in autos:
        assert load_air(dump_air(auto)) == auto


@FUZZ
@given(mutated())
def test_mutated_conformance_automata(text):
    _check(text)


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes(data):
    _check(data)


BOMB = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
        '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><NFA><Node NodeID="&c;" NodeType="START"/></NFA>')


@pytest.mark.parametrize("text, reason", [
    (BOMB, "DOCTYPE and ENTITY declarations are not allowed (no entity expansion); remove them"),
    ('<!DOCTYPE x SYSTEM "http://127.0.0.1:1/x.dtd"><NFA/>',
     "DOCTYPE and ENTITY declarations are not allowed (no entity expansion); remove them"),
    ("<NFA>" + "<Node>" * 100_000, "AIR document is not well-formed XML: Excessive depth in document: 256"),
    ("<Bogus/>", "root element must be <NFA> (or <NFAs>), not <Bogus>"),
    (b"\xff\x00", "AIR document is not well-formed XML"),
], ids=["entity-bomb", "external-dtd", "deep", "root", "bytes"])
def test_entities_and_huge_inputs_are_refused(text, reason):
    with pytest.raises(CayugaError) as info:
        load_air_many(text)
    assert reason in info.value.message


#: Found by test_mutated_conformance_automata (CI, seed 4094507346): a mutation took Price out of
#: node 1's schema; the loader refused the map that still produces it (docs/design/air-format.md),
#: the judge's oracle did not check for attributes beyond the schema (nor for one set twice).
FOUND_MAP = ('<NFA><Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="1">'
             '<SchemaMap>{pairs}</SchemaMap></ForwardEdge></Node><Node NodeID="1" NodeType="INTERMEDIATE_OR_END">'
             '<Schema><AttrName Name="Name" Type="string"/><AttrName Name="Volume" Type="int"/></Schema>'
             '<OutputStreamName Name="MyStock" Type="OUT"/></Node></NFA>')
PAIR = '<OldNewAttrPair OldAttrSource="EV" OldAttr="{0}" NewAttr="{0}"/>'


def _found_map(*names: str) -> str:
    """FOUND_MAP with a schema map copying the event's ``names``."""
    return FOUND_MAP.format(pairs="".join(PAIR.format(n) for n in names))


@pytest.mark.parametrize("names, reason", [
    (("Name", "Price", "Volume"), "the schema map produces Price, which is not in the schema of node 1"),
    (("Name", "Volume", "Volume"), "the schema map sets Volume more than once"),
    (("Name",), "the schema map does not produce Volume of node 1"),
], ids=["beyond-the-schema", "twice", "short"])
def test_a_schema_map_must_produce_its_destinations_schema_exactly(names, reason):
    """Refused by the loader, saying why, and by the judge (the documented rule)."""
    text = _found_map(*names)
    assert _invalid(text) is not None
    with pytest.raises(CayugaError) as info:
        load_air_many(text)
    assert reason in info.value.message
    _check(text)
    assert _invalid(_found_map("Name", "Volume")) is None


@pytest.mark.parametrize("expr, refused", [
    ("CONTAINS(E<Name, 'IBM')=1", True),  # found by the long campaign: a comparison as an argument
    ("CONTAINS(E>Name, 'IBM')=1", True),
    ("CONTAINS((E<Name), 'IBM')=1", False),  # (in parentheses: arithmetic's atom; a type clash when run)
    ("CONTAINS(EV.Name, 'IBM')=1", False),
])
def test_a_functions_arguments_are_arithmetic(expr, refused):
    """docs/design/semantics.md: the loader and the judge's oracle read arguments alike."""
    pred = f'<EvalFunc><PredClause><ComplexPred Expr="{escape(expr)}"/></PredClause></EvalFunc>'
    text = _found_map("Name", "Volume").replace('<ForwardEdge Destination="1">',
                                                f'<ForwardEdge Destination="1">{pred}')
    assert (_invalid(text) is not None) == refused
    _check(text)


@pytest.mark.parametrize("name", sorted(p.name for p in AIR_DIR.glob("*.xml")))
def test_every_conformance_document_loads_and_round_trips(name):
    """The other half of the fuzzers' contract: good documents are not refused."""
    text = (AIR_DIR / name).read_text()
    autos = load_air_many(text)
    root = ET.fromstring(text)
    assert len(autos) == (1 if root.tag == "NFA" else len(root))
    for auto in autos:
        assert load_air(dump_air(auto)) == auto


def test_the_check_fails_a_loader_that_refuses_valid_air(monkeypatch):
    """A refusal used to pass whatever the document; now only an invalid one may be refused."""
    assert all(_invalid(text) is None for text in CORPUS)  # the judge finds the original files valid

    def refuse(text, **kw):
        raise AirError("refused")

    monkeypatch.setattr(sys.modules[__name__], "load_air_many", refuse)
    with pytest.raises(AssertionError, match="a valid document was refused"):
        _check(CORPUS[0])
    _check("<NFA><Node/></NFA>")  # an invalid one may be
