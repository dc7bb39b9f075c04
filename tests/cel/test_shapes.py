"""The shape cache (air/cel/shapes.py): a query bound from its shape's compiled
form is exactly the query compiled on its own (automata, literal types,
output and internal stream names), and gives the same witnesses; errors keep
their own positions."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from air.cel import CelError, compile_cel
from air.cel.shapes import ShapeCache, same_compiled, split_shape
from air.model import StreamSchema, parse_stream_decl
from tests.cel.corpus import STREAMS, cel_files, cel_text
from tests.cel.test_equivalence import events, witnesses
from tests.conftest import examples


def _compiles(text: str, **kw) -> bool:
    try:
        compile_cel(text, STREAMS, **kw)
    except CelError:
        return False
    return True


CORPUS = [p.stem for p in cel_files() if _compiles(p.read_text())]


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_queries_bound_from_their_shape_equal_their_own_compilation(name):
    text = cel_text(name)
    cache = ShapeCache()
    for prefix in ("s1", "s22", None, "s333"):
        got = cache.compile(text, STREAMS, name_prefix=prefix)
        assert same_compiled(got, compile_cel(text, STREAMS, name_prefix=prefix))
    assert cache.hits == 2 and cache.uncacheable == 0  # s22 and s333 were bound (None is its own shape)


#: Templates with holes for constants; each test fills them at random.
TEMPLATES = [
    "SELECT Name, Price_1 AS Before, Price AS After FROM FILTER{{Name = {s}}}(Stock) "
    "NEXT{{$1.Name = $2.Name AND $2.Price > {f} * $1.Price}} Stock PUBLISH {p}",
    "FILTER{{Price > {i} AND Price < -{f} + {i}}}(Stock)",
    "FILTER{{Name = {s} AND Name = {s}}}(Stock)",  # atoms equal when both constants are
    "FILTER{{DUR < {i} MIN AND DUR < {i} SEC AND DUR >= {f} HOURS}}(Stock)",  # units: equal after conversion
    "SELECT Name, Price ^ {i} AS P, Price ^ -{i} AS Q, Volume % {i} AS V FROM FILTER{{Volume / {i} > {i}}}(Stock)",
    "SELECT Name, Price, Volume FROM Stock FOLD{{$2.Name = $.Name AND $2.Volume > {i}, "
    "$2.Price > $.Price * {f},}} Stock PUBLISH {p}",
    "SELECT * FROM (SELECT Name FROM FILTER{{Name = {s}}}(Stock) PUBLISH {p}) NEXT{{$1.Name = $2.Name AND "
    "DUR < {i}}} Stock",
    "SELECT * FROM (SELECT IBMPrice AS X FROM FILTER{{IBMPrice > {f} OR IBMPrice < {i}}}(IBMStock)) "
    "NEXT{{$2.Name = {s} AND $2.Price > $1.X}} Stock",
    "SELECT Name FROM Stock NEXT{{$1.Name = $2.N}} (SELECT Name AS N FROM FILTER{{Price > {i}}}(Stock) "
    "NEXT{{$1.Name = $2.Name}} Stock)",
]


def fill_template(template: str, rnd: random.Random) -> str:
    def s():
        return "'" + rnd.choice(["IBM", "MSFT", "it''s", "", "1", "Up", "ÄÖ"]) + "'"

    def i():
        return str(rnd.choice([0, 1, 2, 3, 7, 60, 1000, 1000003, 10 ** 20]))

    def f():
        return rnd.choice(["1.05", "0.5", "2.0", "1e3", "0.1", "1.", ".5", "3e-2"])

    def p():
        return rnd.choice(["Out", "Up_IBM", "X1", "Stocks"])

    out, fill = [], {"s": s, "i": i, "f": f, "p": p}
    for piece in template.split("{"):
        if "}" in piece and piece[0] in fill and piece[1] == "}":
            out.append(fill[piece[0]]() + piece[2:])
        elif out:
            out.append("{" + piece)
        else:
            out.append(piece)
    return "".join(out).replace("{{", "{").replace("}}", "}")


@settings(examples(0.6))
@given(st.integers(0, 10 ** 9), st.sampled_from(TEMPLATES), st.sampled_from([1.0, 1000.0]))
def test_random_constants_bind_exactly_as_compiling_alone(seed, template, unit):
    rnd = random.Random(seed)
    cache = ShapeCache()
    matched = 0
    for k in range(6):
        text = fill_template(template, rnd)
        prefix = f"s{k}"
        try:
            own = compile_cel(text, STREAMS, name_prefix=prefix, time_unit_ms=unit)
        except CelError as exc:
            with pytest.raises(CelError) as info:
                cache.compile(text, STREAMS, name_prefix=prefix, time_unit_ms=unit)
            assert info.value.to_dict() == exc.to_dict()
            continue
        got = cache.compile(text, STREAMS, name_prefix=prefix, time_unit_ms=unit)
        assert same_compiled(got, own), text
        if not matched:  # the witnesses too, until one of the queries has matched something
            out = own.outputs[-1]
            want = witnesses(own.automata, events(seed % 4), out)
            assert witnesses(got.automata, events(seed % 4), out) == want, text
            matched = sum(want.values())
    assume(matched)  # something was compared: an example whose queries match nothing shows nothing


def test_per_symbol_queries_share_one_shape_and_give_the_same_witnesses():
    cache = ShapeCache()
    template = ("SELECT Name, Price_1 AS Before, Price AS After FROM FILTER{{Name = '{s}'}}(Stock) "
                "NEXT{{$1.Name = $2.Name AND $2.Price > {f} * $1.Price}} Stock PUBLISH Up_{s}")
    for k, (sym, f) in enumerate([("IBM", "1.01"), ("MSFT", "1.0"), ("DELL", "0.99"), ("IBM", "1.5")]):
        text = template.format(s=sym, f=f)
        got = cache.compile(text, STREAMS, name_prefix=f"s{k}")
        own = compile_cel(text, STREAMS, name_prefix=f"s{k}")
        assert same_compiled(got, own)
        assert got.outputs == (f"Up_{sym}",)
        for seed in range(4):
            evs = events(seed)
            assert witnesses(got.automata, evs, f"Up_{sym}") == witnesses(own.automata, evs, f"Up_{sym}")
    assert cache.stats() == {"shapes": 1, "hits": 3, "misses": 1, "uncacheable": 0}


def test_split_shape_keeps_what_changes_types_or_meaning_in_the_shape():
    assert split_shape("FILTER{Name = 'A'}(Stock)")[0] != split_shape("FILTER{Name = 1}(Stock)")[0]
    assert split_shape("FILTER{Price > 1}(Stock)")[0] != split_shape("FILTER{Price > 1.0}(Stock)")[0]
    assert split_shape("SELECT Price ^ -0 AS P FROM Stock")[1] == ()  # 0 stays: 2 ^ -0 is an int
    assert split_shape("FILTER{Name = 'IBM'}(S1) PUBLISH S1")[2] == ()  # a name read elsewhere stays
    assert split_shape("FILTER{x = 'it''s -- 5'}(S) -- 7 '\n")[1] == ("it's -- 5",)  # comments stay
    assert split_shape("FILTER{S000001 > 1.5e3 AND $1.x > .5}(S)")[1] == (1500.0, 0.5)
    assert split_shape("FILTER{Name = '\x00'}(Stock)") is None


def test_errors_keep_their_own_line_column_and_excerpt():
    cache = ShapeCache()
    good = "SELECT Name FROM FILTER{Name = 'IBM'}(Stock)"
    cache.compile(good, STREAMS, name_prefix="s1")
    for bad in ["SELECT Name FROM FILTER{Name = 'International Business'}(Stok)",
                "SELECT Name FROM FILTER{Name = 'A'}(Stock)\nNEXT{$2.Prize > 1} Stock",
                "SELECT Name FROM FILTER{Name = 5}(Stock)",
                "SELECT Name FROM FILTER{Name = 'IBM'(Stock)"]:
        with pytest.raises(CelError) as own:
            compile_cel(bad, STREAMS, name_prefix="s2")
        with pytest.raises(CelError) as got:
            cache.compile(bad, STREAMS, name_prefix="s2")
        assert got.value.to_dict() == own.value.to_dict() and str(got.value) == str(own.value)
    assert cache.stats()["shapes"] == 1  # errors are not cached


def test_a_literal_out_of_range_is_refused_from_a_cached_shape_too():
    """Issue 34: a query of a cached shape was bound without reading its
    literals, so ``1e999`` (infinite) or an int beyond 64 bits got in where
    compile_cel refuses them (docs/design/semantics.md#arithmetic-and-comparison)."""
    cache = ShapeCache()
    cache.compile("SELECT Name FROM FILTER{Price > 1.5 AND Volume > 5}(Stock)", STREAMS)
    for bad in ["SELECT Name FROM FILTER{Price > 1e999 AND Volume > 5}(Stock)",
                "SELECT Name FROM FILTER{Price > 1.5 AND Volume > 9223372036854775808}(Stock)"]:
        with pytest.raises(CelError) as own:
            compile_cel(bad, STREAMS)
        with pytest.raises(CelError) as got:
            cache.compile(bad, STREAMS)
        assert "out of range" in str(own.value) and str(got.value) == str(own.value)
    smallest = "SELECT Name FROM FILTER{Price > 1.5 AND Volume > -9223372036854775808}(Stock)"
    assert same_compiled(cache.compile(smallest, STREAMS), compile_cel(smallest, STREAMS))


def test_a_stream_declared_again_differently_means_a_recompile():
    cache = ShapeCache()
    text = "SELECT Name FROM FILTER{{Name = '{}'}}(Quote)"
    v1 = {"Quote": parse_stream_decl("Quote(Name string, Price float)")}
    v2 = {"Quote": StreamSchema("Quote", parse_stream_decl("Quote(Price float, Name string)").attributes)}
    cache.compile(text.format("A"), v1, name_prefix="s1")
    got = cache.compile(text.format("B"), v2, name_prefix="s2")
    assert same_compiled(got, compile_cel(text.format("B"), v2, name_prefix="s2"))
    assert cache.hits == 0 and cache.misses == 2
    assert same_compiled(cache.compile(text.format("C"), v2, name_prefix="s3"),
                         compile_cel(text.format("C"), v2, name_prefix="s3"))
    assert cache.hits == 1


def test_functions_and_time_unit_are_part_of_the_key():
    cache = ShapeCache()
    text = "FILTER{DUR < 5 SEC}(Stock)"
    a = cache.compile(text, STREAMS, time_unit_ms=1.0)
    b = cache.compile(text, STREAMS, time_unit_ms=1000.0)
    assert same_compiled(b, compile_cel(text, STREAMS, time_unit_ms=1000.0)) and not same_compiled(a, b)
    assert cache.hits == 0


def test_origins_survive_binding_and_storing_and_a_form_without_them_is_compiled_again():
    import json

    text = ("(SELECT Name, Price FROM FILTER{{Name = {s}}}(Stock) NEXT{{$1.Name = $2.Name}} Stock) "
            "FOLD{{, $2.Price > {f},}} (SELECT Name, Price FROM Stock)")
    first, second = text.format(s="'IBM'", f="1.5"), text.format(s="'A much longer name'", f="12345.25")
    cache = ShapeCache()
    cache.compile(first, STREAMS)
    want = compile_cel(second, STREAMS).origins
    assert [(o.operator, o.ordinal, o.has_pred) for o in want] == [("NEXT", 0, True), ("FOLD", 1, False)]
    assert cache.compile(second, STREAMS).origins == want and cache.hits == 1
    rows = cache.export()
    again = ShapeCache()
    assert again.load(rows) == 1
    assert again.compile(second, STREAMS).origins == want and again.hits == 1
    older = [(key, json.dumps({k: v for k, v in json.loads(form).items() if k != "origins"})) for key, form in rows]
    assert ShapeCache().load(older) == 0  # written before origins were kept: its first query compiles it again
