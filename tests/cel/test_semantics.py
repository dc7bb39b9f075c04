"""Semantic analysis: every class of user error with its exact position and
message, the automatic renaming rules, type inference and DUR units."""

from __future__ import annotations

import pytest

from air.cel import (CelError, CelNameError, CelSchemaError, CelSyntaxError, CelTypeError,
                     compile_cel, parse)
from air.cel.compiler import validate
from air.cel.semantics import Duration, Where, analyze
from air.expr import Compare, Literal
from air.model import Attribute, StreamSchema
from tests.cel.corpus import STREAMS

ERRORS = [
    # unknown stream
    (CelNameError, "SELECT *\nFROM Stok", 2, 6,
     "unknown stream 'Stok'; did you mean 'Stock'? (declared streams: IBMStock, Stock)"),
    # unknown attribute (bare, decorated, in SELECT)
    (CelNameError, "SELECT * FROM FILTER{Prise > 3}(Stock)", 1, 22,
     "unknown attribute 'Prise' in FILTER; did you mean 'Price'? (the input has Name, Price, Volume)"),
    (CelNameError, "SELECT * FROM Stock NEXT{$1.Name = $2.Nme} Stock", 1, 36,
     "unknown attribute '$2.Nme'; did you mean 'Name'?: the second input of NEXT has Name, Price, Volume"),
    (CelNameError, "SELECT IBMPrice FROM Stock", 1, 8, "unknown attribute 'IBMPrice' in SELECT"),
    (CelNameError, "SELECT * FROM Stock NEXT{Price_1 > 1} Stock", 1, 26,
     "unknown attribute 'Price_1' in NEXT"),
    # ambiguous attribute
    (CelNameError, "SELECT * FROM Stock\n  NEXT{Name = 'IBM'} Stock", 2, 8,
     "attribute 'Name' is ambiguous: both inputs of NEXT have it; write $1.Name or $2.Name"),
    (CelNameError, "SELECT * FROM Stock FOLD{Price > 1,,} Stock", 1, 26,
     "attribute 'Price' is ambiguous: both inputs of FOLD have it"),
    # bad decorators (the unknown-decorator case $3 is a syntax error: see test_parser)
    (CelNameError, "SELECT * FROM FILTER{$2.Name = 'IBM'}(Stock)", 1, 22,
     "'$2.Name': FILTER has a single input; write $1.Name or Name"),
    (CelNameError, "SELECT * FROM Stock NEXT{$.Name = 'IBM'} Stock", 1, 26,
     "'$.Name' (the last iteration) is only valid inside FOLD"),
    (CelNameError, "SELECT $1.Name FROM Stock", 1, 8, "decorators are not allowed in SELECT; write Name"),
    (CelNameError, "SELECT * FROM Stock NEXT{$1.DUR > 3} Stock", 1, 26,
     "the duration of the first input is not available in NEXT"),
    # functions
    (CelNameError, "SELECT * FROM FILTER{CONTAIN(Name, 'x') = 1}(Stock)", 1, 22,
     "unknown function CONTAIN; did you mean 'CONTAINS'? (available: CONTAINS, SIMILARITY)"),
    (CelTypeError, "SELECT * FROM FILTER{CONTAINS(Name, 3) = 1}(Stock)", 1, 37,
     "argument 2 of CONTAINS must be a string, not an int"),
    (CelTypeError, "SELECT * FROM FILTER{SIMILARITY(Name) > 0.5}(Stock)", 1, 22,
     "SIMILARITY takes 2 arguments (string, string), not 1"),
    # type mismatches
    (CelTypeError, "SELECT * FROM FILTER{Name > 3}(Stock)", 1, 27, "cannot compare string with int"),
    (CelTypeError, "SELECT * FROM Stock NEXT{$1.Price = $2.Name} Stock", 1, 35,
     "cannot compare float with string"),
    (CelTypeError, "SELECT Name + 1 AS x FROM Stock", 1, 13,
     "cannot apply '+' to a string; arithmetic needs int or float operands"),
    (CelTypeError, "SELECT -Name AS x FROM Stock", 1, 8, "cannot negate a string"),
    (CelTypeError, "SELECT * FROM FILTER{Volume % 2.5 = 1}(Stock)", 1, 29, "'%' (remainder) needs int operands"),
    (CelTypeError, "SELECT * FROM FILTER{Price}(Stock)", 1, 22,
     "a predicate must be a comparison such as Price > 10, not a value of type float"),
    (CelTypeError, "SELECT * FROM FILTER{DUR + 1 > 3}(Stock)", 1, 22,
     "DUR can only be compared directly with a constant"),
    (CelTypeError, "SELECT * FROM FILTER{DUR > Price}(Stock)", 1, 28, "DUR must be compared with a number"),
    (CelTypeError, "SELECT * FROM FILTER{Price > 3 MIN}(Stock)", 1, 30,
     "a time unit (MIN) is only allowed on a constant compared with DUR"),
    (CelTypeError, "SELECT * FROM (SELECT *, 1 AS cnt FROM Stock) FOLD{,,$.cnt + 0.5 AS cnt} Stock", 1, 54,
     "FOLD aggregate 'cnt' is int but its expression is float"),
    # duplicate output names
    (CelSchemaError, "SELECT Name,\n       Price AS Name FROM Stock", 2, 8,
     "duplicate output attribute 'Name' in SELECT; rename one of them with AS"),
    (CelSchemaError, "SELECT *, Volume FROM Stock", 1, 11, "duplicate output attribute 'Volume' in SELECT"),
    (CelSchemaError, "SELECT Price * 2 FROM Stock", 1, 8, "give this computed column a name with AS"),
    (CelSchemaError, "SELECT * FROM (SELECT Name, Price FROM Stock) NEXT (SELECT Name, Price AS Price_1 FROM Stock)",
     1, 47, "NEXT output would have two attributes named 'Price_1' after renaming the first input's "
     "attributes to *_1"),
    (CelSchemaError, "SELECT * FROM Stock FOLD{,,} Stock FOLD{,,} Stock", 1, 36,
     "FOLD output would have two attributes named 'Name_1'"),
    (CelSchemaError, "SELECT * FROM (Stock PUBLISH X) NEXT Stock PUBLISH X", 1, 52, "the query publishes 'X' twice"),
    (CelSchemaError, "SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Stock", 1, 48,
     "the query reads the stream 'Stock' that it publishes"),
    # FOLD invariant and aggregates
    (CelSchemaError, "SELECT *\nFROM (SELECT Name FROM Stock) FOLD{,,} Stock", 2, 31,
     "FOLD needs the first input to have every attribute of the second (schema inclusion); "
     "the first input lacks Price, Volume"),
    (CelSchemaError, "SELECT * FROM Stock FOLD{,,$.x + 1 AS x} Stock", 1, 28,
     "FOLD aggregate 'x' must name an attribute of the first input (Name, Price, Volume)"),
]


@pytest.mark.parametrize("cls,text,line,column,message", ERRORS, ids=[e[4][:50] for e in ERRORS])
def test_user_errors_have_class_position_and_message(cls, text, line, column, message):
    with pytest.raises(CelError) as info:
        compile_cel(text, STREAMS)
    e = info.value
    assert type(e) is cls
    assert (e.line, e.column) == (line, column)
    assert message in e.message
    src, caret = e.excerpt.split("\n")
    assert src[2:] == text.splitlines()[line - 1] and caret.index("^") == column + 1
    assert e.to_dict() == {"kind": cls.kind, "message": e.message, "line": line, "column": column,
                           "excerpt": e.excerpt}


def test_error_classes_share_one_family():
    for cls in (CelSyntaxError, CelNameError, CelTypeError, CelSchemaError):
        assert issubclass(cls, CelError)


def test_validate_reports_all_syntax_errors_or_the_first_semantic_one():
    assert validate("SELECT * FROM Stock PUBLISH T1", STREAMS) == []
    errs = validate("SELECT # FROM Stock NEXT{x = } Stock", STREAMS)
    assert [(type(e), e.column) for e in errs] == [(CelSyntaxError, 8), (CelSyntaxError, 10),
                                                   (CelSyntaxError, 30)]
    errs = validate("SELECT * FROM Stok", STREAMS)
    assert [(type(e), e.column) for e in errs] == [(CelNameError, 15)]


# --------------------------------------------------------------------------- schemas


def out_schema(text: str, **kw) -> list[tuple[str, str]]:
    q = compile_cel(text, STREAMS, **kw)
    return [(a.name, a.type) for a in q.schemas[q.outputs[-1]].attributes]


def test_next_renames_every_left_attribute_when_any_name_is_shared():
    assert [n for n, _ in out_schema("Stock NEXT Stock")] == [
        "Name_1", "Price_1", "Volume_1", "Name", "Price", "Volume"]
    assert [n for n, _ in out_schema("Stock NEXT Stock NEXT Stock")] == [
        "Name_1_1", "Price_1_1", "Volume_1_1", "Name_1", "Price_1", "Volume_1", "Name", "Price", "Volume"]
    # (SELECT Name ...) shares Name with Stock: Price is renamed too ("for uniformity")
    assert [n for n, _ in out_schema("(SELECT Name, Price AS P FROM Stock) NEXT Stock")] == [
        "Name_1", "P_1", "Name", "Price", "Volume"]


def test_next_without_shared_names_keeps_them():
    assert out_schema("IBMStock NEXT{$2.Name = 'MSFT'} Stock") == [
        ("IBMPrice", "float"), ("Name", "string"), ("Price", "float"), ("Volume", "int")]


def test_fold_output_schema_of_example_7():
    text = ("SELECT * FROM FILTER{cnt > 10}((SELECT *, 1 AS cnt FROM FILTER{Volume > 10000}(Stock))"
            " FOLD{$2.Name = $.Name, $2.Price > $.Price, $.cnt+1 AS cnt} Stock)")
    # the system paper's renaming example (docs/design/semantics.md#decorators-and-renaming) lists
    # (Name_1, Price_1, Volume_1, cnt_1, Name, Price, Volume, cnt); cnt is only in
    # the first input, so by the renaming rule it keeps its name, as the original compiler did (T25)
    assert out_schema(text) == [("Name_1", "string"), ("Price_1", "float"), ("Volume_1", "int"),
                                ("cnt", "int"), ("Name", "string"), ("Price", "float"), ("Volume", "int")]


def test_fold_keeps_first_only_attributes_and_renames_shared_ones():
    assert out_schema("Stock FOLD{$1.Name = $2.Name,,} (SELECT Name FROM Stock)") == [
        ("Name_1", "string"), ("Price", "float"), ("Volume", "int"), ("Name", "string")]


def test_output_types_are_inferred():
    text = ("SELECT 1 + 2 AS i, Volume * Price AS f, Volume / 2 AS d, 7 % 3 AS m, 'x' AS s, "
            "CONTAINS(Name, 'IB') AS c, SIMILARITY(Name, 'IBM') AS sim, -Volume AS neg, "
            "Volume ^ 2 AS p, 2.0 ^ 2 AS pf, TRUE AS b, UPPER(Name) AS u FROM Stock")
    assert out_schema(text, functions={"upper": "str"}) == [
        ("i", "int"), ("f", "float"), ("d", "int"), ("m", "int"), ("s", "string"), ("c", "int"),
        ("sim", "float"), ("neg", "int"), ("p", "int"), ("pf", "float"), ("b", "bool"), ("u", "string")]


def test_user_functions_are_case_insensitive_and_may_shadow_builtins():
    assert out_schema("SELECT contains(Name) AS c FROM Stock", functions={"CONTAINS": "float"}) == [
        ("c", "float")]


def test_bool_attributes_can_be_predicates():
    flags = StreamSchema("Flags", (Attribute("on", "bool"), Attribute("n", "int")))
    q = compile_cel("SELECT n FROM FILTER{on AND n > 1}(Flags)", {"Flags": flags})
    atoms = q.automata[0].states[0].forwards[0].predicate.clauses[0].atoms
    assert [(a.event_attr, a.op, a.const) for a in atoms] == [("on", "=", "true"), ("n", ">", "1")]
    with pytest.raises(CelTypeError, match="bool values can only be compared with = or !="):
        compile_cel("SELECT n FROM FILTER{on < TRUE}(Flags)", {"Flags": flags})


def test_dual_needs_no_declaration():
    assert out_schema("SELECT '' as Name, 0.0 as Price, 0 as Volume FROM DUAL") == [
        ("Name", "string"), ("Price", "float"), ("Volume", "int")]


# --------------------------------------------------------------------------- DUR


def dur_const(text: str, time_unit_ms: float = 1.0):
    plan = analyze(parse(text), STREAMS, source=text, time_unit_ms=time_unit_ms).plan
    assert isinstance(plan, Where)
    c = plan.pred
    assert isinstance(c, Compare) and isinstance(c.left, Duration)
    return c.op, c.right


@pytest.mark.parametrize("unit,ms", [("MS", 1), ("msec", 1), ("milliseconds", 1), ("SEC", 1000),
                                     ("seconds", 1000), ("s", 1000), ("MIN", 60_000), ("minutes", 60_000),
                                     ("HOUR", 3_600_000), ("hours", 3_600_000), ("DAY", 86_400_000),
                                     ("days", 86_400_000)])
def test_dur_units_are_converted_to_the_time_unit(unit, ms):
    op, lit = dur_const(f"FILTER{{DUR > 10 {unit}}}(Stock)")
    assert (op, lit) == (">", Literal(10 * ms)) and type(lit.value) is int


def test_dur_without_unit_is_in_the_time_unit_and_constants_may_come_first():
    assert dur_const("FILTER{DUR > 100}(Stock)") == (">", Literal(100))
    assert dur_const("FILTER{10 MIN <= DUR}(Stock)") == (">=", Literal(600_000))
    assert dur_const("FILTER{DUR < 1.5 MIN}(Stock)", time_unit_ms=1000) == ("<", Literal(90))
    assert dur_const("FILTER{DUR < 1 MS}(Stock)", time_unit_ms=1000) == ("<", Literal(0.001))


def test_power_is_int_only_for_a_constant_non_negative_exponent():
    from air.model import parse_stream_decl

    s = {"S": parse_stream_decl("S(a int, b int)")}
    q = compile_cel("SELECT a ^ 2 AS sq, a ^ b AS p, 2 ^ -1 AS half FROM S PUBLISH P", s)
    assert [(a.name, a.type) for a in q.schemas["P"].attributes] == [("sq", "int"), ("p", "float"),
                                                                       ("half", "float")]


def test_an_unknown_stream_with_no_near_name_says_how_to_declare_it():
    from air.cel import compile_cel

    with pytest.raises(CelNameError) as info:
        compile_cel("SELECT * FROM Temp", STREAMS)
    assert info.value.message.startswith("unknown stream 'Temp' (declared streams: ")
    assert info.value.message.endswith("); declare it first (POST /streams on a server, --stream for cayuga run)")
