"""Registration warnings (air/boundwarn.py): which NEXT, FOLD or AIR state keeps
automaton instances without a time bound, where it is written, and the fix."""

from __future__ import annotations

import re
from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.airxml import load_air_many
from air.boundwarn import UNBOUNDED, air_warnings, cel_warnings, keeps_unbounded, operator_positions
from air.cel import compile_cel
from air.cel.shapes import ShapeCache
from air.model import Predicate, State, parse_stream_decl
from tests.conftest import ROOT, examples

STOCK = parse_stream_decl("Stock(Name string, Price float, Volume int)")
STREAMS = {"Stock": STOCK}
RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
          "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")


def warn(text: str, streams=STREAMS, **kw):
    return cel_warnings(text, compile_cel(text, streams, **kw))


def caret_under(w) -> str:
    """The text the excerpt's caret points at (the excerpt is indented by two)."""
    src, caret = w.excerpt.split("\n")
    return src[len(caret) - 1:]


def test_the_readme_rising_query_warns_at_its_next_with_the_fix():
    [w] = warn(RISING)
    assert (w.code, w.automaton, w.state, w.stream, w.operator) == (UNBOUNDED, "Rising", "1", "Stock", "NEXT")
    assert (w.line, w.column) == (1, RISING.index("NEXT") + 1)
    assert caret_under(w).startswith("NEXT{$1.Name = $2.Name")
    assert "kept as long as the server runs" in w.message
    assert "DUR < 1 HOUR" in w.fix and "NEXT{" in w.fix
    assert w.to_dict()["code"] == UNBOUNDED and set(w.to_dict()) == set(w._fields)
    assert w.render().startswith(f"line 1, column {w.column}: warning: NEXT keeps")


@pytest.mark.parametrize("text", [
    RISING.replace("$2.Price >= 1.05 * $1.Price", "DUR < 1 HOUR"),
    RISING.replace("$2.Price >= 1.05 * $1.Price", "$2.Price >= 1.05 * $1.Price AND DUR <= 10 MIN"),
    RISING.replace("$2.Price >= 1.05 * $1.Price", "DUR = 5"),
    "FILTER{Price > 10}(Stock)",  # keeps nothing
    "SELECT * FROM Stock NEXT Stock",  # every Stock event affects the instance
    "SELECT * FROM Stock NEXT{} Stock",
    "SELECT * FROM Stock FOLD{, $2.Price > $.Price, } Stock",  # TRUE filter
    "SELECT * FROM Stock FOLD{$2.Name = $.Name AND DUR < 1 DAY, $2.Price > $.Price, } Stock",
    "Stock NEXT{$1.Name = $2.Name AND DUR < 1 HOUR OR $2.Price > 100 AND DUR < 2 HOURS} Stock",
])
def test_bounded_or_unconditional_clauses_do_not_warn(text):
    assert warn(text) == []


def test_a_fold_whose_filter_no_event_meets_is_a_runaway():
    text = "SELECT * FROM Stock FOLD{$2.Price < 0, true, } Stock"
    [w] = warn(text)
    assert (w.operator, w.state, w.column) == ("FOLD", "1", text.index("FOLD") + 1)
    assert caret_under(w).startswith("FOLD{")
    assert "FOLD{... AND DUR < 1 HOUR, ..., ...}" in w.fix


def test_a_bound_on_the_wrong_duration_is_no_bound():
    # $2.DUR and DUR in a FILTER of the second input are the event's own duration,
    # and DUR outside NEXT{} bounds the result, not the wait
    assert len(warn("SELECT * FROM Stock NEXT{$1.Name = $2.Name AND $2.DUR < 5} Stock")) == 1
    assert len(warn("SELECT * FROM Stock NEXT FILTER{DUR < 5}(Stock)")) == 1
    assert len(warn("FILTER{DUR < 1 HOUR}(Stock NEXT{$1.Name = $2.Name} Stock)")) == 1


def test_the_fix_fits_how_the_clause_is_written():
    [bare] = warn("SELECT * FROM Stock NEXT FILTER{Price > 100}(Stock)")
    assert bare.fix.startswith("give it a time bound: NEXT{DUR < 1 HOUR}")
    [fold] = warn("SELECT * FROM Stock FOLD{, true, } FILTER{Price > 100}(Stock)")
    assert fold.fix.startswith("give FOLD a time bound as its filter: FOLD{DUR < 1 HOUR, ..., ...}")


def test_an_or_with_one_alternative_unbounded_warns_and_says_which():
    text = "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND DUR < 1 HOUR OR $2.Price > 100} Stock"
    [w] = warn(text)
    assert "1 of the 2 alternatives of its OR has no DUR bound" in w.message
    assert "NEXT{(...) AND DUR < 1 HOUR}" in w.fix
    assert warn(text.replace("$2.Price > 100", "$2.Price > 100 AND DUR < 5 SEC")) == []


NESTED = """-- NEXT and FOLD in a comment, and in a string, are not operators
SELECT * FROM (SELECT Name, Price FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs)
  NEXT{$1.Name = $2.Name AND DUR < 1 HOUR}
  (SELECT Name, Price FROM FILTER{Name != 'NEXT'}(Stock) /* FOLD */
     FOLD{$2.Name = $.Name, $2.Price > $.Price,} Stock)
PUBLISH Out"""


def test_nested_queries_warn_once_per_clause_at_its_own_line():
    got = warn(NESTED)
    lines = NESTED.split("\n")
    assert [(w.operator, w.line, w.column) for w in got] == [
        ("NEXT", 2, lines[1].index("NEXT{") + 1),
        ("FOLD", 5, lines[4].index("FOLD{") + 1)]
    assert [w.automaton for w in got] == ["Pairs", "Out__1"]
    assert [caret_under(w)[:5] for w in got] == ["NEXT{", "FOLD{"]


def test_a_query_reading_another_queries_output_warns_about_its_own_clause():
    first = compile_cel(RISING, STREAMS)
    streams = {**STREAMS, **first.schemas}
    text = "SELECT * FROM Rising NEXT{$1.Name = $2.Name AND $2.After > $1.After} Rising PUBLISH Twice"
    [w] = warn(text, streams)
    assert (w.stream, w.automaton, w.column) == ("Rising", "Twice", text.index("NEXT") + 1)


def test_a_query_bound_from_a_cached_shape_points_into_its_own_text():
    cache = ShapeCache()
    template = ("SELECT * FROM FILTER{{Name = '{}'}}(Stock)\n  NEXT{{$1.Name = $2.Name AND $2.Price > {} * $1.Price}} "
                "Stock PUBLISH {}")
    cache.compile(template.format("IBM", 1.5, "Early"), STREAMS, name_prefix="s1")
    text = template.format("A much longer name\nover two lines", 1.000001, "Later")
    bound = cache.compile(text, STREAMS, name_prefix="s2")
    assert cache.hits == 1
    [w] = cel_warnings(text, bound)
    assert w == warn(text, name_prefix="s2")[0]
    assert (w.line, w.automaton) == (3, "Later") and caret_under(w).startswith("NEXT{")


def test_operator_positions_skip_comments_and_strings_and_fall_back_to_the_parser():
    text = "Stock -- NEXT\n NEXT{$2.Name = 'FOLD'} /* NEXT */ Stock FOLD{,,} Stock"
    want = [(2, 2), (2, text.split("\n")[1].index("FOLD{") + 1)]
    assert operator_positions(text) == want
    assert operator_positions(text, 2) == want
    assert operator_positions("Stock NEXT Stock", 5) == [(1, 7)]  # the parser decides when the count is off


#: The scan operator_positions made before (a Python step a word): the reference the regex scan must equal.
_WORDS = re.compile(r"(--[^\n]*|//[^\n]*|/\*.*?\*/|'(?:[^']|'')*')|([A-Za-z_][A-Za-z_0-9]*)", re.S)


def _word_by_word(text: str) -> list[tuple[int, int]]:
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    out = []
    for m in _WORDS.finditer(text):
        if m.group(2) is not None and m.group(2).upper() in ("NEXT", "FOLD"):
            line = bisect_right(starts, m.start())
            out.append((line, m.start() - starts[line - 1] + 1))
    return out


_PIECES = ["NEXT", "next", "FoLd", "fold", "FOLD{", "NEXT_1", "9NEXT", "a9NEXT", "xNEXT", "NEXTx", "NEXT9", "_FOLD", "é",
           "NEXTé", "\u212aNEXT", " ", "\n", "{", "}", "(", "$2.", "'", "''", "'NEXT'", "--", "-", "/", "//", "/*",
           "*/", "*", "Stock", "1.5", "9", "_"]


@settings(examples(4, deadline=None))
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_operator_positions_find_what_a_scan_word_by_word_finds(pieces):
    text = "".join(pieces)
    assert operator_positions(text) == _word_by_word(text)


def test_air_states_warn_with_the_automaton_state_and_xml_line():
    text = (ROOT / "examples" / "example9.xml").read_text()
    autos = load_air_many(text, name="ex9")
    got = air_warnings(autos, text)
    lines = text.split("\n")
    assert [(w.automaton, w.state, w.operator, w.stream) for w in got] == [("ex9", "A", None, "Stock"),
                                                                           ("ex9", "B", None, "Stock")]
    for w in got:
        assert lines[w.line - 1].startswith(f'<Node NodeID="{w.state}"') and w.column == 0
        assert w.excerpt == "  " + lines[w.line - 1]
        assert 'Const="3600000"' in w.fix and "<FilterEdge>" in w.fix
    assert 'Const="3600"' in air_warnings(autos, text, time_unit_ms=1000.0)[0].fix


def test_air_with_a_composite_bound_in_every_clause_does_not_warn():
    text = (ROOT / "examples" / "example9.xml").read_text()
    bound = '<DurationPred Type="COMPOSITE" OP="&lt;" Const="3600000"/>\n</PredClause>'
    filters = text.replace('NodeAttr="Name_n"/>\n</PredClause>', 'NodeAttr="Name_n"/>\n' + bound)
    filters = filters.replace('NodeAttr="Name"/>\n</PredClause>', 'NodeAttr="Name"/>\n' + bound)
    assert air_warnings(load_air_many(filters, name="ex9"), filters) == []


def test_which_states_keep_instances():
    never = Predicate(())  # FALSE: nothing affects the instance, so it is dropped at once
    assert not keeps_unbounded(State("1", False, "Stock", filter=never))
    assert not keeps_unbounded(State("1", False, "Stock", filter=None))
    assert not keeps_unbounded(State("1", False, None))
    one = compile_cel(RISING, STREAMS).automata[0]
    assert [keeps_unbounded(s) for s in one.states] == [False, True, False]
