"""Event decoding: the typed block path and the line-by-line path accept and
refuse exactly the same lines, with the same events and the same errors."""

from __future__ import annotations

import functools
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.engine import Event
from air.formats import JsonDecoder, LineError, make_decoder, witness_bytes, witness_dict
from air.model import parse_stream_decl
from tests.conftest import STOCK, examples

CATALOG = {"Stock": STOCK, "Temp": parse_stream_decl("Temp(Room string, Celsius float, Open bool)")}


def per_line(lines: list[bytes], fmt: str = "jsonl", **kw):
    """The reference: each line through Decoder.decode on its own."""
    dec = make_decoder(fmt, CATALOG, **kw)
    events, errors = [], []
    for n, line in enumerate(lines, 1):
        try:
            ev = dec.decode(line.rstrip(b"\r"))
        except LineError as exc:
            errors.append((n, str(exc)))
            continue
        if ev is not None:
            events.append((n, ev))
    return events, errors


def blockwise(lines: list[bytes], fmt: str = "jsonl", **kw):
    dec = make_decoder(fmt, CATALOG, **kw)
    batch = dec.decode_batch(b"".join(line + b"\n" for line in lines), 1)
    return [(batch.line_of(i), ev) for i, ev in enumerate(batch.events)], batch.errors


GOOD = b'{"stream": "Stock", "t0": 1, "t1": 2, "Name": "IBM", "Price": 84.5, "Volume": 300}'

HOSTILE = {
    b'{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": NaN, "Volume": 1}': "NaN at column 54",
    b'{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": -Infinity, "Volume": 1}': "-Infinity",
    b'{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": 1e400, "Volume": 1}': "out of range",
    b'{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": 1.0, "Volume": 1180591620717411303424}':
        "must be int (64-bit)",
    b'{"stream": "Stock", "t1": 2, "Name": "I\xffBM", "Price": 1.0, "Volume": 1}': "not valid UTF-8: byte 40",
    b'{"stream": "Stock", "t1": 2, "Name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}": "nested too deeply",
    b'{"stream": "Stock", "t1": 1e999, "Name": "IBM", "Price": 1.0, "Volume": 1}': "out of range",
    b'{"stream": "Stock", "t1": 36893488147419103232, "Name": "IBM", "Price": 1.0, "Volume": 1}': "64-bit",
    b'{"stream": "Stock", "t1": true, "Name": "IBM", "Price": 1.0, "Volume": 1}': "timestamp True",
    b"not json": "expected a JSON object at column 1",
    b'{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": 1.0, "Volume": 1}{"stream": "Stock"}':
        "trailing characters",
}


@pytest.mark.parametrize("line", list(HOSTILE), ids=[v for v in HOSTILE.values()])
def test_hostile_values_are_refused_with_a_reason_on_both_paths(line):
    lines = [GOOD, line, GOOD]
    ref_events, ref_errors = per_line(lines)
    events, errors = blockwise(lines)
    assert [n for n, _ in events] == [1, 3] and events == ref_events
    assert errors == ref_errors and [n for n, _ in errors] == [2]
    assert HOSTILE[line] in errors[0][1]


def test_a_clean_block_takes_the_typed_path_and_keeps_line_numbers():
    lines = [GOOD, b"", b"  \r", GOOD.replace(b'"t1": 2', b'"t1": 3'),
             b'{"stream": "Temp", "t1": 4, "Room": "A", "Celsius": 20, "Open": true}']
    dec = JsonDecoder(CATALOG, streams=["Stock"])
    batch = dec.decode_batch(b"\n".join(lines) + b"\n", 10)
    assert batch.errors == [] and batch.typed  # no line was decoded on its own
    assert [batch.line_of(i) for i in range(3)] == [10, 13, 14]
    assert batch.events == [Event("Stock", ("IBM", 84.5, 300), 1, 2), Event("Stock", ("IBM", 84.5, 300), 1, 3),
                            Event("Temp", ("A", 20.0, True), 4, 4)]
    assert "Temp" in dec.typed_streams  # learned from the block itself


def test_a_block_with_a_bad_line_takes_the_precise_path():
    dec = JsonDecoder(CATALOG, streams=["Stock"])
    batch = dec.decode_batch(GOOD + b"\n" + b'{"stream": "Stock", "t1": 3}' + b"\n" + GOOD + b"\n", 10)
    assert not batch.typed and [n for n, _ in batch.errors] == [11]
    assert [batch.line_of(i) for i in range(2)] == [10, 12]
    assert dec.typed_streams == {"Stock"}


def test_a_stream_whose_declaration_goes_away_is_forgotten():
    catalog = dict(CATALOG)
    dec = JsonDecoder(catalog.get, streams=["Temp"])
    line = b'{"stream": "Temp", "t1": 4, "Room": "A", "Celsius": 20, "Open": true}\n'
    assert len(dec.decode_batch(line).events) == 1
    del catalog["Temp"]
    batch = dec.decode_batch(line, 7)
    assert batch.events == [] and batch.errors == [(7, "unknown stream 'Temp'; declare it first")]
    assert "Temp" not in dec.typed_streams
    catalog["Temp"] = parse_stream_decl("Temp(Room string)")  # published again, with another schema
    batch = dec.decode_batch(b'{"stream": "Temp", "t1": 4, "Room": "A"}\n')
    assert batch.events == [Event("Temp", ("A",), 4, 4)] and batch.errors == []


def test_clock_times_and_lenient_conversions_match_the_line_path():
    clock = iter(range(100, 200)).__next__
    lines = [b'{"stream": "Stock", "Name": "IBM", "Price": 1, "Volume": 1}',
             b'{"stream": "Stock", "t1": "1970-01-01T00:00:01Z", "Name": "IBM", "Price": "2.5", "Volume": "3"}',
             b'{"stream": "Stock", "t0": 5, "Name": 7, "Price": 2, "Volume": 4.0}']
    events, errors = blockwise(lines, clock=clock)
    assert errors == []
    assert [e for _, e in events] == [Event("Stock", ("IBM", 1.0, 1), 100, 100),
                                      Event("Stock", ("IBM", 2.5, 3), 1000, 1000),
                                      Event("Stock", ("7", 2.0, 4), 5, 5)]


# random lines: well-typed events, values of the wrong type, broken JSON, other streams

_value = st.one_of(st.integers(-(2 ** 65), 2 ** 65), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=5), st.booleans(), st.none(), st.just("1.5"), st.just("7"))
_time = st.one_of(st.none(), st.integers(0, 50), st.floats(0, 50), st.just("1970-01-01T00:00:00.005Z"),
                  st.just("x"))


@st.composite
def _line(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from([b"", b"   ", b"{", b"[1, 2]", b"null", b'{"stream": 5}', b"\xff\xfe"]))
    obj = {"stream": draw(st.sampled_from(["Stock", "Stock", "Stock", "Temp", "Nope"]))}
    for key in ("t0", "t1"):
        t = draw(_time)
        if t is not None:
            obj[key] = t
    if kind < 6:
        obj.update(Name=draw(st.sampled_from(["IBM", "MSFT"])), Price=draw(st.floats(0, 100)),
                   Volume=draw(st.integers(0, 10)))
    else:
        for attr in draw(st.lists(st.sampled_from(["Name", "Price", "Volume", "Room", "Celsius", "Open", "X"]),
                                  max_size=4)):
            obj[attr] = draw(_value)
    return json.dumps(obj).encode()


@settings(examples(1.5))
@given(lines=st.lists(_line(), max_size=25), streams=st.sampled_from([(), ("Stock",), ("Stock", "Temp")]))
def test_block_and_line_paths_agree_on_random_lines(lines, streams):
    def clock():
        return 1000  # events without timestamps

    ref = per_line(lines, clock=clock)
    dec = JsonDecoder(CATALOG, clock=clock, streams=streams)
    batch = dec.decode_batch(b"".join(line + b"\n" for line in lines), 1)
    assert ([(batch.line_of(i), ev) for i, ev in enumerate(batch.events)], batch.errors) == ref


@pytest.mark.parametrize("fmt,lines", [
    ("cayuga", [b"IBM, 74.75, 100, Stock, 0, 0", b"# a comment", b"IBM, x, 100, Stock, 1, 1", b"I\xffBM, 1, 1, Stock"]),
    ("csv", [b"stream,t1,Name,Price,Volume", b"Stock,1,IBM,1.5,3", b"Stock,2,IBM,nan,3", b"Stock,3,IBM,2,99999999999999999999"]),
])
def test_text_formats_decode_blocks_as_lines(fmt, lines):
    events, errors = blockwise(lines, fmt)
    assert (events, errors) == per_line(lines, fmt)
    assert events and errors


def test_json_documents_for_post_events():
    dec = JsonDecoder(CATALOG, streams=["Stock"])
    events, errors = dec.decode_document(b"[" + GOOD + b", " + GOOD + b"]")
    assert len(events) == 2 and errors == []
    events, errors = dec.decode_document(b'{"events": [' + GOOD + b', {"stream": "Nope"}]}')
    assert len(events) == 1 and errors == [(1, "unknown stream 'Nope'; declare it first")]
    with pytest.raises(LineError, match="NaN"):
        dec.decode_document(b'[{"stream": "Stock", "Price": NaN}]')


def test_witnesses_are_encoded_as_their_dict_would_be():
    ev = Event("Stock", ("IBM \u00e9\"", float("nan"), 2 ** 62), 1, 2.5)
    encoded = json.loads(witness_bytes("Stock", ev, STOCK))
    assert encoded == {**witness_dict("Stock", ev, STOCK), "Price": None}  # not JSON: null
    assert list(encoded) == ["stream", "t0", "t1", "Name", "Price", "Volume"]
    odd = parse_stream_decl("Odd(t0 int, x int)")  # an attribute named like a timestamp
    assert json.loads(witness_bytes("Odd", Event("Odd", (7, 8), 1, 2), odd)) == {"stream": "Odd", "t0": 7, "t1": 2,
                                                                                  "x": 8}


@settings(examples(3))
@given(st.lists(st.sampled_from([b" ", b"\t", b"\r", b"\n", b"{", b"a"]), max_size=60).map(b"".join))
def test_nonblank_lines_counts_the_lines_with_more_than_blanks(data):
    """The typed path's count of lines (compiled: one pass; plain Python: newlines or a
    regular expression) against its definition."""
    from air.engine.convert import nonblank_lines

    expected = sum(1 for line in data.split(b"\n") if line.strip(b" \t\r"))
    assert nonblank_lines(data) == expected


@pytest.mark.parametrize("count, length", [(0, 1), (1, 0), (15, 3), (16, 3), (65535, 1), (65536, 1), (2, 255),
                                           (2, 256), (2, 65535), (2, 65536), (1, 300_000)])
def test_lines_are_packed_as_msgpack_packs_their_list(count, length):
    """``pack_lines`` (compiled: two passes over the JSON lines, no object a line) against its
    definition: msgspec's MessagePack of the list of the lines, and their lengths, at every
    boundary of MessagePack's array and bin headers."""
    from array import array

    from air.engine.convert import pack_lines

    lines = [bytes([65 + i % 26]) * (length + i % 2) for i in range(count)]
    packed, sizes = pack_lines(b"".join(line + b"\n" for line in lines))
    assert packed == msgspec.msgpack.encode(lines)
    assert array("I" if array("I").itemsize == 4 else "L", sizes).tolist() == [len(x) for x in lines]
    assert pack_lines(b"a\nbc") == pack_lines(b"a\n")  # (what follows the last newline is no line)


def test_emissions_are_encoded_as_each_witness_would_be():
    from air.engine import Emission
    from air.formats import encode_emissions

    odd = parse_stream_decl("Odd(t0 int, x int)")  # no record type: encoded from its dict
    schemas = {"Stock": STOCK, "Odd": odd}
    emissions = [Emission("Stock", Event("Stock", ("IBM \u00e9\"", 1.5, 2 ** 62), 1, 2.5), "OUT", "q"),
                 Emission("Odd", Event("Odd", (7, 8), 1, 2), "OUT", "q"),
                 Emission("Stock", Event("Stock", ("X", float("inf"), 3), 4, 4), "RESUB", "q"),
                 Emission("Stock", Event("Stock", ("Y", 2.0, 4), 5, 6), "OUT", "r")]
    for include_resub in (False, True):
        wanted = [em for em in emissions if em.kind == "OUT" or include_resub]
        data, count = encode_emissions(emissions, schemas.get, include_resub)
        assert count == len(wanted)
        assert data == b"".join(witness_bytes(em.stream, em.event, schemas[em.stream]) + b"\n" for em in wanted)


def test_record_types_kept_from_call_to_call_follow_a_changed_schema():
    """A ``makers`` kept from call to call (a worker's encoder, ``cayuga run``) makes a stream's record
    type once, and again when the stream's schema changes: a stream removed and published again with
    other attributes, or with an attribute named ``t0`` (a dict then), is encoded as its schema now says."""
    from air.engine import Emission
    from air.formats import encode_emissions

    kept: dict = {}
    schemas = {"Rise": parse_stream_decl("Rise(name string, price float)")}
    first = [Emission("Rise", Event("Rise", ("IBM", 1.5), 1, 2), "OUT", "q")]
    wanted = b'{"stream":"Rise","t0":1,"t1":2,"name":"IBM","price":1.5}\n'
    assert encode_emissions(first, schemas.get, False, kept)[0] == wanted
    made = kept["Rise"]
    assert encode_emissions(first, schemas.get, False, kept)[0] == wanted
    assert kept["Rise"] is made  # (made once)
    for decl in ("Rise(volume int, gone string)", "Rise(t0 int, volume int)"):
        schemas["Rise"] = parse_stream_decl(decl)
        again = [Emission("Rise", Event("Rise", (7, 8) if "t0" in decl else (7, "x"), 3, 4), "OUT", "q")]
        data, count = encode_emissions(again, schemas.get, False, kept)
        assert count == 1 and data == witness_bytes("Rise", again[0].event, schemas["Rise"]) + b"\n"
        assert data == encode_emissions(again, schemas.get)[0]  # (as a call that keeps none)


def test_the_typed_path_converts_in_the_engines_build():
    """air.engine.convert is compiled with the engine (or not at all): compiled,
    decoded events and their values leave the cyclic collector at once."""
    import gc

    from air.engine import BUILD, convert

    assert convert.COMPILED is (BUILD == "compiled")
    batch = JsonDecoder(CATALOG, streams=["Stock"]).decode_batch(GOOD + b"\n" + GOOD + b"\n")
    assert batch.typed and batch.events == [Event("Stock", ("IBM", 84.5, 300), 1, 2)] * 2
    if BUILD == "compiled":
        assert not any(gc.is_tracked(ev) or gc.is_tracked(ev.values) for ev in batch.events)


@functools.cache
def _plain_convert():
    """air/engine/convert.py run as plain Python, whichever build this process imports (and that build)."""
    import importlib.util
    from pathlib import Path

    import air.engine.convert as built

    spec = importlib.util.spec_from_file_location("convert_plain", Path(built.__file__).with_name("convert.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.COMPILED is False
    return built, module


@settings(examples(0.5))
@given(st.lists(st.tuples(st.sampled_from(["Stock", "Trade"]), st.sampled_from(["OUT", "RESUB"]),
                          st.sampled_from(["q1", "q2", "q3"]), st.booleans()), max_size=30))
def test_the_owners_groups_and_runs_of_emissions_in_both_builds(spec):
    """``grouped_by_owner`` (a batch grouped by subscription, its subscriptions in the order they first
    emitted, and whether any is not ``OUT``) and ``runs_of`` (compiled: one pass each, reading each
    emission's items straight, a named tuple's too) against their definitions, in this process's build
    and as plain Python: the engine's ``Emission`` named tuples and plain tuples, kind and
    stream names made apart from the literals (equal, not the same objects); ``runs_of`` of
    all the emissions and of one subscription's alone (a heavy query's batch)."""
    from air.engine import Emission

    def fresh(name: str) -> str:  # an equal name, not the same object
        return "".join(list(name))

    ev = Event("Stock", ("X", 1.0, 1), 1, 1)
    ems = [(Emission if named else lambda *items: items)(fresh(stream) if i % 2 else stream, ev, fresh(kind), owner)
           for i, (stream, kind, owner, named) in enumerate(spec)]
    owners = list(dict.fromkeys(em[3] for em in ems))
    other = any(em[2] != "OUT" for em in ems)
    grouped = [em for owner in owners for em in ems if em[3] == owner]
    runs = [(o, [em[0] for em in grouped if em[3] == o]) for o in owners]
    for convert in _plain_convert():
        together, got, got_other = convert.grouped_by_owner(ems)
        assert [tuple(em) for em in together] == [tuple(em) for em in grouped]
        assert list(got) == owners and got_other is other
        assert convert.runs_of(grouped) == ([o for o, _ in runs], [len(sts) for _, sts in runs],
                                           [sts[0] if len(set(sts)) == 1 else sts for _, sts in runs])
        for o, sts in runs[:1]:
            one = [em for em in grouped if em[3] == o]
            assert convert.runs_of(one) == ([o], [len(sts)], [sts[0] if len(set(sts)) == 1 else sts])


@settings(examples(0.5))
@given(st.lists(st.tuples(st.sampled_from(["Stock", "Trade"]), st.sampled_from(["OUT", "OUT", "OUT", "RESUB"]),
                          st.sampled_from(["q1", "q2", "q3", "q4"]), st.booleans()), max_size=30),
       st.lists(st.sampled_from(["q1", "q2", "q3", "q4"]), max_size=4, unique=True))
def test_a_batch_grouped_by_its_owners_numbers_in_both_builds(spec, known):
    """``numbered_runs`` (an engine worker's batch of output witnesses grouped by the numbers its
    subscriptions keep, and numbered as it goes: compiled, no dict made a batch) is
    ``grouped_by_owner`` (the ``OUT`` emissions of it), ``runs_of`` and ``number_names`` of their owners
    together, in this process's build and as plain Python; the emissions of other kinds come back
    apart, in the engine's order, and a subscription with none ``OUT`` is not numbered. The engine's
    ``Emission`` named tuples and plain tuples, names made apart from the literals (equal, not the
    same objects), some subscriptions numbered before."""
    from air.engine import Emission

    def fresh(name: str) -> str:
        return "".join(list(name))

    ev = Event("Stock", ("X", 1.0, 1), 1, 1)
    ems = [(Emission if named else lambda *items: items)(fresh(stream) if i % 2 else stream, ev,
                                                          fresh(kind) if i % 3 else kind,
                                                          fresh(owner) if i % 5 else owner)
           for i, (stream, kind, owner, named) in enumerate(spec)]
    for convert in _plain_convert():
        numbers = {name: i for i, name in enumerate(known)}
        told: list = []
        got = convert.numbered_runs(ems, numbers, told)
        grouped = [em for em in convert.grouped_by_owner(ems)[0] if em[2] == "OUT"]
        want_numbers, want_told = {name: i for i, name in enumerate(known)}, []
        owners, counts, kinds = convert.runs_of(grouped)
        want = (grouped, owners, counts, kinds, convert.number_names(want_numbers, owners, want_told))
        assert got[0] == want[0] and all(x is y for x, y in zip(got[0], want[0]))
        assert got[1:5] == want[1:] and numbers == want_numbers and told == want_told
        others = [em for em in ems if em[2] != "OUT"]
        assert got[5] == others and all(x is y for x, y in zip(got[5], others))


def test_a_batch_grouped_by_numbers_past_their_count_goes_the_plain_way():
    """A subscription's kept number past the count of numbers (never made so: they are dense from
    0) is not a place in the compiled build's arrays: that batch is grouped the plain way, with
    the same result, and no number given."""
    from air.engine import Emission

    ev = Event("Stock", ("X", 1.0, 1), 1, 1)
    ems = [Emission("Stock", ev, kind, owner) for kind, owner in
           [("OUT", "q2"), ("OUT", "q1"), ("RESUB", "q3"), ("OUT", "q2"), ("OUT", "q3")]]
    for convert in _plain_convert():
        numbers, told = {"q1": 0, "q2": 7}, []
        got = convert.numbered_runs(ems, numbers, told)
        assert got == ([ems[0], ems[3], ems[1], ems[4]], ["q2", "q1", "q3"], [2, 1, 1], ["Stock"] * 3, [7, 0, 2],
                       [ems[2]])
        assert numbers == {"q1": 0, "q2": 7, "q3": 2} and told == [2, "q3"]


@settings(examples(0.5))
@given(st.lists(st.sampled_from(["q1", "q2", "q3", "q4"]), max_size=8, unique=True),
       st.lists(st.one_of(st.sampled_from(["q1", "q2", "q3", "q4", "q5"]), st.just(["S", "T"])), max_size=12))
def test_names_are_numbered_once_and_owners_counted_on_in_both_builds(known, names):
    """``number_names`` (a worker's numbers of its subscriptions and streams: each name's,
    the next given to a new one and told once, -1 for a list of streams) and ``count_on``
    (where each owner's numbering stood, by its number, moved on by its count), in this process's build and
    as plain Python, against their definitions."""
    for convert in _plain_convert():
        numbers = {name: i for i, name in enumerate(known)}
        told: list = []
        got = convert.number_names(numbers, names, told)
        given = dict(zip(told[1::2], told[::2]))
        assert len(given) == len(told) // 2 and not set(given) & set(known)
        assert list(given.values()) == list(range(len(known), len(known) + len(given)))
        assert got == [-1 if type(n) is not str else numbers[n] for n in names]
        owners = list(dict.fromkeys(n for n in names if type(n) is str))
        lasts = [10 * k for k in range(len(numbers))]
        nums = [numbers[o] for o in owners]
        counts = list(range(1, len(owners) + 1))
        before = list(lasts)
        assert convert.count_on(lasts, nums, counts) == [before[k] for k in nums]
        assert lasts == [x + dict(zip(nums, counts)).get(k, 0) for k, x in enumerate(before)]


@settings(examples(0.5))
@given(st.lists(st.tuples(st.sampled_from(["Stock", "Trade"]), st.booleans(), st.sampled_from([1, 1.0, 2, 2.0, 3, 700]),
                          st.sampled_from(["same", "equal", "earlier"])), max_size=24))
def test_the_columns_span_order_and_counts_of_events_in_both_builds(spec):
    """The passes over a block's or a batch's events (compiled: each event's fields read from
    its struct) against their definitions, in this process's build and as plain Python:
    ``t1_span`` (``min``/``max``: the first of equals, an int beside an equal float),
    ``t1_ordered``, ``stream_counts`` (``Counter``'s, in order) and ``event_columns`` (a
    worker's batch, a journal record's events: one stream where all are equal, no t0 column
    where each event is a point: its t0 its t1, the same object or an equal int). Stream names
    made apart from the literals now and then (equal, not the same objects); t0 the same
    object as t1, an equal int (beside a float t1: not a point), or an earlier one."""
    from collections import Counter

    def fresh(name: str) -> str:
        return "".join(list(name))

    events = []
    for stream, apart, t1, how in spec:
        t0 = t1 if how == "same" else (int(t1) + 0 if how == "equal" else t1 - 1)
        events.append(Event(fresh(stream) if apart else stream, (stream, t1), t0, t1))
    streams = [e.stream for e in events]
    t0s, t1s = [e.t0 for e in events], [e.t1 for e in events]
    for convert in _plain_convert():
        lo, hi = convert.t1_span(events)
        assert (lo, hi) == ((min(t1s), max(t1s)) if events else (None, None))
        if events:
            assert lo is min(t1s) and hi is max(t1s)
        assert convert.t1_ordered(events) is all(a <= b for a, b in zip(t1s, t1s[1:]))
        counts = convert.stream_counts(events)
        assert type(counts) is dict and list(counts.items()) == list(Counter(streams).items())
        got_streams, values, got_t0s, got_t1s = convert.event_columns(events)
        one = bool(streams) and streams.count(streams[0]) == len(streams)
        assert got_streams == (streams[0] if one else streams)
        assert got_streams is streams[0] if one else type(got_streams) is list
        assert values == [e.values for e in events] and got_t1s == t1s
        assert all(map(lambda a, b: a is b, got_t1s, t1s))
        if all(a is b or (type(a) is int and type(b) is int and a == b) for a, b in zip(t0s, t1s)):
            assert got_t0s is None
        else:
            assert got_t0s == t0s and list(map(type, got_t0s)) == list(map(type, t0s))


def test_a_block_of_points_crosses_to_a_worker_without_t0_and_its_times_are_counted_in_both_builds():
    """Decoded lines whose t0 equals their t1 (integers, each its own object) are points: a
    worker's batch of them carries no t0 column, and they come back equal, their times ints;
    one earlier t0 brings the column back. ``times_given`` counts the times a block's records
    name (not null), what ``keys_as_decoded`` adds to their attributes, in both builds."""
    from server.workers import codec

    lines = [b'{"stream": "Stock", "t0": 900, "t1": 900, "Name": "A", "Price": 1.5, "Volume": 2}',
             b'{"stream": "Stock", "t1": 901, "Name": "B", "Price": 2.5, "Volume": 3}',
             b'{"stream": "Stock", "t0": 800, "t1": 902, "Name": "C", "Price": 3.5, "Volume": 4}',
             b'{"stream": "Stock", "t0": null, "t1": 903, "Name": "D", "Price": 4.5, "Volume": 5}']
    dec = JsonDecoder(CATALOG, streams=["Stock"])
    for block, points in ((lines[:2], True), (lines[:3], False), (lines, False)):
        batch = dec.decode_batch(b"\n".join(block) + b"\n")
        assert not batch.errors and batch.typed is (len(block) < 4)  # (a null time: line by line)
        events = batch.events
        raw = msgspec.msgpack.decode(codec.encode_batch(0, [], events)[1:])
        assert (raw[4] is None) is points
        back = codec.decode_batch(codec.encode_batch(0, [], events)[1:])[2]
        assert back == events and all(type(e.t0) is int and type(e.t1) is int for e in back)
    records = dec._block.decode_lines(b"\n".join(lines))
    for convert in _plain_convert():
        assert convert.times_given(records) == 2 + 1 + 2 + 1


@settings(examples(0.5))
@given(st.sampled_from([b"", b"s1:", b"q%d:", "caf\u00e9 %s:".encode()]),
       st.lists(st.tuples(st.one_of(st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1), st.booleans()),
                          st.binary(max_size=40)), max_size=20),
       st.booleans())
def test_numbered_lines_are_the_prefix_the_seq_and_the_payload_in_both_builds(prefix, items, as_range):
    """``numbered_lines`` (a client's witnesses with their seqs: compiled, each line made at
    its length) against ``%``-formatting, in this process's build and as plain Python: a
    prefix holding ``%``, seqs of every size and sign (a bool among them), a range of seqs."""
    seqs = range(7, 7 + len(items)) if as_range else [s for s, _ in items]
    payloads = [p for _, p in items]
    want = [prefix + b"%d " % s + p for s, p in zip(seqs, payloads)]
    for convert in _plain_convert():
        assert convert.numbered_lines(prefix, seqs, payloads) == want


class _Tagged(str):
    """A str subclass: never shared (whoever made it may tell its values apart by their type)."""


#: Values of an event as sharing sees them: names, the empty string, a str subclass ("tagged"),
#: strings on both sides of SHARED_MAX_LENGTH, and values that are not strings.
_VALUES = st.one_of(st.sampled_from(["IBM", "MSFT", "", "tagged"]), st.text(min_size=62, max_size=66),
                    st.floats(allow_nan=False), st.integers(), st.booleans(), st.none())


def _fresh(v):
    """``v`` made apart (equal, not the same object; "tagged" a :class:`_Tagged` "IBM")."""
    if v == "tagged":
        return _Tagged("IBM")
    return "".join(list(v)) if type(v) is str else v


def _shared_model(rows: list, table: dict, longest: int, most: int) -> list:
    """What sharing makes of ``rows``' values: the object each item becomes, by definition."""
    out = []
    for row in rows:
        got = []
        for v in row:
            if type(v) is str and len(v) <= longest:
                if v in table:
                    v = table[v]
                else:
                    if len(table) >= most:
                        table.clear()
                    table[v] = v
            got.append(v)
        out.append(got)
    return out


@settings(examples(0.5))
@given(st.lists(st.lists(_VALUES, max_size=5), max_size=16),
       st.sampled_from([2, 1 << 16]), st.booleans(), st.booleans())
def test_the_short_strings_of_events_are_shared_and_their_values_kept_in_both_builds(rows, most, held, points):
    """``events_of`` (a worker's batch decoded into events) and ``shared_values``, in this process's
    build and as plain Python, against their definition: each exact str of at most
    ``SHARED_MAX_LENGTH`` characters becomes the first equal one the table holds (the table emptied
    when full: ``SHARED_MAX_STRINGS`` made 2 now and then), longer strings, a str subclass and
    every other value stay the objects they were, and the values are equal to what was sent. Each
    string is made apart (equal, not the same object). Tuples the caller holds too are left as they
    were (compiled, those only the decoded list holds are shared in place)."""
    for convert in _plain_convert():
        longest = convert.SHARED_MAX_LENGTH
        assert 62 < longest < 66  # (the long strings drawn straddle it)
        saved = convert.SHARED_MAX_STRINGS
        convert.SHARED_MAX_STRINGS = most
        try:
            made = [[_fresh(v) for v in row] for row in rows]
            items = [list(r) for r in made]  # (the items, not the tuples: the tuples only ``values`` holds)
            values = [tuple(r) for r in made]
            others = list(values) if held else None
            del made
            want = _shared_model(items, {}, longest, most)
            t1s = list(range(1, len(rows) + 1))
            t0s = None if points else [t - 1 for t in t1s]
            streams = "Stock" if len(rows) % 2 else ["Stock"] * len(rows)
            table: dict = {}
            events = convert.events_of(streams, values, t0s, t1s, table)
            assert [e.stream for e in events] == ["Stock"] * len(rows)
            assert [e.t1 for e in events] == t1s and [e.t0 for e in events] == (t1s if points else t0s)
            for ev, row, orig in zip(events, want, items):
                assert type(ev.values) is tuple and ev.values == tuple(orig)
                assert all(a is b for a, b in zip(ev.values, row))
                assert [type(v) for v in ev.values] == [type(v) for v in orig]
            if held:
                assert all(all(a is b for a, b in zip(t, orig)) for t, orig in zip(others, items))
            assert len(table) <= most
            again = _shared_model([list(t) for t in others or []], dict(table), longest, most) if held else []
            for t, row in zip(others or [], again):  # shared_values: a new tuple, the caller's kept
                got = convert.shared_values(t, table)
                assert got == t and all(a is b for a, b in zip(got, row))
            if held:
                assert all(all(a is b for a, b in zip(t, orig)) for t, orig in zip(others, items))
        finally:
            convert.SHARED_MAX_STRINGS = saved


@settings(examples(0.5))
@given(st.lists(st.tuples(st.sampled_from(["Stock", "Trade", "S" * 65]), st.lists(_VALUES, max_size=5), st.booleans()),
                max_size=16),
       st.sampled_from([2, 1 << 16]))
def test_the_events_of_journal_rows_share_names_and_short_strings_in_both_builds(rows, most):
    """``events_of_rows`` (a journal record's rows, as a recovery's replay and a backfill's history
    read them) in this process's build and as plain Python, against the definition: each row's
    stream name, then its values' exact strs of at most ``SHARED_MAX_LENGTH`` characters, become
    the first equal one the table holds (emptied when full); the rest stay the objects they were;
    the values are equal to the row's; a values tuple something else holds too is left as it was."""
    for convert in _plain_convert():
        longest = convert.SHARED_MAX_LENGTH
        saved = convert.SHARED_MAX_STRINGS
        convert.SHARED_MAX_STRINGS = most
        try:
            made = [(_fresh(stream), [_fresh(v) for v in vals], held) for stream, vals, held in rows]
            flat = [[stream, *vals] for stream, vals, _ in made]  # (what the model shares, in order)
            data = [(stream, tuple(vals), t, t + 1) for t, (stream, vals, _) in enumerate(made)]
            others = [row[1] if held else None for row, (_, _, held) in zip(data, made)]
            want = _shared_model(flat, {}, longest, most)
            table: dict = {}
            events = convert.events_of_rows(data, table)
            for ev, row, orig, t in zip(events, want, flat, range(len(rows))):
                assert ev.stream == orig[0] and ev.stream is row[0] and (ev.t0, ev.t1) == (t, t + 1)
                assert type(ev.values) is tuple and ev.values == tuple(orig[1:])
                assert all(a is b for a, b in zip(ev.values, row[1:]))
            for held_tuple, orig in zip(others, flat):
                if held_tuple is not None:  # (shared into a new tuple: the holder's is as it was)
                    assert all(a is b for a, b in zip(held_tuple, orig[1:]))
            assert len(table) <= most
        finally:
            convert.SHARED_MAX_STRINGS = saved


def test_decoded_events_share_their_short_strings_across_blocks_and_batches():
    """The names of JSON lines decoded by two decoders (two connections: one table a process,
    ``STRINGS``) are one object a name (air/formats.py's records, each a fresh string), a name
    longer than ``SHARED_MAX_LENGTH`` is not; and a worker's batches decoded with one table
    share theirs too (server/workers/codec.py; as a worker decodes them, with the process's)."""
    from air.engine.convert import SHARED_MAX_LENGTH
    from server.workers import codec

    long_name = "N" * (SHARED_MAX_LENGTH + 1)

    def line(t, name):
        return b'{"stream": "Stock", "t1": %d, "Name": "%s", "Price": 1.5, "Volume": 2}' % (t, name.encode())

    first = JsonDecoder(CATALOG, streams=["Stock"]).decode_batch(line(1, "IBM") + b"\n" + line(2, long_name)
                                                                 + b"\n").events
    second = JsonDecoder(CATALOG, streams=["Stock"]).decode_batch(line(3, "IBM") + b"\n" + line(4, long_name)
                                                                  + b"\n").events  # (another connection's)
    assert first[0].values[0] is second[0].values[0] == "IBM"
    assert first[1].values[0] == second[1].values[0] == long_name and first[1].values[0] is not second[1].values[0]
    table: dict = {}
    body = codec.encode_batch(0, [], first + second)[1:]
    one, two = (codec.decode_batch(body, table)[2] for _ in range(2))
    assert one == two == first + second
    assert one[0].values[0] is one[2].values[0] is two[0].values[0] is table["IBM"]
    assert one[1].values[0] is not two[1].values[0] and long_name not in table
    from air.engine.convert import STRINGS

    as_worker = codec.decode_batch(body)[2]  # (as a worker decodes: the process's table)
    assert as_worker == first + second and first[0].values[0] is as_worker[2].values[0] is STRINGS["IBM"]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65535, 65536])
def test_a_name_repeated_packs_as_msgspec_packs_its_list(n):
    """``pack_repeated`` (a batch of one subscription on one stream: its sid and stream a
    witness each, made by repeating one packed name) is msgspec's MessagePack of the list, at
    each boundary of MessagePack's array headers."""
    from server.delivery.encoding import pack_repeated

    for name in ("s1", "Rising", "q" * 40):
        assert pack_repeated(name, n) == msgspec.msgpack.encode([name] * n)
