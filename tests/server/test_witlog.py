"""The witness log on its own: round trip, torn and corrupt tails, retention
by size and by age (an injected clock), dedupe, reading while appending."""

from __future__ import annotations

import os
import threading
import time

import pytest

from server.durability.witlog import Gone, WitnessLog


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


@pytest.mark.parametrize("lost", ["records", "bytes", "index"])
def test_segments_after_one_that_lost_its_end_are_set_aside_so_the_replay_leaves_no_gap(tmp_path, lost):
    """After a power cut a sealed segment may have lost the end it never synced
    while the next one kept what was written to it (tests/server/test_powercut.py):
    before, the next segment's seqs stood beyond a gap the replay never filled
    (it appends only what is above the last seq). Now that segment and those
    after it are set aside as ``*.dropped``, the last seq is what is whole, and
    the re-produced witnesses fill the log without a gap."""
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
    kept = [n for n, _ in WitnessLog(d).read("s1")]
    assert kept == list(range(1, 121))
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
    last = wl.last_seq("s1")
    assert last < 120 and [n for n, _ in wl.read("s1")] == list(range(1, last + 1))
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".dropped")) == [p.name + ".dropped"
                                                                                  for p in segs[1:]]
    wl.append(big(range(1, 121)))  # the replay: what was kept is not appended again, the rest is
    assert [n for n, _ in wl.read("s1")] == list(range(1, 121))
    wl.close()
    assert [n for n, _ in WitnessLog(d).read("s1")] == list(range(1, 121))
