"""The payloads an engine worker writes beside the witness log (server/durability/witside.py)
and the witness log's records that refer to them (kind 3): read back by cursors as the
batch records are, found again when the log is opened, counted by retention and deleted
with the last segment that refers to them, synced before the records, and a payload file
that lost its end read as gaps, never as other witnesses. A worker that cannot write its
file (a real full tmpfs) sends the payloads to the main process as before."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.msgpack import encode

from server.delivery.encoding import Columns, pack_flat
from server.delivery import witnesses as delivery
from server.delivery.witnesses import read_parts
from server.durability import framing, fsio
from server.durability.framing import FramingError
from server.durability.witlog import Gap, WitnessLog
from server.durability.witrecords import RUNS, SIDE, parse, runs_columns, unpack_runs
from server.durability.witside import SideReader, SideWriter, listing
from tests.conftest import examples
from tests.server.tmpfs import fill, tmpfs


def witnesses(sids: list[str], first: dict[str, int], stream: str = "Out") -> tuple[list, list, list, list]:
    """Columns of one witness per entry of ``sids``, numbered on from ``first`` (changed)."""
    seqs = []
    for s in sids:
        first[s] = first.get(s, 0) + 1
        seqs.append(first[s])
    payloads = [b'{"s":"%s","n":%d}' % (s.encode(), n) for s, n in zip(sids, seqs)]
    return sids, seqs, [stream] * len(sids), payloads


def append_side(wl: WitnessLog, writer: SideWriter, cols: tuple, kind: int = RUNS) -> None:
    """Append ``cols`` as the main process does a worker's batch whose payloads the worker wrote:
    each subscription's witnesses together (as a worker packs them), told per subscription (kind
    4), or with ``kind`` 3 a sid, seq and stream a witness (as the Cayuga before wrote them)."""
    first = list(dict.fromkeys(cols[0]))
    order = sorted(range(len(cols[0])), key=lambda i: first.index(cols[0][i]))
    sids, seqs, streams, payloads = ([col[i] for i in order] for col in cols)
    ref = tuple(writer.write(encode(payloads)))
    owners = list(dict.fromkeys(sids))
    firsts = [seqs[sids.index(s)] for s in owners]
    lasts = [seqs[len(sids) - 1 - sids[::-1].index(s)] for s in owners]
    if kind == SIDE:
        body = (b"\x94", encode(sids), encode(seqs), encode(streams), encode(ref))
    else:
        kinds = [sts[0] if len(set(sts)) == 1 else sts
                 for sts in ([t for s, t in zip(sids, streams) if s == o] for o in owners)]
        counts = [b - a + 1 for a, b in zip(firsts, lasts)]
        body = (b"\x95", encode(owners), encode(firsts), encode(counts), encode(kinds), encode(ref))
    wl.append_packed(body, len(sids), wl.numbers.array(owners), np.array(firsts), np.array(lasts),
                     wl.numbers.array(sids), wl.stream_numbers.array(streams), ref, kind=kind)


def read_all(wl: WitnessLog, sid: str) -> list:
    cur = wl.cursor(sid=sid, after={sid: wl.first_seq(sid) - 1})  # (from the first one retained)
    try:
        out = []
        while got := cur.read():
            out += [(n, p) for _, n, p in got]
        return out
    finally:
        cur.close()


def test_a_writer_frames_each_batch_and_starts_a_new_file_when_one_is_full(tmp_path):
    w = SideWriter(tmp_path, 3, max_bytes=200)
    refs = [w.write(encode([b"x" * 50, b"%d" % i])) for i in range(8)]
    w.close()
    assert len({r.name for r in refs}) > 2 and all(r.name.startswith("side-w3-") for r in refs)
    assert sorted(p.name for p in listing(tmp_path)) == sorted({r.name for r in refs})
    for p in listing(tmp_path):
        assert p.read_bytes()[:8] == framing.file_header(framing.PAYLOADS)
    r = SideReader(tmp_path, max_open=2)
    for i, ref in enumerate(refs):
        payload = r.read(ref)
        assert bytes(payload) == encode([b"x" * 50, b"%d" % i])
    r.close()
    assert SideWriter(tmp_path, 3).tag != w.tag  # a restarted worker never appends to its predecessor's files


@pytest.mark.parametrize("kind", [RUNS, SIDE])
def test_side_records_read_back_as_batch_records_do_and_survive_reopening(tmp_path, kind):
    """Both kinds of record that refer to a worker's payloads: told per subscription (kind 4,
    what this Cayuga writes), and a witness each (kind 3, in a segment of the framing before,
    sealed when the log is opened)."""
    wl = WitnessLog(tmp_path / "w")
    w = SideWriter(tmp_path / "w", 0)
    seqs: dict[str, int] = {}
    wl.append([("a", 1, "Out", b'{"inline":1}')])
    seqs["a"] = 1
    append_side(wl, w, witnesses(["a", "b", "a", "c"], seqs), kind)
    append_side(wl, w, witnesses(["b", "c"], seqs, stream="Other"), kind)
    append_side(wl, w, (["d", "d", "d"], [1, 2, 3], ["Out", "Other", "Out"], [b'{"d":1}', b'{"d":2}', b'{"d":3}']),
                kind)  # (one subscription on two streams, in a batch of its own)
    expect_a = [(1, b'{"inline":1}'), (2, b'{"s":"a","n":2}'), (3, b'{"s":"a","n":3}')]
    expect_d = [(1, b'{"d":1}'), (2, b'{"d":2}'), (3, b'{"d":3}')]
    assert read_all(wl, "a") == expect_a and read_all(wl, "d") == expect_d
    assert read_all(wl, "c") == [(1, b'{"s":"c","n":1}'), (2, b'{"s":"c","n":2}')]  # (after others' in each batch)
    assert [(s, n) for s, n, _ in wl.read_stream("Other")] == [("b", 2), ("c", 2), ("d", 2)]
    assert wl.publishers("Other") == {"b", "c", "d"}
    # the record holds no payload: only where the worker wrote them
    (seg,) = sorted((tmp_path / "w").glob("wit-*.log"))
    data = bytearray(seg.read_bytes())
    assert data[:8] == b"CAYUGAW\x04" and b'"s":"a"' not in data
    kinds, runs = [], []
    pos = framing.file_kind(data, framing.WITNESS_LOG, "seg")
    while (rec := parse(data, pos, len(data))) is not None:
        kinds.append(rec[0])
        if rec[0] == RUNS:
            runs.append(unpack_runs(rec[4])[:4])
        pos = rec[-1]
    assert kinds.count(kind) == 3
    if kind == RUNS:  # told per subscription: its sid, first seq, count and stream(s) once
        assert runs == [(["a", "b", "c"], [2, 1, 1], [2, 1, 1], ["Out"] * 3),
                        (["b", "c"], [2, 2], [1, 1], ["Other"] * 2),
                        (["d"], [1], [3], [["Out", "Other", "Out"]])]
    weight = wl.bytes
    assert weight > len(data)  # the payloads referred to count as the log's
    w.close()
    wl.close()
    if kind == SIDE:
        data[7] = 3  # as the Cayuga before wrote them
        seg.write_bytes(bytes(data))
    wl = WitnessLog(tmp_path / "w")  # the active segment scanned again (one of the framing before: sealed)
    assert read_all(wl, "a") == expect_a and read_all(wl, "d") == expect_d
    assert [(s, n) for s, n, _ in wl.read_stream("Out")][-2:] == [("d", 1), ("d", 3)]
    assert wl.last_seqs() == {"a": 3, "b": 2, "c": 2, "d": 3}
    assert wl.publishers("Other") == {"b", "c", "d"} and wl.publishers("Out") == {"a", "b", "c", "d"}
    assert wl.first_seq("a") == 1 and wl.first_seq("d") == 1
    if kind == RUNS:
        assert wl.bytes == weight and len(list((tmp_path / "w").glob("wit-*.log"))) == 1
    else:  # sealed, and a new segment begun (its checkpoint)
        assert wl.bytes > weight and len(list((tmp_path / "w").glob("wit-*.log"))) == 2
    assert listing(tmp_path / "w")  # referred to: kept
    wl.close()


def test_a_sealed_segment_keeps_its_payload_files_in_its_index_and_retention_deletes_them_with_it(tmp_path):
    d = tmp_path / "w"
    wl = WitnessLog(d, max_bytes=40_000, segment_bytes=4096)
    w = SideWriter(d, 0, max_bytes=3000)
    seqs: dict[str, int] = {}
    for _ in range(200):
        append_side(wl, w, witnesses(["a", "b"] * 10, seqs))
    assert wl.segments > 3 and wl.dropped > 0  # segments sealed (with the payloads' bytes) and deleted
    assert wl.bytes <= 40_000 + 4096 + 3000
    files = {p.name for p in listing(d)}
    referred = {name for seg, _ in wl.segments_copy() for name in seg.side}
    # nothing the retained segments refer to was deleted; nothing else is kept but the writer's newest
    assert referred <= files and files - referred <= {w._name}
    first = wl.first_seq("a")
    got = read_all(wl, "a")
    assert [n for n, _ in got] == list(range(first, seqs["a"] + 1))
    assert all(type(p) is bytes for _, p in got)
    w.close()
    wl.close()
    wl = WitnessLog(d, max_bytes=40_000, segment_bytes=4096)  # the sealed segments' indexes say the same
    assert {name for seg, _ in wl.segments_copy() for name in seg.side} == referred
    assert {p.name for p in listing(d)} == referred  # the writer's newest, if no segment refers to it: gone
    assert [n for n, _ in read_all(wl, "a")] == list(range(first, seqs["a"] + 1))
    wl.close()


def test_a_restarted_workers_predecessors_files_are_deleted_once_no_segment_refers_to_them(tmp_path):
    """The newest file of each worker is kept while no segment refers to it (its next batch may);
    a restarted worker writes files of its own, and its predecessor's go like any other."""
    d = tmp_path / "w"
    wl = WitnessLog(d, max_bytes=20_000, segment_bytes=4096)
    seqs: dict[str, int] = {}
    dead = SideWriter(d, 0, max_bytes=3000)
    for _ in range(30):
        append_side(wl, dead, witnesses(["a", "b"] * 10, seqs))
    dead.close()  # killed: a new process, a new tag
    assert any(p.name.startswith(f"side-{dead.tag}-") for p in listing(d))
    again = SideWriter(d, 0, max_bytes=3000)
    for _ in range(100):
        append_side(wl, again, witnesses(["a", "b"] * 10, seqs))
    assert wl.dropped > 0
    assert not any(p.name.startswith(f"side-{dead.tag}-") for p in listing(d))
    assert {p.name for p in listing(d)} - {name for seg, _ in wl.segments_copy() for name in seg.side} <= {again._name}
    again.close()
    wl.close()


def test_a_reader_lets_go_of_the_files_retention_deletes(tmp_path):
    """A reader (the main process's for watched subscriptions, a cursor's) holds its files open;
    one that retention deleted took its room on disk until it was closed. The log now tells its
    readers, from the thread that deletes, and each closes those files at its next read."""
    d = tmp_path / "w"
    wl = WitnessLog(d, max_bytes=20_000, segment_bytes=4096)
    w = SideWriter(d, 0, max_bytes=3000)
    seqs: dict[str, int] = {}
    reader, idle = wl.side_reader(), wl.side_reader()
    refs = []
    for _ in range(6):
        refs.append(tuple(w.write(encode([b"x" * 600, b"y"]))))
        append_side(wl, w, witnesses(["a", "b"] * 10, seqs))
    for ref in refs:
        assert reader.payloads(ref) == [b"x" * 600, b"y"]
    first = refs[0][0]
    assert first in reader.held()
    for _ in range(200):
        append_side(wl, w, witnesses(["a", "b"] * 10, seqs))
    assert not (d / first).exists() and wl.dropped > 0
    assert first not in reader.held()  # (closed: its room given back)
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # (the listing's own, closed)
            pass
    assert not any("side-" in link and link.endswith(" (deleted)") for link in links)
    newest = append_side_ref(wl, w, seqs)
    assert reader.payloads(newest) == [b"z"]  # (and it reads on)
    assert not idle._gone  # a reader that holds none of the files deleted keeps nothing of them
    reader.close()
    w.close()
    wl.close()


def test_a_file_deleted_while_a_reader_opens_it_is_read_and_not_kept(tmp_path, monkeypatch):
    """Retention deletes a file between a reader's opening it and listing it as held: the log's
    word (forget) came before the reader held it, so the reader finds it deleted itself."""
    import server.durability.witside as witside

    d = tmp_path / "w"
    d.mkdir()
    w = SideWriter(d, 0)
    ref = tuple(w.write(encode([b"p", b"q"])))
    w.close()

    def open_then_deleted(path, mode):
        f = open(path, mode)
        os.unlink(path)
        return f

    monkeypatch.setattr(witside, "open", open_then_deleted, raising=False)
    reader = SideReader(d)
    assert reader.payloads(ref) == [b"p", b"q"]
    assert reader.held() == []
    reader.close()


def append_side_ref(wl: WitnessLog, w: SideWriter, seqs: dict) -> tuple:
    ref = tuple(w.write(encode([b"z"])))
    append_side(wl, w, witnesses(["a"], seqs))
    return ref


def test_payload_files_only_set_aside_segments_refer_to_are_set_aside_with_them(tmp_path):
    """Recovery sets aside (``*.dropped``) the segments after a hole a power cut made; reopening
    the log then deleted the payload files only they referred to, as orphans, and they could no
    longer be read whole. Those files are now set aside with them; the others stay."""
    d = tmp_path / "w"
    wl = WitnessLog(d, segment_bytes=4096)
    w = SideWriter(d, 0, max_bytes=2000)
    seqs: dict[str, int] = {}
    for _ in range(60):
        append_side(wl, w, witnesses(["a"] * 10, seqs))
    w.close()
    segs = [(seg.path.name, set(seg.side)) for seg, _ in wl.segments_copy()]
    wl.close()
    assert len(segs) >= 3
    before = {p.name for p in listing(d)}
    first = d / segs[0][0]
    first.write_bytes(first.read_bytes()[:-7])  # a torn record at its end: a hole before the next
    wl = WitnessLog(d, segment_bytes=4096)
    assert wl.set_aside_after_holes({"a": 0}) == len(segs) - 1
    kept = segs[0][1]
    only_set_aside = set().union(*(names for _, names in segs[1:])) - kept
    assert only_set_aside
    assert {p.name for p in listing(d)} == kept & before
    assert {p.name for p in d.iterdir() if p.name.startswith("side-") and p.name.endswith(".dropped")} == {
        n + ".dropped" for n in only_set_aside}
    for name, _ in segs[1:]:
        assert (d / (name + ".dropped")).exists()
    wl.close()
    wl = WitnessLog(d, segment_bytes=4096)  # (opened again: nothing set aside is taken for an orphan)
    assert {p.name for p in d.iterdir() if p.name.endswith(".dropped") and p.name.startswith("side-")} == {
        n + ".dropped" for n in only_set_aside}
    wl.close()


def test_payloads_no_record_refers_to_are_deleted_when_the_log_is_opened(tmp_path):
    """A worker killed after it wrote a batch's payloads and before the main process logged it."""
    d = tmp_path / "w"
    wl = WitnessLog(d)
    w = SideWriter(d, 0)
    seqs: dict[str, int] = {}
    append_side(wl, w, witnesses(["a", "b"], seqs))
    kept = w._name
    orphan = SideWriter(d, 1)
    orphan.write(encode([b"{}"]))
    orphan.close()
    w.close()
    wl.close()
    wl = WitnessLog(d)
    assert [p.name for p in listing(d)] == [kept]
    assert read_all(wl, "b") == [(1, b'{"s":"b","n":1}')]
    wl.close()


def test_sync_makes_the_payload_files_and_their_entries_durable_before_the_records(tmp_path, monkeypatch):
    """A record never outlives the payloads it refers to: ``sync`` fsyncs the payload files
    referred to since the last one first, and the directory when a worker created one."""
    d = tmp_path / "w"
    wl = WitnessLog(d)
    w = SideWriter(d, 0)
    seqs: dict[str, int] = {}
    append_side(wl, w, witnesses(["a", "b"], seqs))
    wl.sync()
    synced = []
    real_open, real_fsync = fsio.open, fsio.fsync
    opened: dict[int, str] = {}

    def spy_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        opened[fd] = str(path)
        return fd

    monkeypatch.setattr(fsio, "open", spy_open)
    monkeypatch.setattr(fsio, "fsync", lambda fd: (synced.append(opened.get(fd, "?")), real_fsync(fd)))
    w2 = SideWriter(d, 1)  # another worker's file: a new entry in the log's directory
    append_side(wl, w2, witnesses(["a", "b"], seqs))
    wl.sync()
    names = [p.rsplit("/", 1)[-1] for p in synced]
    assert names[0] == w2._name and names[-1] == "w" and any(n.startswith("wit-") for n in names)
    synced.clear()
    append_side(wl, w2, witnesses(["a", "b"], seqs))
    wl.sync()  # the same file again: no new entry
    assert [p.rsplit("/", 1)[-1] for p in synced][0] == w2._name and not any(p.endswith("/w") for p in synced)
    synced.clear()
    wl.sync()  # nothing referred to since: no payload file synced
    assert not any(p.endswith(".dat") for p in synced)
    monkeypatch.undo()
    w.close()
    w2.close()
    wl.close()


def test_payloads_lost_with_the_end_of_their_file_are_read_as_gaps(tmp_path):
    """A power cut kept the record and not the end of the payload file it refers to: each
    witness of it is handed on as a gap (and counted), never as another's payload; the
    witnesses after it are read as they are."""
    d = tmp_path / "w"
    wl = WitnessLog(d)
    w = SideWriter(d, 0)
    seqs: dict[str, int] = {}
    append_side(wl, w, witnesses(["a", "b"], seqs))
    append_side(wl, w, witnesses(["a", "b"], seqs))
    w.close()
    path = d / w._name
    path.write_bytes(path.read_bytes()[:-3])  # the second batch's payloads cut short
    w2 = SideWriter(d, 0)
    append_side(wl, w2, witnesses(["a", "b"], seqs))
    cur = wl.cursor(sid="a")
    got = cur.read()
    assert got[0] == ("a", 1, b'{"s":"a","n":1}')
    assert got[1] == ("a", 2, Gap(2, 2)) and cur.gaps == 1
    assert got[2] == ("a", 3, b'{"s":"a","n":3}')
    cur.close()
    w2.close()
    wl.close()


@pytest.mark.parametrize("sealed", [False, True])
def test_records_that_refer_past_the_end_of_a_payload_file_are_cut_off_as_a_torn_tail_when_opened(tmp_path, sealed):
    """A power cut kept the log's records and not the end of the payload file they refer to
    (nothing orders unsynced writes to two files): when the log is opened, the first record that
    refers past the end is where the segment's tail is cut, in the active segment and in a sealed
    one (its index says where its references end). The numbers go back to what the log holds,
    so that recovery makes those witnesses again (witgaps.py), and the next segment's checkpoint
    shows the hole (a sealed one's, for recovery to set aside: witholes.py)."""
    d = tmp_path / "w"
    wl = WitnessLog(d, segment_bytes=4096 if sealed else 1 << 20)
    w = SideWriter(d, 0)
    seqs: dict[str, int] = {}
    append_side(wl, w, witnesses(["a", "b"], seqs))
    keep = (d / w._name).stat().st_size
    for _ in range(3):
        append_side(wl, w, witnesses(["a", "b"], seqs))
    if sealed:
        while wl.segments < 2:
            wl.append([("c", seqs.setdefault("c", 0) + 1, "Out", b"x" * 200)])
            seqs["c"] += 1
    w.close()
    wl.close()
    first = sorted(d.glob("wit-*.log"))[0]
    assert (first.with_suffix(".idx").exists()) == sealed
    with open(d / w._name, "r+b") as f:
        f.truncate(keep + 5)  # the second batch's payloads cut short, the later ones gone
    wl = WitnessLog(d, segment_bytes=4096 if sealed else 1 << 20)
    assert wl.truncated > 0
    got = read_all(wl, "a")
    assert [n for n, p in got if type(p) is bytes] == [1]
    if sealed:
        assert got[1:] == [(4, Gap(2, 4))]
        assert wl.gaps()["a"] == [(2, 4)]  # between the segments: the next one's checkpoint numbers past
    else:
        assert wl.last_seq("a") == 1 and wl.last_seq("b") == 1  # numbered on from what the log holds
    wl.close()


def test_a_segment_of_the_framing_before_is_sealed_and_the_log_goes_on_in_one_of_version_4(tmp_path):
    d = tmp_path / "w"
    wl = WitnessLog(d)
    wl.append([("a", 1, "Out", b"{}")])
    wl.close()
    (seg,) = d.glob("wit-*.log")
    data = bytearray(seg.read_bytes())
    data[7] = 2  # as the Cayuga before this one wrote it (the same records)
    seg.write_bytes(bytes(data))
    wl = WitnessLog(d)
    w = SideWriter(d, 0)
    append_side(wl, w, witnesses(["a", "b"], {"a": 1}))
    segs = sorted(d.glob("wit-*.log"))
    assert len(segs) == 2 and segs[0].read_bytes()[7] == 2 and segs[1].read_bytes()[7] == 4
    assert [n for n, _ in read_all(wl, "a")] == [1, 2]
    w.close()
    wl.close()
    data[7] = 5
    seg.write_bytes(bytes(data))
    with pytest.raises(FramingError, match="framing version 5"):
        WitnessLog(d)


@pytest.mark.parametrize("witnesses_n", [10, 40, 70_000])
def test_the_watched_subscriptions_payloads_are_read_alone_and_equal_the_batchs(tmp_path, witnesses_n, monkeypatch):
    """The main process reads only the payloads of the few subscriptions a client watches, by
    the sizes the worker sends (witnesses.py's read_parts): the same streams and payloads as
    unpacking the whole batch, for payloads of each MessagePack bin size (up to 255 bytes, up
    to 65,535, more), arrays of each header size (under 16 items, under 65,536, more), and an
    owner whose witnesses are on several streams. Sizes that do not add up are not trusted."""
    owners = [f"s{i}" for i in range(witnesses_n // 5)]
    counts = [5] * len(owners)
    kinds, sids, streams, payloads = [], [], [], []
    for i, sid in enumerate(owners):
        sts = ["Out"] * 5 if i % 7 else ["Out", "Alt", "Out", "Out", "Alt"]
        kinds.append("Out" if i % 7 else sts)
        sids += [sid] * 5
        streams += sts
        for j in range(5):
            n = (i * 5 + j) % 97
            size = 300 if n == 3 else 70_000 if n == 5 and witnesses_n < 1000 else 10 + n
            payloads.append(b"%s.%d:" % (sid.encode(), j) + b"x" * size)
    w = SideWriter(tmp_path, 0)
    cols = pack_flat((owners, counts, kinds, sids, streams, payloads), side=w.write)
    w.close()
    assert cols.ref is not None and len(cols.sizes) == 4 * len(payloads)
    reader = SideReader(tmp_path)
    cols.reader = reader.payloads
    wanted = sorted({0, 1, len(owners) // 2, len(owners) - 1})
    owner_ends = np.cumsum(counts)
    if witnesses_n < 100:  # more than a sixteenth of the witnesses wanted: read whole, by default
        assert read_parts(cols, wanted, [kinds[i] for i in wanted], owner_ends, reader) is None
        monkeypatch.setattr(delivery, "SPAN_SHARE", 0.5)
        wanted = wanted[:1]
    got = read_parts(cols, wanted, [kinds[i] for i in wanted], owner_ends, reader)
    assert got is not None
    whole = Columns(owners, counts, kinds, encode(sids), encode((streams, payloads)))
    assert got == whole.parts_at(wanted)
    assert read_parts(cols, list(range(len(owners))), kinds, owner_ends, reader) is None  # (all of them)
    bad = Columns(owners, counts, kinds, cols.sids, cols.rest, ref=cols.ref, sizes=cols.sizes[:-4] + b"\0\0\0\0")
    assert read_parts(bad, wanted, [kinds[i] for i in wanted], owner_ends, reader) is None
    reader.close()


def test_a_worker_that_cannot_write_its_payloads_sends_them_as_before(tmp_path):
    """pack_flat with a writer on a full tmpfs: the columns are those packed without one (the
    main process then meets the full disk itself), and the writer goes on once there is room."""
    flat = (["a", "b"], [2, 1], ["Out", "Out"], ["a", "a", "b"], ["Out"] * 3, [b"{1}", b"{2}", b"{3}"])
    plain = pack_flat(flat)
    with tmpfs(tmp_path, "1m") as mnt:
        w = SideWriter(mnt, 0)
        got = pack_flat(flat, side=w.write)
        assert got.ref is not None and bytes(got.rest) == bytes(got.sids) == b""  # (the owners' alone)
        reader = SideReader(mnt)
        got.reader = reader.payloads
        assert got.groups() == plain.groups()
        reader.close()
        ballast = fill(mnt)
        big = (["a", "b"], [1, 1], ["Out", "Out"], ["a", "b"], ["Out"] * 2, [b"x" * 300_000] * 2)
        full = pack_flat(big, side=w.write)
        assert full.ref is None and bytes(full.rest) == bytes(pack_flat(big).rest)
        ballast.unlink()
        again = pack_flat(flat, side=w.write)
        assert again.ref is not None
        w.close()
    one = pack_flat((["a"], [3], ["Out"], ["a"] * 3, ["Out"] * 3, [b"{1}", b"{2}", b"{3}"]), side=w.write)
    assert one.ref is None  # (one subscription's batch: a few witnesses, sent as they are)
    assert isinstance(one, Columns)


@examples(2, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 1000), st.booleans()), max_size=30))
def test_a_record_told_per_subscription_reads_as_a_witness_each(runs):
    """witrecords.runs_columns: a kind 4 record's columns are, witness by witness, what a kind 3
    record of the same batch holds (a subscription on several streams among them), by array passes."""
    owners = [f"s{i}" for i in range(len(runs))]
    firsts = [first for _, first, _ in runs]
    counts = [n for n, _, _ in runs]
    kinds = [[f"T{j % 2}" for j in range(n)] if several else "Out" for n, _, several in runs]
    sids, seqs, streams = [], [], []
    for sid, (n, first, several), kind in zip(owners, runs, kinds):
        sids += [sid] * n
        seqs += range(first, first + n)
        streams += kind if several else [kind] * n
    ref = ("side-w0-x.dat", 8, 100)
    assert runs_columns(unpack_runs(encode((owners, firsts, counts, kinds, ref)))) == (sids, seqs, streams, ref)


@pytest.mark.parametrize("runs, why", [
    ((["a", "b"], [1], [1, 1], ["Out", "Out"]), "differ in length"),
    ((["a"], [1], [0], ["Out"]), "not positive"),
    ((["a"], [1], [2], [["Out"]]), "not as many as its witnesses"),
])
def test_a_record_told_per_subscription_that_is_not_whole_is_refused(runs, why):
    with pytest.raises(ValueError, match=why):
        runs_columns((*runs, ("side-w0-x.dat", 8, 100)))
