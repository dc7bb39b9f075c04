"""The event journal (server/durability/journal.py) and the queue's hook that feeds it: real files."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.engine import Event
from server.durability import fsio
from server.durability.framing import HEADER
from server.durability.journal import Journal, segment_name
from server.ingest.queue import DelayQueue
from tests.conftest import examples


def ev(t1, name="IBM", t0=None):
    return Event("Stock", (name, 1.5, 7), t1 if t0 is None else t0, t1)


def records(j: Journal, after: int = 0) -> list:
    return list(j.replay(after))


def flusher_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "cayuga-journal-flush"]


@pytest.mark.parametrize("mode", ["write", "fsync"])
def test_round_trip_keeps_every_value_type_and_positions_continue_across_reopen(tmp_path, mode):
    evs = [Event("S", ("text é", -3, 2.0, True, False, 9223372036854775807, -0.5, ""), 0, 1),
           Event("S", ("", 0, 1e308, False, True, -9223372036854775808, 3.0, "x"), 1.25, 2.5),
           Event("T", (), 5, 5)]
    j = Journal(tmp_path / "j", mode)
    assert j.appended == 0
    assert j.append(evs[:2], "a", 2) == 1
    assert j.append([], None, None) == 2
    assert j.append(evs[2:], "b", 10) == 3
    j.close()
    j = Journal(tmp_path / "j", mode)
    got = records(j)
    assert [(p, s, d) for p, _, s, d in got] == [(1, "a", 2), (2, None, None), (3, "b", 10)]
    back = got[0][1] + got[2][1]
    assert back == evs
    for a, b in zip(back, evs):  # ints stay ints, floats floats, bools bools
        assert [type(v) for v in (*a.values, a.t0, a.t1)] == [type(v) for v in (*b.values, b.t0, b.t1)]
        assert isinstance(a.values, tuple)
    assert j.senders == {"a": 2, "b": 10}
    assert j.append([ev(9)], "a", 3) == 4
    assert [p for p, *_ in j.replay(2)] == [3, 4]
    j.close()
    assert flusher_threads() == []


def _three_records(tmp_path):
    d = tmp_path / "j"
    j = Journal(d, "write")
    for i in range(3):
        j.append([ev(i), ev(i, "MSFT")], "s", i + 1)
    j.close()
    path = d / segment_name(1)
    data = path.read_bytes()
    # the last record starts where a journal of two records ends
    j2 = tmp_path / "two"
    j = Journal(j2, "write")
    for i in range(2):
        j.append([ev(i), ev(i, "MSFT")], "s", i + 1)
    j.close()
    last_start = (j2 / segment_name(1)).stat().st_size
    return d, path, data, last_start


def test_a_torn_last_record_is_dropped_at_every_cut(tmp_path):
    d, path, data, last_start = _three_records(tmp_path)
    for cut in range(last_start, len(data)):
        path.write_bytes(data[:cut])
        j = Journal(d, "write")
        assert j.torn == (1 if cut > last_start else 0), cut
        assert j.appended == 2
        assert [(p, s, n) for p, _, s, n in records(j)] == [(1, "s", 1), (2, "s", 2)]
        assert j.senders == {"s": 2}
        assert path.stat().st_size == last_start  # truncated at the last good record
        assert j.append([ev(5)], "s", 3) == 3  # and appends go on from there
        j.close()
        j = Journal(d, "write")
        assert j.torn == 0 and j.appended == 3
        j.close()


@pytest.mark.parametrize("where", ["last", "middle", "header"])
def test_a_flipped_byte_drops_that_record_and_everything_after_it(tmp_path, where):
    d, path, data, last_start = _three_records(tmp_path)
    start = HEADER.size  # the segment's records start after the file header
    header_len = start + 8 + int.from_bytes(data[start:start + 4], "little")
    offset = {"last": len(data) - 3, "middle": header_len + 12, "header": start + 10}[where]
    bad = bytearray(data)
    bad[offset] ^= 0x40
    path.write_bytes(bytes(bad))
    j = Journal(d, "write")
    assert j.torn == 1
    kept = {"last": 2, "middle": 0, "header": 0}[where]
    assert j.appended == kept
    assert [p for p, *_ in records(j)] == list(range(1, kept + 1))
    assert j.append([ev(1)]) == kept + 1
    j.close()


def test_a_bad_record_in_an_older_segment_drops_the_later_segments_too(tmp_path):
    d = tmp_path / "j"
    j = Journal(d, "write", segment_bytes=4096)
    for i in range(200):
        j.append([ev(i)] * 5, "s", i + 1)
    segs = j.segments
    j.close()
    assert len(segs) > 3
    data = bytearray(segs[1].read_bytes())
    data[-5] ^= 1  # the last record of the second segment
    segs[1].write_bytes(bytes(data))
    j = Journal(d, "write", segment_bytes=4096)
    first_of_third = int(segs[2].name.split(".")[0])
    assert j.appended == first_of_third - 2
    assert j.segments == segs[:2]
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".dropped")) == \
        sorted(p.name + ".dropped" for p in segs[2:])
    assert j.senders == {"s": j.appended}
    assert [p for p, *_ in records(j)] == list(range(1, j.appended + 1))
    j.close()


def test_the_sender_table_survives_truncate_before_and_reopen(tmp_path):
    d = tmp_path / "j"
    j = Journal(d, "write", segment_bytes=4096)
    for i in range(300):
        j.append([ev(i)] * 3, "a" if i % 3 else "b", i + 1)
        if i == 10:
            j.append([], "c", 77)
    table = dict(j.senders)
    firsts = [int(p.name.split(".")[0]) for p in j.segments]  # each segment's first record
    assert len(firsts) > 3  # segments before the one that holds pos, and one after it
    pos = (firsts[-3] + firsts[-2]) // 2  # a record inside the third segment from the end
    assert j.truncate_before(pos) == len(firsts) - 3  # every segment before it; not it, nor those after
    assert [int(p.name.split(".")[0]) for p in j.segments] == firsts[-3:]
    assert j.segments[0].exists() and not (d / segment_name(1)).exists()
    last = j.appended
    j.close()
    j = Journal(d, "write", segment_bytes=4096)
    assert j.senders == table == {"a": 300, "b": 298, "c": 77}
    assert j.appended == last
    assert j.append([ev(1)]) == last + 1
    assert [p for p, *_ in records(j, last - 2)] == [last - 1, last, last + 1]
    held = j.segments
    assert len(held) >= 3 and j.truncate_before(10 ** 9) == len(held) - 1  # all but the newest, which stays
    assert j.segments == held[-1:]
    j.close()


def test_oldest_is_the_first_record_held_and_matches_replay(tmp_path):
    d = tmp_path / "j"
    j = Journal(d, "write", segment_bytes=4096)
    assert j.oldest() is None
    for i in range(200):
        j.append([ev(i)] * 3, "s", i + 1)
    assert j.oldest() == 1
    j.truncate_before(j.appended - 5)
    first = next(iter(j.replay(0)))[0]
    assert j.oldest() == first > 1
    j.close()
    j = Journal(d, "write", segment_bytes=4096)  # what it knows of its segments after a reopen
    assert j.oldest() == first
    j.close()


def test_positions_continue_when_only_an_empty_newest_segment_is_left(tmp_path):
    d = tmp_path / "j"
    j = Journal(d, "write", segment_bytes=4096)
    while len(j.segments) < 3:
        j.append([ev(1)] * 20, "s", j.appended + 1)
    j.truncate_before(j.appended + 1)
    n = j.appended
    j.close()
    # the newest segment holds records, so positions go on after its last one
    j = Journal(d, "write", segment_bytes=4096)
    assert j.appended == n and j.senders == {"s": n}
    j.close()


def test_wait_durable_in_each_mode(tmp_path):
    w = Journal(tmp_path / "w", "write")
    p = w.append([ev(1)])
    assert w.durable() == p and w.wait_durable(p, 0) and w.syncs == 0
    w.close()
    f = Journal(tmp_path / "f", "fsync")
    assert flusher_threads() == ["cayuga-journal-flush"]
    for _ in range(50):
        p = f.append([ev(1)] * 10)
    assert f.wait_durable(p, 10)
    assert f.durable() >= p and f.syncs >= 1 and sum(f.sync_buckets) == f.syncs
    assert not f.wait_durable(p + 1, 0.05)  # nothing was appended there
    f.close()
    assert flusher_threads() == []
    assert f.durable() == p


def test_syncs_nobody_waits_for_are_paced_and_one_waited_for_starts_at_once(tmp_path):
    """``sync_interval`` (the ``journal_sync_ms`` setting): after a round, what is appended
    while nobody waits joins the next round, due an interval later (an hour here); a
    ``wait_durable`` starts it at once, and it covers everything appended meanwhile. A close
    in the middle of the pause syncs what is left itself."""
    f = Journal(tmp_path / "f", "fsync", sync_interval=3600.0)
    p = f.append([ev(1)])
    assert f.wait_durable(p, 60) and f.syncs == 1  # the first round: nothing before it to wait for
    for t in range(2, 102):
        p = f.append([ev(t)])
    assert f.wait_durable(p, 60)  # (not an hour: the waiter ends the pause)
    assert f.syncs == 2 and f.durable() == p  # one round for the hundred records
    last = f.append([ev(200)])
    f.close()  # (not an hour either: the flusher leaves its pause, the close syncs)
    assert flusher_threads() == [] and f.durable() == last and f.syncs == 3
    with pytest.raises(ValueError):
        Journal(tmp_path / "o", "off")


def test_sync_makes_every_record_durable_in_each_mode(tmp_path, monkeypatch):
    """What a snapshot waits for before it is published (checkpoints.py): with
    ``write`` too, every segment written since the last sync() is fdatasynced,
    and the directory once a segment was created; with ``fsync`` the flusher's
    round. (tests/server/test_powercut.py shows what a snapshot past the journal's
    end did after a power cut.)"""
    names, synced = {}, []
    real_open, real_sync = fsio.open, fsio.fdatasync

    def opener(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        names[fd] = Path(path).name
        return fd

    def fdatasync(fd):
        synced.append(names.get(fd))
        real_sync(fd)

    monkeypatch.setattr(fsio, "open", opener)
    monkeypatch.setattr(fsio, "fdatasync", fdatasync)
    dirs = []
    monkeypatch.setattr(Journal, "_fsync_dir", lambda self: dirs.append(self.directory.name))
    w = Journal(tmp_path / "w", "write", segment_bytes=200)
    for i in range(1, 21):
        w.append([ev(i)], "s", i)
    segments = [p.name for p in w.segments]
    assert len(segments) > 2 and not synced and not dirs  # write(2) only, until now
    assert w.sync() == 20
    assert sorted(synced) == sorted(segments) and dirs == ["w"]
    synced.clear()
    w.append([ev(21)], "s", 21)  # (in a new segment: the last one was full)
    now = [p.name for p in w.segments]
    assert w.sync() == 21 and now[-1] in synced and set(synced) <= {segments[-1], now[-1]}  # what was written since
    assert dirs == ["w"] * (1 + (now != segments))
    w.close()
    f = Journal(tmp_path / "f", "fsync")
    p = f.append([ev(1)])
    assert f.sync() == p and f.durable() >= p
    f.close()


def test_replayed_and_followed_events_share_their_names_as_decoded_ones_do(tmp_path):
    """A journal's events come back with one object a stream name and a short string value
    (air/engine/convert.py's ``events_of_rows``): a recovery's replay and a backfill's history give
    the engine what the live decoder gives it, not a fresh string an event; a long one is not shared."""
    from air.engine.convert import SHARED_MAX_LENGTH

    long_name = "N" * (SHARED_MAX_LENGTH + 1)
    j = Journal(tmp_path / "j", "write")
    for t in range(4):  # (each record's names made apart: equal, not the same objects)
        j.append([Event("".join(["St", "ock"]), ("".join(["I", "BM"]), 1.5, "".join(list(long_name))), t, t)])
    for got in (list(j.replay(0)), list(j.follow(0, j.appended, []))):
        evs = [e for r in got for e in r.events]
        assert len(evs) == 4 and all(e == Event("Stock", ("IBM", 1.5, long_name), t, t) for t, e in enumerate(evs))
        assert all(e.stream is evs[0].stream and e.values[0] is evs[0].values[0] for e in evs)
        assert evs[0].values[2] is not evs[1].values[2]
    j.close()


def test_replay_works_before_new_appends(tmp_path):
    j = Journal(tmp_path / "j", "fsync", segment_bytes=4096)
    for i in range(100):
        j.append([ev(i)], "s", i + 1)
    j.close()
    j = Journal(tmp_path / "j", "fsync", segment_bytes=4096)
    assert [p for p, *_ in j.replay(90)] == list(range(91, 101))
    assert [e[0].t1 for _, e, _, _ in j.replay(0)] == list(range(100))
    j.close()


# --------------------------------------------------------------------------- the queue hook


def journaled_queue(tmp_path, capacity=100_000, delay=0.0, clock=None, mode="write"):
    q = DelayQueue(capacity, delay, clock=clock)
    q.journal = Journal(tmp_path / "jq", mode)
    return q


def test_each_part_is_one_record_with_its_meta_and_late_events_are_not_journaled(tmp_path):
    now = [100.0]
    q = journaled_queue(tmp_path, capacity=3, clock=lambda: now[0])
    ends = []

    def meta(end):
        ends.append(end)
        return "s", end * 10

    got = []
    t = threading.Thread(target=lambda: got.extend(q.put_batch([ev(t) for t in (1, 2, 3, 4, 5)], meta=meta)))
    t.start()
    out = []
    while len(out) < 5:
        out += q.get_batch(10, timeout=5)
    t.join(5)
    assert ends[0] == 3 and ends[-1] == 5  # a part of 3 (the room there was), then the rest
    assert q.put_batch([ev(1), ev(9)], meta=lambda end: ("s", 99)) == [0]  # 1 is late now
    q.record_progress("t", 4)
    recs = records(q.journal)
    assert [[e.t1 for e in evs] for _, evs, _, _ in recs][-2:] == [[9], []]
    assert [e.t1 for _, evs, _, _ in recs for e in evs] == [1, 2, 3, 4, 5, 9]
    assert recs[-2][2:] == ("s", 99) and recs[-1][2:] == ("t", 4)
    assert q.progress("s") == 99 and q.progress("t") == 4 and q.progress("x") == 0
    # a part whose events were all late still keeps the sender's progress
    assert q.put_batch([ev(2)], meta=lambda end: ("s", 100)) == [0]
    assert q.progress("s") == 100 and records(q.journal)[-1][1] == []
    q.journal.close()


def test_without_a_journal_progress_is_kept_in_memory():
    q = DelayQueue(10, clock=lambda: 0.0)
    q.put_batch([ev(5)], meta=lambda end: ("s", 3))
    q.record_progress("s", 4)
    assert q.progress("s") == 4


def _stable_by_t1(events):
    return sorted(events, key=lambda e: e.t1)


@pytest.mark.parametrize("in_order", [True, False])
def test_journal_order_is_the_queues_release_order_with_concurrent_senders(tmp_path, in_order):
    """Several threads put blocks while the engine side takes batches: the
    journal's events, sorted stably by t1, are exactly what left the queue."""
    now = [0.0]
    q = journaled_queue(tmp_path, capacity=500, clock=lambda: now[0])
    released: list = []
    stop = threading.Event()

    def consume():
        while not stop.is_set() or len(q):
            now[0] += 3
            released.extend(q.get_batch(64, timeout=0.01))

    def produce(k):
        import random
        rnd = random.Random(k)
        base = 0
        for b in range(150):
            ts = [base + rnd.randint(0, 40) for _ in range(rnd.randint(1, 30))]
            block = [Event("Stock", (f"p{k}", float(b), i), t, t) for i, t in enumerate(sorted(ts) if in_order else ts)]
            q.put_batch(block, meta=lambda end, k=k, b=b: (f"p{k}", b * 1000 + end))
            base += rnd.randint(0, 5)

    consumer = threading.Thread(target=consume)
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    consumer.start()
    for p in producers:
        p.start()
    for p in producers:
        p.join(60)
    stop.set()
    q.close(drain=True)
    consumer.join(60)
    released += q.get_batch(10 ** 6, timeout=0)
    journaled = [e for _, evs, _, _ in records(q.journal) for e in evs]
    assert len(journaled) == q.accepted == len(released)
    assert _stable_by_t1(journaled) == released
    q.journal.close()


_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(0, 30), max_size=12), st.booleans()),
    st.tuples(st.just("get"), st.integers(1, 8), st.integers(0, 40))), max_size=40)


@settings(examples(1.5))
@given(ops=_OPS, delay=st.sampled_from([0, 5]))
def test_the_journal_holds_exactly_the_kept_events_in_arrival_order(tmp_path_factory, ops, delay):
    now = [0.0]
    q = journaled_queue(tmp_path_factory.mktemp("q"), capacity=10_000, delay=delay, clock=lambda: now[0])
    serial = iter(range(10_000))
    kept, released = [], []
    for op in ops:
        if op[0] == "put":
            _, ts, in_order = op
            block = [Event("Stock", (str(next(serial)), 1.0, 1), t, t) for t in (sorted(ts) if in_order else ts)]
            late = set(q.put_batch(block, meta=lambda end: ("s", end)))
            kept += [e for i, e in enumerate(block) if i not in late]
        else:
            _, k, t = op
            now[0] = max(now[0], t)
            released += q.get_batch(k, timeout=0)
    q.close(drain=True)
    released += q.get_batch(10_000, timeout=0)
    journaled = [e for _, evs, _, _ in records(q.journal) for e in evs]
    assert journaled == kept
    assert _stable_by_t1(journaled) == released
    q.journal.close()


def test_copy_of_a_journal_directory_reads_back_the_same(tmp_path):
    j = Journal(tmp_path / "a", "write")
    j.append([ev(1)], "s", 1)
    j.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    j = Journal(tmp_path / "b", "write")
    assert j.appended == 1 and j.senders == {"s": 1}
    j.close()


def test_records_are_columns_and_the_rows_of_earlier_versions_still_read(tmp_path):
    """A record's events are packed as columns (retention.Columns); a journal written before them
    holds rows, and both are read back alike, every value and time of the same type, by a
    recovery's replay, a history's follow and retention's reading of a segment's times."""
    import msgspec

    mixed = [Event("S", ("é", -3, 2.0, True, None), 0, 1), Event("T", (), 1.25, 2.5),
             Event("S", ("x", 4, 0.5, False, ""), 3, 3)]
    points = [Event("Stock", ("IBM", 1.5, 7), t, t) for t in (4, 5.0, 6)]
    rows = [[e.stream, list(e.values), e.t0, e.t1] for e in points]
    j = Journal(tmp_path / "j", "write")
    j.append(mixed, "a", 3)
    j.append(points, "a", 6, packed=msgspec.Raw(msgspec.msgpack.encode(rows)))  # as an earlier version wrote it
    j.append(points)
    j.append([], "a", 9)
    for got in (records(j), list(j.follow(0, j.appended, []))):
        assert [(r.sender, r.lines_done) for r in got] == [("a", 3), ("a", 6), (None, None), ("a", 9)]
        for r, want in zip(got, (mixed, points, points, [])):
            assert r.events == want
            assert [(type(e.t0), type(e.t1), tuple(map(type, e.values))) for e in r.events] == \
                   [(type(e.t0), type(e.t1), tuple(map(type, e.values))) for e in want]
    j.close()
    again = Journal(tmp_path / "j", "write")  # read on open: every record whole
    assert [len(r.events) for r in records(again)] == [3, 3, 3, 0] and again.torn == 0
    times = again._times()  # (a segment opened again is read for its times)
    assert (times[0].t_lo, times[0].t_hi) == (1, 6)
    again.close()
