"""Issue 33, round 3: a witness log cut short while the server was stopped.

The finding: with the witness log cut to 8 MB while the server was stopped,
one line said a torn tail was cut off, and witnesses 68,655-135,595 were gone:
``last_seq`` said 68,654, ``watch --from-start`` stopped there and waited
forever, and new witnesses went on at 135,596.

Now recovery checks the log against what its starting point (the snapshot's
numbers) says was numbered: what the journal can give again is made again by
replaying it from an older starting point (the witnesses are a function of the
events, and keep their numbers); what it cannot is marked in the log, named on
/health, and a watcher reading across it gets ``{"control": "gap", ...}`` in
its place, never a silent stop. Numbering goes on after the lost witnesses.
Each test runs ``cayuga serve`` processes on one data directory, cuts the
newest witness-log segment between two lives, and reads with real WebSocket
clients (and ``cayuga watch``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import websockets.sync.client as ws_client

from clients.testing import ServerProcess, cayuga_command, stock, wait_until
from server.durability.witlog import WitnessLog

ALL = "SELECT * FROM Stock PUBLISH All"  # one witness per event


def up(srv: ServerProcess) -> dict:
    """Start ``srv`` and wait until its recovery is over (/health may be degraded: that is under test)."""
    srv.start()
    return wait_until(lambda: (h := srv.health()) and h["status"] not in ("starting",)
                      and not h.get("replay_remaining") and h, 120, what="the server's recovery to end")


def send(srv: ServerProcess, sid: str, first_t: int, n: int, last_seq: int) -> None:
    """``n`` Stock events at times ``first_t``..., 100 at a time, each hundred's witnesses awaited (so
    the log holds many records, one a batch), ending at ``sid``'s witness ``last_seq``."""
    for k in range(0, n, 100):
        events = [stock("IBM", float(t % 97 + 1), 5, t) for t in range(first_t + k, first_t + min(k + 100, n))]
        assert srv.http_client.post("/events", json=events).status_code == 202
        want = last_seq - n + k + len(events)
        wait_until(lambda: srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"] >= want,
                   60, what=f"witness {want} of {sid}")


def read(srv: ServerProcess, sid: str, from_: int, upto: int) -> list:
    """What a watcher with ``?from=`` gets, up to witness ``upto``: (seq, witness JSON) pairs and the
    control notices (dicts), in order."""
    got: list = []
    url = f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}?from={from_}&batch=500"
    with ws_client.connect(url, open_timeout=30) as ws:
        while not got or not isinstance(got[-1], tuple) or got[-1][0] < upto:
            msg = ws.recv(timeout=60)  # a silent wait (the finding) fails here
            if msg.startswith('{"control"'):
                got.append(json.loads(msg))
                continue
            for line in msg.split("\n"):
                seq, _, body = line.partition(" ")
                got.append((int(seq), body))
    return got


def cut_witness_log(data_dir: Path, keep: float, sid: str) -> int:
    """Cut the newest witness-log segment to ``keep`` of its bytes (mid-record: a torn tail) and return
    the last witness of ``sid`` the log then holds, as a server opening it finds it."""
    newest = sorted((data_dir / "witnesses").glob("wit-*.log"))[-1]
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(int(size * keep))
    wl = WitnessLog(data_dir / "witnesses")  # (cuts the torn record off, as the server would)
    try:
        return wl.last_seq(sid)
    finally:
        wl.close()


def no_traceback(srv: ServerProcess) -> None:
    assert "Traceback" not in srv.log.read_text(), srv.log_tail()


def test_a_cut_witness_log_is_rebuilt_from_the_journal_with_the_same_numbers(tmp_path):
    """The shipped settings: one snapshot (at the stop), the journal from its first record (one
    segment): the replay from the journal's start makes the lost witnesses again, numbers and payloads."""
    data = tmp_path / "data"
    srv = ServerProcess(data, tmp_path / "server.log")
    try:
        up(srv)
        sid = srv.http_client.post("/subscriptions", json={"cel": ALL}).json()["id"]
        send(srv, sid, 1, 3000, 3000)
        before = read(srv, sid, 1, 3000)
        assert [n for n, _ in before] == list(range(1, 3001))
        srv.stop()
        kept = cut_witness_log(data, 0.3, sid)
        assert 0 < kept < 3000
        srv = ServerProcess(data, tmp_path / "server.log", http_port=srv.http_port, tcp_port=srv.tcp_port)
        health = up(srv)
        assert read(srv, sid, 1, 3000) == before  # every witness, its number and its payload, once
        assert health["status"] == "ok", health
        assert health["witness_gaps"] == {} and health["recovered"]["rebuilt"] == {sid: [kept + 1, 3000]}
        assert srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"] == 3000
        send(srv, sid, 3001, 2, 3002)
        assert [n for n, _ in read(srv, sid, 2999, 3002)] == [2999, 3000, 3001, 3002]
        no_traceback(srv)
    finally:
        srv.stop()


def test_what_the_journal_cannot_give_again_is_a_gap_named_on_health_and_told_to_watchers(tmp_path):
    """Small journal segments, two lives: the journal before the first life's snapshot is gone. A cut
    below that snapshot's numbers loses those witnesses for good; the later ones are made again from
    it; watchers get a gap notice where the lost ones would be; numbering never gives a number twice."""
    data = tmp_path / "data"
    # no history retained on purpose (retain_duration, retain_bytes: docs/design/backfill.md), so that
    # the journal recovery no longer needs is deleted
    env = {"CAYUGA_JOURNAL_SEGMENT_BYTES": "4096", "CAYUGA_RETAIN_DURATION": "0", "CAYUGA_RETAIN_BYTES": "1"}
    srv = ServerProcess(data, tmp_path / "server.log", settings=env)
    try:
        up(srv)
        sid = srv.http_client.post("/subscriptions", json={"cel": ALL}).json()["id"]
        send(srv, sid, 1, 1000, 1000)
        srv.stop()  # snapshot A: witness 1000; the journal before it is deleted
        srv = ServerProcess(data, tmp_path / "server.log", settings=env, http_port=srv.http_port,
                            tcp_port=srv.tcp_port)
        up(srv)
        send(srv, sid, 1001, 2000, 3000)
        before = read(srv, sid, 1, 3000)
        srv.stop()  # snapshot B: witness 3000
        kept = cut_witness_log(data, 0.15, sid)
        assert 0 < kept < 1000
        lost = {"from": kept + 1, "to": 1000}

        srv = ServerProcess(data, tmp_path / "server.log", settings=env, http_port=srv.http_port,
                            tcp_port=srv.tcp_port)
        health = up(srv)
        assert health["status"] == "degraded" and health["witness_gaps"] == {sid: [lost]}, health
        assert f"{sid} {kept + 1}-1000" in health["reason"] and "no client can get them" in health["reason"]
        assert health["recovered"]["rebuilt"] == {sid: [1001, 3000]}
        assert srv.http_client.get("/readyz").status_code == 200  # it serves and takes events all the same
        assert srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"] == 3000

        got = read(srv, sid, 1, 3000)
        notices = [m for m in got if isinstance(m, dict)]
        assert len(notices) == 1 and got.index(notices[0]) == kept
        notice = notices[0]
        assert (notice["control"], notice["subscription"], notice["from"], notice["to"]) == \
            ("gap", sid, kept + 1, 1000), notice
        assert f"witnesses {kept + 1} to 1000 of {sid} cannot be served" in notice["message"]
        assert [m for m in got if isinstance(m, tuple)] == before[:kept] + before[1000:]
        inside = read(srv, sid, kept + 5, 1001)  # from inside the gap: told at once
        assert inside[0]["from"] == kept + 5 and inside[0]["to"] == 1000 and inside[1][0] == 1001

        send(srv, sid, 3001, 3, 3003)  # numbered on after the log's last: no number given twice
        assert [n for n, _ in read(srv, sid, 3001, 3003)] == [3001, 3002, 3003]
        watch = subprocess.run(cayuga_command("watch", sid, "--url", srv.base_url, "--from-start", "--seq",
                                              "--count", str(kept + 2003)),
                               env=srv.env, capture_output=True, text=True, timeout=120)
        assert watch.returncode == 0, watch.stderr
        printed = [int(line.split(" ", 1)[0]) for line in watch.stdout.splitlines()]
        assert printed == list(range(1, kept + 1)) + list(range(1001, 3004))
        assert f"witnesses {kept + 1} to 1000 of {sid} cannot be served" in watch.stderr, watch.stderr
        no_traceback(srv)
        srv.stop()

        # a later start finds the mark: the same gap, nothing marked twice, nothing rebuilt
        srv = ServerProcess(data, tmp_path / "server.log", settings=env, http_port=srv.http_port,
                            tcp_port=srv.tcp_port)
        health = up(srv)
        assert health["witness_gaps"] == {sid: [lost]} and "rebuilt" not in health["recovered"], health
        assert "witness_gaps" not in health["recovered"]
        no_traceback(srv)
    finally:
        srv.stop()
