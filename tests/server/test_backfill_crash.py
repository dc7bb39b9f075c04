"""A backfill (issue 36) killed with SIGKILL, as a crash: during its run over history,
and during its hand-over (joined to the live engine, but no snapshot holding its
state durable yet). After the restart it runs again, and every witness reaches a
watcher from seq 1 exactly once, with the number it had: `cayuga run`'s witnesses."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from clients.client import CayugaClient
from clients.testing import ServerProcess, wait_until
from server.durability.checkpoints import Checkpoints
from server.serve import RunningServer
from tests.server.conftest import make_settings, stock
from tests.server.test_backfill import RISING, all_witnesses, cayuga_run, ticks


def backfill_worker(server_pid: int) -> int | None:
    """The pid of the server's engine process running a backfill (the server runs with
    engine_workers 0: its only ``server.workers.worker`` child is the backfill's)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and b"server.workers.worker" in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z":
            return int(p)
    return None


def post(client: CayugaClient, events: list[dict], block: int = 5000) -> None:
    for i in range(0, len(events), block):
        client.post_events(events[i:i + block])


def backfill(client: CayugaClient, sid: str) -> dict:
    return client.subscription(sid)["backfill"]


def test_kill_during_the_backfill_then_it_runs_again_and_each_witness_comes_once(tmp_path):
    events = ticks(60_000, seed=11)
    with ServerProcess(tmp_path / "data", settings={"CAYUGA_ENGINE_WORKERS": "0"}) as srv:
        client = CayugaClient(srv.base_url)
        post(client, events)
        wait_until(lambda: client.health()["events_taken"] >= len(events), 60, what="history taken")
        for _attempt in range(3):  # stop its engine mid-way: a backfill that finished first is deleted and redone
            sid = client.http.post("/subscriptions", json={"cel": RISING, "from": "retained"}).json()["id"]
            wait_until(lambda: backfill(client, sid)["witnesses"] > 0 or backfill(client, sid)["state"] != "running",
                       60, what="the first historical witnesses", interval=0.005)
            pid = backfill_worker(srv.proc.pid)
            if pid is not None:
                os.kill(pid, signal.SIGSTOP)  # frozen mid-way: the backfill stays running until the kill
            if backfill(client, sid)["state"] == "running":
                break
            client.unsubscribe(sid)
        bf = backfill(client, sid)
        assert bf["state"] == "running" and 0 < bf["events_done"] < len(events), bf
        delivered = bf["witnesses"]
        srv.kill()
        srv.start()
        srv.wait_up()
        wait_until(lambda: backfill(client, sid)["state"] in ("handing_over", "live"), 120, what="the hand-over")
        more = [stock("A", 10.0, 1, events[-1]["t1"] + 1), stock("A", 20.0, 1, events[-1]["t1"] + 2)]
        client.post_events(more)
        expected = cayuga_run(tmp_path, RISING, events + more)
        assert len(expected) > delivered > 0
        got = all_witnesses(client, sid, len(expected))  # seqs 1, 2, ... each once (checked)
        assert [{k: v for k, v in w.items() if k != "replay"} for w in got] == expected
        assert all(w.get("replay") for w in got[:-1]) and "replay" not in got[-1]
        client.close()


def test_kill_during_the_hand_over_runs_the_backfill_again_to_a_new_cut(tmp_path):
    events = ticks(3000, seed=12)
    data = tmp_path / "data"
    with ServerProcess(data) as srv:  # engine_workers 1: the state goes into the engine worker
        client = CayugaClient(srv.base_url)
        post(client, events)
        wait_until(lambda: client.health()["events_taken"] >= len(events), 60, what="history taken")
        # no snapshot can be written: the hand-over is never done (durable), it stays handing_over
        (data / "snapshots").rename(tmp_path / "snapshots.away")
        (data / "snapshots").write_text("not a directory")
        sid = client.http.post("/subscriptions", json={"cel": RISING, "from": "retained"}).json()["id"]
        wait_until(lambda: backfill(client, sid)["state"] == "handing_over", 60, what="the hand-over")
        end = events[-1]["t1"]
        live = [stock("A", 10.0, 1, end + 1), stock("A", 20.0, 1, end + 2)]
        client.post_events(live)  # witnessed live, numbered on after the history's
        first = cayuga_run(tmp_path, RISING, events + live)
        got = all_witnesses(client, sid, len(first))
        assert "replay" not in got[-1] and got[-2].get("replay") is True
        assert backfill(client, sid)["state"] == "handing_over"
        srv.kill()
        (data / "snapshots").unlink()
        shutil.move(tmp_path / "snapshots.away", data / "snapshots")
        srv.start()
        srv.wait_up()
        wait_until(lambda: backfill(client, sid)["state"] == "live", 120, what="the backfill live again")
        more = [stock("A", 9.0, 1, end + 3), stock("A", 30.0, 1, end + 4)]
        client.post_events(more)
        expected = cayuga_run(tmp_path, RISING, events + live + more)
        got = all_witnesses(client, sid, len(expected))  # seqs 1, 2, ... each once (checked)
        assert [{k: v for k, v in w.items() if k != "replay"} for w in got] == expected
        client.close()



def test_a_worker_killed_after_the_hand_over_before_a_snapshot_marks_the_backfilled_subscription(tmp_path,
                                                                                              monkeypatch):
    """The state a backfill brought is in no snapshot until one is written after the
    hand-over: a live engine worker that dies meanwhile is caught up from the journal
    without it. The subscription runs on, marked inexact wherever a user looks, never
    silently short."""
    monkeypatch.setattr(Checkpoints, "take", lambda self, now: None)  # no snapshot: it stays handing_over
    events = ticks(3000, seed=13)
    srv = RunningServer(make_settings(tmp_path, engine_workers=1, snapshot_seconds=0,
                                      snapshot_events=10_000_000)).start()
    try:
        with CayugaClient(srv.base_url) as client:
            post(client, events)
            wait_until(lambda: client.health()["events_taken"] >= len(events), 60, what="history taken")
            sid = client.http.post("/subscriptions", json={"cel": RISING, "from": "retained"}).json()["id"]
            wait_until(lambda: backfill(client, sid)["state"] == "handing_over", 60, what="the hand-over")
            assert client.subscription(sid)["exact"] is True
            os.kill(client.health()["workers"][0]["pid"], signal.SIGKILL)
            h = wait_until(lambda: (h := client.health())["workers"][0]["restarts"] == 1
                           and h["workers"][0]["state"] == "running" and h, 120, what="the worker started again")
            assert sid in h["inexact"], h
            sub = client.subscription(sid)
            assert sub["exact"] is False and "backfill's hand-over" in sub["inexact"]["reason"], sub
    finally:
        srv.stop()
