"""CEL parser and compiler under random text. What it proves, for every text:

- parse_all, validate and compile_cel raise nothing: every problem is a
  CelError with a message, at a position inside the text (a line of the text,
  a column on that line or just after its end) and an excerpt cut to a window;
- validate and compile_cel agree: validate finds errors exactly when
  compile_cel refuses the query;
- what compiles writes out as AIR that reads back as the same automaton;
- every conformance query compiles (good input is not refused).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from air.airxml import dump_air, load_air
from air.cel import CelError, compile_cel, parse_all, validate
from air.model import parse_stream_decl
from tests.cel.corpus import STREAMS as CORPUS_STREAMS
from tests.cel.corpus import UNKNOWN_SCHEMA, cel_files
from tests.fuzz.conftest import FUZZ

STREAMS = [parse_stream_decl("Stock(Name string, Price float, Volume int)")]

TOKENS = ["SELECT", "FROM", "FILTER", "NEXT", "FOLD", "PUBLISH", "AS", "AND", "OR", "NOT", "DUR", "SUM", "MAX",
          "Stock", "Name", "Price", "Volume", "Price_1", "$1.", "$2.", "$.", "$", "{", "}", "(", ")", ",", ";",
          "=", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "^", "'IBM'", "'", "1", "1.5", "-3", "10 MIN",
          "1e309", "99999999999999999999", "*", "\n", " ", "CONTAINS(", "\t", "é", "\x00", "TRUE"]
CORPUS = [p.read_text() for p in cel_files()]

token_soup = st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join)


@st.composite
def mutated_corpus(draw) -> str:
    """A conformance query with a slice cut out, or a token put in."""
    text = draw(st.sampled_from(CORPUS))
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 20)))
    return text[:i] + draw(st.sampled_from(["", *TOKENS])) + text[j:]


def _positioned(e: CelError, text: str) -> None:
    assert isinstance(e, CelError) and e.message
    lines = text.split("\n")
    assert 1 <= e.line <= len(lines), (e.line, e.column, e.message)
    assert 1 <= e.column <= len(lines[e.line - 1]) + 1, (e.line, e.column, e.message)
    assert len(e.excerpt) < 400  # excerpts are cut to a window


def _check(text: str) -> None:
    _, errors = parse_all(text)
    for e in errors:
        _positioned(e, text)
    found = validate(text, STREAMS)
    for e in found:
        _positioned(e, text)
    try:
        q = compile_cel(text, STREAMS)
    except CelError as exc:
        _positioned(exc, text)
        assert found, "validate passed a query that compile_cel refused"
        return
    assert not found, "validate found errors in a query that compile_cel compiled"
    for auto in q.automata:  # what compiles writes out as AIR and reads back
        assert load_air(dump_air(auto), name=auto.name) == auto  # the name is not part of AIR


def _refused(text: str, message: str, line: int, column: int) -> None:
    """``text`` is refused by validate and compile_cel, first with ``message`` at (line, column)."""
    _check(text)
    found = validate(text, STREAMS)
    assert found and message in found[0].message and (found[0].line, found[0].column) == (line, column), found
    with pytest.raises(CelError) as info:
        compile_cel(text, STREAMS)
    assert message in info.value.message


@FUZZ
@given(token_soup)
def test_token_soup(text):
    _check(text)


@FUZZ
@given(mutated_corpus())
def test_mutated_conformance_queries(text):
    _check(text)


@FUZZ
@given(st.text(max_size=300))
def test_any_text(text):
    _check(text)


def test_deep_nesting_is_an_error_not_a_crash():
    """Finding: 5,000 parentheses raised RecursionError from the parser (a 500 from the API)."""
    deep = "the query is nested too deeply"
    _refused("SELECT * FROM " + "(" * 5000 + "Stock" + ")" * 5000, deep, 1, 1)
    _refused("SELECT * FROM FILTER{" + "(" * 5000 + "Price > 1" + ")" * 5000 + "}(Stock)", deep, 1, 1)
    _refused("SELECT * FROM FILTER{Price > " + "1 + " * 20_000 + "1}(Stock)", deep, 1, 1)
    _refused("SELECT " + "Price + " * 20_000 + "1 AS P FROM Stock", deep, 1, 1)
    # "--" starts a comment: the rest of the line is gone, and the predicate with it
    text = "SELECT * FROM FILTER{Price > " + "-" * 5000 + "1}(Stock)"
    _refused(text, "expected a value but found end of input", 1, len(text) + 1)


@pytest.mark.parametrize("path", cel_files(), ids=lambda p: p.stem)
def test_every_conformance_query_compiles(path):
    text = path.read_text()
    if path.stem in UNKNOWN_SCHEMA:  # over an undeclared stream: they parse, but cannot compile
        assert parse_all(text)[1] == []
        return
    streams = list(CORPUS_STREAMS.values())
    assert validate(text, streams) == []
    for auto in compile_cel(text, streams).automata:
        assert load_air(dump_air(auto), name=auto.name) == auto


def test_control_characters_in_strings_are_refused():
    """Long-run finding: 'IBM' with a NUL in it compiled, but the AIR written
    for it could not be read back (XML cannot carry U+0000)."""
    (err,) = validate("SELECT * FROM FILTER{Name = '\x00IBM'}(Stock)", STREAMS)
    assert (err.line, err.column) == (1, 30) and "control character U+0000" in err.message
    _check("SELECT * FROM FILTER{Name = 'I\tB\nM'}(Stock)")  # tab and newline are fine


def test_what_compiles_loads_back_as_air():
    """Long-run findings: DUAL queries wrote end nodes without <Schema>, and
    DUR > 1e309 wrote Const="inf"; neither AIR could be read back."""
    for text in ("DUAL", "SELECT 0 AS x FROM DUAL PUBLISH Z"):
        assert validate(text, STREAMS) == []
        _check(text)
    (err,) = validate("SELECT * FROM FILTER{DUR > 1e309}(Stock)", STREAMS)
    assert "out of range" in err.message and (err.line, err.column) == (1, 28)
