"""Each line decoder under random lines: every non-blank line becomes an
event or an error with its line number, the typed (block) path agrees with
the line-by-line path, and no value breaks SPEC §2 (64-bit ints, finite
floats, valid strings)."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from air.model import parse_stream_decl
from server.formats import INT_MAX, INT_MIN, make_decoder
from tests.fuzz.conftest import FUZZ

STOCK = parse_stream_decl("Stock(Name string, Price float, Volume int)")
CATALOG = {"Stock": STOCK}

values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=8), st.just("NaN"), st.just("1e999"), st.lists(st.integers(), max_size=2))


@st.composite
def json_line(draw) -> bytes:
    obj = {"stream": draw(st.sampled_from(["Stock", "Stock", "Nope", 1]))}
    for key in draw(st.lists(st.sampled_from(["t0", "t1", "Name", "Price", "Volume", "Extra"]), max_size=6)):
        obj[key] = draw(values)
    if draw(st.booleans()):  # a well-formed event, sometimes
        obj.update(Name=draw(st.text(max_size=5)), Price=draw(st.floats(-1e6, 1e6)),
                   Volume=draw(st.integers(-10, 10)), t1=draw(st.integers(0, 10)))
    text = json.dumps(obj, allow_nan=True)
    cut = draw(st.integers(0, len(text) + 5))
    return text[:cut].encode() if cut < len(text) else text.encode()


lines = st.one_of(json_line(), st.binary(max_size=60).filter(lambda b: b"\n" not in b),
                  st.text(max_size=60).filter(lambda t: "\n" not in t).map(str.encode))
blocks = st.lists(lines, min_size=1, max_size=12)


def _sane(ev) -> None:
    assert ev.stream == "Stock" and len(ev.values) == 3
    name, price, volume = ev.values
    assert isinstance(name, str) and isinstance(price, float) and math.isfinite(price)
    assert isinstance(volume, int) and INT_MIN <= volume <= INT_MAX
    assert ev.t0 <= ev.t1


def _run(fmt: str, block: list[bytes]) -> None:
    data = b"\n".join(block) + b"\n"
    batch = make_decoder(fmt, CATALOG, clock=lambda: 1000.0).decode_batch(data, 1)
    nonblank = sum(1 for line in block if line.strip())
    assert len(batch.events) + len(batch.errors) <= nonblank + (1 if fmt == "csv" else 0)
    for n, reason in batch.errors:
        assert 1 <= n <= len(block) and reason
    for i, ev in enumerate(batch.events):
        _sane(ev)
        assert 1 <= batch.line_of(i) <= len(block)
    if fmt == "jsonl":  # the typed block path and the precise line path agree
        precise = [make_decoder(fmt, CATALOG, clock=lambda: 1000.0).decode_batch(line + b"\n", n)
                   for n, line in enumerate(block, 1)]
        assert [e for b in precise for e in b.events] == batch.events
        assert [e for b in precise for e in b.errors] == batch.errors


@FUZZ
@given(blocks)
def test_json_lines(block):
    _run("jsonl", block)


@FUZZ
@given(blocks)
def test_cayuga_lines(block):
    _run("cayuga", block)


@FUZZ
@given(st.lists(st.sampled_from([b"stream,t0,t1,Name,Price,Volume", b"Stock,1,1,IBM,1.5,3", b"Stock,,,a,b,c",
                                 b"Stock,1,2,\"x,y\",1e999,1", b"Stock,1,1,IBM,nan,1",
                                 b"Stock,1,1,I,1,99999999999999999999",
                                 b"\xff\xfe", b"\"", b",,,,,", b"Stock,2,1,IBM,1,1"]), min_size=1, max_size=10))
def test_csv_lines(block):
    _run("csv", block)
