"""The witness log on its own: round trip, torn and corrupt tails, retention
by size and by age (an injected clock), dedupe, reading while appending."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from server.durability.witlog import Gap, Gone, WitnessLog


def recs(sid: str, seqs, stream: str = "Out") -> list[tuple]:
    return [(sid, n, stream, b'{"n":%d}' % n) for n in seqs]


def seg_files(d) -> list:
    return sorted(p for p in d.iterdir() if p.suffix == ".log")


def test_round_trip_and_reopen(tmp_path):
    wl = WitnessLog(tmp_path)
    wl.append(recs("s1", range(1, 4)) + recs("s2", [1]))
    wl.append(recs("s1", [4], stream="Other"))
    assert list(wl.read("s1")) == [(n, b'{"n":%d}' % n) for n in range(1, 5)]
    assert list(wl.read("s1", 3)) == [(3, b'{"n":3}'), (4, b'{"n":4}')]
    assert list(wl.read_stream("Out")) == [("s1", 1, b'{"n":1}'), ("s1", 2, b'{"n":2}'), ("s1", 3, b'{"n":3}'),
                                          ("s2", 1, b'{"n":1}')]
    assert list(wl.read_stream("Out", {"s1": 2})) == [("s1", 3, b'{"n":3}'), ("s2", 1, b'{"n":1}')]
    assert wl.records == 5 and wl.appended == 5
    wl.close()
    wl = WitnessLog(tmp_path)
    assert wl.last_seqs() == {"s1": 4, "s2": 1} and wl.first_seq("s1") == 1 and wl.first_seq("s9") == 1
    assert [n for n, _ in wl.read("s1")] == [1, 2, 3, 4]
    wl.close()


def _two_records(d):
    """A log of two records (seqs 1-2, then 3): its one segment, its bytes, where the last record starts."""
    wl = WitnessLog(d)
    wl.append(recs("s1", [1, 2]))
    good = wl.bytes
    wl.append(recs("s1", [3]))
    full = wl.bytes
    wl.close()
    (path,) = seg_files(d)
    data = path.read_bytes()
    assert len(data) == full
    return path, data, good, full


def test_a_torn_tail_at_every_offset_of_the_last_record_is_cut_off(tmp_path):
    d = tmp_path / "w"
    path, data, good, full = _two_records(d)
    for cut in range(good, full):
        path.write_bytes(data[:cut])
        wl = WitnessLog(d)
        assert [n for n, _ in wl.read("s1")] == [1, 2], cut
        assert wl.last_seq("s1") == 2 and path.stat().st_size == good and wl.truncated == cut - good
        wl.append(recs("s1", [3]))  # appending goes on where the good records end
        assert [n for n, _ in wl.read("s1")] == [1, 2, 3]
        wl.close()


def test_a_flipped_byte_in_the_last_record_is_never_misread(tmp_path):
    d = tmp_path / "w"
    path, data, good, full = _two_records(d)
    for i in range(good, full):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= bit
            path.write_bytes(bytes(bad))
            wl = WitnessLog(d)
            assert list(wl.read("s1")) == [(1, b'{"n":1}'), (2, b'{"n":2}')], (i, bit)
            assert path.stat().st_size == good
            wl.close()


def test_retention_by_size_deletes_whole_old_segments(tmp_path):
    wl = WitnessLog(tmp_path, max_bytes=8192, segment_bytes=1024)
    for k in range(0, 400, 10):
        wl.append(recs("s1", range(k + 1, k + 11)) + recs("s2", [k // 10 + 1]))
    assert wl.bytes <= 8192 + 1024 and wl.segments >= 4
    first = wl.first_seq("s1")
    assert first > 1 and wl.dropped > 0
    assert [n for n, _ in wl.read("s1", first)] == list(range(first, 401))
    with pytest.raises(Gone) as info:
        wl.cursor(sid="s1", after={"s1": 0})
    assert str(info.value) == f"from 1 is no longer retained: the log of s1 starts at {first}"
    wl.close()
    wl = WitnessLog(tmp_path, max_bytes=8192, segment_bytes=1024)  # the index survives, so do the seqs
    assert wl.first_seq("s1") == first and wl.last_seqs() == {"s1": 400, "s2": 40}
    wl.close()


def test_retention_by_age_with_an_injected_clock(tmp_path):
    now = [time.time()]
    wl = WitnessLog(tmp_path, max_seconds=60, segment_bytes=1 << 20, clock=lambda: now[0])
    wl.append(recs("s1", [1, 2]))
    now[0] += 30
    assert wl.retain() == 0 and wl.first_seq("s1") == 1
    now[0] += 31  # the newest witness is older than 60 s: the segment is sealed, then deleted
    assert wl.retain() == 2
    assert wl.records == 0 and wl.first_seq("s1") == 3 and wl.last_seq("s1") == 2 and wl.dropped == 2
    wl.append(recs("s1", [3]))
    assert list(wl.read("s1", 3)) == [(3, b'{"n":3}')]
    wl.close()
    # after a restart the seqs of deleted segments come from the checkpoint that opens each segment
    wl = WitnessLog(tmp_path, max_seconds=60, clock=lambda: now[0])
    assert wl.last_seq("s1") == 3 and wl.first_seq("s1") == 3
    wl.close()
    # and a segment's age after a restart is its file's modification time
    for p in seg_files(tmp_path):
        os.utime(p, (now[0] - 3600, now[0] - 3600))
    wl = WitnessLog(tmp_path, max_seconds=60, clock=lambda: now[0])
    wl.retain()
    assert wl.records == 0 and wl.last_seq("s1") == 3
    wl.close()


def test_re_produced_seqs_are_not_appended_again(tmp_path):
    wl = WitnessLog(tmp_path)
    first = recs("s1", [1, 2, 3])
    assert wl.append(first) is first
    again = recs("s1", [2, 3, 4]) + recs("s2", [1])
    kept = wl.append(again)
    assert [r[:2] for r in kept] == [("s1", 4), ("s2", 1)] and kept[0] is again[2]
    assert wl.deduplicated == 2 and [n for n, _ in wl.read("s1")] == [1, 2, 3, 4]
    assert wl.append(recs("s1", [1, 2])) == []
    wl.close()


def test_reading_while_appending(tmp_path):
    wl = WitnessLog(tmp_path, max_bytes=1 << 30, segment_bytes=16 << 10)
    total = 20_000
    got: list[int] = []
    errors: list[BaseException] = []

    def reader():
        try:
            cur = wl.cursor(sid="s1")
            deadline = time.monotonic() + 60
            while len(got) < total and time.monotonic() < deadline:
                batch = cur.read(max_records=333)
                got.extend(n for _, n, _ in batch)
            cur.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    for k in range(0, total, 100):
        wl.append(recs("s1", range(k + 1, k + 101)) + recs("s2", range(k + 1, k + 101)))
    t.join(60)
    assert not t.is_alive() and not errors
    assert got == list(range(1, total + 1))
    assert wl.segments > 10
    wl.close()


def test_a_gap_mark_is_read_as_a_gap_and_survives_reopening_and_sealing(tmp_path):
    wl = WitnessLog(tmp_path, segment_bytes=4096)
    wl.append(recs("s1", range(1, 11)) + recs("s2", [1]))
    assert wl.note_gaps({"s1": 20, "s2": 1}) == {"s1": (11, 20)}  # s2 is numbered that far already
    assert wl.note_gaps({"s1": 15}) == {}
    wl.append(recs("s1", [21, 22]))
    assert wl.last_seq("s1") == 22 and wl.gaps() == {"s1": [(11, 20)]}
    gap = ("s1", 20, Gap(11, 20))
    cur = wl.cursor(sid="s1", after={"s1": 8})
    assert [r[1] if r != gap else r for r in cur.read()] == [9, 10, gap, 21, 22] and cur.gaps == 1
    inside = wl.cursor(stream="Out", after={"s1": 14}).read()  # a stream reader, from inside the gap
    assert inside[0][:2] == ("s2", 1) and inside[1] == ("s1", 20, Gap(15, 20))
    assert [r[1] for r in inside[2:]] == [21, 22]
    assert [n for n, _ in wl.read("s1")] == list(range(1, 11)) + [21, 22]  # the plain reader skips it
    wl.append(recs("s1", range(23, 200)))  # seals the segment: its index holds the gap
    wl.close()
    wl = WitnessLog(tmp_path, segment_bytes=4096)
    assert wl.gaps() == {"s1": [(11, 20)]} and wl.last_seq("s1") == 199
    assert wl.cursor(sid="s1", after={"s1": 10}).read()[0] == gap
    wl.close()


def test_a_gap_mark_with_nothing_after_it_is_told_not_waited_on(tmp_path):
    wl = WitnessLog(tmp_path)
    wl.append(recs("s1", range(1, 4)))
    wl.note_gaps({"s1": 9})
    cur = wl.cursor(sid="s1", after={"s1": 3})
    assert cur.read() == [("s1", 9, Gap(4, 9))] and cur.read() == [] and wl.caught_up(cur.after, sid="s1")
    wl.close()


def test_a_sealed_segment_cut_short_is_a_gap_against_the_next_checkpoint(tmp_path):
    wl = WitnessLog(tmp_path, segment_bytes=4096)
    for n in range(1, 301, 10):
        wl.append(recs("s1", range(n, n + 10)))
    wl.close()
    first, second = seg_files(tmp_path)[:2]
    with open(first, "r+b") as f:  # its index no longer fits: it is scanned, and its torn tail cut
        f.truncate(first.stat().st_size // 2)
    wl = WitnessLog(tmp_path, segment_bytes=4096)
    ns = [n for n, _ in wl.read("s1")]
    held, resumed = next((a, b) for a, b in zip(ns, ns[1:]) if b != a + 1)
    assert held < resumed - 1 and wl.gaps() == {"s1": [(held + 1, resumed - 1)]}
    got = wl.cursor(sid="s1", after={"s1": held - 1}).read(5)
    assert got[:3] == [("s1", held, got[0][2]), ("s1", resumed - 1, Gap(held + 1, resumed - 1)),
                       ("s1", resumed, got[2][2])]
    wl.close()


@pytest.mark.parametrize("lost", ["records", "bytes", "index"])
def test_segments_after_a_hole_past_the_starting_point_are_set_aside_so_the_replay_leaves_no_gap(tmp_path, lost):
    """After a power cut a sealed segment may have lost the end it never synced
    while the next one kept what was written to it (tests/server/test_powercut.py):
    the next segment's seqs stood beyond a hole the replay never filled (it
    appends only what is above the last seq), and readers got a Gap for
    witnesses the journal still gives. Recovery now sets aside, as
    ``*.dropped``, that segment and those after it when the hole begins past its
    starting point's numbers, and the re-produced witnesses fill the log without
    a gap. A hole the starting point counts (synced, then damaged) stays a gap."""
    d = tmp_path / "w"

    def big(seqs) -> list[tuple]:
        return [("s1", n, "Out", b'{"n":%d,"pad":"%s"}' % (n, b"x" * 200)) for n in seqs]

    wl = WitnessLog(d, segment_bytes=4096)
    for first in range(1, 121, 10):
        wl.append(big(range(first, first + 10)))
    wl.close()
    segs = seg_files(d)
    assert len(segs) >= 3
    first = segs[0]
    assert [n for n, _ in WitnessLog(d).read("s1")] == list(range(1, 121))
    whole = first.read_bytes()
    if lost == "records":  # whole records lost: it ends cleanly, shorter than its index says
        probe = WitnessLog(tmp_path / "probe")
        probe.append(big(range(1, 11)))
        end = probe.bytes
        probe.close()
        first.write_bytes(whole[:end])
    elif lost == "bytes":  # a torn record at its end
        first.write_bytes(whole[:len(whole) - 7])
    else:  # its index lost too, and the end
        first.with_suffix(".idx").unlink()
        first.write_bytes(whole[:len(whole) // 2])
    wl = WitnessLog(d, segment_bytes=4096)
    before = wl.gaps()
    assert wl.set_aside_after_holes({"s1": 120}) == 0 and wl.gaps() == before  # counted: it stays a gap
    assert wl.set_aside_after_holes({"s1": 0}) == len(segs) - 1  # a replay from 0 makes it all again
    held = wl.last_seq("s1")
    assert held < 20 and wl.gaps() == {}
    assert [n for n, _ in wl.read("s1")] == list(range(1, held + 1))
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".dropped")) == [p.name + ".dropped"
                                                                                  for p in segs[1:]]
    wl.append(big(range(1, 121)))  # the replay: what was kept is not appended again, the rest is
    assert [n for n, _ in wl.read("s1")] == list(range(1, 121))
    wl.close()
    assert [n for n, _ in WitnessLog(d).read("s1")] == list(range(1, 121))


def test_a_readers_pass_over_batches_without_its_name_and_its_slice_of_those_with_it(tmp_path):
    """A subscription's (or stream's) reader passes over a batch record whose bytes lack its name,
    unpacked or not, and takes its own witnesses of one as one slice where they are together.
    Neither may lose one: names inside others ("a" in "ab", a stream in a payload), witnesses
    apart in a batch, and a batch with every one of them, all read back in order."""
    d = tmp_path / "w"
    wl = WitnessLog(d)
    n: dict[str, int] = {}

    def w(sid: str, stream: str = "Out", payload: bytes = b"") -> tuple:
        n[sid] = n.get(sid, 0) + 1
        return sid, n[sid], stream, payload or b'{"s":"%s","n":%d}' % (sid.encode(), n[sid])

    wl.append([w("ab"), w("b"), w("ab")])  # "a"'s name inside another's: read and passed over
    wl.append([w("b", payload=b'{"note":"Other"}')])  # a stream's name in a payload
    wl.append([w("a"), w("a"), w("b"), w("a", "Other")])  # together, then one more on another stream
    wl.append([w("a"), w("ab"), w("a"), w("b", "Other"), w("a")])  # apart
    wl.append([w("a"), w("a")])  # nothing but its own
    for sid in ("a", "ab", "b"):
        assert [seq for seq, _ in wl.read(sid)] == list(range(1, n[sid] + 1))
    assert [p for _, p in wl.read("a")] == [b'{"s":"a","n":%d}' % i for i in range(1, n["a"] + 1)]
    cur = wl.cursor(stream="Other", after={})
    got = []
    while batch := cur.read():
        got += [(s, seq) for s, seq, _ in batch]
    cur.close()
    assert got == [("a", 3), ("b", 4)]
    wl.close()


def test_stream_readers_find_every_publisher_when_a_subscription_changes_streams(tmp_path):
    """The index says which subscriptions published on which stream; a writer looks only at
    pairs whose stream is not the last one seen of their subscription in the segment: a
    subscription going back and forth between streams, in one batch and across batches,
    packed or not, is found on each, in the active segment and after sealing and reopening."""
    from msgspec.msgpack import encode

    wl = WitnessLog(tmp_path, segment_bytes=600)
    wl.append(recs("s1", [1], "A") + recs("s2", [1], "A"))
    wl.append(recs("s1", [2], "B"))  # a new stream of a subscription the segment knows
    wl.append(recs("s1", [3], "A") + recs("s1", [4], "C") + recs("s1", [5], "A"))  # and back, in one batch
    sids, seqs, streams, payloads = ["s2", "s3", "s3"], [2, 1, 2], ["B", "B", "A"], [b"{}", b"{}", b"{}"]
    body = encode((sids, seqs, streams, payloads))
    owners = wl.numbers.array(["s2", "s3"])  # a worker's packed batch
    wl.append_packed([body], 3, owners, np.array([2, 1]), np.array([2, 2]), wl.numbers.array(sids),
                     wl.stream_numbers.array(streams))
    expect = {"A": {"s1", "s2", "s3"}, "B": {"s1", "s2", "s3"}, "C": {"s1"}}
    assert {st: wl.publishers(st) for st in "ABC"} == expect
    assert [(s, n) for s, n, _ in wl.read_stream("A")] == [("s1", 1), ("s2", 1), ("s1", 3), ("s1", 5), ("s3", 2)]
    assert [(s, n) for s, n, _ in wl.read_stream("B")] == [("s1", 2), ("s2", 2), ("s3", 1)]
    for k in range(6, 30):  # segments fill and seal: the hint starts anew in each
        wl.append(recs("s1", [k], "ABC"[k % 3]))
    assert wl.segments > 2
    assert [n for s, n, _ in wl.read_stream("C")] == [4] + [k for k in range(6, 30) if k % 3 == 2]
    wl.close()
    wl = WitnessLog(tmp_path, segment_bytes=600)
    assert {st: wl.publishers(st) for st in "ABC"} == expect
    wl.close()


def test_a_stream_reader_leaves_a_sealed_segment_whose_last_record_is_on_another_stream(tmp_path):
    """A subscription publishing on several streams: its last seq in a sealed segment may be on
    another stream than the reader's, above what the reader has read of its stream. The reader
    once went back to that segment for ever (a thread at 100% of a core, the client waiting),
    and took the seqs in between, on the other streams, for gaps."""
    wl = WitnessLog(tmp_path, segment_bytes=600)
    for k in range(1, 30):
        wl.append(recs("s1", [k], "ABC"[k % 3]))
    assert wl.segments > 2
    read: dict[str, tuple[list, int]] = {}

    def reader(st: str) -> None:
        got: list = []
        cur = wl.cursor(stream=st)
        while batch := cur.read(max_records=4):  # [] at the end of what is appended
            got += [n for _s, n, _p in batch]
        cur.close()
        read[st] = (got, cur.gaps)

    for st, r in (("A", 0), ("B", 1), ("C", 2)):
        t = threading.Thread(target=reader, args=(st,), daemon=True)
        t.start()
        t.join(60)  # (it ends at once; a reader going round for ever never would)
        assert not t.is_alive(), f"the reader of {st} never reached the end of the log"
        assert read[st] == ([k for k in range(1, 30) if k % 3 == r], 0)  # every witness of its stream, no gap
    wl.close()


def test_a_segments_index_folded_from_its_records_is_the_one_a_record_at_a_time_gives():
    """The active segment keeps each batch record's numbers and folds them into its index when
    read (server/durability/witrecords.py): random records (subscriptions in any order, some on
    several streams, folds between some of them) give each subscription's first seq, first
    record and last seq, and each stream's publishers, as indexing one record at a time does.
    Sealed, its records become one, and its index (written from that record alone where no reader
    folded any, else from what was folded and the rest) and its folds say the same."""
    import json
    from pathlib import Path

    from server.durability.seqmap import Numbers
    from server.durability.witrecords import Segment, load_index

    rng = np.random.default_rng(7)
    for _trial in range(100):
        subs, streams = Numbers(), Numbers()
        n, kinds = int(rng.integers(1, 40)), int(rng.integers(1, 5))
        names = [f"s{i}" for i in range(n)]
        seg, last = Segment(1, Path("unused.log")), {}
        reads = rng.random() < 0.5  # (none: the index of a sealed segment comes from its records alone)
        want_subs: dict[str, list[int]] = {}
        want_streams: dict[str, set[str]] = {}
        for r in range(int(rng.integers(1, 12))):
            owners = [names[i] for i in rng.choice(n, int(rng.integers(1, n + 1)), replace=False)]
            counts = rng.integers(1, 4, len(owners))
            starts = np.array([last.get(s, 0) + 1 for s in owners])
            ends = starts + counts - 1
            pair_sids, pair_streams = [], []
            for s, c, first, end in zip(owners, counts.tolist(), starts.tolist(), ends.tolist()):
                last[s] = end
                want_subs.setdefault(s, [first, r * 100, end])[2] = end
                for _ in range(c):
                    pair_sids.append(s)
                    pair_streams.append(f"T{int(rng.integers(0, kinds))}")
                    want_streams.setdefault(pair_streams[-1], set()).add(s)
            seg.take_batch(r * 100, 100, int(counts.sum()), (subs, streams), subs.array(owners), starts, ends,
                           subs.array(pair_sids), streams.array(pair_streams), 0.0)
            if reads and rng.random() < 0.3:
                assert seg.subs.keys() <= want_subs.keys()  # a reader: folded so far
        if rng.random() < 0.7:
            seg.seal()
            back = Segment(1, Path("unused.log"))  # (the index as a log opened later reads it)
            back.take_index(load_index(seg.index_bytes()))
            assert {s: [v.first_seq, v.first_off, v.last_seq] for s, v in back.subs.items()} == want_subs
            assert back.records == seg.records and back.streams == want_streams
        assert {s: [v.first_seq, v.first_off, v.last_seq] for s, v in seg.subs.items()} == want_subs
        assert seg.streams == want_streams


def test_an_index_and_a_checkpoint_of_non_ascii_names_are_read_back(tmp_path, monkeypatch):
    """The index of a sealed segment (MessagePack columns) and each segment's checkpoint (UTF-8
    JSON: json.dumps escaped other letters) name subscriptions and streams in UTF-8: a reopened
    log takes both, its scan not needed."""
    wl = WitnessLog(tmp_path, segment_bytes=1024)
    for k in range(0, 60, 6):
        wl.append(recs("Kurs-Müller", range(k + 1, k + 7), stream="Preisanstieg€") + recs("株価", [k // 6 + 1]))
    assert wl.segments >= 3
    wl.close()
    idx = sorted(tmp_path.glob("*.idx"))
    assert idx and "Müller".encode() in idx[0].read_bytes()
    scanned, scan = [], WitnessLog._scan
    monkeypatch.setattr(WitnessLog, "_scan", lambda self, seg, *a: scanned.append(seg) or scan(self, seg, *a))
    wl = WitnessLog(tmp_path, segment_bytes=1024)
    assert wl.last_seqs() == {"Kurs-Müller": 60, "株価": 10}
    assert [n for n, _ in wl.read("Kurs-Müller", 1)] == list(range(1, 61))
    assert [s for s, _n, _p in wl.read_stream("Preisanstieg€")] == ["Kurs-Müller"] * 60
    assert len(scanned) == 1  # only the active segment, which has no index
    wl.close()


def test_a_damaged_or_older_index_is_read_or_its_segment_scanned(tmp_path, monkeypatch):
    """A sealed segment's index is MessagePack columns; one of the JSON an earlier version wrote
    is read as well (no scan), and one that is not an index (cut short, its places out of range,
    garbage) is left aside: the segment is scanned, and the log reads the same."""
    import msgspec

    from server.durability.witrecords import Segment, load_index

    wl = WitnessLog(tmp_path, segment_bytes=1024)
    for k in range(0, 60, 6):
        wl.append(recs("a", range(k + 1, k + 7), stream="A") + recs("b", [k // 6 + 1], stream="B"))
    wl.close()
    first = sorted(tmp_path.glob("*.idx"))[0]
    columns = first.read_bytes()
    seg = Segment(0, first.with_suffix(".log"))
    seg.take_index(load_index(columns))
    as_json = msgspec.json.encode({"size": seg.size, "records": seg.records,
                                   "subs": {s: [v.first_seq, v.first_off, v.last_seq] for s, v in seg.subs.items()},
                                   "streams": {k: sorted(v) for k, v in seg.streams.items()}})
    out_of_range = msgspec.msgpack.encode({**msgspec.msgpack.decode(columns),
                                          "pair_sids": np.array([0, 7], "<i4").tobytes()})
    scanned, scan = [], WitnessLog._scan
    monkeypatch.setattr(WitnessLog, "_scan", lambda self, seg, *a: scanned.append(seg.path) or scan(self, seg, *a))
    for index, is_read in ((as_json, True), (columns[: len(columns) // 2], False), (out_of_range, False),
                           (b"\x00garbage", False)):
        first.write_bytes(index)
        scanned.clear()
        wl = WitnessLog(tmp_path, segment_bytes=1024)
        assert (first.with_suffix(".log") not in scanned) == is_read, index[:20]
        assert [n for n, _ in wl.read("a", 1)] == list(range(1, 61)) and wl.last_seqs() == {"a": 60, "b": 10}
        assert wl.publishers("B") == {"b"}
        wl.close()


def test_writing_and_rolling_the_log_imports_nothing_more(tmp_path):
    """The engine thread writes the witness log and seals its segments mid-run: nothing it
    calls may import a module then (np.unique imported numpy.ma at its first call, 10 ms
    on the engine thread at a run's first roll). In an interpreter of its own, with the
    witness log imported as the server has it, a subscription on two streams in turn
    (the seal's pairs sorted) and a roll."""
    import json
    import subprocess
    import sys

    code = f"""
import json, sys
from server.durability.witlog import WitnessLog
wl = WitnessLog({str(tmp_path)!r}, segment_bytes=600)
before = set(sys.modules)
for k in range(1, 40):
    wl.append([("s1", k, "AB"[k % 2], b'{{"n":%d}}' % k), ("s2", k, "A", b"{{}}")])
assert wl.segments > 2
wl.close()
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert json.loads(out) == []
