"""History kept on purpose (issue 36): the journal's retention beyond what recovery
needs, and the history reader's order (server/durability/retention.py, history.py)."""

from __future__ import annotations

import json
import math
import random

import pytest

from air.engine import Event
from server.config import Settings
from server.durability.history import FromError, HistoryReader, cut_point, resolve_from
from server.durability.journal import Journal
from server.ingest.queue import DelayQueue


def ev(t1, i=0):
    return Event("Stock", ("IBM", float(i), i), t1, t1)


def filled(tmp_path, n_records=40, per=5, **kw) -> Journal:
    j = Journal(tmp_path / "j", "write", segment_bytes=2048, **kw)
    for r in range(n_records):
        j.append([ev(r * 10 + k, k) for k in range(per)] * 4)
    return j


def test_segments_recovery_no_longer_needs_stay_within_the_retained_time(tmp_path):
    j = filled(tmp_path, retain_time=150, retain_bytes=1 << 30)
    before = len(j.segments)
    assert before > 4
    newest = j.retained()["to"]
    j.truncate_before(j.appended + 1)  # a snapshot covers everything: recovery needs nothing
    kept = j.retained()
    assert kept["segments"] < before
    # every segment left holds an event within the retained time, but the newest is always kept
    assert kept["from"] is not None and kept["to"] == newest
    window = sum(1 for r in range(40) for k in range(5) if r * 10 + k >= newest - 150) * 4
    assert sum(1 for r in j.replay(0) for e in r.events if e.t1 >= newest - 150) == window  # all of it kept
    assert 0 < kept["from"] <= newest - 150  # the oldest history went, the window's did not
    j.close()


def test_retain_bytes_bounds_the_history_oldest_first_and_recovery_needs_come_first(tmp_path):
    j = filled(tmp_path, retain_time=10 ** 9, retain_bytes=10_000)
    total = j.retained()["bytes"]
    assert total > 10_000
    j.truncate_before(1)  # recovery still needs everything: nothing goes
    assert j.retained()["bytes"] == total
    j.truncate_before(j.appended + 1)
    kept = j.retained()
    assert kept["bytes"] <= 10_000 + 4096 + 200  # within one segment of the bound
    assert kept["from"] > 0
    assert list(j.replay(0))[-1].position == j.appended  # the newest records stay
    j.close()


def test_a_pinned_segment_stays_until_the_reader_moves_on(tmp_path):
    j = filled(tmp_path, retain_time=1, retain_bytes=1)
    pin = j.pin(1)
    j.truncate_before(j.appended + 1)
    assert j.retained()["first"] == 1
    j.unpin(pin)
    j.retain()
    assert j.retained()["first"] > 1
    j.close()


def test_retained_times_survive_a_reopen(tmp_path):
    j = filled(tmp_path, n_records=10, retain_time=100)
    got = j.retained()
    j.close()
    j2 = Journal(tmp_path / "j", "write", segment_bytes=4096, retain_time=100)
    assert j2.retained() == got
    j2.close()


@pytest.fixture(params=[65536, 7], ids=["one-sort", "merged-pieces"])
def piece(request, monkeypatch):
    """History sorted in one piece, or (a small SORT_PIECE) in pieces each merged with the order's tail."""
    from server.durability import history

    monkeypatch.setattr(history, "SORT_PIECE", request.param)
    return request.param


def test_history_comes_back_in_the_order_the_queue_released_it(tmp_path, piece):
    """Blocks out of order, ties, late events refused: the reader's order is the engine's."""
    rnd = random.Random(7)
    j = Journal(tmp_path / "j", "write", segment_bytes=8192)
    q = DelayQueue(1_000_000, delay=0.0, event_time=True)
    q.journal = j
    taken = []
    i = 0
    for block in range(300):
        base = block * 3
        evs = []
        for _ in range(rnd.randint(1, 6)):
            i += 1
            evs.append(ev(base + rnd.randint(-8, 3), i))
        q.put_batch(evs)
        if block % 7 == 0:
            taken += q.get_batch(rnd.randint(1, 50), timeout=0)
    q.close(drain=True)
    while True:
        got = q.get_batch(1000, timeout=0)
        if not got:
            break
        taken += got
    assert q.late > 0  # some were refused, and never journaled
    reader = HistoryReader(j, -100, j.retained()["first"])
    history = reader.below(j.appended, math.inf, len(taken) + 100)  # everything, queued or not
    assert [(e.t1, e.values) for e in history] == [(e.t1, e.values) for e in taken]
    j.close()


def test_the_reader_follows_the_live_queue_and_its_cut_is_exactly_what_was_taken(tmp_path, piece):
    j = Journal(tmp_path / "j", "write", segment_bytes=8192)
    q = DelayQueue(1_000_000, delay=5, event_time=True)
    q.journal = j
    rnd = random.Random(3)
    taken, fed = [], []
    reader = HistoryReader(j, 50, j.retained()["first"])
    for block in range(200):
        q.put_batch([ev(block * 2 + rnd.randint(-3, 2), block * 10 + k) for k in range(3)])
        taken += q.get_batch(rnd.randint(0, 8), timeout=0)
        last = q.last_released  # sampled before the journal's position, as the backfill's engine does
        fed += reader.below(j.appended, last, rnd.randint(1, 20))
        assert [e.values for e in fed] == [e.values for e in taken if e.t1 >= 50][:len(fed)]
    fed += reader.take_cut(*cut_point(j, q, 50))
    assert [e.values for e in fed] == [e.values for e in taken if e.t1 >= 50]
    assert len(q) > 0  # what is still queued goes to the live engine, not the reader
    j.close()


def test_from_is_resolved_against_the_retained_range(tmp_path):
    j = filled(tmp_path, n_records=10)
    kept = j.retained()
    assert resolve_from("retained", j, kept["to"], 1.0) == kept["from"]
    assert resolve_from(kept["from"] + 3, j, kept["to"], 1.0) == kept["from"] + 3
    assert resolve_from("-50ms", j, 90, 1.0) == 40
    assert resolve_from("-1s", j, 1000, 10.0) == 900
    with pytest.raises(FromError) as exc:
        resolve_from(kept["from"] - 1, j, kept["to"], 1.0)
    assert exc.value.retained == {"from": kept["from"], "to": kept["to"]}
    assert f"events from {kept['from']} to {kept['to']}" in str(exc.value)
    for bad in ("yesterday", "-", "-3 parsecs", True, None, [1]):
        with pytest.raises(FromError):
            resolve_from(bad, j, 90, 1.0)
    with pytest.raises(FromError, match="durability is off"):
        resolve_from(5, None, 90, 1.0)
    j.close()


def test_retention_settings_read_durations_and_sizes():
    st = Settings(retain_duration="90m", retain_bytes="10MB", time_unit_ms=1000)
    assert (st.retain_duration, st.retain_bytes, st.retain_units) == (5400, 10_000_000, 5400)
    assert Settings().retain_duration == 86400 and Settings().retain_bytes == 1 << 30
    with pytest.raises(ValueError, match="retain_duration"):
        Settings(retain_duration="a while")


def test_a_full_disk_takes_the_retained_history_first_and_the_next_append_fits(tmp_path):
    from server.durability.diskfull import DiskFull
    from tests.server.tmpfs import fill, tmpfs

    with tmpfs(tmp_path, "1m") as mnt:
        j = Journal(mnt / "journal", "write", segment_bytes=4096, retain_time=10 ** 9, retain_bytes=1 << 30)
        try:
            for r in range(30):
                j.append([Event("Stock", ("X" * 256, 1.0, r), r, r)] * 5)
            j.truncate_before(j.appended + 1)  # recovery needs none of it: kept only for retention
            assert j.retained()["segments"] > 5
            fill(mnt)
            with pytest.raises(DiskFull):
                j.append([Event("Stock", ("X" * 256, 1.0, 99), 99, 99)] * 20)
            kept = j.retained()
            assert kept["segments"] == 1 and j.retention_shed > 5  # the history went, the newest segment stayed
            assert j.append([Event("Stock", ("X" * 256, 1.0, 99), 99, 99)] * 20) == 31  # retried: it fits now
        finally:
            j.close()


def test_follow_reads_only_what_is_new_and_gives_replay_s_records(tmp_path):
    j = Journal(tmp_path / "j", "write", segment_bytes=2048)
    cursor: list = []
    got = []
    for r in range(60):
        j.append([ev(r, r)] * (1 + r % 4), "s" if r % 2 else None, r if r % 2 else None)
        if r % 7 == 0:
            got += list(j.follow(got[-1].position if got else 0, j.appended, cursor))
    got += list(j.follow(got[-1].position, j.appended, cursor))
    assert len(j.segments) >= 3
    assert got == list(j.replay(0))
    assert list(j.follow(j.appended, j.appended, cursor)) == []
    assert [r.position for r in j.follow(10, 20, [])] == list(range(11, 21))
    j.close()


def test_a_backfill_engine_reads_history_in_its_own_process_in_the_queue_s_order_and_pins_it(tmp_path):
    """The backfill's engine process follows the journal's files itself (server/backfill/engine.py):
    what it feeds, request by request and at the cut, is what the queue released, in its order;
    what it has still to read is pinned against retention, and nothing once it stops."""
    from clients.testing.market import STOCK
    from server.backfill.engine import BackfillEngine
    from server.subscriptions.registry import compile_subscription

    rnd = random.Random(11)
    j = Journal(tmp_path / "j", "write", segment_bytes=2048, retain_time=1, retain_bytes=1)
    q = DelayQueue(1_000_000, delay=4, event_time=True)
    q.journal = j
    taken, i = [], 0
    for block in range(120):  # out of order within the delay, ties, some refused as late
        evs = []
        for _ in range(rnd.randint(1, 5)):
            i += 1
            t = block * 3 + rnd.randint(-6, 2)
            evs.append(Event("Stock", (f"S{i % 7}", float(i), i), t, t))
        q.put_batch(evs)
        taken += q.get_batch(rnd.randint(0, 12), timeout=0)
    segments = len(j.segments)
    assert segments > 3
    autos, _ = compile_subscription("cel", "SELECT * FROM Stock", {"Stock": STOCK}, "h1", {}, 1.0)
    eng = BackfillEngine(Settings(), "cayuga-test-backfill", replay=True)
    fed = []

    def volumes(cols) -> list[int]:
        return [json.loads(p)["Volume"] for _sid, _streams, payloads in cols.groups() for p in payloads]

    try:
        eng.start([STOCK], "h1", autos)
        eng.open_history(j, start=20)
        j.truncate_before(j.appended + 1)  # recovery needs none of it: only the pin keeps it from retention
        assert j.retain() == 0 and len(j.segments) == segments  # pinned from the first record
        while True:
            eng.ask(q, 16)
            n, cols = eng.answer()
            fed += volumes(cols)
            assert n == len(volumes(cols))
            if not n:
                break
        released = [e.values[2] for e in taken if e.t1 >= 20]
        assert fed == released[:len(fed)] and len(fed) > 100  # all it had released for sure, in its order
        q.put_batch([Event("Stock", ("S1", 0.0, 10_000), 400, 400)])  # after the last read: followed at the cut
        taken += q.get_batch(5, timeout=0)
        n, cols = eng.cut(q, 20)
        fed += volumes(cols)
        assert fed == [e.values[2] for e in taken if e.t1 >= 20]  # exactly what the live engine took
        assert len(q) > 0  # the queued ones are the live engine's
        assert eng.given == len(fed) and eng.scanned == len(fed) + sum(1 for e in q.export_state()["events"]
                                                                       if e[3] >= 20)
    finally:
        eng.stop()
    assert j.retain() > 0  # unpinned
    j.close()
