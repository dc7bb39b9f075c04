"""The AIR loader under mutated documents: a loaded automaton or a
CayugaError, never another exception (lxml is hardened: no entities, no
network, bounded size)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from air.airxml import load_air_many
from air.errors import CayugaError
from tests.conftest import AIR_DIR
from tests.fuzz.conftest import FUZZ

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


def _check(text) -> None:
    try:
        autos = load_air_many(text)
    except CayugaError as exc:
        assert str(exc)
        return
    assert autos


@FUZZ
@given(mutated())
def test_mutated_conformance_automata(text):
    _check(text)


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes(data):
    _check(data)


def test_entities_and_huge_inputs_are_refused():
    bomb = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
            '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><NFA><Node NodeID="&c;" NodeType="START"/></NFA>')
    _check(bomb)
    _check('<!DOCTYPE x SYSTEM "http://127.0.0.1:1/x.dtd"><NFA/>')
    _check("<NFA>" + "<Node>" * 100_000)
