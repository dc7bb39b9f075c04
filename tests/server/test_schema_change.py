"""Issue 33, round 3: a restart with a changed configuration.

The finding: change ``Trade.Qty`` int -> string, or remove ``Trade`` from the
configured streams, and restart: ``restored 2/2``, ``GET /subscriptions/s1``
404, its watcher closed with 4404, only an ERROR line in the log, /health
``ok``; changing ``Stock.Price`` float -> int silently re-typed Rising's output.

Now a stored subscription that no longer compiles is kept, marked broken with
the reason (GET /subscriptions, GET /subscriptions/{id}, /health degraded
naming it, its watchers closed with 4409 and a reason saying why and what to
do), can be deleted, and comes back by itself at a later start whose
configuration fits it again, its witnesses numbered on. A type change that
alters what a stored subscription reads or publishes stops the start (exit 2,
one line per subscription naming the stream, the attribute, the old and new
type) unless accepted (``--accept-schema-changes``,
``CAYUGA_ACCEPT_SCHEMA_CHANGES``), which recompiles them. Every test restarts
real ``cayuga serve`` processes on one data directory with another
configuration and watches with real WebSocket clients.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed

from clients.testing import RISING, ServerProcess, cayuga_command, stock, wait_until
from tests.server.conftest import NUMBERED_OTHERWISE

STOCK = {"Name": "string", "Price": "float", "Volume": "int"}
TRADE = {"Sym": "string", "Qty": "int"}
BIG = "SELECT * FROM FILTER{Qty > 5} Trade PUBLISH Big"
BIGGER = "SELECT * FROM Big PUBLISH Bigger"  # reads what BIG publishes


def streams(**schemas) -> dict[str, str]:
    return {"CAYUGA_STREAMS": json.dumps(schemas)}


def up(srv: ServerProcess) -> dict:
    """Start ``srv`` and wait until its recovery is over (/health may be degraded: that is under test)."""
    srv.start()
    return wait_until(lambda: (h := srv.health()) and h["status"] != "starting" and not h.get("replay_remaining")
                      and h, 120, what="the server's recovery to end")


def again(srv: ServerProcess, settings: dict[str, str]) -> ServerProcess:
    """The next life of ``srv``'s data directory (same ports, its log appended), with ``settings``."""
    srv.stop()  # (its process has ended already; this closes its HTTP client)
    return ServerProcess(srv.data_dir, srv.log, settings=settings, http_port=srv.http_port, tcp_port=srv.tcp_port)


def closed(srv: ServerProcess, path: str) -> tuple[int, str]:
    """The close code and reason a WebSocket client of ``path`` gets."""
    with ws_client.connect(f"ws://127.0.0.1:{srv.http_port}{path}", open_timeout=30) as ws:
        with pytest.raises(ConnectionClosed) as exc:
            ws.recv(timeout=60)
    return exc.value.rcvd.code, exc.value.rcvd.reason


def trade(sym: str, qty, t: int) -> dict:
    return {"stream": "Trade", "t0": t, "t1": t, "Sym": sym, "Qty": qty}


def post(srv: ServerProcess, events: list[dict]) -> None:
    r = srv.http_client.post("/events", json=events)
    assert r.status_code == 202 and not r.json()["rejected"], r.text


def last_seq(srv: ServerProcess, sid: str) -> int:
    return srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"]


def no_traceback(srv: ServerProcess) -> None:
    assert "Traceback" not in srv.log.read_text() and NUMBERED_OTHERWISE not in srv.log.read_text(), srv.log_tail()


def test_a_subscription_whose_stream_is_removed_is_kept_broken_and_comes_back(tmp_path):
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", settings=streams(Stock=STOCK, Trade=TRADE))
    try:
        up(srv)
        s1 = srv.http_client.post("/subscriptions", json={"cel": BIG, "name": "big_trades"}).json()["id"]
        s2 = srv.http_client.post("/subscriptions", json={"cel": BIGGER}).json()["id"]
        s3 = srv.http_client.post("/subscriptions", json={"cel": RISING}).json()["id"]
        with ws_client.connect(f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{s1}?seq=1", open_timeout=30) as ws:
            wait_until(lambda: srv.health()["clients"] == 1, what="the watcher registered")
            post(srv, [trade("IBM", 10, 1), trade("IBM", 2, 2)])
            assert ws.recv(timeout=60).startswith("1 ")
        wait_until(lambda: last_seq(srv, s2) == 1, what="s2's witness")
        srv.stop()

        srv = again(srv, streams(Stock=STOCK))  # Trade is gone
        health = up(srv)
        assert health["status"] == "degraded" and set(health["broken"]) == {s1, s2}, health
        b1, b2 = health["broken"][s1], health["broken"][s2]
        assert b1["name"] == "big_trades" and "reads stream Trade, which the configuration no longer declares" \
            in b1["reason"], b1
        assert b2["upstream"] == s1 and f"which subscription {s1} publishes, and {s1} is broken" in b2["reason"]
        assert f"{s1} (big_trades): it reads stream Trade" in health["reason"] and "restart" in health["reason"]
        assert srv.http_client.get("/readyz").status_code == 200  # the rest runs: still ready
        listed = srv.http_client.get("/subscriptions").json()
        assert [s["id"] for s in listed] == [s1, s2, s3] and [bool(s["broken"]) for s in listed] == [1, 1, 0]
        one = srv.http_client.get(f"/subscriptions/{s1}")
        assert one.status_code == 200 and one.json()["broken"]["reason"] == b1["reason"], one.text
        assert one.json()["text"] == BIG and one.json()["last_seq"] == 1
        code, reason = closed(srv, f"/ws/subscriptions/{s1}?from=2")
        assert code == 4409 and reason.startswith(f"{s1} is broken: reads stream Trade") \
            and reason.endswith("fix the config and restart, or DELETE it"), (code, reason)
        watch = subprocess.run(cayuga_command("watch", s1, "--url", srv.base_url), env=srv.env,
                               capture_output=True, text=True, timeout=120)
        assert watch.returncode == 1 and f"{s1} is broken: reads stream Trade" in watch.stderr, watch.stderr
        refused = srv.http_client.delete(f"/subscriptions/{s1}")
        assert refused.status_code == 409 and refused.json()["readers"] == [s2], refused.text
        assert srv.http_client.get(f"/subscriptions/{s1}/automaton").status_code == 409
        post(srv, [stock("IBM", 100.0, 5, 3), stock("IBM", 110.0, 5, 4)])  # the others run as before
        wait_until(lambda: last_seq(srv, s3) == 1, what="Rising's witness")
        since = b1["since"]
        no_traceback(srv)
        srv.stop()

        srv = again(srv, streams(Stock=STOCK))  # still gone: still broken, since the first time
        health = up(srv)
        assert set(health["broken"]) == {s1, s2} and health["broken"][s1]["since"] == since, health
        srv.stop()

        srv = again(srv, streams(Stock=STOCK, Trade=TRADE))  # back as it was: so are they
        health = up(srv)
        assert health["status"] == "ok" and health["broken"] == {}, health
        assert [s["broken"] for s in srv.http_client.get("/subscriptions").json()] == [None, None, None]
        with ws_client.connect(f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{s1}?from=2", open_timeout=30) as ws:
            wait_until(lambda: srv.health()["clients"] == 1, what="the watcher registered")
            post(srv, [trade("IBM", 20, 5)])
            seq, _, body = ws.recv(timeout=60).partition(" ")
        assert seq == "2" and json.loads(body)["Qty"] == 20  # numbered on after what it had
        wait_until(lambda: last_seq(srv, s2) == 2, what="s2's next witness")
        assert srv.http_client.get("/stats").json()["worker_seqs_told_wrong"] == 0  # (its worker was told so)
        no_traceback(srv)
    finally:
        srv.stop()


def test_a_broken_subscription_can_be_deleted_and_stays_deleted(tmp_path):
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", settings=streams(Stock=STOCK, Trade=TRADE))
    try:
        up(srv)
        s1 = srv.http_client.post("/subscriptions", json={"cel": BIG}).json()["id"]
        s2 = srv.http_client.post("/subscriptions", json={"cel": BIGGER}).json()["id"]
        srv.stop()
        srv = again(srv, streams(Stock=STOCK))
        assert set(up(srv)["broken"]) == {s1, s2}
        r = srv.http_client.delete(f"/subscriptions/{s1}", params={"cascade": "true"})
        assert r.status_code == 204, r.text
        assert srv.http_client.get(f"/subscriptions/{s1}").status_code == 404
        assert srv.http_client.get("/subscriptions").json() == []
        health = srv.health()
        assert health["status"] == "ok" and health["broken"] == {}, health
        srv.stop()
        srv = again(srv, streams(Stock=STOCK, Trade=TRADE))  # it fits again, but it is gone for good
        assert up(srv)["status"] == "ok" and srv.http_client.get("/subscriptions").json() == []
    finally:
        srv.stop()


class AcceptingServer(ServerProcess):
    """``cayuga serve --accept-schema-changes``."""

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cayuga_command("serve", "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port),
                               "--data-dir", str(self.data_dir), "--accept-schema-changes"),
                env=self.env, stdout=log, stderr=subprocess.STDOUT)


def test_a_type_change_is_refused_at_start_naming_each_subscription_unless_accepted(tmp_path):
    data = tmp_path / "data"
    before = streams(Stock=STOCK, Trade=TRADE)
    srv = ServerProcess(data, tmp_path / "server.log", settings=before)
    try:
        up(srv)
        s1 = srv.http_client.post("/subscriptions", json={"cel": BIG}).json()["id"]
        s2 = srv.http_client.post("/subscriptions", json={"cel": RISING, "name": "rising"}).json()["id"]
        post(srv, [stock("IBM", 100.0, 5, 1), stock("IBM", 110.0, 5, 2)])
        wait_until(lambda: last_seq(srv, s2) == 1, what="Rising's witness")
        srv.stop()

        changed = streams(Stock={**STOCK, "Price": "int"}, Trade={**TRADE, "Qty": "string"})
        refused = subprocess.run(cayuga_command("serve", "--http-port", "0", "--tcp-port", "0", "--data-dir",
                                                str(data)), env={**srv.env, **changed},
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.splitlines()
        assert lines[0].startswith("cayuga: cannot start: the configured streams changed") and "2 stored" in lines[0]
        assert f"  {s1}: input Trade.Qty int -> string" in lines, lines
        assert (f"  {s2} (rising): input Stock.Price float -> int; output Rising.Before float -> int; "
                "output Rising.After float -> int") in lines, lines
        assert "--accept-schema-changes" in lines[-1] and "CAYUGA_ACCEPT_SCHEMA_CHANGES=true" in lines[-1]

        srv = again(srv, before)  # refused: nothing changed; the old configuration starts as before
        health = up(srv)
        assert health["status"] == "ok" and health["broken"] == {}, health
        srv.stop()

        srv = AcceptingServer(data, srv.log, settings=changed, http_port=srv.http_port, tcp_port=srv.tcp_port)
        health = up(srv)
        assert set(health["broken"]) == {s1} and "input Trade.Qty int -> string" in health["broken"][s1]["reason"]
        assert "cannot compare string with int" in health["broken"][s1]["reason"], health
        log = srv.log.read_text()
        assert f"accepted a change of the schemas of subscription {s2}" in log
        post(srv, [stock("IBM", 200, 5, 3), stock("IBM", 220, 5, 4)])  # int prices now
        wait_until(lambda: last_seq(srv, s2) == 2, what="Rising's witness of the new schema")
        with ws_client.connect(f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{s2}?from=1", open_timeout=30) as ws:
            got = [ws.recv(timeout=60) for _ in range(2)]
        first, second = (json.loads(m.partition(" ")[2]) for m in got)
        assert (first["Before"], first["After"]) == (100.0, 110.0)  # logged as it was
        # afresh: the old partial match (IBM at 110.0) was not carried over into the new schema
        assert (second["Before"], second["After"]) == (200, 220) and type(second["After"]) is int
        no_traceback(srv)
        srv.kill()  # before any snapshot of the new schema: the replay starts from the old one

        srv = again(srv, changed)  # accepted once: the next start takes it as it is
        health = up(srv)
        assert set(health["broken"]) == {s1} and health["status"] == "degraded", health
        post(srv, [stock("IBM", 300, 5, 5)])  # the replay fed it IBM at 220 again, as the first life did
        wait_until(lambda: last_seq(srv, s2) == 3, what="Rising's next witness")
        with ws_client.connect(f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{s2}?from=1", open_timeout=30) as ws:
            again_got = [ws.recv(timeout=60) for _ in range(3)]
        assert again_got[:2] == got and [m.partition(" ")[0] for m in again_got] == ["1", "2", "3"]
        third = json.loads(again_got[2].partition(" ")[2])
        assert (third["Before"], third["After"]) == (220, 300), third
        no_traceback(srv)
    finally:
        srv.stop()


FUNCS = {"CAYUGA_FUNCTIONS": json.dumps({"HYPOT": {"path": "math:hypot", "returns": "float"}})}
FAR = "SELECT Name, HYPOT(Price, Volume) AS H FROM FILTER{HYPOT(Price, Volume) > 10}(Stock) PUBLISH Far"


def test_subscriptions_restored_before_and_during_a_replay_are_kept_broken_too(tmp_path):
    """Not the streams but a function gone: no schema check, the restore finds it. One subscription
    comes from the snapshot, one is registered after it and comes back where the replay reaches it
    (recovery.defer): both are kept broken, and both come back when the function does."""
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", settings={**streams(Stock=STOCK), **FUNCS})
    try:
        up(srv)
        s1 = srv.http_client.post("/subscriptions", json={"cel": FAR}).json()["id"]
        srv.stop()  # the shutdown snapshot holds s1
        srv = again(srv, {**streams(Stock=STOCK), **FUNCS})
        up(srv)
        post(srv, [stock("IBM", 20.0, 5, 1)])
        wait_until(lambda: last_seq(srv, s1) == 1, what="s1's witness")
        s2 = srv.http_client.post("/subscriptions", json={"cel": FAR.replace("Far", "Far2")}).json()["id"]
        post(srv, [stock("IBM", 30.0, 5, 2)])
        wait_until(lambda: last_seq(srv, s2) == 1, what="s2's witness")
        srv.kill()  # no snapshot since: s2 comes back at its point of the journal's replay

        srv = again(srv, streams(Stock=STOCK))  # HYPOT is gone
        health = up(srv)
        assert set(health["broken"]) == {s1, s2}, health
        for sid in (s1, s2):
            assert "HYPOT" in health["broken"][sid]["reason"], health["broken"][sid]
            assert closed(srv, f"/ws/subscriptions/{sid}")[0] == 4409
        no_traceback(srv)
        srv.stop()

        srv = again(srv, {**streams(Stock=STOCK), **FUNCS})
        health = up(srv)
        assert health["broken"] == {} and health["status"] == "ok", health
        post(srv, [stock("IBM", 40.0, 5, 3)])
        wait_until(lambda: last_seq(srv, s1) == 3 and last_seq(srv, s2) == 2, what="both numbered on")
        no_traceback(srv)
    finally:
        srv.stop()
