"""CEL parsing: the conformance corpus, the grammar's corners, syntax errors
with exact positions, collect mode, and a printer round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.cel import CelSyntaxError, parse, parse_all
from air.cel.ast import Filter, Fold, Next, Quantity, Query, SelectItem, Star, StreamRef, SubQuery
from air.cel.printer import format_query
from air.expr import And, Binary, Call, Compare, Dur, Literal, Or, Ref
from tests.cel.corpus import cel_files
from tests.conftest import examples


@pytest.mark.parametrize("path", cel_files(), ids=lambda p: p.stem)
def test_every_conformance_query_parses_and_round_trips(path):
    q = parse(path.read_text())
    assert isinstance(q, Query)
    assert parse(format_query(q)) == q


def test_select_star_publish():
    assert parse("SELECT * FROM Stock PUBLISH T1") == Query((Star(),), StreamRef("Stock"), "T1")


def test_select_clause_is_optional_and_keywords_are_case_insensitive():
    q = parse("filter{Name = 'IBM'} stock next {$1.Name = $2.Name} stock publish x")
    assert q == Query((Star(),), Next(
        Filter(Compare("=", Ref("Name"), Literal("IBM")), StreamRef("stock")),
        Compare("=", Ref("Name", "1"), Ref("Name", "2")), StreamRef("stock")), "x")


def test_select_items_aliases_and_expressions():
    q = parse("SELECT 1 + 2 as Number, 'myName' as Name, CONTAINS(Name, 'IBM') as isIBM, Price FROM Stock")
    assert q.select == (
        SelectItem(Binary("+", Literal(1), Literal(2)), "Number"),
        SelectItem(Literal("myName"), "Name"),
        SelectItem(Call("CONTAINS", (Ref("Name"), Literal("IBM"))), "isIBM"),
        SelectItem(Ref("Price"), None),
    )


def test_filter_on_parenthesised_stream_expression_is_one_operand():
    # test41: the FILTER applies to the whole NEXT, not to its left input
    q = parse("SELECT * FROM FILTER {Price_1 < 10}\n(Stock NEXT {$1.Name=$2.Name} Stock)\n PUBLISH T41")
    assert isinstance(q.source, Filter) and isinstance(q.source.input, Next)


@pytest.mark.parametrize("text", ["FILTER{Price > 60.5} (Stock) NEXT{$1.Name = $2.Name} Stock",
                                  "FILTER{Price > 60.5} Stock NEXT{$1.Name = $2.Name} Stock"])
def test_filter_binds_tighter_than_next(text):
    src = parse(text).source
    assert isinstance(src, Next) and isinstance(src.left, Filter)
    assert src.left.input == StreamRef("Stock")


def test_next_and_fold_are_left_associative():
    # NEXT's braces may be omitted ("S NEXT S", docs/design/semantics.md#cel)
    src = parse("A NEXT B FOLD{,,} C NEXT D").source
    assert isinstance(src, Next) and src.right == StreamRef("D")
    assert isinstance(src.left, Fold) and src.left.right == StreamRef("C")
    assert src.left.left == Next(StreamRef("A"), None, StreamRef("B"))


def test_fold_parts():
    assert parse("Stock FOLD{} Stock").source == Fold(StreamRef("Stock"), None, None, (), StreamRef("Stock"))
    f = parse("X FOLD {, $.cnt > 10 AND DUR < 1, $.cnt+1 AS cnt} Y").source
    assert f.cond is None
    assert f.rebind == And((Compare(">", Ref("cnt", "LAST"), Literal(10)), Compare("<", Dur(), Literal(1))))
    assert f.aggs == (SelectItem(Binary("+", Ref("cnt", "LAST"), Literal(1)), "cnt"),)


def test_subquery_with_select_or_publish_is_kept_plain_parentheses_are_not():
    q = parse("SELECT Name FROM (SELECT Price FROM Stock) NEXT{$1.Price = $2.Price} (Stock)")
    assert q.source.left == SubQuery(Query((SelectItem(Ref("Price")),), StreamRef("Stock")))
    assert q.source.right == StreamRef("Stock")
    inner = parse("(Stock PUBLISH Mine) NEXT Stock").source.left
    assert inner == SubQuery(Query((Star(),), StreamRef("Stock"), "Mine"))


def test_dur_units_comments_semicolon_and_dual():
    q = parse("-- a comment\nSELECT '' as Name FROM FILTER{DUR >= 10min /* inline */ AND 2 HOURS > DUR}(DUAL);")
    assert q.source.pred == And((Compare(">=", Dur(), Quantity(10, "MIN")),
                                 Compare(">", Quantity(2, "HOUR"), Dur())))
    assert q.source.input == StreamRef("DUAL")


def test_operator_precedence():
    e = parse("FILTER{a + b * c ^ 2 > 1 OR x = 1 AND y = 2}(S)").source.pred
    assert e == Or((Compare(">", Binary("+", Ref("a"), Binary("*", Ref("b"), Binary("^", Ref("c"), Literal(2)))),
                            Literal(1)),
                    And((Compare("=", Ref("x"), Literal(1)), Compare("=", Ref("y"), Literal(2))))))


def test_positions_are_recorded():
    q = parse("SELECT *\nFROM Stock\n  NEXT{$1.Name = $2.Name} Stock")
    assert (q.source.line, q.source.column) == (3, 3)
    assert (q.source.pred.left.line, q.source.pred.left.column) == (3, 8)
    assert (q.source.right.line, q.source.right.column) == (3, 27)


# --------------------------------------------------------------------------- errors

ERRORS = [
    # missing brace
    ("SELECT *\nFROM FILTER{Price > 3 Stock", 2, 23, "expected '}' to close FILTER{ but found 'Stock'"),
    ("SELECT * FROM FILTER Name='IBM'}(Stock)", 1, 22, "expected '{' after FILTER but found 'Name'"),
    # bad token
    ("SELECT * FROM Stock # 3", 1, 21, "unexpected character '#'"),
    ("SELECT * FROM Stock NEXT{$1.Name == = $2.Name} Stock", 1, 37, "expected a value but found '='"),
    # unterminated string
    ("SELECT *\nFROM FILTER{Name = 'IBM}(Stock)", 2, 20, "unterminated string literal"),
    ("SELECT * /* never closed\nFROM Stock", 1, 10, "unterminated comment"),
    # bad decorator
    ("SELECT * FROM Stock NEXT{$3.Name = $2.Name} Stock", 1, 26, "unknown decorator '$3'; use $1, $2 or $"),
    ("SELECT * FROM Stock NEXT{$1 = 2} Stock", 1, 29, "expected '.' after decorator '$1' but found '='"),
    # structure
    ("SELECT Name, FROM Stock", 1, 14, "expected a value but found 'FROM'"),
    ("SELECT Name Stock", 1, 13, "expected FROM but found 'Stock'"),
    ("SELECT * FROM", 1, 14, "expected a stream name, FILTER{...} or '(' but found end of input"),
    ("SELECT * FROM Stock PUBLISH", 1, 28, "expected an output stream name after PUBLISH but found end of input"),
    ("SELECT * FROM Stock Stock", 1, 21, "expected the end of the query (or NEXT, FOLD, PUBLISH) but found 'Stock'"),
    ("SELECT * FROM (Stock NEXT Stock", 1, 32, "expected ')' to close '(' but found end of input"),
    ("SELECT * FROM FILTER{}(Stock)", 1, 22, "FILTER{} needs a predicate"),
    ("SELECT * FROM Stock FOLD{$1.Name = $2.Name} Stock", 1, 43,
     "expected ',' after FOLD's filter predicate (FOLD{filter, rebind, aggregates}) but found '}'"),
    ("SELECT * FROM Stock FOLD{,, $.cnt + 1} Stock", 1, 38,
     "expected AS <attribute> after a FOLD aggregate expression but found '}'"),
    ("SELECT * FROM NEXT", 1, 15, "expected a stream name, FILTER{...} or '(' but found 'NEXT'"),
]


@pytest.mark.parametrize("text,line,column,message", ERRORS, ids=[e[3][:40] for e in ERRORS])
def test_syntax_errors_have_exact_positions(text, line, column, message):
    with pytest.raises(CelSyntaxError) as info:
        parse(text)
    e = info.value
    assert (e.line, e.column) == (line, column)
    assert message in e.message
    # the caret sits under the reported column of the reported line
    src_line, caret = e.excerpt.split("\n")
    assert src_line[2:] == text.splitlines()[line - 1]
    assert caret.index("^") - 2 == column - 1
    assert e.to_dict()["kind"] == "syntax"


def test_parse_all_collects_several_errors_in_order():
    text = ("SELECT Name, FROM FILTER{Price >> 3}(Stock)\n"
            "  NEXT{$3.Name = 1} Stock # PUBLISH")
    query, errors = parse_all(text)
    assert query is None
    assert [(e.line, e.column) for e in errors] == [(1, 14), (1, 33), (2, 8), (2, 27), (2, 36)]
    assert [type(e) for e in errors] == [CelSyntaxError] * 5
    assert "unknown decorator '$3'" in errors[2].message
    assert "unexpected character '#'" in errors[3].message
    assert "expected an output stream name after PUBLISH" in errors[4].message
    # excerpts point into the original text, even after a bad character was skipped
    assert errors[4].excerpt.splitlines()[0] == "    NEXT{$3.Name = 1} Stock # PUBLISH"


def test_parse_all_assumes_a_missing_closing_brace_and_goes_on():
    query, errors = parse_all("Stock NEXT{$1.x = $2.x Stock NEXT{$1.y = } Stock")
    assert [(e.line, e.column, e.message.split(" but")[0]) for e in errors] == [
        (1, 24, "expected '}' to close NEXT{"), (1, 42, "expected a value")]


def test_parse_all_respects_max_errors_and_returns_the_query_when_clean():
    query, errors = parse_all("SELECT # FROM @ Stock ~ `", max_errors=2)
    assert query is None and len(errors) == 2
    query, errors = parse_all("SELECT * FROM Stock PUBLISH T1")
    assert errors == [] and query == parse("SELECT * FROM Stock PUBLISH T1")


def test_unterminated_string_in_collect_mode_reports_only_that():
    query, errors = parse_all("SELECT * FROM FILTER{Name = 'IBM}(Stock)")
    assert [(e.column, e.message) for e in errors] == [(29, "unterminated string literal")]


# --------------------------------------------------------------------------- round trip

_names = st.sampled_from(["Name", "Price", "Volume", "cnt", "x_1", "a"])
_streams = st.sampled_from(["Stock", "S2", "DUAL"]).map(StreamRef)
_literals = st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False).filter(lambda f: f >= 0),
                      st.text("ab' c", max_size=5), st.booleans()).map(Literal)
_refs = st.builds(Ref, _names, st.sampled_from([None, "1", "2", "LAST"]))
_values = st.recursive(
    st.one_of(_literals, _refs),
    lambda inner: st.one_of(
        st.builds(Binary, st.sampled_from("+-*/%^"), inner, inner),
        st.builds(Call, st.sampled_from(["CONTAINS", "F"]), st.lists(inner, max_size=2).map(tuple))),
    max_leaves=6)
_compares = st.one_of(
    st.builds(Compare, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), _values, _values),
    st.builds(Compare, st.sampled_from(["<", ">="]), st.just(Dur()),
              st.builds(Quantity, st.integers(0, 100), st.sampled_from(["MS", "SEC", "MIN", "HOUR", "DAY"]))))
_preds = st.recursive(_compares, lambda inner: st.one_of(
    st.lists(inner, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
    st.lists(inner, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs)))), max_leaves=4)
_items = st.one_of(st.just(Star()), st.builds(SelectItem, _values, st.one_of(st.none(), _names)))


def _exprs(children):
    return st.one_of(
        st.builds(Filter, _preds, children),
        st.builds(Next, children, st.one_of(st.none(), _preds), children),
        st.builds(Fold, children, st.one_of(st.none(), _preds), st.one_of(st.none(), _preds),
                  st.lists(st.builds(SelectItem, _values, _names), max_size=2).map(tuple), children),
        st.builds(lambda sel, src, pub: SubQuery(Query(tuple(sel), src, pub)),
                  st.lists(_items, min_size=1, max_size=3), children, st.one_of(st.none(), _names)))


_queries = st.builds(Query, st.lists(_items, min_size=1, max_size=3).map(tuple),
                     st.recursive(_streams, _exprs, max_leaves=5), st.one_of(st.none(), _names))


@settings(examples(3))
@given(_queries)
def test_printer_round_trips_random_trees(q):
    assert parse(format_query(q)) == q


# --------------------------------------------------------------------------- misspelt keywords (issue 35)

TYPOS = [
    # the misspelt keyword was read as a stream name: the error points at it, not at the word after it
    ("SELEC Name, Price FROM Stock", 1, 1,
     "unknown word 'SELEC'; did you mean SELECT? (read as a name, it cannot be followed by 'Name')"),
    ("selec * from Stock", 1, 1, "unknown word 'selec'; did you mean SELECT?"),
    ("SELECT * FROM FILTR{Price > 1}(Stock)", 1, 15, "unknown word 'FILTR'; did you mean FILTER?"),
    # the misspelt keyword is the token the parser stopped at
    ("SELECT Name FORM Stock", 1, 13, "expected FROM but found 'FORM'; did you mean FROM?"),
    ("SELECT Name FROM Stock NXET Stock", 1, 24,
     "expected the end of the query (or NEXT, FOLD, PUBLISH) but found 'NXET'; did you mean NEXT?"),
    ("SELECT Name FROM Stock\n  PUBLIHS Rising", 2, 3, "but found 'PUBLIHS'; did you mean PUBLISH?"),
    ("Stock FLOD{,, $.n + 1 AS n} Stock", 1, 7, "but found 'FLOD'; did you mean FOLD?"),
    ("Stock NEXT{$1.Price > 1 ANDD $2.Price < 2} Stock", 1, 25, "but found 'ANDD'; did you mean AND?"),
]


@pytest.mark.parametrize("text,line,column,message", TYPOS, ids=[t[0][:24] for t in TYPOS])
def test_a_misspelt_keyword_is_pointed_at_and_named(text, line, column, message):
    for errors in ([_raised(text)], parse_all(text)[1]):
        e = errors[0]
        assert (e.line, e.column) == (line, column), str(e)
        assert message in e.message
        assert e.excerpt.split("\n")[1].index("^") - 2 == column - 1


def _raised(text: str) -> CelSyntaxError:
    with pytest.raises(CelSyntaxError) as info:
        parse(text)
    return info.value


@pytest.mark.parametrize("text", [
    "SELECT * FROM Stock Stock",  # no keyword is near 'Stock'
    "Stock NEXT{$1.Form $2.Price} Stock",  # an attribute after '.' is never taken for a keyword
    "SELECT * FROM Nexus Stock",  # 'Nexus' is two edits from NEXT: a name, not a slip
])
def test_no_keyword_is_guessed_where_none_is_near(text):
    assert all("did you mean" not in e.message for e in parse_all(text)[1])
