"""Engine workers, stage 3 (issue 32, server/workers/restart.py): a worker
killed with SIGKILL while events stream in is started again, rebuilt from the
newest snapshot (or from nothing) and the journal, and every watcher still
gets exactly ``cayuga run``'s witnesses over the whole input, numbered 1..n,
none twice; /health says degraded, names the worker and its progress while it
catches up, then ok. A kill -9 of the server after a restart still recovers
exactly. A worker that keeps dying is stopped, and its subscriptions are
marked everywhere a user looks: never silent."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from clients.client import CayugaClient, is_control
from clients.testing import RISING, logged_witnesses, wait_until, write_ticks
from server.serve import RunningServer
from server.workers import restart
from tests.server.conftest import assert_no_cayuga_threads, assert_numbered_alike, make_settings
from tests.server.test_crash import BIG, BIG_PAIR, CLIMB, expected_witnesses

#: query file -> the stream its watcher checks (NEXT, FOLD, and a chain that reads another's output)
WATCHED = {"rising.cel": "Rising", "climb.cel": "Climb", "big_pair.cel": "BigPair"}
EVENTS = 12_000


def _queries(tmp_path: Path) -> list[Path]:
    qdir = tmp_path / "queries"
    qdir.mkdir()
    for name, text in (("rising.cel", RISING + "\n"), ("climb.cel", CLIMB), ("big.cel", BIG),
                       ("big_pair.cel", BIG_PAIR)):
        (qdir / name).write_text(text)
    return [qdir / n for n in ("rising.cel", "climb.cel", "big.cel", "big_pair.cel")]


class Watcher(threading.Thread):
    """A WebSocket watcher of one subscription, with seqs: every (seq, witness) it got, and the notices."""

    def __init__(self, base_url: str, sid: str, expected: int) -> None:
        super().__init__(name=f"test-watch-{sid}", daemon=True)
        self.base_url, self.sid, self.expected = base_url, sid, expected
        self.got: list[tuple[int, str]] = []
        self.notices: list[dict] = []
        self.connected = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with CayugaClient(self.base_url, timeout=120) as c:
                with c.frames(self.sid, seq=True, batch=1000, timeout=120) as frames:
                    self.connected.set()
                    for msg in frames:
                        if is_control(msg):
                            self.notices.append(json.loads(msg))
                            continue
                        for line in msg.split("\n"):
                            seq, _, body = line.partition(" ")
                            self.got.append((int(seq), json.dumps(json.loads(body), sort_keys=True)))
                        if len(self.got) >= self.expected:
                            return
        except BaseException as exc:  # noqa: BLE001 - the test thread asserts it
            self.error = exc
        finally:
            self.connected.set()


class Held:
    """Holds a restarted worker's catch-up after its first batch until :meth:`release` (so that
    a test sees /health while it catches up): a hook on :meth:`restart.CatchUp._answer`."""

    def __init__(self, monkeypatch) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        answer = restart.CatchUp._answer

        def held(catch_up, fed, recorded):
            got = answer(catch_up, fed, recorded)
            self.reached.set()
            assert self.go.wait(120), "the test never released the catch-up"
            return got

        monkeypatch.setattr(restart.CatchUp, "_answer", held)

    def release(self) -> None:
        self.go.set()


def _send_all(base_url: str, events: list[dict], out: list) -> None:
    """A real TCP sender, sending ``events`` in small blocks (a steady stream)."""
    try:
        with CayugaClient(base_url) as c, c.sender() as snd:
            for k in range(0, len(events), 200):
                snd.send_many(events[k:k + 200])
    except BaseException as exc:  # noqa: BLE001 - the test thread asserts it
        out.append(exc)


@pytest.mark.parametrize("workers, snapshots, clock", [(1, False, "clock"), (2, True, "event")])
def test_a_killed_worker_is_restarted_and_every_witness_arrives_once(tmp_path, monkeypatch, workers, snapshots,
                                                                      clock):
    """kill -9 of one worker while a TCP sender streams: it is started again, from the newest
    snapshot (2 workers, one taken at 2,000 events) or from the journal's beginning (1 worker,
    no snapshot yet, the default clock); the watchers get ``cayuga run``'s witnesses, 1..n;
    /health degraded then ok; then a kill -9 of the server itself (no shutdown snapshot)
    recovers exactly too."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, EVENTS, 30, seed=7)
    order = _queries(tmp_path)
    expected = expected_witnesses(ticks, order)
    events = [json.loads(line) for line in ticks.read_text().splitlines()]
    s = make_settings(tmp_path, time=clock, engine_workers=workers, snapshot_seconds=0, snapshot_events=10_000_000)
    held = Held(monkeypatch)
    srv = RunningServer(s).start()
    sent_errors: list = []
    try:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            ids = {q.name: c.subscribe(cel=q.read_text())["id"] for q in order}
            watchers = {q: Watcher(srv.base_url, ids[q], sum(expected[stream].values()))
                        for q, stream in WATCHED.items()}
            for w in watchers.values():
                w.start()
                w.connected.wait(30)
            wait_until(lambda: c.health()["clients"] >= len(watchers), what="the watchers to connect")
            first = EVENTS // 3
            if snapshots:  # one at 2,000 events: the restart starts from it (none later: it has some to replay)
                c.post_events(events[:2000])
                wait_until(lambda: d.events_taken == 2000, what="2,000 events through the workers")
                d.submit(lambda eng: d.checkpoints.take(0.0)).result(timeout=30)
                wait_until(lambda: d.snapshotter.taken == 1 and not d.snapshotter.running, what="the snapshot")
            c.post_events(events[d.events_taken:first])
            wait_until(lambda: d.events_taken == first, what="the first third through the workers")
            victim = int(c.subscription(ids["big_pair.cel"])["runs_on"].split()[-1])
            pid = d.links[victim].process.pid
            sender = threading.Thread(target=_send_all, args=(srv.base_url, events[first:], sent_errors))
            sender.start()
            wait_until(lambda: d.events_taken > first, what="the stream to flow")
            os.kill(pid, signal.SIGKILL)
            assert held.reached.wait(60), "the worker was not started again"
            h = c.health()
            assert h["status"] == "degraded", h
            assert f"engine worker {victim} died and was started again" in h["reason"]
            mine = h["workers"][victim]
            assert mine["state"] == "catching_up" and mine["restarts"] == 1 and mine["catch_up"]["events_total"] > 0
            assert mine["pid"] != pid and "exit code -9" in mine["last_death"]
            held.release()
            sender.join(120)
            assert not sender.is_alive() and not sent_errors, sent_errors
            wait_until(lambda: d.events_taken == EVENTS, timeout=120, what="every event through the workers")
            for w in watchers.values():
                w.join(120)
            h = wait_until(lambda: (h := c.health())["status"] == "ok" and h, what="/health ok again")
            assert [w["state"] for w in h["workers"]] == ["running"] * workers
            assert h["workers"][victim]["restarts"] == 1
            # its instances are counted again (a count that was out when it died does not stop the counting)
            wait_until(lambda: c.health()["workers"][victim]["instances"] > 0, what="the restarted worker's count")
            subs = {q: c.subscription(i) for q, i in ids.items()}
        for q, stream in WATCHED.items():
            w = watchers[q]
            assert w.error is None, w.error
            assert [n for n, _ in w.got] == list(range(1, len(w.got) + 1)), f"{stream}: seqs not 1..n"
            assert Counter(body for _, body in w.got) == expected[stream], stream
            assert subs[q]["last_seq"] == len(w.got) and subs[q]["exact"], subs[q]
            assert not w.notices, w.notices
        logged = {q: logged_witnesses(srv.base_url, ids[q], subs[q]["last_seq"]) for q in WATCHED}
    finally:
        held.release()
        d.checkpoints.final = lambda: None  # no shutdown snapshot: as after kill -9 of the server
        srv.stop()
    assert_numbered_alike(srv)  # (the restarted worker was told where its subscriptions stood)
    srv = RunningServer(s).start()  # the server's own crash after the worker's restart recovers exactly
    try:
        d = srv.daemon
        wait_until(lambda: d.caught_up and d.events_taken == EVENTS, timeout=120, what="the recovery")
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
            for q in WATCHED:
                sub = c.subscription(ids[q])
                assert sub["last_seq"] == subs[q]["last_seq"] and sub["exact"]
                assert logged_witnesses(srv.base_url, ids[q], sub["last_seq"]) == logged[q]
    finally:
        srv.stop()
    assert_numbered_alike(srv)
    assert_no_cayuga_threads()


def test_a_worker_that_keeps_dying_is_stopped_and_its_subscriptions_are_marked(tmp_path):
    """Killed again and again (each time once it is back): after MAX_DEATHS deaths within
    DEATH_WINDOW it is not started again; each of its subscriptions is marked on /health,
    GET /subscriptions/{id} (inexact, runs_on nowhere) and to its watcher; /livez says 503."""
    s = make_settings(tmp_path, engine_workers=1)
    srv = RunningServer(s).start()
    pids = []
    try:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            notices: list[dict] = []
            watcher = Watcher(srv.base_url, sid, 1)
            watcher.notices = notices
            watcher.start()
            wait_until(lambda: c.health()["clients"] >= 1, what="the watcher to connect")
            for k in range(restart.MAX_DEATHS):
                pid = d.links[0].process.pid
                pids.append(pid)
                os.kill(pid, signal.SIGKILL)
                if k < restart.MAX_DEATHS - 1:
                    wait_until(lambda: (w := c.health()["workers"][0])["restarts"] == k + 1 and w["state"] == "running"
                               and w["pid"] != pid, what=f"restart {k + 1}")
            h = wait_until(lambda: (h := c.health())["workers"][0]["state"] == "stopped" and h,
                           what="the worker stopped")
            assert h["status"] == "degraded" and f"died {restart.MAX_DEATHS} times" in h["reason"]
            assert "restart the server" in h["reason"] and sid in h["inexact"]
            sub = c.subscription(sid)
            assert not sub["exact"] and "engine worker 0 is stopped" in sub["inexact"]["reason"]
            assert sub["runs_on"].startswith("nowhere: engine worker 0 is stopped")
            assert c.http.get("/livez").status_code == 503
            wait_until(lambda: any(n.get("control") == "inexact" and n.get("subscription") == sid
                                   for n in notices), what="the watcher's notice")
            r = c.http.post("/subscriptions", json={"cel": "SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Up"})
            assert r.status_code == 400 and "engine worker 0, which is stopped" in r.text, r.text
    finally:
        srv.stop()
    for p in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    srv = RunningServer(s).start()  # a restart of the server gets a worker again
    try:
        with CayugaClient(srv.base_url) as c:
            assert c.health()["workers"][0]["state"] == "running"
    finally:
        srv.stop()
    assert_no_cayuga_threads()


def test_a_worker_that_dies_while_it_catches_up_is_stopped(tmp_path, monkeypatch):
    """Killed again while it replays the journal: it is not started a third time; its
    subscriptions are marked, and /health says why."""
    s = make_settings(tmp_path, time="event", engine_workers=1)
    held = Held(monkeypatch)
    srv = RunningServer(s).start()
    try:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            ticks = tmp_path / "ticks.jsonl"
            write_ticks(ticks, 3000, 10, seed=3)
            c.post_events([json.loads(line) for line in ticks.read_text().splitlines()])
            wait_until(lambda: d.events_taken == 3000, what="the events through the worker")
            first = d.links[0].process.pid
            os.kill(first, signal.SIGKILL)
            assert held.reached.wait(60), "the worker was not started again"
            second = c.health()["workers"][0]["pid"]
            assert second != first
            os.kill(second, signal.SIGKILL)
            wait_until(lambda: d.links[0].gone is not None, what="the second death")
            held.release()
            h = wait_until(lambda: (h := c.health())["workers"][0]["state"] == "stopped" and h,
                           what="the worker stopped")
            assert "could not be caught up" in h["reason"] and sid in h["inexact"]
            assert not c.subscription(sid)["exact"]
    finally:
        held.release()
        srv.stop()
    assert_no_cayuga_threads()


def test_kill_9_of_the_server_after_a_worker_restart_recovers_exactly(tmp_path):
    """``cayuga serve`` with 2 workers as a process: one worker killed and started again,
    more events, then the server itself killed with SIGKILL (its workers die with it); the
    restart recovers from the snapshot and the journal, and every subscription's log holds
    ``cayuga run``'s witnesses, numbered 1..n, none twice."""
    from clients.testing import ServerProcess

    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 8000, 30, seed=11)
    order = _queries(tmp_path)
    expected = expected_witnesses(ticks, order)
    events = [json.loads(line) for line in ticks.read_text().splitlines()]
    half = len(events) // 2
    srv = ServerProcess(tmp_path / "data", settings={"CAYUGA_ENGINE_WORKERS": "2", "CAYUGA_SNAPSHOT_EVENTS": "2000"})
    try:
        srv.start()
        srv.wait_up()
        with CayugaClient(srv.base_url) as c:
            ids = {q.name: c.subscribe(cel=q.read_text())["id"] for q in order}
            c.post_events(events[:half])
            wait_until(lambda: c.health()["events_taken"] == half, what="the first half")
            before = c.health()["workers"]
            os.kill(before[1]["pid"], signal.SIGKILL)
            h = wait_until(lambda: (h := c.health())["workers"][1]["restarts"] == 1 and h["status"] == "ok" and h,
                           what="worker 1 started again")
            assert h["workers"][0]["pid"] == before[0]["pid"]  # the other worker kept running, with its state
            c.post_events(events[half:])
            wait_until(lambda: c.health()["events_taken"] == len(events), what="the second half")
            workers = [w["pid"] for w in c.health()["workers"]]
        srv.kill()
        for pid in workers:  # they die with the server (PR_SET_PDEATHSIG)
            wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or
                       Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z",
                       what=f"worker {pid} to end with the server")
        srv.start()
        srv.wait_up()
        with CayugaClient(srv.base_url) as c:
            wait_until(lambda: c.health()["events_taken"] == len(events), what="the recovery")
            assert c.health()["status"] == "ok"
            for q, stream in WATCHED.items():
                sub = c.subscription(ids[q])
                got = logged_witnesses(srv.base_url, ids[q], sub["last_seq"])
                assert [n for n, _ in got] == list(range(1, sub["last_seq"] + 1)), stream
                assert Counter(json.dumps(json.loads(w), sort_keys=True) for _, w in got) == expected[stream], stream
                assert sub["exact"]
    finally:
        srv.stop()
    assert "Traceback" not in srv.log.read_text()


QUERIES = [
    ("rising", RISING, {}),
    ("runs", "SELECT Name, Price FROM Stock FOLD{$2.Name = $1.Name, $2.Price > $.Price, } Stock PUBLISH Runs", {}),
]
#: registered after the snapshot: the catch-up installs them at their point; the cap sheds (recorded) after it
LATER = [("later", "SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
                   "$2.Price > 1.03 * $1.Price} Stock PUBLISH Later", {}),
         ("capped", "SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
                    "$2.Price > 1.02 * $1.Price} Stock PUBLISH Capped", {"max_instances": 12})]


def _steps(tmp_path: Path, workers: int, events: list[dict], kill: bool) -> dict:
    """Events to 2,000 (a snapshot there), to 3,000, a capped subscription registered, to 5,000,
    (the worker killed and started again), the rest; each subscription's numbered witnesses."""
    s = make_settings(tmp_path / f"steps{workers}", time="event", engine_workers=workers, snapshot_seconds=0,
                      snapshot_events=10_000_000)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        d = srv.daemon
        ids = {name: c.subscribe(cel=q, **caps)["id"] for name, q, caps in QUERIES}
        for upto in (2000, 3000, 5000, len(events)):
            done = d.events_taken
            c.post_events(events[done:upto])
            wait_until(lambda upto=upto: d.events_taken == upto, what=f"{upto} events through")
            if upto == 2000 and kill:
                d.submit(lambda eng: d.checkpoints.take(0.0)).result(timeout=30)
                wait_until(lambda: d.snapshotter.taken == 1 and not d.snapshotter.running, what="the snapshot")
            if upto == 3000:
                for name, q, caps in LATER:
                    ids[name] = c.subscribe(cel=q, **caps)["id"]
            if upto == 5000 and kill:
                pid = d.links[0].process.pid
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda: (w := c.health()["workers"][0])["restarts"] == 1 and w["state"] == "running",
                           what="the worker started again")
        subs = {name: c.subscription(i) for name, i in ids.items()}
        if kill:
            assert c.health()["status"] == "degraded" and set(c.health()["inexact"]) == {ids["capped"]}
        return {"witnesses": {name: logged_witnesses(srv.base_url, i, subs[name]["last_seq"])
                              for name, i in ids.items()},
                "exact": {name: sub["exact"] for name, sub in subs.items()}}


def test_the_catch_up_installs_later_subscriptions_and_sheds_where_they_were(tmp_path):
    """After the snapshot a capped subscription is registered and its cap sheds (recorded);
    the worker killed later is caught up with it installed at its point and each recorded
    shedding applied at its own: every subscription's witnesses and numbers are those of the
    engine thread's run of the same steps without a kill."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 7000, 20, seed=5)
    events = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = _steps(tmp_path, 0, events, kill=False)
    assert expected["exact"] == {"rising": True, "runs": True, "later": True, "capped": False}  # its cap shed
    assert all(expected["witnesses"].values())
    assert _steps(tmp_path, 1, events, kill=True) == expected
    assert_no_cayuga_threads()


def test_a_worker_that_dies_while_the_server_recovers_is_started_again_from_the_snapshot(tmp_path, monkeypatch):
    """Killed just before it loads its part of the snapshot at a start: the recovery goes on,
    the engine thread starts it again from that snapshot, and the subscription has its
    instances back, exact (no inexact mark for what was not lost)."""
    from server.workers.dispatch import WorkerEngineThread

    s = make_settings(tmp_path, time="event", engine_workers=1)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=RISING)["id"]
        ticks = tmp_path / "ticks.jsonl"
        write_ticks(ticks, 2000, 10, seed=3)
        c.post_events([json.loads(line) for line in ticks.read_text().splitlines()])
        wait_until(lambda: srv.daemon.events_taken == 2000, what="the events")
        wait_until(lambda: c.subscription(sid)["instances"] > 0, what="the instances counted")
        before = c.subscription(sid)
    real = WorkerEngineThread.import_snapshot

    def killed_first(thread, snap_file, snap):
        link = thread.links[0]
        os.kill(link.process.pid, signal.SIGKILL)
        wait_until(lambda: link.gone is not None, what="the worker's death")
        return real(thread, snap_file, snap)

    monkeypatch.setattr(WorkerEngineThread, "import_snapshot", killed_first)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        h = wait_until(lambda: (h := c.health())["workers"][0]["restarts"] == 1 and h["status"] == "ok" and h,
                       what="the worker started again, and the server ok")
        assert h["recovered"]["snapshot"]
        wait_until(lambda: c.subscription(sid)["instances"] == before["instances"], what="its instances back")
        sub = c.subscription(sid)
        assert sub["exact"] and sub["last_seq"] == before["last_seq"]
    assert_no_cayuga_threads()

