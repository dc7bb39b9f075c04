"""The one framing of the durable files (server/durability/framing.py): new files
say which framing they have, and a data directory written before it (journal
segments, witness-log segments, snapshots) is still recovered, torn tails
included, with nothing lost and no witness renumbered.

The files of the older framings are written here by an encoder of this test's
own (struct, zlib, msgspec and pickle, not the product's framing code), as the
code before the one framing wrote them."""

from __future__ import annotations

import json
import pickle
import struct
import zlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.engine import Event
from server.durability.framing import VERSIONS, FramingError, Scan, frame
from server.durability.journal import Journal, segment_name
from server.durability.snapshot import MAGIC, SnapshotError, SnapshotStore, decode, encode
from server.durability.witlog import WitnessLog
from server.durability.witrecords import Segment, load_index
from tests.conftest import examples

# --------------------------------------------------------------------------- the older framings, by hand

_pack = msgspec.msgpack.encode


def old_journal_record(payload: bytes) -> bytes:
    """``<u32 length><u32 CRC32 of the payload><payload>``: the journal before the one framing."""
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def old_journal_segment(first: int, senders: dict[str, int], records: list[tuple]) -> bytes:
    """A journal segment: its header record, then ``(sender, lines_done, [(stream, values, t0, t1)])`` records."""
    out = old_journal_record(_pack({"first": first, "senders": senders}))
    for sender, done, events in records:
        out += old_journal_record(_pack([sender, done, [[e.stream, list(e.values), e.t0, e.t1] for e in events]]))
    return out


def old_witlog_record(kind: int, seq: int, payload: bytes) -> bytes:
    """``<u32 body length><u32 CRC32 of length and body><body>``, body ``<u8 kind><u64 seq><u16 0><u16 0> payload``."""
    body = struct.pack("<BQHH", kind, seq, 0, 0) + payload
    length = struct.pack("<I", len(body))
    return length + struct.pack("<I", zlib.crc32(body, zlib.crc32(length))) + body


def old_witlog_segment(checkpoint: dict[str, int], batches: list[list[tuple]]) -> bytes:
    """A witness-log segment: its checkpoint (kind 1), then batches (kind 2) of (sid, seq, stream, payload)."""
    out = old_witlog_record(1, 0, json.dumps(checkpoint).encode())
    for batch in batches:
        sids, seqs, streams, payloads = (list(c) for c in zip(*batch))
        out += old_witlog_record(2, len(batch), _pack([sids, seqs, streams, payloads]))
    return out


def old_snapshot(state: dict) -> bytes:
    payload = pickle.dumps(state)
    return b"CAYUGASNAP1\n" + struct.pack(">QI", len(payload), zlib.crc32(payload)) + payload


def ev(t, name="IBM"):
    return Event("Stock", (name, 1.5 + t, t), t, t)


def wit(sid, seq, stream="Out"):
    return (sid, seq, stream, b'{"n":%d}' % seq)


def assert_new_framing(path, kind: bytes, version: int | None = None) -> None:
    version = VERSIONS[kind] if version is None else version
    assert path.read_bytes()[:8] == b"CAYUGA" + kind + bytes([version]), path


# --------------------------------------------------------------------------- new files


def test_every_new_file_starts_with_the_header_of_its_kind_and_framing_version(tmp_path):
    j = Journal(tmp_path / "j", "write")
    j.append([ev(1)], "s", 1)
    j.close()
    assert_new_framing(tmp_path / "j" / segment_name(1), b"J")
    wl = WitnessLog(tmp_path / "w")
    wl.append([wit("a", 1)])
    wl.close()
    (seg,) = (tmp_path / "w").glob("wit-*.log")
    assert_new_framing(seg, b"W", 4)  # (it may tell a worker's batch per subscription: a reader of 3 would not know)
    (snap,) = SnapshotStore(tmp_path / "s").write({"fed": 1}, journal=1)
    assert_new_framing(snap.path, b"S")
    assert MAGIC == b"CAYUGAS\x02"


def test_the_length_is_under_the_crc_in_every_kind(tmp_path):
    """A record whose length and CRC were both changed to agree with a shorter
    payload (as the journal's old CRC of the payload alone allowed) is refused."""
    j = Journal(tmp_path / "j", "write")
    for i in range(2):
        j.append([ev(i)], "s", i + 1)
    j.close()
    path = tmp_path / "j" / segment_name(1)
    data = bytearray(path.read_bytes())
    head_end = 8 + 8 + int.from_bytes(data[8:12], "little")
    last = head_end + 8 + int.from_bytes(data[head_end:head_end + 4], "little")
    n = int.from_bytes(data[last:last + 4], "little")
    short = bytes(data[last + 8:last + 8 + n - 1])  # one byte less, with the payload's own CRC
    data[last:last + 8] = struct.pack("<II", n - 1, zlib.crc32(short))
    path.write_bytes(bytes(data))
    j = Journal(tmp_path / "j", "write")
    assert j.torn == 1 and j.appended == 1
    j.close()


def test_a_snapshot_in_several_records_reads_back_and_refuses_every_tear_and_flip():
    state = {"fed": 3, "values": list(range(200))}
    data = encode(state, chunk=97)
    assert data.startswith(MAGIC) and decode(data) == state
    for cut in range(len(data)):
        with pytest.raises(SnapshotError):
            decode(data[:cut])
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        with pytest.raises(SnapshotError):
            decode(bytes(bad))


@settings(examples(3))
@given(payloads=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8), data=st.data())
def test_the_scan_yields_the_records_before_the_first_damaged_one_and_never_a_damaged_one(payloads, data):
    """Records framed by this test's own code; torn at any offset or one byte
    flipped: the scan yields exactly the whole records before the damage, and
    ``good`` is where they end."""
    frames = []
    for p in payloads:
        length = struct.pack("<I", len(p))
        frames.append(length + struct.pack("<I", zlib.crc32(p, zlib.crc32(length))) + p)
    assert [frame(p) for p in payloads] == frames
    buf = b"".join(frames)
    ends = [sum(map(len, frames[:k + 1])) for k in range(len(frames))]
    at = data.draw(st.integers(0, len(buf) - 1), label="offset")
    if data.draw(st.booleans(), label="torn"):
        damaged = buf[:at]
    else:
        damaged = bytearray(buf)
        damaged[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        damaged = bytes(damaged)
    whole = sum(1 for e in ends if e <= at)  # the records that end before the damage
    scan = Scan(damaged)
    got = [bytes(p) for _, p in scan]
    assert got == payloads[:whole]
    assert scan.good == (ends[whole - 1] if whole else 0)
    assert (scan.problem is None) == (scan.good == len(damaged))


def test_a_file_of_another_kind_or_a_newer_framing_is_refused_with_what_it_is(tmp_path):
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / segment_name(1)).write_bytes(b"CAYUGAW\x02" + b"\0" * 20)
    with pytest.raises(FramingError, match="a witness-log segment, not a journal segment: move it out"):
        Journal(tmp_path / "j", "write")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "wit-000000000001.log").write_bytes(b"CAYUGAW\x05" + b"\0" * 20)
    with pytest.raises(FramingError, match="framing version 5, which this Cayuga does not read"):
        WitnessLog(tmp_path / "w")
    with pytest.raises(SnapshotError, match="framing version 9"):
        decode(b"CAYUGAS\x09" + b"\0" * 20)


# --------------------------------------------------------------------------- the journal before the one framing


OLD_JOURNAL = [  # (first position, header's senders, records)
    (1, {}, [("a", 2, [ev(1), ev(2)]), (None, None, [ev(3)]), ("b", 1, [])]),
    (4, {"a": 2, "b": 1}, [("a", 3, [ev(4, "MSFT")]), ("b", 5, [ev(5), ev(6)])]),
]


def _write_old_journal(d, segments=OLD_JOURNAL):
    d.mkdir(parents=True, exist_ok=True)
    for first, senders, recs in segments:
        (d / segment_name(first)).write_bytes(old_journal_segment(first, senders, recs))


def _expected(segments=OLD_JOURNAL):
    out, pos = [], 1
    for _, _, recs in segments:
        for sender, done, events in recs:
            out.append((pos, events, sender, done))
            pos += 1
    return out


@pytest.mark.parametrize("mode", ["write", "fsync"])
def test_a_journal_of_the_older_framing_is_replayed_whole_and_goes_on_in_the_new(tmp_path, mode):
    d = tmp_path / "j"
    _write_old_journal(d)
    old = {p.name: p.read_bytes() for p in d.iterdir()}
    j = Journal(d, mode)
    assert j.torn == 0 and j.appended == 5 and j.senders == {"a": 3, "b": 5}
    assert list(j.replay(0)) == _expected()
    assert j.append([ev(7)], "a", 4) == 6
    j.close()
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.name in old} == old  # left as they were
    assert_new_framing(d / segment_name(6), b"J")
    j = Journal(d, mode)
    assert j.torn == 0 and j.appended == 6 and j.senders == {"a": 4, "b": 5}
    assert list(j.replay(0)) == _expected() + [(6, [ev(7)], "a", 4)]
    assert j.truncate_before(6) == 2 and j.oldest() == 6
    j.close()


def test_a_torn_tail_of_the_older_journal_framing_is_cut_at_every_offset(tmp_path):
    d = tmp_path / "j"
    _write_old_journal(d)
    path = d / segment_name(4)
    data = path.read_bytes()
    last_start = len(old_journal_segment(4, {"a": 2, "b": 1}, OLD_JOURNAL[1][2][:1]))
    for cut in range(last_start, len(data)):
        for p in d.iterdir():
            if p.name != segment_name(1):
                p.unlink()
        path.write_bytes(data[:cut])
        j = Journal(d, "write")
        assert j.torn == (1 if cut > last_start else 0), cut
        assert j.appended == 4 and j.senders == {"a": 3, "b": 1}
        assert list(j.replay(0)) == _expected()[:4]
        assert path.stat().st_size == last_start
        assert j.append([ev(9)], "b", 2) == 5  # in a new segment, in the new framing
        j.close()
        assert_new_framing(d / segment_name(5), b"J")
        j = Journal(d, "write")
        assert j.torn == 0 and [p for p, *_ in j.replay(0)] == [1, 2, 3, 4, 5] and j.senders == {"a": 3, "b": 2}
        j.close()


def test_a_newest_older_journal_segment_of_only_its_header_is_replaced_keeping_the_senders(tmp_path):
    d = tmp_path / "j"
    segments = OLD_JOURNAL + [(6, {"a": 3, "b": 5}, [])]
    _write_old_journal(d, segments)
    (d / segment_name(1)).unlink()  # deleted after a snapshot: the sender table lives in the headers
    j = Journal(d, "write")
    assert j.appended == 5 and j.senders == {"a": 3, "b": 5}
    assert_new_framing(d / segment_name(6), b"J")
    assert j.append([ev(8)], "c", 9) == 6
    j.close()
    assert not list(d.glob("*.new"))
    (d / (segment_name(7) + ".new")).write_bytes(b"CAYUGAJ\x02")  # a replacement a crash left behind
    (d / segment_name(4)).unlink()  # the new segment's header holds the table
    j = Journal(d, "write")
    assert j.senders == {"a": 3, "b": 5, "c": 9} and [p for p, *_ in j.replay(0)] == [6]
    assert not list(d.glob("*.new"))
    j.close()


# --------------------------------------------------------------------------- the witness log before it


def _write_old_witlog(d):
    """Two segments: the first's checkpoint holds ``gone``, whose witnesses were deleted by retention."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "wit-000000000004.log").write_bytes(old_witlog_segment(
        {"gone": 7}, [[wit("a", 1), wit("a", 2), wit("b", 1, "Other")], [wit("a", 3)]]))
    (d / "wit-000000000005.log").write_bytes(old_witlog_segment(
        {"gone": 7, "a": 3, "b": 1}, [[wit("b", 2, "Other"), wit("a", 4)]]))


def test_a_witness_log_of_the_older_framing_is_read_whole_and_goes_on_in_the_new(tmp_path):
    d = tmp_path / "w"
    _write_old_witlog(d)
    wl = WitnessLog(d)
    assert wl.truncated == 0
    assert wl.last_seqs() == {"gone": 7, "a": 4, "b": 2}  # no witness renumbered
    assert list(wl.read("a")) == [(n, b'{"n":%d}' % n) for n in (1, 2, 3, 4)]
    assert list(wl.read_stream("Other")) == [("b", 1, b'{"n":1}'), ("b", 2, b'{"n":2}')]
    assert wl.append([wit("a", 4), wit("a", 5), wit("gone", 8)]) == [wit("a", 5), wit("gone", 8)]
    wl.close()
    assert_new_framing(d / "wit-000000000006.log", b"W")
    wl = WitnessLog(d)
    assert wl.last_seqs() == {"gone": 8, "a": 5, "b": 2}
    assert [n for n, _ in wl.read("a")] == [1, 2, 3, 4, 5]
    assert list(wl.read("gone", 8)) == [(8, b'{"n":8}')] and wl.first_seq("gone") == 8
    wl.close()


def test_a_torn_tail_of_the_older_witness_log_framing_is_cut_at_every_offset(tmp_path):
    d = tmp_path / "w"
    _write_old_witlog(d)
    path = d / "wit-000000000005.log"
    data = path.read_bytes()
    good = len(old_witlog_segment({"gone": 7, "a": 3, "b": 1}, []))
    for cut in range(good, len(data)):
        for p in d.iterdir():
            if p.name != "wit-000000000004.log":
                p.unlink()
        path.write_bytes(data[:cut])
        wl = WitnessLog(d)
        assert wl.truncated == cut - good and path.stat().st_size == good, cut
        assert wl.last_seqs() == {"gone": 7, "a": 3, "b": 1}
        assert [n for n, _ in wl.read("a")] == [1, 2, 3]
        wl.append([wit("a", 4)])
        wl.close()
        assert_new_framing(d / "wit-000000000006.log", b"W")
        wl = WitnessLog(d)
        assert [n for n, _ in wl.read("a")] == [1, 2, 3, 4] and wl.truncated == 0
        wl.close()


# --------------------------------------------------------------------------- snapshots before it


def test_snapshots_of_the_older_framing_load_and_a_torn_one_is_skipped(tmp_path):
    store = SnapshotStore(tmp_path)
    older = tmp_path / f"snapshot-0000000001-j{10:020d}.bin"
    newer = tmp_path / f"snapshot-0000000002-j{20:020d}.bin"
    older.write_bytes(old_snapshot({"fed": 1}))
    data = old_snapshot({"fed": 2, "values": [("IBM", 1.5, None)]})
    newer.write_bytes(data)
    state, f = store.load_latest()
    assert state == {"fed": 2, "values": [("IBM", 1.5, None)]} and f.journal == 20
    for cut in range(len(data)):  # torn in the old format: the older one stands in
        newer.write_bytes(data[:cut])
        state, f = store.load_latest()
        assert state == {"fed": 1} and f.journal == 10, cut
    assert store.corrupt == len(data)
    kept = store.write({"fed": 3}, journal=30)  # the next one is written in the new framing
    assert_new_framing(kept[0].path, b"S")
    assert store.load_latest()[0] == {"fed": 3}


# --------------------------------------------------------------------------- a real server on an older directory


def _new_records(data: bytes) -> list[bytes]:
    """The records of a file of the one framing, read by this test's own code (each CRC checked)."""
    out, pos = [], 8
    while pos < len(data):
        n, crc = struct.unpack_from("<II", data, pos)
        body = data[pos + 8:pos + 8 + n]
        assert len(body) == n and zlib.crc32(body, zlib.crc32(data[pos:pos + 4])) == crc
        out.append(body)
        pos += 8 + n
    return out


def to_older_framing(data_dir) -> int:
    """Rewrite every file of the one framing under ``data_dir`` as the code before it wrote it;
    returns how many files were rewritten."""
    done = 0
    for p in (data_dir / "journal").glob("*.journal"):
        data = p.read_bytes()
        if data[:8] == b"CAYUGAJ\x02":
            p.write_bytes(b"".join(old_journal_record(r) for r in _new_records(data)))
            done += 1
    for p in (data_dir / "witnesses").glob("wit-*.log"):
        data = p.read_bytes()
        if data[:8] in (b"CAYUGAW\x02", b"CAYUGAW\x03", b"CAYUGAW\x04"):  # (none of its records of kind 3 or 4 here)
            p.write_bytes(data[8:])  # the same records, without the file header
            idx = p.with_suffix(".idx")
            if idx.exists():  # offsets as they were without the header, in the JSON index of then
                seg = Segment(0, p)
                seg.take_index(load_index(idx.read_bytes()))
                idx.write_text(json.dumps({
                    "size": seg.size - 8, "records": seg.records,
                    "subs": {s: [v.first_seq, v.first_off - 8, v.last_seq] for s, v in seg.subs.items()},
                    "streams": {k: sorted(v) for k, v in seg.streams.items()}}))
            done += 1
    for p in (data_dir / "snapshots").glob("snapshot-*.bin"):
        data = p.read_bytes()
        if data[:8] == b"CAYUGAS\x02":
            head, *pieces = _new_records(data)
            payload = b"".join(pieces)
            assert struct.unpack("<Q", head) == (len(payload),)
            p.write_bytes(b"CAYUGASNAP1\n" + struct.pack(">QI", len(payload), zlib.crc32(payload)) + payload)
            done += 1
    return done


def test_a_real_server_recovers_a_data_directory_of_the_older_framing(tmp_path):
    """``cayuga serve`` on a data directory rewritten in the framings before the
    one framing: after kill -9 (the journal replayed, its witnesses already in
    the witness log), and after a graceful stop (the snapshot's partial
    matches): the witnesses keep their numbers and new ones number on."""
    from tests.server.test_crash import PROFILES, README_WITNESSES, Server, post_readme_example, wait_for

    data = tmp_path / "data"
    srv = Server(data, tmp_path / "server.log", PROFILES["defaults"])
    try:
        srv.start()
        srv.wait_up()
        sid = post_readme_example(srv)
        srv.kill()
        assert to_older_framing(data) == 2  # a journal segment and a witness-log segment
        srv.start()
        health = srv.wait_up()
        assert health["recovered"].get("replayed_events") == 6, health["recovered"]
        assert srv.last_seq(sid) == 2
        assert [(n, json.loads(w)) for n, w in srv.logged(sid, 2)] == list(enumerate(README_WITNESSES, 1))
        srv.proc.terminate()  # a graceful stop writes a snapshot
        assert srv.proc.wait(60) == 0
        newest = srv.snapshots()[-1].name
        assert to_older_framing(data) >= 3  # the snapshot, and the segments begun in this life
        srv.start()
        health = srv.wait_up()
        recovered = health["recovered"]
        assert recovered["snapshot"] == newest and recovered["instances"] > 0, recovered
        assert recovered["replayed_records"] == 0, recovered  # the partial matches come from the snapshot
        assert srv.last_seq(sid) == 2
        # IBM at 96: 5% above the quotes at 90 and 91 still waiting: two new witnesses, numbered 3 and 4
        more = {"stream": "Stock", "t0": 33900000, "t1": 33900000, "Name": "IBM", "Price": 96.0, "Volume": 1}
        r = srv.http_client.post("/events", json=[more])
        assert r.status_code == 202 and not r.json().get("rejected"), r.text
        wait_for("the new witnesses", lambda: srv.last_seq(sid) == 4, 30)
        got = srv.logged(sid, 4)
        assert [(n, json.loads(w)) for n, w in got[:2]] == list(enumerate(README_WITNESSES, 1))
        assert [n for n, _ in got] == [1, 2, 3, 4]
    finally:
        srv.stop()
    assert "Traceback" not in srv.log.read_text()
