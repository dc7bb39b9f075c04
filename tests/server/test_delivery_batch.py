"""A batch's witnesses from the engine's emissions to the clients
(server/delivery/witnesses.py): made and encoded a batch at a time, by the
encoder ``cayuga run`` uses, with the numbers, order and bytes as before; an
engine worker's, sent as the witness log's packed columns, logged as the same bytes."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
from collections import Counter

import msgspec
import numpy as np
import pytest

from clients.client import CayugaClient
from clients.offline import run_offline
from clients.testing.market import STOCK
from server.delivery.hub import ClientChannel, NotifierHub
from server.delivery.encoding import EncodedBatch, LocalNumbers, pack_columns
from server.delivery.witnesses import NumberMap, Witnesses
from server.durability.witlog import WitnessLog
from server.durability.witrecords import pack_seqs, unpack_batch
from server.observability.counters import Count, Counters
from server.serve import RunningServer
from server.workers import codec
from tests.server.conftest import make_settings

PAIRS = "SELECT Name, Price_1 AS First, Price AS Second FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"
#: right-nested: two automata linked by an internal (RESUB) stream
NESTED = ("SELECT * FROM Stock NEXT{$1.Name = $2.N} "
          "(SELECT Name AS N, Price AS P FROM Stock NEXT{$1.Name = $2.Name} Stock) PUBLISH Nested")
ALL = "SELECT * FROM Stock PUBLISH All"


def _lines(n: int, names: int = 5) -> bytes:
    return "".join(f'{{"stream": "Stock", "t0": {i}, "t1": {i}, "Name": "N{i % names}", "Price": {1.0 + i % 3}, '
                   f'"Volume": {i}}}\n' for i in range(1, n + 1)).encode()


def _offline(tmp_path, queries: dict[str, str], data: bytes) -> list[dict]:
    files = []
    for name, text in queries.items():
        f = tmp_path / f"{name}.cel"
        f.write_text(text)
        files.append(f)
    return run_offline([STOCK], files, io.BytesIO(data), include_resub=True).witnesses


def _read(frames, want: int) -> list[str]:
    got: list[str] = []
    while len(got) < want:
        got.extend(next(frames).split("\n"))
    return got


def test_two_subscriptions_and_a_watched_internal_stream_in_the_same_batches_are_cayuga_runs_witnesses(
        client, tmp_path):
    """Emissions of two subscriptions and of an internal stream interleave in
    each batch: each subscription's witnesses are numbered 1, 2, ... in the
    engine's order, with the bytes ``cayuga run`` writes, and the watcher of the
    internal stream gets its witnesses (not numbered, not logged)."""
    pairs = client.subscribe(cel=PAIRS)
    nested = client.subscribe(cel=NESTED)
    (internal,) = nested["internal_streams"]
    data = _lines(3000)
    offline = _offline(tmp_path, {"pairs": PAIRS, "nested": NESTED}, data)
    want = {s: [w for w in offline if w["stream"] == s] for s in ("Pairs", "Nested")}
    inner = [w for w in offline if w["stream"] not in want]
    assert want["Pairs"] and want["Nested"] and inner
    with client.frames(pairs["id"], seq=True, timeout=10) as a, \
            client.frames(nested["id"], seq=True, timeout=10) as b, \
            client.frames(stream=internal, timeout=10) as c:
        with client.sender() as s:
            s.send_lines(data, 3000)
        for frames, stream in ((a, "Pairs"), (b, "Nested")):
            got = _read(frames, len(want[stream]))
            assert [int(x.partition(" ")[0]) for x in got] == list(range(1, len(want[stream]) + 1))
            assert [json.loads(x.partition(" ")[2]) for x in got] == want[stream]  # the engine's order
        got = _read(c, len(inner))
        assert Counter(map(_unnamed, map(json.loads, got))) == Counter(map(_unnamed, inner))


def _unnamed(w: dict) -> str:
    """A witness without its stream name (``cayuga run`` names a query's internal streams after its file)."""
    return json.dumps({k: v for k, v in w.items() if k != "stream"}, sort_keys=True)


def test_the_engine_thread_makes_no_python_call_per_witness(tmp_path):
    """The engine hands each emission to a list's ``append`` (a C call): the
    delivery code runs a few times per batch, not once per witness."""
    calls = Counter()
    delivery = ("server/delivery/witnesses.py", "air/formats.py")

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(delivery):
            calls[frame.f_code.co_name] += 1

    srv = RunningServer(make_settings(tmp_path))
    threading.setprofile(profile)  # the threads the server starts are profiled
    try:
        srv.start()
    finally:
        threading.setprofile(None)
    n = 5000
    try:
        with CayugaClient(srv.base_url) as client:
            sub = client.subscribe(cel=ALL)
            with client.frames(sub["id"], timeout=10) as frames:
                with client.sender() as s:
                    s.send_lines(_lines(n), n)
                assert len(_read(frames, n)) == n
    finally:
        srv.stop()
        sys.setprofile(None)
    assert sum(calls.values()) < n // 10, calls.most_common(5)


def _batch(i: int) -> list:
    """One batch's encoded witnesses: three subscriptions, one of them on two streams."""
    return [("s1", ["A"] * 3, [b'{"n":%d}' % (i * 10 + k) for k in range(3)]),
            ("s2", ["B", "C", "B"], [b'{"m":%d}' % (i * 10 + k) for k in range(3)]),
            ("s3", ["D"], [b'{"x":%d}' % i])]


def _witnesses(tmp_path, name: str) -> tuple[Witnesses, WitnessLog, ClientChannel]:
    hub = NotifierHub()
    outputs = {"s1": {"A"}, "s2": {"B", "C"}, "s3": {"D"}}
    subs = {sid: type("Sub", (), {"outputs": o})() for sid, o in outputs.items()}
    wit = Witnesses(lambda _s: None, hub, Counters(), subs, threading.Event(), lambda: 0)
    log = WitnessLog(tmp_path / name)
    wit.open(log)
    channel = ClientChannel(asyncio.new_event_loop(), 1000)
    hub.register("subscription", "s2", channel)  # s2 is watched, s1 and s3 are not
    return wit, log, channel


def test_an_engine_workers_packed_columns_are_numbered_logged_and_offered_as_the_general_way_does(tmp_path):
    """An engine worker sends its witnesses as the witness log's columns, packed
    (server/workers/codec.py): the main process numbers them per subscription and
    writes the record without unpacking it. The log then holds the very bytes the
    general way (:meth:`Witnesses.deliver_encoded`) writes; the watched subscription's
    client gets the same chunks; a batch made again after a restart (the log holds
    its seqs) is logged and offered only for what is new."""
    general, general_log, general_ch = _witnesses(tmp_path, "general")
    packed, packed_log, packed_ch = _witnesses(tmp_path, "packed")
    for i in range(4):
        assert general.deliver_encoded(EncodedBatch(_batch(i), []))
        assert packed.deliver_columns(pack_columns(_batch(i)))
    general_log.close()
    packed_log.close()
    segments = sorted((tmp_path / "general").glob("wit-*.log"))
    assert segments and [p.read_bytes() for p in segments] == \
        [p.read_bytes() for p in sorted((tmp_path / "packed").glob("wit-*.log"))]
    assert packed.seq == general.seq == {"s1": 12, "s2": 12, "s3": 4}
    assert packed.owner_witnesses == general.owner_witnesses
    got = [(c.sid, list(c.seqs), c.payloads) for c in packed_ch.take_all()[0]]
    assert got == [(c.sid, list(c.seqs), c.payloads) for c in general_ch.take_all()[0]]
    assert got[0] == ("s2", [1, 2, 3], [b'{"m":0}', b'{"m":1}', b'{"m":2}']) and {g[0] for g in got} == {"s2"}

    again = WitnessLog(tmp_path / "packed")  # a restart: numbering goes back to a snapshot's (s2 at 9)
    packed.open(again)
    packed.seq = {"s1": 9, "s2": 9, "s3": 3}
    assert packed.deliver_columns(pack_columns(_batch(3)))  # made again: the log holds every one
    assert again.appended == 0 and packed_ch.take_all()[0] == []
    assert packed.deliver_columns(pack_columns(_batch(4)))  # new: logged and offered
    assert again.appended == 7 and [list(c.seqs) for c in packed_ch.take_all()[0]] == [[13, 14, 15]]
    assert list(again.read("s2", 12)) == [(12, b'{"m":32}'), (13, b'{"m":40}'), (14, b'{"m":41}'),
                                          (15, b'{"m":42}')]
    again.close()
    general_ch.loop.close()
    packed_ch.loop.close()


def test_a_workers_numbers_for_subscriptions_and_streams_are_learnt_once_and_follow_a_restarted_worker(tmp_path):
    """A worker numbers the subscriptions and streams of its results itself and tells
    each number once (:class:`LocalNumbers`); the engine thread numbers by them
    (:class:`NumberMap`) without a pass over the ids. A restarted worker numbers afresh, in
    another order: its numbers replace the old ones. A batch whose numbers were told for
    others (its own telling went elsewhere) is checked against the names and learnt again
    from them. Every way writes the bytes, the seqs and the stream index the general way does."""
    general, general_log, general_ch = _witnesses(tmp_path, "general")
    packed, packed_log, packed_ch = _witnesses(tmp_path, "packed")
    known, first = NumberMap(), LocalNumbers()
    batches = [_batch(i) for i in range(6)] + [[_batch(6)[1]]]  # the last: only one on several streams
    restarted = LocalNumbers()
    restarted.number(pack_columns(list(reversed(batches[0]))))  # its numbers: s3 0, s2 1, s1 2 (told elsewhere)
    for i, batch in enumerate(batches):
        assert general.deliver_encoded(EncodedBatch(batch, []))
        local = first if i < 3 else restarted if i > 3 else LocalNumbers()
        cols = pack_columns(batch if i < 4 else list(reversed(batch)), local)
        assert bool(cols.fresh) == (i in (0, 3))
        assert packed.deliver_columns(cols, known)
        if i == 4:  # told elsewhere: its numbers were those of the others; learnt again from the names
            assert known.subs[:3].tolist() == packed_log.numbers.array(["s3", "s2", "s1"]).tolist()
    only_several = pack_columns([_batch(7)[1]], LocalNumbers())  # no stream of one's own told yet
    nums, kinds = NumberMap().take(only_several, packed_log)
    assert nums.tolist() == packed_log.numbers.array(["s2"]).tolist() and kinds.tolist() == [-1]
    general_log.close()
    packed_log.close()
    assert packed.seq == general.seq == {"s1": 18, "s2": 21, "s3": 6}
    assert packed.owner_witnesses == general.owner_witnesses
    for stream, sids in {"A": {"s1"}, "B": {"s2"}, "C": {"s2"}, "D": {"s3"}}.items():
        assert packed_log.publishers(stream) == general_log.publishers(stream) == sids
    for sid in ("s1", "s2", "s3"):
        assert list(packed_log.read(sid)) == list(general_log.read(sid))
    got = [(c.sid, list(c.seqs), c.payloads) for c in packed_ch.take_all()[0]]
    assert got == [(c.sid, list(c.seqs), c.payloads) for c in general_ch.take_all()[0]]
    general_ch.loop.close()
    packed_ch.loop.close()


def test_a_batch_of_one_subscription_on_one_stream_is_logged_and_offered_as_the_general_way_does(tmp_path):
    """A server of few subscriptions delivers mostly batches of one subscription's witnesses:
    those take scalar steps (``Witnesses._deliver_one``) and still write the general way's
    bytes, numbers, index and chunks; one made again after a restart is logged only for what is new."""
    general, general_log, general_ch = _witnesses(tmp_path, "general")
    packed, packed_log, packed_ch = _witnesses(tmp_path, "packed")
    known, local = NumberMap(), LocalNumbers()
    for i in range(3):
        for one in ([_batch(i)[1]], [_batch(i)[0]], [("s2", ["C"], [b'{"c":%d}' % i])]):  # s2 on several, then one
            assert general.deliver_encoded(EncodedBatch(one, []))
            assert packed.deliver_columns(pack_columns(one, local), known)
    assert [p.read_bytes() for p in sorted((tmp_path / "general").glob("wit-*.log"))] == \
        [p.read_bytes() for p in sorted((tmp_path / "packed").glob("wit-*.log"))]
    assert packed.seq == general.seq == {"s1": 9, "s2": 12} and packed.owner_witnesses == general.owner_witnesses
    assert packed_log.publishers("C") == general_log.publishers("C") == {"s2"}
    got = [(c.sid, list(c.seqs), c.payloads) for c in packed_ch.take_all()[0]]
    assert got == [(c.sid, list(c.seqs), c.payloads) for c in general_ch.take_all()[0]] and got[-1][1] == [12]
    packed.seq = {"s1": 8, "s2": 12}  # a restart: s1's last witness is made again, then a new one
    assert packed.deliver_columns(pack_columns([("s1", ["A"], [b'{"n":22}'])], local), known)
    assert packed_log.last_seq("s1") == 9 and packed.seq["s1"] == 9
    assert packed.deliver_columns(pack_columns([("s1", ["A"], [b'{"n":30}'])], local), known)
    assert list(packed_log.read("s1", 9)) == [(9, b'{"n":22}'), (10, b'{"n":30}')]
    general_log.close()
    packed_log.close()
    general_ch.loop.close()
    packed_ch.loop.close()


def test_a_worker_numbers_its_subscriptions_witnesses_and_the_main_process_checks_each_batch(tmp_path):
    """An engine worker numbers the witnesses of the subscriptions placed whole on it
    (:attr:`LocalNumbers.last`; where each stood before a batch in :attr:`Columns.befores`),
    on from where the main process told it each stands (:meth:`LocalNumbers.seed`); the main
    process checks every batch's against its own numbering, on both ways (several subscriptions,
    and one alone). One told otherwise (a worker that was not told) changes nothing written or
    offered: the main process's numbers stand, the batch is counted, and the subscription is
    marked to be told again (``Witnesses.reseed``)."""
    general, general_log, general_ch = _witnesses(tmp_path, "general")
    packed, packed_log, packed_ch = _witnesses(tmp_path, "packed")
    packed.reseed = set()  # (as server/workers/dispatch.py's loop sets it)
    wrong = lambda: packed.counters.get(Count.WORKER_SEQS_TOLD_WRONG)  # noqa: E731
    known, local = NumberMap(), LocalNumbers()
    for i in range(3):
        for batch in (_batch(i), [_batch(i)[0]]):  # several subscriptions, then one alone
            assert general.deliver_encoded(EncodedBatch(batch, []))
            assert packed.deliver_columns(pack_columns(batch, local), known)
    assert local.last == packed.seq == general.seq == {"s1": 18, "s2": 9, "s3": 3}
    assert wrong() == 0 and packed.reseed == set()

    restarted = LocalNumbers()  # numbers from 0: never told where s1 and s2 stand
    restarted.seed({"s3": 3})
    for batch in (_batch(3), [_batch(3)[0]]):
        assert general.deliver_encoded(EncodedBatch(batch, []))
        assert packed.deliver_columns(pack_columns(batch, restarted), known)
    assert wrong() == 3 and packed.reseed == {"s1", "s2"}  # s1 in both batches, s2 once; s3 was told
    assert packed.seq == general.seq == {"s1": 24, "s2": 12, "s3": 4}
    restarted.seed({sid: packed.seq[sid] for sid in sorted(packed.reseed)})  # (what dispatch.py's seed sends)
    assert general.deliver_encoded(EncodedBatch(_batch(4), []))
    assert packed.deliver_columns(pack_columns(_batch(4), restarted), known)
    assert wrong() == 3 and restarted.last == packed.seq == general.seq == {"s1": 27, "s2": 15, "s3": 5}
    general.seq["s1"] = packed.seq["s1"] = 2**31 + 5  # past int32: one alone, told as an int64
    for told_s1, counted in ((2**31 + 5, 3), (2**31 + 7, 4)):  # right, then wrong (it stands at 2**31 + 8)
        restarted.seed({"s1": told_s1})
        one = [_batch(5)[0]]
        assert general.deliver_encoded(EncodedBatch(one, []))
        assert packed.deliver_columns(pack_columns(one, restarted), known)
        assert wrong() == counted and packed.seq == general.seq
    assert packed.seq["s1"] == 2**31 + 11
    restarted.seed({"s1": packed.seq["s1"]})
    general_log.close()
    packed_log.close()
    assert [p.read_bytes() for p in sorted((tmp_path / "general").glob("wit-*.log"))] == \
        [p.read_bytes() for p in sorted((tmp_path / "packed").glob("wit-*.log"))]
    got = [(c.sid, list(c.seqs), c.payloads) for c in packed_ch.take_all()[0]]
    assert got == [(c.sid, list(c.seqs), c.payloads) for c in general_ch.take_all()[0]]
    restarted.forget("s1")  # removed from the worker: placed again, it starts where it is told (0 until then)
    assert restarted.last["s1"] == 0
    restarted.seed({"s1": 40, "s9": 7})  # (s9: told of before its first batch)
    assert restarted.last == {"s1": 40, "s2": 15, "s3": 5, "s9": 7}
    told = pack_columns([("s9", ["D"], [b"{}"]), ("s1", ["A", "A"], [b"{}", b"{}"])], restarted).befores
    assert np.frombuffer(told, np.int32).tolist() == [7, 40]
    assert restarted.last == {"s1": 42, "s2": 15, "s3": 5, "s9": 8}
    general_ch.loop.close()
    packed_ch.loop.close()


def test_a_batch_crosses_to_a_worker_as_columns_and_comes_back_the_same_events():
    """A ``B`` message (server/workers/codec.py): the events as columns, one stream name where
    all are of one, no t0 column where every t0 is its t1 (points); each event decoded equal to
    the one sent, its times of the same types (an int t0 beside an equal float t1 stays an int)."""
    import msgspec

    from air.engine import Event
    from server.workers import codec

    mixed = [Event("Stock", ("A", 1.0, 2), 5, 5), Event("Trade", ("B", 2, 3.5), 4.0, 6.0),
             Event("Stock", ("C", None, True), 7, 7.0)]
    now = 1795885196748.25
    points = [Event("Stock", (f"S{i}", 1.5 * i, i), t, t) for i, t in enumerate((now, now + 1, 3))]
    for events, per_stream in ((mixed, None), (points, {"Stock": 3}), (points, None), ([], None)):
        body = codec.encode_batch(9, [["s1", 3, "r", False, 2]], events, per_stream)
        assert body[:1] == codec.BATCH
        fed, recorded, back, counted = codec.decode_batch(body[1:])
        assert (fed, recorded, counted) == (9, [["s1", 3, "r", False, 2]], per_stream)
        assert back == events
        assert [(type(e.t0), type(e.t1)) for e in back] == [(type(e.t0), type(e.t1)) for e in events]
    raw = msgspec.msgpack.decode(codec.encode_batch(0, [], points, {"Stock": 3})[1:])
    assert raw[2] == "Stock" and raw[4] is None and raw[5] == [now, now + 1, 3]  # one name, no t0 column
    raw = msgspec.msgpack.decode(codec.encode_batch(0, [], mixed)[1:])
    assert raw[2] == ["Stock", "Trade", "Stock"] and raw[4] == [5, 4.0, 7]


def test_the_watched_ones_of_a_workers_columns_are_found_by_their_numbers_as_clients_come_and_go(tmp_path):
    """With columns from a worker (through the pipe's codec: the names stay packed), the
    subscriptions a client watches, as a subscription or by a stream, are found by their
    numbers and only theirs unpacked; watchers that come and go between batches, one of a
    subscription numbered only later, and one on a second stream of a subscription on
    several: each channel gets the chunks the general way gives it."""
    from server.workers import codec

    outputs = {"s1": {"A", "E"}, "s2": {"B", "C"}, "s3": {"D"}, "s4": {"F"}}
    subs = {sid: type("Sub", (), {"outputs": o})() for sid, o in outputs.items()}
    ways = []
    for name in ("general", "packed"):
        hub = NotifierHub()
        wit = Witnesses(lambda _s: None, hub, Counters(), subs, threading.Event(), lambda: 0)
        log = WitnessLog(tmp_path / name)
        wit.open(log)
        ways.append((wit, log, hub, {k: ClientChannel(asyncio.new_event_loop(), 10_000) for k in "abcd"}))
    local, known = LocalNumbers(), NumberMap()

    def batch(i: int) -> list:
        out = [("s1", ["A", "E", "A"], [b'{"n":%d}' % (i * 10 + k) for k in range(3)]),
               ("s2", ["B"] * 2, [b'{"m":%d}' % (i * 10 + k) for k in range(2)]),
               ("s3", ["D"], [b'{"x":%d}' % i])]
        return out + [("s4", ["F"], [b'{"f":%d}' % i])] if i >= 3 else out

    watch = {0: [("register", "subscription", "s2", "a")],
             2: [("register", "stream", "D", "b"), ("register", "subscription", "s4", "c"),
                 ("unregister", "subscription", "s2", "a")],
             4: [("register", "stream", "E", "d"), ("unregister", "stream", "D", "b")]}
    for i in range(6):
        for wit, _log, hub, chans in ways:
            for how, kind, key, ch in watch.get(i, ()):
                getattr(hub, how)(kind, key, chans[ch])
        general, packed = ways[0][0], ways[1][0]
        assert general.deliver_encoded(EncodedBatch(batch(i), []))
        body = codec.encode_result(1, EncodedBatch(batch(i), []), (), None, [], None, [], local=local)
        cols = codec.decode_result(body[1:])[9]
        assert packed.deliver_columns(cols, known)
        assert type(cols._owners) is not list  # (the names were not unpacked: only the watched ones' witnesses)
    got = [{k: [(c.sid, list(c.seqs), c.payloads) for c in ch.take_all()[0]] for k, ch in chans.items()}
           for _wit, _log, _hub, chans in ways]
    assert got[0] == got[1]
    assert [c[0] for c in got[1]["a"]] == ["s2", "s2"] and {c[0] for c in got[1]["b"]} == {"s3"}
    assert [c[1] for c in got[1]["c"]] == [[1], [2], [3]] and {c[0] for c in got[1]["d"]} == {"s1"}
    for _wit, log, _hub, chans in ways:
        log.close()
        for ch in chans.values():
            ch.loop.close()


def test_a_workers_flat_encoding_packs_the_columns_and_numbers_of_the_grouped_one():
    """An engine worker encodes its witnesses flat (``encode(ems, flat=True)``: no pass per
    subscription) and packs them as they are (``pack_flat``): the columns, the numbers and what
    they tell, and the watched internal witnesses, are those of the grouped encoding packed per
    subscription, batch after batch, over random emissions: subscriptions on one stream and on
    several, streams many subscriptions share and first seen in the batch, RESUB ones watched
    or not. With the worker's numbers (``local``: grouped by the numbers it keeps, RESUB emissions
    apart), the same columns and numbers, and the same watched internal groups, in the order of each
    subscription's first RESUB emission."""
    import random
    from array import array

    from air.engine import Emission, Event
    from air.model import Attribute, StreamSchema
    from server.delivery.encoding import WitnessEncoder, pack_flat

    streams = [f"S{i}" for i in range(12)] + ["Int0", "Int1"]
    schemas = {s: StreamSchema(s, (Attribute("Name", "string"), Attribute("N", "int"))) for s in streams}
    enc = WitnessEncoder(schemas.get, lambda owner, stream: stream == "Int0" or owner == "q3")
    rnd = random.Random(7)
    grouped_numbers, flat_numbers, runs_numbers = LocalNumbers(), LocalNumbers(), LocalNumbers()
    told: tuple[dict, dict] = ({}, {})  # number -> name, as the main process learns them
    for batch in range(44):
        ems = []
        if batch >= 40:  # one subscription a batch (a heavy query's): on one stream, then on two
            on = ["S1"] * (2 + 20 * (batch % 3)) + ["S2"] * (batch % 2)
            ems = [Emission(s, Event(s, ("q1", i), i, i), "OUT", "q1") for i, s in enumerate(on)]
        for i in range(rnd.randrange(0, 300) if batch < 40 else 0):
            owner = f"q{rnd.randrange(4 * (batch + 1))}"  # (new subscriptions in later batches)
            several = owner.endswith("7")  # these publish on several streams
            stream = rnd.choice(streams[:12]) if several else streams[int(owner[1:]) % (3 + batch % 10)]
            kind = "OUT"
            if rnd.random() < 0.1:
                stream, kind = rnd.choice(["Int0", "Int1"]), "RESUB"
            items = (stream, Event(stream, (owner, i), i, i), kind, owner)  # (the engine's: named tuples)
            ems.append(Emission(*items) if i % 2 else items)
        grouped, flat = enc.encode(ems), enc.encode(ems, flat=True)
        assert flat.groups == [] and flat.internal == grouped.internal
        a = pack_columns(grouped.groups, grouped_numbers)
        b = pack_flat(flat.flat, flat_numbers) if flat.flat is not None else pack_columns([], flat_numbers)
        numbered = enc.encode(ems, flat=True, local=runs_numbers)
        c = pack_flat(numbered.flat, runs_numbers) if numbered.flat is not None else pack_columns([], runs_numbers)
        first_resub = list(dict.fromkeys(em[3] for em in ems if em[2] == "RESUB"))
        assert numbered.internal == sorted(grouped.internal, key=lambda g: first_resub.index(g[0]))
        for field in ("owners", "counts", "streams", "nums", "stream_nums", "fresh", "fresh_streams", "checks"):
            assert getattr(a, field) == getattr(b, field) == getattr(c, field), (batch, field)
        assert bytes(a.sids) == bytes(b.sids) and bytes(a.rest) == bytes(b.rest)
        assert a.befores == c.befores and (a.befores or not a.owners), batch
        for names, fresh in zip(told, (b.fresh, b.fresh_streams)):  # each name told once, each number once
            pairs = dict(zip(fresh[::2], fresh[1::2]))
            assert len(pairs) == len(fresh) // 2 and not set(pairs) & set(names)
            assert not set(pairs.values()) & set(names.values())
            names.update(pairs)
        nums, stream_nums = array("i", b.nums), array("i", b.stream_nums)
        assert [told[0][k] for k in nums] == b.owners
        assert [told[1][t] if t >= 0 else None for t in stream_nums] == [
            k if type(k) is str else None for k in b.streams]


def test_seqs_packed_from_their_array_read_back_as_the_list_and_past_four_billion_too():
    """witrecords.pack_seqs: what the witness log's readers decode is the list of seqs, for every
    length MessagePack heads an array by differently (up to 15, 65,535, more) and for seqs past
    a uint32; a negative seq is refused, not written wrapped."""
    for seqs in ([], [7], list(range(1, 16)), list(range(1, 17)), list(range(5, 70_005)),
                 [2**32 - 1, 2**32, 2**40 + 3]):
        packed = pack_seqs(np.array(seqs, np.int64))
        assert msgspec.msgpack.decode(packed) == seqs
        record = b"\x94" + msgspec.msgpack.encode(["s"] * len(seqs)) + packed + msgspec.msgpack.encode(
            [["A"] * len(seqs), [b"{}"] * len(seqs)])[1:]
        assert unpack_batch(record)[1] == seqs
    with pytest.raises(ValueError):
        pack_seqs(np.array([3, -1]))


def test_a_workers_columns_cross_the_pipe_as_bin_and_their_counts_as_int32():
    """What an engine worker's result carries of its columns (server/workers/codec.py): the main
    process reads the counts as an array without a list, and the packed columns as views of the
    message that decode to what was packed."""
    cols = pack_columns(_batch(2), LocalNumbers())
    msg = codec.encode_result(9, type("E", (), {"groups": _batch(2), "flat": None, "internal": []})(),
                              (), 0, [], None, [])
    got = codec.decode_result(msg[1:])[9]
    assert np.frombuffer(got.counts_packed(), np.int32).tolist() == cols.counts == [3, 3, 1]
    assert got.befores == b""  # (not numbered by a worker: nothing told)
    local = LocalNumbers()
    for seed, width in ((2 ** 31 - 1, np.int32), (2 ** 31, np.int64)):  # int32 while all fit
        local.seed({"s2": seed})
        msg = codec.encode_result(9, type("E", (), {"groups": _batch(2), "flat": None, "internal": []})(),
                                  (), 0, [], None, [], local=local)
        told = codec.decode_result(msg[1:])[9].befores
        assert len(told) == 3 * np.dtype(width).itemsize and np.frombuffer(told, width).tolist()[1] == seed
    assert local.last["s2"] == 2 ** 31 + 3
    assert got.counts == [3, 3, 1] and got.owner_count() == 3
    assert type(got.sids) is memoryview and bytes(got.sids) == bytes(cols.sids)
    assert got.owners == ["s1", "s2", "s3"] and got.streams == ["A", ["B", "C", "B"], "D"]
    assert got.groups() == pack_columns(_batch(2)).groups()
