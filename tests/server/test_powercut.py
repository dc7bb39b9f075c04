"""Power cuts: what a real ``cayuga serve`` recovers from the disk a power cut
leaves at a random point, where every write and every directory entry not yet
fsynced is gone (tests/server/powercut.py builds that disk from a record of
the run's file operations, the method of ALICE, OSDI 2014). ``kill -9`` keeps
the page cache, and the failing-fsync tests see a sync that errors, not one
that never happened: neither shows this.

A case: a data directory with four subscriptions (NEXT, FOLD, a filter and a
chain that reads its output) is set up and stopped; then a server runs on it,
recording every change its journal, witness log and snapshot writers (the
engine worker's forked children included) make, while a sender with a
``#sender`` id sends a stream of ticks and marks each ``#ack`` it receives in
the same record; snapshots are frequent, so cuts fall between them, while one
is written and just after one is published. The server's witness log at the
end is the reference. For each cut (just after an acknowledgement, just after
a snapshot is published, just before a witness-log or snapshot file is synced,
anywhere), the disk at the cut is written out, by the
harshest model (only what was fsynced), with a random prefix of each file's
and directory's unsynced changes kept, or (just before a sync) with the file
about to be synced holding only what it had synced and everything else kept; a fresh server recovers from it, the
sender resumes from its ``#resume N`` and sends the rest; then every
subscription's witness log, served from ``?from=1``, must be the reference:
the same witnesses with the same numbers, each once.

- ``durability: fsync``: ``#resume N`` is at least every acknowledgement made
  before the cut: nothing acknowledged is lost, nothing is delivered twice;
- ``durability: write``: acknowledged events may be lost, but only those
  acknowledged since the newest snapshot published before the cut began (the
  README: the journal is synced each time a snapshot is published); the
  sender sends them again; nothing is delivered twice.

Cuts per durability: 4 (the default and ci Hypothesis profiles: about 25 s
each), 24 under the long profile (``CAYUGA_HYPOTHESIS_PROFILE=long``), or
``CAYUGA_POWERCUT_CUTS``; events 2,000, 6,000 under long, or
``CAYUGA_POWERCUT_EVENTS``. ``CAYUGA_POWERCUT_SEED``
replays a run (the seed is printed).
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings

from air.engine import Event
from clients.testing import ServerProcess, cayuga_env, logged_witnesses, wait_until
from clients.testing.servers import UP
from server.durability import fsio
from server.durability.journal import Journal
from tests.server import powercut

LONG = settings.get_current_profile_name() == "long"  # the Hypothesis profile (tests/conftest.py) decides
CUTS = int(os.environ.get("CAYUGA_POWERCUT_CUTS") or (24 if LONG else 4))
EVENTS = int(os.environ.get("CAYUGA_POWERCUT_EVENTS") or (6000 if LONG else 2000))
SEED = int(os.environ.get("CAYUGA_POWERCUT_SEED") or random.randrange(1 << 30))
SITE = Path(__file__).resolve().parent / "powercut_site"
#: frequent snapshots; small journal and witness-log segments, so that segments are started, sealed and
#: deleted (the witness log is kept whole: about 170 bytes an event here; its segments are an eighth of it)
SETTINGS = {"CAYUGA_SNAPSHOT_SECONDS": "0.2", "CAYUGA_SNAPSHOT_EVENTS": "150", "CAYUGA_JOURNAL_SEGMENT_BYTES": "8192",
            "CAYUGA_WITNESS_LOG_BYTES": str(400 * EVENTS)}
QUERIES = [
    "SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
    "NEXT{$1.Name = $2.Name AND $2.Price >= 1.02 * $1.Price} Stock PUBLISH Rising",
    "SELECT * FROM (SELECT Name, Price FROM FILTER{Volume >= 500}(Stock)) "
    "FOLD{$1.Name = $2.Name, $2.Price > $.Price AND DUR < 40,} "
    "(SELECT Name, Price FROM FILTER{Volume >= 500}(Stock)) PUBLISH Climb",
    "SELECT Name, Price FROM FILTER{Volume >= 800}(Stock) PUBLISH Big",
    "SELECT Name, Price_1 AS First, Price AS Second FROM Big NEXT{$1.Name = $2.Name} Big PUBLISH BigPair",
]


class AckSender:
    """A TCP sender with ``#sender`` and ``#ack`` whose reader calls ``on_ack(n)``
    the moment an ``#ack n`` line arrives."""

    def __init__(self, port: int, sender_id: str, on_ack=None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.on_ack = on_ack
        self.errors: list[str] = []
        self.ended = False
        self.cond = threading.Condition()
        try:
            self.sock.sendall(f"#sender {sender_id}\n#ack\n".encode())
            buf = b""
            while b"\n" not in buf:
                chunk = self.sock.recv(65536)
                assert chunk, "the server closed the connection before #resume"
                buf += chunk
            line, _, buf = buf.partition(b"\n")
            assert line.startswith(b"#resume "), line
        except BaseException:
            self.sock.close()
            raise
        self.resume = self.acked = int(line.split()[1])
        self.thread = threading.Thread(target=self._read, args=(buf,), name="powercut-acks", daemon=True)
        self.thread.start()

    def _read(self, buf: bytes) -> None:
        while True:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"#ack "):
                    n = int(line[5:])
                    if self.on_ack is not None:
                        self.on_ack(n)
                    with self.cond:
                        self.acked = max(self.acked, n)
                        self.cond.notify_all()
                elif line:
                    self.errors.append(line.decode(errors="replace"))
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def send(self, lines: list[str]) -> None:
        self.sock.sendall("".join(line + "\n" for line in lines).encode())

    def wait_acked(self, n: int, timeout: float = 60) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.acked >= n or self.ended, timeout)
            assert self.acked >= n, f"acknowledged {self.acked} of {n} lines; errors {self.errors[-3:]}"

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(30)
        self.sock.close()


def ticks(rng: random.Random, n: int) -> list[str]:
    t, out = 1000, []
    for _ in range(n):
        t += rng.choice((0, 0, 1, 1, 2, 5))  # many simultaneous ticks
        out.append(json.dumps({"stream": "Stock", "t0": t, "t1": t, "Name": rng.choice("ABC"),
                               "Price": round(rng.uniform(90, 110), 1), "Volume": rng.randint(1, 1000)}))
    return out


def serve(data: Path, log: Path, durability: str, record: Path | None = None, where: str = "") -> ServerProcess:
    """A server on ``data``, its recovery over; recording into ``record`` if
    given; after a cut (``where`` says which) it must have recovered healthy:
    a witness log with gaps, for one, makes /health degraded."""
    settings = {**SETTINGS, "CAYUGA_DURABILITY": durability}
    if record is not None:  # the sitecustomize in powercut_site records, in the server and its worker
        settings.update(POWERCUT_LOG=str(record), POWERCUT_ROOT=str(data),
                        PYTHONPATH=os.pathsep.join([str(SITE), cayuga_env()["PYTHONPATH"]]))
    srv = ServerProcess(data, log, settings)
    srv.start()
    try:
        health = wait_until(lambda: (h := srv.health()) and h["status"] != "starting" and not h.get("replay_remaining")
                            and h, 60, what="the server to finish its recovery")
        assert health["status"] in UP, (f"{where or data}: the server recovered {health['status']}: "
                                        f"{health.get('reasons')}; witness gaps: {health.get('witness_gaps')}")
    except BaseException:
        srv.stop()
        raise
    return srv


def send_all(srv: ServerProcess, lines: list[str], sender: AckSender, rng: random.Random | None = None) -> None:
    """The lines after ``sender.resume``, in blocks; every one acknowledged and taken by the engine."""
    at = sender.resume
    while at < len(lines):
        block = lines[at:at + (rng.randint(1, 60) if rng else 500)]
        sender.send(block)
        at += len(block)
        if rng:  # the stream spread over time, so that snapshots fall between its blocks
            time.sleep(0.01)
            if rng.random() < 0.5:
                sender.wait_acked(at)  # sometimes in step with the acknowledgements, so cuts find them
    sender.wait_acked(len(lines))
    wait_until(lambda: (h := srv.health())["events_taken"] >= len(lines) and not h["replay_remaining"], 60,
               what=f"the engine to take the {len(lines)} events")


def witness_logs(srv: ServerProcess) -> dict[str, list[tuple[int, str]]]:
    out = {}
    for sub in srv.http_client.get("/subscriptions").json():
        last = srv.http_client.get(f"/subscriptions/{sub['id']}").json()["last_seq"]
        out[sub["id"]] = logged_witnesses(srv.base_url, sub["id"], last)
    return out


def cuts(records: list[tuple], rng: random.Random, n: int) -> list[tuple[str, int]]:
    """(why, cut): just after an acknowledgement, just after a snapshot is published
    (the snapshots directory synced after a rename into it), just before a
    witness-log or snapshot file is synced (when the most is written and not
    synced: the end of a sealed segment and the start of the next, or an engine
    worker's payloads and the records that refer to them), and anywhere."""
    acks = [i + 1 for i, r in enumerate(records) if r[0] == "mark"]
    published = [i + 1 for i, r in enumerate(records)
                 if r[0] == "sync" and r[3] and r[2] == "snapshots"
                 and any(x[0] == "rename" and x[2].startswith("snapshots") for x in records[max(i - 3, 0):i])]
    unsynced = [i for i, r in enumerate(records) if r[0] == "sync" and not r[3] and not r[2].startswith("journal")]
    sealed = [i for i in unsynced if i + 1 < len(records)  # (the recording may end with such a sync)
              and records[i + 1][0] == "sync" and records[i + 1][2].startswith("witnesses/wit-")
              and records[i][2].startswith("witnesses/wit-") and records[i + 1][2] > records[i][2]]
    # before the sync of an engine worker's payload file, the records that refer to them written (witside.py)
    side = [i for i in unsynced if records[i][2].startswith("witnesses/side-")]
    unsynced = (sealed + side) or unsynced  # before the sync of a sealed segment, a newer one written: the most at stake
    assert acks and published, f"the run made {len(acks)} acknowledgements and published {len(published)} snapshots"
    kinds = [("after an ack", acks), ("after a snapshot was published", published),
             ("before a witness log or snapshot sync", unsynced), ("anywhere", list(range(len(records) + 1)))]
    return [(kinds[k % 4][0], rng.choice(kinds[k % 4][1])) for k in range(n)]


def acked_before_last_snapshot(records: list[tuple], cut: int) -> int:
    """The acknowledgements marked before the newest snapshot published (its
    rename into snapshots/ and that directory's sync) before record ``cut``
    began (its file opened): the journal was synced past them before it was
    published, whatever the durability (server/durability/checkpoints.py)."""
    floor = 0
    for i, r in enumerate(records[:cut]):
        if r[0] == "sync" and r[3] and r[2] == "snapshots":
            for x in records[max(i - 3, 0):i]:
                if x[0] == "rename" and x[1].endswith(".tmp") and x[2].endswith(".bin"):
                    began = max(j for j in range(i) if records[j][0] == "open" and records[j][1] == x[1])
                    floor = max([floor] + [m[2] for m in records[:began] if m[0] == "mark"])
    return floor


def disk_model(k: int) -> str:
    """The disk model of the ``k``-th cut: the first four (CI) take the harshest
    after an acknowledgement and anywhere, a prefix of the unsynced changes
    after a publish, and before a sync the file about to be synced losing what
    it was to make durable while every other file keeps all (``reorder``: the
    end of a sealed witness-log segment lost, the next segment kept); the next
    four the other way round (a prefix before a sync), ..."""
    first = ("sync", "prefix", "reorder", "sync")[k % 4]
    return first if (k // 4) % 2 == 0 else {"sync": "prefix", "prefix": "sync", "reorder": "prefix"}[first]


def test_the_disk_at_a_cut_holds_what_was_synced_and_at_most_what_was_written(tmp_path, monkeypatch):
    """The harness itself, in this process: a journal (``write``: nothing is
    synced but by sync()) records 3 events, syncs, records 2 more in a new
    segment. Cut after the last record, the harshest disk holds the 3 events
    (the new segment's name was never synced: it is gone); a disk that keeps a
    prefix of what was not synced holds 3 to 5, never a record misread. (The
    journal's directory, created by the journal, is there after a cut only
    because fsio.makedirs syncs its parent: without that the harshest disk
    held no journal at all.)"""
    root = tmp_path / "data"
    root.mkdir()
    (root / "before").write_bytes(b"on disk before the recording")  # durable: in every disk after a cut
    record = tmp_path / "record.bin"
    rec = powercut.Recorder(str(record), str(root))
    for name in powercut.NAMES:
        monkeypatch.setattr(fsio, name, getattr(rec, name))
    tree = powercut.snapshot_tree(root)
    j = Journal(root / "journal", "write", segment_bytes=150)
    for i in range(3):
        j.append([Event("Stock", ("A", 1.0, i), i, i)], "s", i + 1)
    j.sync()
    for i in range(3, 5):
        j.append([Event("Stock", ("A", 1.0, i), i, i)], "s", i + 1)
    j.close()
    assert len(j.segments) >= 2
    records = powercut.read_log(record)
    monkeypatch.undo()  # the journals below read the disks without recording
    kept = set()
    for k in range(30):
        model = "sync" if k == 0 else "prefix"
        disk = tmp_path / f"cut{k}"
        powercut.materialize(powercut.disk_at(tree, records, len(records), model, random.Random(k)), disk)
        assert (disk / "before").read_bytes() == b"on disk before the recording"
        back = Journal(disk / "journal", "write")
        try:
            events = [e.values[2] for r in back.replay(0) for e in r.events]
        finally:
            back.close()
        assert events == list(range(len(events))) and back.senders.get("s", 0) == len(events), (model, events)
        assert 3 <= len(events) <= 5, (model, events)
        if model == "sync":
            assert len(events) == 3
        kept.add(len(events))
    assert 3 in kept and max(kept) > 3  # the prefixes do keep unsynced records, sometimes


@pytest.mark.parametrize("durability", ["fsync", "write"])
def test_a_power_cut_loses_nothing_acknowledged_and_delivers_nothing_twice(tmp_path, durability):
    rng = random.Random(SEED)
    print(f"CAYUGA_POWERCUT_SEED={SEED}: {EVENTS} events, {CUTS} cuts, durability {durability}")
    lines, data, record = ticks(rng, EVENTS), tmp_path / "data", tmp_path / "record.bin"
    srv = serve(data, tmp_path / "setup.log", durability)  # the subscriptions, then a graceful stop
    try:
        for q in QUERIES:
            r = srv.http_client.post("/subscriptions", json={"cel": q})
            assert r.status_code == 201, r.text
    finally:
        srv.stop()
    os.sync()
    tree, store = powercut.snapshot_tree(data), powercut.store_rows(data / "cayuga.sqlite3", tmp_path / "store0")
    srv = serve(data, tmp_path / "recorded.log", durability, record)
    try:
        sender = AckSender(srv.tcp_port, "pc", on_ack=lambda n: powercut.mark(str(record), "ack", n))
        try:
            send_all(srv, lines, sender, rng)
        finally:
            sender.close()
        reference = witness_logs(srv)
    finally:
        srv.kill()  # what comes after the last record does not matter
        srv.stop()
    assert all(reference.values()) and len(reference) == len(QUERIES), {k: len(v) for k, v in reference.items()}
    assert powercut.store_rows(data / "cayuga.sqlite3", tmp_path / "store1") == store, \
        "the store changed while recording: the power-cut model holds it as it was"
    records = powercut.read_log(record)
    lost = []
    for k, (why, cut) in enumerate(cuts(records, rng, CUTS)):
        model = disk_model(k)
        acked = max([r[2] for r in records[:cut] if r[0] == "mark"], default=0)
        where = (f"cut {k} ({why}, record {cut} of {len(records)}, {model} model, {acked} lines acknowledged "
                 f"before it; CAYUGA_POWERCUT_SEED={SEED})")
        disk = tmp_path / f"cut{k}"
        powercut.materialize(powercut.disk_at(tree, records, cut, model, rng), disk)
        srv = serve(disk, tmp_path / f"cut{k}.log", durability, where=where)
        try:
            sender = AckSender(srv.tcp_port, "pc")
            try:
                if durability == "fsync":
                    assert sender.resume >= acked, f"{where}: the server has {sender.resume} lines after recovery"
                else:  # what the README says write may lose: what was acknowledged since the last snapshot
                    floor = acked_before_last_snapshot(records, cut)
                    assert sender.resume >= floor, (f"{where}: the server has {sender.resume} lines after recovery; "
                                                    f"{floor} were acknowledged before the last snapshot began")
                lost.append(acked - min(sender.resume, acked))
                send_all(srv, lines, sender)
            finally:
                sender.close()
            got = witness_logs(srv)
        finally:
            srv.stop()
        for sid, want in reference.items():
            assert got.get(sid) == want, (
                f"{where}: subscription {sid}: {len(got.get(sid, []))} witnesses logged, {len(want)} in the "
                f"run without a cut; first difference at "
                f"{next((i for i, (a, b) in enumerate(zip(got.get(sid, []), want)) if a != b), None)}")
        text = (tmp_path / f"cut{k}.log").read_text()
        assert "Traceback" not in text, f"{where}:\n{text[-3000:]}"
    print(f"acknowledged lines lost per cut ({durability}): {lost}")
