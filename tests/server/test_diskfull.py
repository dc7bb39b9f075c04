"""A full disk under the journal, the witness log and snapshots (issue 19),
on a real, tiny tmpfs filled with a file: a write that does not fit is cut
back to the last whole record and refused (DiskFull), nothing half written is
followed by later records, and writing simply works again once space is freed.
The process-level test (a real ``cayuga serve``) is test_diskfull_serve.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from air.engine import Event
from clients.client import CayugaClient
from server.durability import fsio
from server.durability.diskfull import DiskFull, DiskState
from server.durability.journal import Journal
from server.durability.snapshot import SnapshotStore, Snapshotter
from server.durability.witlog import WitnessLog
from server.ingest.queue import DelayQueue
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings
from tests.server.test_acks import Raw
from tests.server.tmpfs import fill, free_space, tmpfs
from server.observability.counters import Count


def ev(t1: int, name: str = "IBM") -> Event:
    return Event("Stock", (name, 1.5, 7), t1, t1)


def block(first: int, n: int) -> list[Event]:
    """``n`` events with a long name each: one record of about n * 300 bytes."""
    return [ev(first + i, "X" * 256) for i in range(n)]


def segment_sizes(j: Journal) -> list[int]:
    return [p.stat().st_size for p in j.segments]


@pytest.mark.parametrize("mode", ["write", "fsync"])
def test_a_journal_append_that_does_not_fit_is_cut_back_refused_and_retried(tmp_path, mode):
    with tmpfs(tmp_path, "1m") as mnt:
        disk = DiskState()
        j = Journal(mnt / "journal", mode, disk=disk)
        try:
            assert j.append(block(0, 3), "s", 3) == 1
            filler = fill(mnt)
            assert free_space(mnt) == 0
            before, appended = segment_sizes(j), j.appended
            for attempt in range(3):  # it stays refused while the disk is full, never half written
                with pytest.raises(DiskFull) as info:
                    j.append(block(10, 40), "s", 43)  # ~12 KB: more than the last page's slack
                assert segment_sizes(j) == before
            exc = info.value
            assert str(exc) == "disk full: the journal could not be written (No space left on device)"
            assert exc.part == "journal" and exc.path.startswith(str(mnt))
            assert j.appended == appended and j.senders == {"s": 3} and j.write_failures == 3
            assert disk.failing("journal") is exc and "No space left" in disk.current()["journal"]["error"]
            filler.unlink()  # space returns: the next append simply works
            assert j.append(block(10, 40), "s", 43) == 2
            assert disk.failing("journal") is None and j.failure is None
            assert j.wait_durable(2, 10)
        finally:
            j.close()
        j = Journal(mnt / "journal", mode)
        try:
            assert j.torn == 0  # nothing to cut: no half record was left in the middle
            got = [(pos, len(evs), sender, done) for pos, evs, sender, done in j.replay(0)]
            assert got == [(1, 3, "s", 3), (2, 40, "s", 43)]
            assert j.senders == {"s": 43}
        finally:
            j.close()


def test_a_journal_segment_that_cannot_be_started_is_removed_and_the_old_one_kept(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        j = Journal(mnt / "journal", "write", segment_bytes=2048)
        try:
            j.append(block(0, 10), "s", 10)  # past segment_bytes: the next append starts a segment
            fill(mnt)
            with pytest.raises(DiskFull) as info:
                j.append(block(10, 40), "s", 50)
            assert "journal" in str(info.value) and j.appended == 1
            assert [p.name for p in j.segments] == [p.name for p in sorted((mnt / "journal").iterdir())]
            assert len(j.segments) == 1  # the new segment's file was removed again
            (mnt / "filler").unlink()
            assert j.append(block(10, 40), "s", 50) == 2
            assert len(j.segments) == 2
        finally:
            j.close()
        j = Journal(mnt / "journal", "write", segment_bytes=2048)
        try:
            assert j.torn == 0
            assert [(p, len(e)) for p, e, _s, _d in j.replay(0)] == [(1, 10), (2, 40)]
        finally:
            j.close()


def test_the_queue_keeps_nothing_of_a_part_the_journal_refused(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        q = DelayQueue(1000, delay=0)
        q.journal = j = Journal(mnt / "journal", "write")
        try:
            assert q.put_batch(block(0, 2), meta=lambda end: ("s", end)) == []
            filler = fill(mnt)
            with pytest.raises(DiskFull) as info:
                q.put_batch(block(2, 60), meta=lambda end: ("s", 2 + end))
            assert info.value.first_refused == 0
            assert len(q) == 2 and q.accepted == 2 and q.progress("s") == 2 and j.appended == 1
            filler.unlink()
            assert q.put_batch(block(2, 60), meta=lambda end: ("s", 2 + end)) == []
            assert len(q) == 62 and q.progress("s") == 62
        finally:
            j.close()


def test_a_journal_sync_that_fails_keeps_the_flusher_alive_and_refuses_appends(tmp_path, monkeypatch):
    """fdatasync failing (ENOSPC on a file system that allocates at writeback):
    tmpfs never fails a sync, so this one is injected (through the durable files'
    seam, server/durability/fsio.py)."""
    real = fsio.fdatasync
    failing = threading.Event()
    failing.set()

    def fdatasync(fd):
        if failing.is_set():
            raise OSError(28, "No space left on device")
        return real(fd)

    disk = DiskState()
    j = Journal(tmp_path / "journal", "fsync", disk=disk)
    try:
        monkeypatch.setattr(fsio, "fdatasync", fdatasync)
        pos = j.append([ev(1)], "s", 1)
        assert not j.wait_durable(pos, 10)  # gives up at the failure, not at the timeout
        assert j.durable() < pos
        with pytest.raises(DiskFull, match="the journal could not be synced"):
            j.append([ev(2)], "s", 2)
        assert disk.failing("journal") is not None
        failing.clear()
        deadline = time.monotonic() + 10  # the flusher tries again (RETRY_SECONDS) and lives on
        while j.sync_failure is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert j.wait_durable(pos, 10)
        assert j.append([ev(2)], "s", 2) == pos + 1
        assert j.wait_durable(pos + 1, 10) and disk.failing("journal") is None
    finally:
        monkeypatch.setattr(fsio, "fdatasync", real)
        j.close()


def _batch(first: int, n: int, sid: str = "s1") -> tuple[list, list, list, list]:
    payload = b'{"stream":"Out","v":"' + b"y" * 400 + b'"}'
    return [sid] * n, list(range(first, first + n)), ["Out"] * n, [payload] * n


def test_a_witness_log_append_that_does_not_fit_is_cut_back_and_can_be_tried_again(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        disk = DiskState()
        wl = WitnessLog(mnt / "witnesses", disk=disk)
        try:
            assert wl.append_columns(*_batch(1, 3)) == []
            filler = fill(mnt)
            seg = mnt / "witnesses" / "wit-000000000001.log"
            size = seg.stat().st_size
            for _ in range(2):
                with pytest.raises(DiskFull) as info:
                    wl.append_columns(*_batch(4, 40))  # ~17 KB
                assert seg.stat().st_size == size
            assert str(info.value) == "disk full: the witness log could not be written (No space left on device)"
            assert wl.last_seq("s1") == 3 and wl.appended == 3 and disk.failing("witness_log") is not None
            filler.unlink()
            assert wl.append_columns(*_batch(4, 40)) == []  # the same batch, held and tried again
            assert wl.last_seq("s1") == 43 and disk.failing("witness_log") is None
        finally:
            wl.close()
        wl = WitnessLog(mnt / "witnesses")
        try:
            assert wl.truncated == 0
            assert [seq for seq, _ in wl.read("s1")] == list(range(1, 44))
        finally:
            wl.close()


def test_a_witness_log_segment_that_cannot_be_started_is_started_by_a_later_append(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        wl = WitnessLog(mnt / "witnesses")
        first = mnt / "witnesses" / "wit-000000000001.log"
        try:
            wl.append_columns(*_batch(1, 7))
            size = first.stat().st_size
            assert size < 4096 - 600  # the next small batch fits in the slack of the file's last page
            wl.segment_bytes = size + 1  # ... and fills the segment: it is sealed, the next one cannot start
            filler = fill(mnt)
            assert wl.append_columns(*_batch(8, 1)) == []
            assert wl.segments == 1 and first.stat().st_size > size  # sealed; no second segment on disk
            assert sorted(p.name for p in (mnt / "witnesses").iterdir()) == [first.name]
            with pytest.raises(DiskFull):  # the next append must start it: refused, nothing left behind
                wl.append_columns(*_batch(9, 1))
            assert sorted(p.name for p in (mnt / "witnesses").iterdir()) == [first.name]
            filler.unlink()
            assert wl.append_columns(*_batch(9, 1)) == []
            assert wl.segments == 2 and wl.last_seq("s1") == 9
        finally:
            wl.close()
        wl = WitnessLog(mnt / "witnesses")
        try:
            assert wl.truncated == 0 and [s for s, _ in wl.read("s1")] == list(range(1, 10))
        finally:
            wl.close()


def test_a_snapshot_that_cannot_be_written_leaves_no_file_and_is_reported(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        disk = DiskState()
        store = SnapshotStore(mnt / "snapshots")
        fill(mnt)
        state = {"blob": os.urandom(200_000)}
        with pytest.raises(OSError):
            store.write(state, 7)  # the shutdown snapshot, in this process
        assert list((mnt / "snapshots").iterdir()) == []
        snap = Snapshotter(store, disk=disk)
        assert snap.fork(threading.Lock(), lambda: 7, lambda: state)  # a periodic one, in a forked child
        assert snap.wait(30)
        assert snap.failed == 1 and snap.taken == 0
        assert list((mnt / "snapshots").iterdir()) == []
        assert store.load_latest() is None
        assert "disk full: a snapshot could not be written" in disk.current()["snapshot"]["error"]
        (mnt / "filler").unlink()
        assert snap.fork(threading.Lock(), lambda: 7, lambda: state)
        assert snap.wait(30) and snap.taken == 1
        assert disk.failing("snapshot") is None
        assert store.load_latest()[0] == state


# ---------------------------------------------------------------------- a real server, in this process


def ticks(start: int, end: int, t: int | None = None) -> str:
    """Data lines numbered start..end (inclusive), at time ``t`` (default: the server stamps them)."""
    at = {} if t is None else {"t0": t, "t1": t}
    return "".join(json.dumps({"stream": "Stock", "Name": f"N{i % 7}", "Price": float(i), "Volume": i, **at}) + "\n"
                   for i in range(start, end + 1))


def _resume(port: int, sender: str) -> tuple[Raw, int]:
    """Connect as ``sender`` (retrying while its last connection is still ending); the connection and N of #resume N."""
    deadline = time.monotonic() + 10
    while True:
        c = Raw(port)
        c.send(f"#sender {sender}\n#ack\n")
        answer = c.line()
        if answer.startswith("#resume "):
            return c, int(answer.split()[1])
        c.close()
        assert answer.startswith(f"error: sender {sender} is already connected") and time.monotonic() < deadline
        time.sleep(0.05)


def test_a_tcp_sender_is_told_disk_full_and_from_which_line_and_resumes_there(tmp_path):
    with tmpfs(tmp_path, "2m") as mnt:
        srv = RunningServer(make_settings(tmp_path, data_dir=mnt / "data", durability="write")).start()
        try:
            port, journal = srv.daemon.receiver.port, srv.daemon.journal
            c, resume = _resume(port, "feed")
            assert resume == 0
            c.send(ticks(1, 100))
            while c.line() != "#ack 100":
                pass
            filler = fill(mnt)
            for attempt in range(3):  # refused each time, the same way, while the disk is full
                c.send(ticks(resume + 1, 2000))
                said = [x for x in c.rest() if not x.startswith("#ack")]
                c.close()
                n = journal.senders["feed"] + 1  # where the journal stands: the line the sender goes on from
                assert 100 < n <= 2000
                assert said == [f"error: disk full: the journal could not be written (No space left on device); "
                                f"nothing from line {n} on was accepted; retry later"]
                c, resume = _resume(port, "feed")
                assert resume == n - 1
            assert srv.daemon.disk.episodes == 1  # logged once, not per line or per connection
            assert srv.daemon.disk.current()["journal"]["failures"] >= 3
            health = httpx.get(srv.base_url + "/health").json()
            assert health["status"] == "degraded" and "journal could not be written" in health["reason"]
            metrics = httpx.get(srv.base_url + "/metrics").text
            assert 'cayuga_disk_full_refusals_total{source="tcp"} 3.0' in metrics
            assert 'cayuga_disk_full{part="journal"} 1.0' in metrics

            other = tmp_path / "other.jsonl"  # cayuga send gives up after --retry-for, saying why
            other.write_text(ticks(1, 2000))
            send = [sys.executable, "-m", "clients.cli", "send", str(other), "--url", srv.base_url, "--port",
                    str(port), "--sender-id", "other"]
            done = subprocess.run([*send, "--retry-for", "1"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 1
            assert ("gave up after 1 s of retries: the server's disk is full: the journal could not be written "
                    "(No space left on device); nothing from line 1 on was accepted; retry later") in done.stderr

            filler.unlink()  # space returns: the sender goes on where the server said, no restart
            c.send(ticks(resume + 1, 2000))
            while c.line() != "#ack 2000":
                pass
            c.close()
            done = subprocess.run([*send, "--retry-for", "30"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert httpx.get(srv.base_url + "/health").json()["status"] == "ok"
            volumes = [e.values[2] for _p, evs, sender, _d in journal.replay(0) if sender == "feed" for e in evs]
            assert volumes == list(range(1, 2001))  # each line exactly once, in order
        finally:
            srv.stop()
    assert_no_cayuga_threads()


def test_witnesses_the_log_cannot_take_are_held_not_delivered_and_a_stop_leaves_them_to_the_journal(tmp_path):
    """The engine holds a batch the witness log refused: no client gets it; a
    stop meanwhile ends within the shutdown timeout, writes no snapshot, and
    the next start (space back) produces, logs and delivers those witnesses."""
    query = "SELECT Name, Price, Volume FROM FILTER{Volume >= 10}(Stock) PUBLISH Big\n"
    with tmpfs(tmp_path, "4m") as mnt:
        settings = make_settings(tmp_path, data_dir=mnt / "data", durability="write", delay=1500,
                                 shutdown_timeout=3)
        srv = RunningServer(settings).start()
        stopped = False
        try:
            with CayugaClient(srv.base_url) as api:
                sid = api.subscribe(cel=query)["id"]
            got: list[str] = []
            connected = threading.Event()

            def watch() -> None:  # a live client, until the server closes it (1001 at the stop)
                with CayugaClient(srv.base_url) as api, api.frames(sid, batch=1000, timeout=60) as frames:
                    connected.set()
                    for msg in frames:
                        got.extend(msg.split("\n"))

            watcher = threading.Thread(target=watch)
            watcher.start()
            assert connected.wait(10)
            c, _ = _resume(srv.daemon.receiver.port, "feed")
            # one time for all: held back 1.5 s by the delay (journaled, not processed yet), then released in
            # full batches, each with more witnesses than the slack of the witness log's last page takes
            c.send(ticks(1, 3000, t=int(time.time() * 1000)))
            while c.line() != "#ack 3000":
                pass
            c.close()
            filler = fill(mnt)  # the witness log cannot take them when they come out
            deadline = time.monotonic() + 30
            while not srv.daemon.counters.get(Count.WITNESS_LOG_ERRORS):
                assert time.monotonic() < deadline, "the engine never met the full witness log"
                time.sleep(0.01)
            assert srv.daemon.witlog.last_seq(sid) == 0
            r = httpx.post(srv.base_url + "/subscriptions", json={"cel": query.replace("Big", "Other")})
            assert r.status_code == 507 and "the witness log could not be written, and the engine waits" \
                in r.json()["detail"], r.text
            # a registration whose check passed just before the hold began (the suite at 2 workers met one):
            # answered 507 as soon as the hold is seen, not after the disk has room again (nor a timeout)
            registrar, checks = srv.daemon.registrar, []
            real_check = registrar._require_ready
            registrar._require_ready = lambda: checks.append(1) if len(checks) == 0 else real_check()
            try:
                r = httpx.post(srv.base_url + "/subscriptions", json={"cel": query.replace("Big", "Late")}, timeout=20)
            finally:
                registrar._require_ready = real_check
            assert len(checks) == 1 and r.status_code == 507 and "the engine waits" in r.json()["detail"], r.text
            assert [s["id"] for s in httpx.get(srv.base_url + "/subscriptions").json()] == [sid]
            health = httpx.get(srv.base_url + "/health").json()
            assert health["status"] == "degraded" and "witness log could not be written" in health["reason"]
            begun = time.monotonic()
            srv.stop()
            stopped = True
            watcher.join(30)
            assert not watcher.is_alive()
            assert got == []  # nothing reached the client that is not in the log
            assert time.monotonic() - begun < settings.shutdown_timeout + 5
            assert srv.daemon.witnesses.unlogged > 0
            assert list((mnt / "data" / "snapshots").glob("*.bin")) == []  # no snapshot past unlogged witnesses
            filler.unlink()
            srv = RunningServer(settings).start()
            stopped = False
            expected = [i for i in range(1, 3001) if i >= 10]
            with CayugaClient(srv.base_url) as api, api.frames(sid, from_=1, batch=1000, timeout=30) as frames:
                logged = []
                while len(logged) < len(expected):
                    logged += next(frames).split("\n")
            seqs = [int(x.split(" ", 1)[0]) for x in logged]
            volumes = [json.loads(x.split(" ", 1)[1])["Volume"] for x in logged]
            assert seqs == list(range(1, len(expected) + 1)) and volumes == expected
        finally:
            if not stopped:
                srv.stop()
    assert_no_cayuga_threads()


def test_changes_the_store_cannot_write_answer_507_and_leave_nothing_behind(tmp_path):
    query = "SELECT Name, Price FROM FILTER{Volume >= 10}(Stock) PUBLISH Big\n"
    with tmpfs(tmp_path, "4m") as mnt:
        settings = make_settings(tmp_path, data_dir=mnt / "data")
        srv = RunningServer(settings).start()
        try:
            api = httpx.Client(base_url=srv.base_url, timeout=30)
            kept = api.post("/subscriptions", json={"cel": query}).json()["id"]
            filler = fill(mnt)
            r = api.post("/subscriptions", json={"cel": query.replace("Big", "Other")})
            assert r.status_code == 507, r.text
            assert r.json()["detail"].startswith("disk full: 1 subscription(s) could not be stored; none was "
                                                 "registered (database or disk is full)"), r.text
            assert [s["id"] for s in api.get("/subscriptions").json()] == [kept]
            assert not srv.daemon.engine.has_owner("s2")  # not kept in memory either
            r = api.post("/streams", json={"name": "Trade", "schema": {"Sym": "string"}})
            assert r.status_code == 507 and "stream Trade could not be stored" in r.json()["detail"], r.text
            assert api.get("/streams/Trade").status_code == 404
            r = api.delete(f"/subscriptions/{kept}")
            assert r.status_code == 507 and "nothing was deleted" in r.json()["detail"], r.text
            assert [s["id"] for s in api.get("/subscriptions").json()] == [kept]
            health = api.get("/health").json()
            assert health["status"] == "degraded" and "database or disk is full" in health["reason"]
            assert health["disk_full"]["store"]["path"] == str(mnt / "data" / "cayuga.sqlite3")
            filler.unlink()
            deadline = time.monotonic() + 10  # the store is probed again: /health is ok without any change
            while api.get("/health").json()["status"] != "ok":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert api.post("/subscriptions", json={"cel": query.replace("Big", "Other")}).json()["id"] == "s2"
            api.close()
        finally:
            srv.stop()
        srv = RunningServer(settings).start()  # what was answered 507 did not happen; the rest did
        try:
            assert [s["id"] for s in httpx.get(srv.base_url + "/subscriptions").json()] == [kept, "s2"]
        finally:
            srv.stop()
    assert_no_cayuga_threads()


def test_post_events_says_which_items_were_accepted_when_the_disk_fills_in_the_middle(tmp_path):
    """A request of two queue parts (4096 events each) whose second does not fit."""
    from server.api.events import QUEUE_PART

    with tmpfs(tmp_path, "8m") as mnt:
        srv = RunningServer(make_settings(tmp_path, data_dir=mnt / "data", durability="write")).start()
        try:
            name = "N" * 200
            events = [{"stream": "Stock", "Name": name, "Price": 1.0, "Volume": i} for i in range(2 * QUEUE_PART)]
            one = sum(len(json.dumps(e)) for e in events[:QUEUE_PART])  # about the journal record of one part
            filler = fill(mnt, leave=int(one * 1.5))
            r = httpx.post(srv.base_url + "/events", json=events, timeout=60)
            assert r.status_code == 507, r.text
            body = r.json()
            assert body["accepted"] == QUEUE_PART and body["not_accepted_from"] == QUEUE_PART, body
            assert (f"the first {QUEUE_PART} of the {2 * QUEUE_PART} events were accepted (the body's items before "
                    f"index {QUEUE_PART}); those from item {QUEUE_PART} on were not: send only those again") \
                in body["detail"]
            journaled = [e.values[2] for _p, evs, _s, _d in srv.daemon.journal.replay(0) for e in evs]
            assert journaled == list(range(QUEUE_PART))
            filler.unlink()
            r = httpx.post(srv.base_url + "/events", json=events[QUEUE_PART:], timeout=60)
            assert r.status_code == 202 and r.json()["accepted"] == QUEUE_PART, r.text
        finally:
            srv.stop()
    assert_no_cayuga_threads()
