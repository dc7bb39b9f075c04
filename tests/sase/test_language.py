"""The SASE front end's language: what it reads, and every error a user can
meet, with its line, column and caret (docs/design/sase.md#grammar,
docs/design/sase.md#what-is-refused-and-why)."""

from __future__ import annotations

import pytest

from air.airxml import dump_air, load_air_many
from air.model import parse_stream_decl
from air.sase import SaseError, SaseNameError, SaseRefused, SaseSyntaxError, SaseTypeError, compile_sase, validate

STREAMS = [parse_stream_decl(d) for d in (
    "SHELF(tag string, shelf string, price float)", "COUNTER(tag string, amount int)",
    "EXIT(tag string, gate int)", "MED(name string, medicine string, amount int)",
    "ODD(tag int, note string)")]
SHOPLIFTING = ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z)\nWHERE [tag] AND x.shelf = 'A'\nWITHIN 12 hours\n"
               "RETURN x.tag, z.gate")


def error_of(text: str, **kw) -> SaseError:
    with pytest.raises(SaseError) as info:
        compile_sase(text, STREAMS, **kw)
    return info.value


def where(text: str, fragment: str) -> tuple[int, int]:
    """(line, column) of the first ``fragment`` in ``text`` (the last with a "LAST:" prefix)."""
    before = text[:text.rindex(fragment[5:])] if fragment.startswith("LAST:") else text[:text.index(fragment)]
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def test_the_issues_query_compiles_to_air_that_loads_like_any_other():
    q = compile_sase(SHOPLIFTING, STREAMS, time_unit_ms=1000, name_prefix="shop")
    assert q.outputs == ("shop",) and q.schemas["shop"].names == ("tag", "gate")
    assert [a.name for a in q.automata] == ["shop__SHELF", "shop__COUNTER", "shop__EXIT", "shop"]
    assert "shop__u" in q.schemas and q.warnings == ()
    text = "<NFAs>\n" + "".join(dump_air(a) for a in q.automata) + "</NFAs>\n"
    assert [dump_air(a) for a in load_air_many(text)] == [dump_air(a) for a in q.automata]
    window = [a for s in q.automata[-1].states if s.filter for c in s.filter.clauses for a in c.atoms
              if type(a).__name__ == "DurationAtom"]
    assert {a.const for a in window} == {12 * 3600.0}  # 12 hours in seconds, the stream time unit here


@pytest.mark.parametrize("text", [
    "SEQ(SHELF x, EXIT z)",
    "event seq(SHELF x, EXIT z) within 5 where [tag];",
    "EVENT SEQ(SHELF, !COUNTER, EXIT) WHERE [tag] WITHIN 3 hours",
    "EVENT SEQ(SHELF x, !ANY(COUNTER, SHELF) y, EXIT z) WHERE [tag] AND y.tag != 'zz' WITHIN 1 min",
    "EVENT SEQ(SHELF x, !(ANY(COUNTER, SHELF) y), EXIT z) WHERE $1.tag = $3.tag WITHIN 1 min",
    "EVENT ANY(SHELF, EXIT) x WHERE x.tag = \"it's\" RETURN x.tag",
    "EVENT SHELF x WHERE x.price * 2 > 1.5 AND (x.shelf = 'A' OR x.shelf = 'B') RETURN x.price + 1 AS p",
    "EVENT SEQ(MED x, MED y) WHERE [name = 'John'] AND [medicine = 'Antibiotics'] AND "
    "x.amount + y.amount > 1000 WITHIN 4 hours",
    "EVENT SEQ(SHELF x, EXIT z) -- a comment\n/* and another */ WITHIN 2 RETURN x.tag PUBLISH Out",
])
def test_accepted_forms(text):
    assert compile_sase(text, STREAMS).automata


def test_the_default_return_and_names():
    q = compile_sase("EVENT SEQ(SHELF, EXIT z) WITHIN 2", STREAMS)
    assert q.schemas["Q"].names == ("x1_tag", "x1_shelf", "x1_price", "z_tag", "z_gate")
    q = compile_sase("EVENT SEQ(SHELF x, EXIT z) WITHIN 2 RETURN x.tag, z.tag, z.gate, x.price AS p", STREAMS)
    assert q.schemas["Q"].names == ("x_tag", "z_tag", "gate", "p")
    q = compile_sase("EVENT ANY(SHELF, EXIT) x WITHIN 2", STREAMS)
    assert q.schemas["Q"].names == ("x_tag",)  # what every type of the ANY has


def test_no_window_warns_with_the_position_of_each_component_that_waits():
    text = "EVENT SEQ(SHELF x, EXIT z)\nWHERE [tag]"
    (w,) = compile_sase(text, STREAMS).warnings
    assert w.code == "unbounded_instances" and (w.line, w.column) == (1, 20)
    assert "WITHIN" in w.fix and w.excerpt.endswith("^")


@pytest.mark.parametrize("text, fragment, cls, message", [
    ("EVENT SEQ(SHELF x, EXIT z", "", SaseSyntaxError, "expected ')' to close SEQ("),
    ("EVENT SEQ(SHELF x, , EXIT z)", ", EXIT", SaseSyntaxError, "expected an event type"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tag = 'a", "'a", SaseSyntaxError, "unterminated string"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE tag = 'a'", "tag", SaseSyntaxError, "'tag' alone is not a value"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE [tag", "", SaseSyntaxError, "to close the equivalence test"),
    ("EVENT SEQ(SHELF x, EXIT z) WITHIN hours", "hours", SaseSyntaxError, "expected a duration after WITHIN"),
    ("EVENT SEQ(SHELF x, EXIT z) WITHIN 2 WITHIN 3", "WITHIN 3", SaseSyntaxError, "WITHIN appears twice"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tag = 'a' & z.gate = 1", "&", SaseSyntaxError, "unexpected character"),
    ("EVENT SEQ(SHELF x, EXIT z) RETURN x.tag PUBLISH", "", SaseSyntaxError, "a stream name after PUBLISH"),
    ("EVENT SEQ(SHELF x, EXTI z)", "EXTI", SaseNameError, "unknown event type 'EXTI'; did you mean 'EXIT'?"),
    ("EVENT SEQ(SHELF x, EXIT x)", "x)", SaseNameError, "the variable 'x' names two components"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tga = z.tag", "x.tga", SaseNameError,
     "unknown attribute 'x.tga'; did you mean 'tag'?"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE q.tag = z.tag", "q.tag", SaseNameError, "unknown variable 'q'"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE $3.tag = z.tag", "$3", SaseNameError, "'$3' names no component"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE [gate]", "[gate]", SaseNameError, "SHELF (component 1, x) has no "
     "attribute 'gate'"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tag = z.gate", "=", SaseTypeError, "cannot compare string with int"),
    ("EVENT SEQ(SHELF x, ODD z) WHERE [tag]", "[tag]", SaseTypeError, "compares string with int"),
    ("EVENT ANY(SHELF, ODD) x WHERE x.tag = 'a'", "x.tag", SaseTypeError, "has different types in SHELF, ODD"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tag + 1 > 2", "+", SaseTypeError, "cannot apply '+' to a string"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE FOO(x.tag) = 1", "FOO", SaseNameError, "unknown function FOO"),
    ("EVENT SEQ(SHELF x, EXIT z) WHERE x.tag = 'a' OR [tag]", "[tag]", SaseSyntaxError,
     "an equivalence test [...] is a condition of its own"),
    ("EVENT SEQ(SHELF x, EXIT z) WITHIN 0 hours", "0 hours", SaseTypeError, "WITHIN needs a positive duration"),
    ("EVENT SEQ(SHELF x, EXIT z) RETURN x.tag AS t, z.tag AS t", "z.tag", SaseNameError,
     "two RETURN values are named 't'"),
    ("EVENT SEQ(SHELF x, EXIT z) RETURN x.price * 2", "x.price", SaseNameError, "name RETURN value 1 with AS"),
    ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z) WITHIN 3 RETURN y.tag", "y.tag", SaseNameError,
     "'y' is a negated component"),
    ("EVENT ANY(SHELF, EXIT) x RETURN x.gate", "x.gate", SaseNameError, "SHELF has no attribute 'gate'"),
    ("EVENT SEQ(SHELF x, EXIT z) PUBLISH SHELF", "LAST:SHELF", SaseNameError, "reads the stream 'SHELF' that it"),
])
def test_errors_carry_line_column_and_a_caret(text, fragment, cls, message):
    e = error_of(text)
    assert isinstance(e, cls) and message in e.message, e.render()
    if fragment:
        assert (e.line, e.column) == where(text, fragment), e.render()
    else:  # at the end of the text
        assert (e.line, e.column) == (text.count("\n") + 1, len(text.splitlines()[-1]) + 1), e.render()
    lines = e.render().splitlines()
    assert lines[0].startswith(f"line {e.line}, column {e.column}: ") and lines[-1].strip() == "^"
    assert e.to_dict()["kind"] == cls.kind and e.to_dict()["excerpt"].endswith("^")


@pytest.mark.parametrize("text, fragment, reason", [
    ("EVENT SEQ(!(COUNTER y), EXIT z) WITHIN 5", "!(COUNTER", "cannot start the sequence"),
    ("EVENT SEQ(SHELF x, !(COUNTER y), !(SHELF w), EXIT z) WITHIN 5", "!(SHELF",
     "two consecutive components cannot both be negative"),
    ("EVENT SEQ(SHELF x, !(COUNTER y))", "!(COUNTER", "a negated end (y last) needs WITHIN"),
    ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z) WHERE y.tag = z.tag WITHIN 5", "=",
     "relates the negated component y to z, which comes after it"),
    ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z) WHERE (y.tag = x.tag OR y.amount > 3) WITHIN 5", "y.tag =",
     "must be one comparison"),
    ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z, !(COUNTER w)) WHERE y.amount = w.amount WITHIN 5", "=",
     "relates two negated components"),
    ("EVENT SEQ(SHELF x, !(ANY(EXIT, COUNTER) y), EXIT z) WHERE y.tag = x.tag AND y.gate * 2 > 3 WITHIN 5", "*",
     "arithmetic or a function call"),
    ("EVENT SEQ(SHELF x, EXIT z) RETURN z.t1", "z.t1", "an event's timestamp is not a value"),
])
def test_refusals_say_why(text, fragment, reason):
    e = error_of(text)
    assert isinstance(e, SaseRefused) and reason in e.message, e.render()
    assert (e.line, e.column) == where(text, fragment), e.render()
    assert e.to_dict()["kind"] == "refused"


def test_a_negated_end_needs_a_window_longer_than_one_time_unit():
    e = error_of("EVENT SEQ(SHELF x, !(COUNTER y)) WITHIN 1")
    assert isinstance(e, SaseTypeError) and "t-T+1" in e.message


def test_validate_lists_the_error_and_nothing_when_fine():
    assert validate(SHOPLIFTING, STREAMS) == []
    (e,) = validate("EVENT SEQ(SHELF x, EXTI z)", STREAMS)
    assert e.to_dict() == {"kind": "name", "message": e.message, "line": 1, "column": 20,
                           "excerpt": "  EVENT SEQ(SHELF x, EXTI z)\n                     ^"}


def test_user_functions_are_typed_by_their_declared_return_type():
    assert compile_sase("EVENT SHELF x WHERE SCORE(x.tag) > 2", STREAMS, functions={"score": "float"}).automata
    e = error_of("EVENT SHELF x WHERE SCORE(x.tag) = 'a'", functions={"score": "float"})
    assert isinstance(e, SaseTypeError)
