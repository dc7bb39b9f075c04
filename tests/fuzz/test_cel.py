"""CEL parser and compiler under random text: every outcome is a compiled
query or a CelError with a position inside the text; nothing else escapes,
nothing hangs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from air.airxml import dump_air, load_air
from air.cel import CelError, compile_cel, parse_all, validate
from air.model import parse_stream_decl
from tests.cel.corpus import cel_files
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


def _check(text: str) -> None:
    _, errors = parse_all(text)
    for e in errors:
        assert isinstance(e, CelError) and e.line >= 0
    found = validate(text, STREAMS)
    for e in found:
        assert isinstance(e, CelError)
        assert e.message and len(e.excerpt) < 400  # excerpts are cut to a window
    try:
        q = compile_cel(text, STREAMS)
    except CelError:
        assert found, "validate passed a query that compile_cel refused"
        return
    assert not found
    for auto in q.automata:  # what compiles writes out as AIR and reads back
        load_air(dump_air(auto))


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
    for text in ["SELECT * FROM " + "(" * 5000 + "Stock" + ")" * 5000,
                 "SELECT * FROM FILTER{" + "(" * 5000 + "Price > 1" + ")" * 5000 + "}(Stock)",
                 "SELECT * FROM FILTER{Price > " + "-" * 5000 + "1}(Stock)",
                 "SELECT * FROM FILTER{Price > " + "1 + " * 20_000 + "1}(Stock)",
                 "SELECT " + "Price + " * 20_000 + "1 AS P FROM Stock"]:
        _check(text)


def test_control_characters_in_strings_are_refused():
    """Long-run finding: 'IBM' with a NUL in it compiled, but the AIR written
    for it could not be read back (XML cannot carry U+0000)."""
    (err,) = validate("SELECT * FROM FILTER{Name = '\x00IBM'}(Stock)", STREAMS)
    assert (err.line, err.column) == (1, 30) and "control character U+0000" in err.message
    _check("SELECT * FROM FILTER{Name = 'I\tB\nM'}(Stock)")  # tab and newline are fine


def test_what_compiles_loads_back_as_air():
    """Long-run findings: DUAL queries wrote end nodes without <Schema>, and
    DUR > 1e309 wrote Const="inf"; neither AIR could be read back."""
    _check("DUAL")
    _check("SELECT 0 AS x FROM DUAL PUBLISH Z")
    (err,) = validate("SELECT * FROM FILTER{DUR > 1e309}(Stock)", STREAMS)
    assert "out of range" in err.message and (err.line, err.column) == (1, 28)
