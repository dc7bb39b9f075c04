"""Each line decoder under random lines, against a reference written in this
test from the documented rules (README, "Events over TCP": JSON lines whose
``int`` is 64-bit, ``float`` finite -- NaN and Infinity are not JSON --, text
valid UTF-8, a number in a string converted, ``t0`` defaulting to ``t1``, the
clock stamping events without times, each key given once; the Cayuga line format
``v1,...,vn,Stream,t0,t1``; CSV with a header). The reference uses the
standard library's ``json`` and ``csv``, not air/formats.py.

What it proves, for every block of lines: the decoder's events are exactly the
reference's events (same values, same times, same order, same line numbers),
its errors are exactly on the lines the reference refuses, each with a reason;
no line vanishes, none is decoded twice. For JSON lines the typed block path
(msgspec, what the receivers use) is the path checked.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from air.engine import Event
from air.formats import make_decoder
from air.model import parse_stream_decl
from tests.fuzz.conftest import FUZZ

STOCK = parse_stream_decl("Stock(Name string, Price float, Volume int)")
CATALOG = {"Stock": STOCK}

values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=8), st.just("NaN"), st.just("1e999"), st.lists(st.integers(), max_size=2),
                   st.just(" 84.5 "), st.just("12"), st.just("2024-03-01T10:00:00Z"), st.just(3.0))


@st.composite
def json_line(draw) -> bytes:
    obj = {"stream": draw(st.sampled_from(["Stock", "Stock", "Stock", "Nope", 1]))}
    if draw(st.booleans()):  # a well-formed event, often
        obj.update(Name=draw(st.text(max_size=5)), Price=draw(st.floats(-1e6, 1e6)),
                   Volume=draw(st.integers(-10, 10)), t1=draw(st.integers(0, 10)))
    for key in draw(st.lists(st.sampled_from(["t0", "t1", "Name", "Price", "Volume", "Extra"]), max_size=3)):
        obj[key] = draw(values)  # then a few keys set to anything
    text = json.dumps(obj, allow_nan=True, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0:  # a key given twice, sometimes (with or without space before its colon)
        key = draw(st.sampled_from(sorted(obj)))
        text = text[:-1] + f", {json.dumps(key)}{draw(st.sampled_from(['', ' ', chr(9)]))}: " \
            f"{json.dumps(draw(values), allow_nan=True)}}}"
    if draw(st.integers(0, 3)) == 0:  # cut short, sometimes
        text = text[:draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


@st.composite
def cayuga_line(draw) -> bytes:
    vals = [draw(st.sampled_from(["IBM", "\"I,B\"", " x ", "", "1"])), draw(st.sampled_from(["1.5", "nan", "1e999", "x", "2"])),
            draw(st.sampled_from(["3", "99999999999999999999", "1.0", "x"])), draw(st.sampled_from(["Stock", "Nope"]))]
    vals += draw(st.sampled_from([[], ["1", "1"], ["2", "1"], ["", "5"], ["x", "1"], ["1"]]))
    return (", ".join(vals) + draw(st.sampled_from(["", ",", " "]))).encode()


lines = st.one_of(json_line(), st.binary(max_size=60).filter(lambda b: b"\n" not in b),
                  st.text(max_size=60).filter(lambda t: "\n" not in t).map(str.encode))
blocks = st.lists(lines, min_size=1, max_size=12)


# ---------------------------------------------------------------------- the reference
# Written from the documented rules (README "Events over TCP" and `cayuga run`), not
# from air/formats.py: JSON by the standard library, CSV splitting by the csv module.

INT64 = (-2**63, 2**63 - 1)
CLOCK = 1000.0


class Refused(Exception):
    """The reference refuses the line."""


def _json_number_finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # beyond a 64-bit float: not a number JSON can carry
        raise Refused(f"number {text} out of range")
    return value


def _refuse_constant(name: str):
    raise Refused(f"{name} is not JSON")  # NaN, Infinity, -Infinity


def _int_attr(raw):
    if isinstance(raw, bool):
        raise Refused("bool for int")
    if isinstance(raw, float):
        if not raw.is_integer():
            raise Refused("fraction for int")
        raw = int(raw)
    elif isinstance(raw, str):
        try:
            raw = int(raw.strip())  # a number in a string is converted
        except ValueError:
            raise Refused("not an int") from None
    if not isinstance(raw, int):
        raise Refused("not an int")
    if not INT64[0] <= raw <= INT64[1]:  # int is 64-bit
        raise Refused("int out of range")
    return raw


def _float_attr(raw):
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise Refused("not a float")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (ValueError, OverflowError):
        raise Refused("not a float") from None
    if not math.isfinite(value):  # float is finite
        raise Refused("float not finite")
    return value


def _str_attr(raw):
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return str(raw)
    raise Refused("not a string")


ATTR = {"string": _str_attr, "int": _int_attr, "float": _float_attr}


def _time(raw):
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise Refused("bad timestamp")
    if isinstance(raw, str):
        text = raw.strip()
        for convert in (int, float):
            try:
                return _time(convert(text))
            except (ValueError, OverflowError):
                pass
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise Refused("bad timestamp") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        ms = dt.timestamp() * 1000.0
        return int(ms) if ms.is_integer() else ms
    if isinstance(raw, float) and not math.isfinite(raw):
        raise Refused("timestamp not finite")
    if isinstance(raw, int) and not INT64[0] <= raw <= INT64[1]:
        raise Refused("timestamp out of range")
    return raw


def _times(t0, t1) -> tuple:
    """t0 defaults to t1 (and t1 to t0); without both the clock stamps a point."""
    if t0 is None and t1 is None:
        return CLOCK, CLOCK
    t0 = _time(t0) if t0 is not None else None
    t1 = _time(t1) if t1 is not None else None
    t0 = t1 if t0 is None else t0
    t1 = t0 if t1 is None else t1
    if t0 > t1:
        raise Refused("t0 after t1")
    return t0, t1


def _once(pairs: list) -> dict:
    """An object whose every key is given once (a key given twice is refused, not its last value taken)."""
    if len({k for k, _ in pairs}) != len(pairs):
        raise Refused("a key given twice")
    return dict(pairs)


def ref_json(line: bytes):
    """The event a JSON line is, or Refused."""
    try:
        text = line.decode("utf-8")  # valid UTF-8
        obj = json.loads(text, parse_float=_json_number_finite, parse_constant=_refuse_constant,
                         object_pairs_hook=_once)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise Refused("not JSON") from None
    if isinstance(obj, int) or isinstance(obj, float):  # (a bare number is no event either)
        raise Refused("not an object")
    if not isinstance(obj, dict) or obj.get("stream") != "Stock":
        raise Refused("not an object of a declared stream")
    if set(obj) - {"stream", "t0", "t1", *STOCK.names}:
        raise Refused("an attribute the schema does not have")
    if not all(a.name in obj for a in STOCK.attributes):
        raise Refused("a missing attribute")
    values = tuple(ATTR[a.type](obj[a.name]) for a in STOCK.attributes)
    return Event("Stock", values, *_times(obj.get("t0"), obj.get("t1")))


def ref_cayuga(line: bytes):
    """``v1,...,vn,Stream,t0,t1`` or ``v1,...,vn,Stream`` (clock time); None for a blank or # line."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8") from None
    if not text.strip() or text.lstrip().startswith("#"):
        return None
    try:
        fields = [f.strip() for f in next(csv.reader([text], skipinitialspace=True))]
    except csv.Error:
        raise Refused("not fields") from None
    while fields and fields[-1] == "":  # a trailing comma
        fields.pop()
    n = len(STOCK.attributes)
    if len(fields) == n + 3 and fields[n] == "Stock":
        times = _times(fields[n + 1], fields[n + 2])  # both written: an empty one is no timestamp
    elif len(fields) == n + 1 and fields[n] == "Stock":
        times = (CLOCK, CLOCK)
    else:
        raise Refused("not v1,...,vn,Stream[,t0,t1]")
    return Event("Stock", tuple(ATTR[a.type](v) for v, a in zip(fields, STOCK.attributes)), *times)


def reference(fmt: str, block: list[bytes]) -> tuple[list[tuple[int, Event]], list[int]]:
    """(line number, event) for each event and the numbers of the refused lines."""
    events, refused = [], []
    for n, line in enumerate(block, 1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            ev = ref_json(line) if fmt == "jsonl" else ref_cayuga(line)
        except Refused:
            refused.append(n)
            continue
        if ev is not None:
            events.append((n, ev))
    return events, refused


def _decode(fmt: str, block: list[bytes]):
    data = b"\n".join(block) + b"\n"
    return make_decoder(fmt, CATALOG, clock=lambda: CLOCK).decode_batch(data, 1)


def _same(a: Event, b: Event) -> bool:
    """Equal, and of the same types (1 == 1.0 == True would hide a wrong type)."""
    return a == b and [type(v) for v in (*a.values, a.t0, a.t1)] == [type(v) for v in (*b.values, b.t0, b.t1)]


def _agree(fmt: str, block: list[bytes]) -> None:
    batch = _decode(fmt, block)
    events, refused = reference(fmt, block)
    got = [(batch.line_of(i), ev) for i, ev in enumerate(batch.events)]
    assert [n for n, _ in got] == [n for n, _ in events], (got, events, batch.errors)
    assert all(_same(a, b) for (_, a), (_, b) in zip(got, events)), (got, events)
    assert [n for n, _ in batch.errors] == refused, (batch.errors, refused, got)
    assert all(reason for _, reason in batch.errors)


@FUZZ
@given(blocks)
def test_json_lines(block):
    _agree("jsonl", block)


@FUZZ
@given(st.lists(st.one_of(cayuga_line(), lines), min_size=1, max_size=12))
def test_cayuga_lines(block):
    _agree("cayuga", block)


HEADER = b"stream,t0,t1,Name,Price,Volume"
#: What each CSV line is once the header has been read: an event, or None for an error.
CSV_ROWS = {HEADER: None,  # the header again is a row of the unknown stream "stream"
            b"Stock,1,1,IBM,1.5,3": Event("Stock", ("IBM", 1.5, 3), 1, 1),
            b"Stock,,,a,1,2": Event("Stock", ("a", 1.0, 2), CLOCK, CLOCK),  # no times: the clock's
            b"Stock,,,a,b,c": None, b"Stock,1,2,\"x,y\",1e999,1": None, b"Stock,1,1,IBM,nan,1": None,
            b"Stock,1,1,I,1,99999999999999999999": None, b"\xff\xfe": None, b"\"": None, b",,,,,": None,
            b"Stock,2,1,IBM,1,1": None, b"Stock,1,2,\" q \",84,-4": Event("Stock", ("q", 84.0, -4), 1, 2),
            b"   ": "blank"}


@FUZZ
@given(st.lists(st.sampled_from(sorted(CSV_ROWS)), min_size=1, max_size=10))
def test_csv_lines(block):
    """Before the header every line is refused (it needs a 'stream' column and
    distinct names) except the header itself; after it, each row is what
    CSV_ROWS says."""
    batch = _decode("csv", block)
    events, refused, header = [], [], False
    for n, line in enumerate(block, 1):
        if line == b"   ":
            continue
        if not header:
            if line == HEADER:
                header = True
            else:
                refused.append(n)
        elif CSV_ROWS[line] is None:
            refused.append(n)
        else:
            events.append((n, CSV_ROWS[line]))
    got = [(batch.line_of(i), ev) for i, ev in enumerate(batch.events)]
    assert [n for n, _ in got] == [n for n, _ in events] and all(_same(a, b) for (_, a), (_, b) in zip(got, events))
    assert [n for n, _ in batch.errors] == refused, (batch.errors, refused)
