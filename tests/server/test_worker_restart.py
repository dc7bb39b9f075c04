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
import logging
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from clients.client import CayugaClient, is_control
from clients.testing import RISING, ServerProcess, logged_witnesses, wait_until, write_ticks
from server.serve import RunningServer
from server.workers import dispatch, link as worker_link, restart
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


def test_a_worker_that_does_not_answer_is_named_and_its_events_wait(tmp_path, monkeypatch):
    """A worker stopped (SIGSTOP) lives but answers nothing: once it has owed a batch for
    SILENT_SECONDS, /health says degraded and names it with its pid (``state: not_answering``,
    ``oldest_batch_s``), /metrics gives the batch's age, and it is not restarted. The events wait:
    once it is continued, every witness arrives, as many as the same events give a worker that
    was never stopped, and /health is ok again. A count asked of it meanwhile is a 503 that names
    it."""
    from clients.testing.market import random_walk
    from tests.server.conftest import stock

    monkeypatch.setattr(restart, "SILENT_SECONDS", 0.5)
    ticks = [stock(e.values[0], round(e.values[1], 4), e.values[2], e.t0)
             for e in random_walk(30, 3000, seed=5, down=0.01, up=0.01)]

    def run(stop: bool) -> int:
        s = make_settings(tmp_path / ("stopped" if stop else "plain"), time="event", engine_workers=1)
        with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
            d = srv.daemon
            sid = c.subscribe(cel=RISING)["id"]
            pid = d.links[0].process.pid
            if stop:
                os.kill(pid, signal.SIGSTOP)
            try:
                if stop:  # said at once, owing nothing yet (its process's state)
                    h = wait_until(lambda: (h := c.health())["workers"][0]["state"] == "not_answering" and h,
                                   what="/health to say the stopped worker does not answer")
                    assert h["status"] == "degraded" and h["workers"][0]["oldest_batch_s"] is None
                    assert f"engine worker 0 (pid {pid}) is stopped (a signal or a debugger)" in h["reason"]
                    # a count it would give: 503 at once, saying why (not the generic "did not answer
                    # in time" once the 5 s count timeout has passed)
                    r = c.http.get(f"/subscriptions/{sid}/automaton/instances")
                    assert r.status_code == 503, r.text
                    assert f"engine worker 0 (pid {pid}) is stopped (a signal or a debugger)" in r.json()["detail"]
                    assert "SIGCONT" in r.json()["detail"] and r.json()["detail"].endswith("; retry")
                with c.sender() as snd:
                    snd.send_many(ticks[:1000])
                    if stop:
                        h = wait_until(lambda: "has not answered" in (h := c.health())["reason"] and h,
                                       what="/health to say the worker has not answered a batch")
                        assert h["status"] == "degraded" and f"engine worker 0 (pid {pid}) has not answered" in h["reason"]
                        assert h["workers"][0]["oldest_batch_s"] >= 0.5 and h["workers"][0]["restarts"] == 0
                        metrics = c.http.get("/metrics").text
                        line = next(x for x in metrics.splitlines()
                                    if x.startswith('cayuga_engine_worker_oldest_batch_seconds{worker="0"}'))
                        assert float(line.split()[-1]) >= 0.5
                        assert c.http.get("/stats").json()["workers"][0]["oldest_batch_s"] >= 0.5
                        assert d.events_taken < 1000  # (its batch is not through)
                        os.kill(pid, signal.SIGCONT)
                    snd.send_many(ticks[1000:])
            finally:
                if stop:
                    os.kill(pid, signal.SIGCONT)  # (never leave a stopped process behind)
            wait_until(lambda: d.events_taken == len(ticks), what="every event through the engine")
            h = wait_until(lambda: (h := c.health())["status"] == "ok" and h, what="/health ok again")
            assert h["workers"][0]["state"] == "running" and d.links[0].process.pid == pid
            last = c.subscription(sid)["last_seq"]
            assert len(logged_witnesses(srv.base_url, sid, last)) == last
            return last

    stopped, plain = run(True), run(False)
    assert stopped == plain > 0
    assert_no_cayuga_threads()


#: A user function that does not return until the test lets it (a lookup without a timeout).
HOLDING = """
import os, time

GO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")


def hold(x):
    while not os.path.exists(GO):
        time.sleep(0.02)
    return x
"""


@pytest.mark.parametrize("workers", [1, 0])
def test_a_function_that_does_not_return_is_named(tmp_path, monkeypatch, workers):
    """A user function that does not return holds its batch: /health names the function and the
    line it is at, not only the worker that does not answer (the worker's watch looks once the
    batch has run a second), so the operator knows what to fix; /health's and /stats' ``busy_in``
    give it too, and the console's pill. The in-process engine (``engine_workers: 0``) says the
    same of its thread. Once the function returns, every witness arrives and /health is ok again,
    with nothing said of where the engine is."""
    from server import processing
    from tests.server.conftest import stock

    (tmp_path / "holding_functions.py").write_text(HOLDING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "holding_functions", raising=False)  # (the other case's, let go: its GO is there)
    monkeypatch.setattr(restart, "SILENT_SECONDS", 0.5)
    monkeypatch.setattr(processing, "BUSY_SECONDS", 0.5)
    s = make_settings(tmp_path / "data", time="event", engine_workers=workers,
                      functions={"HOLD": {"path": "holding_functions:hold", "returns": "float"}})
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT Name, HOLD(Price) AS P FROM Stock PUBLISH Held")["id"]
        c.post_events([stock("A", 2.5, 1, 1), stock("B", 3.0, 1, 2)])
        try:
            h = wait_until(lambda: "which has not returned" in ((h := c.health())["reason"] or "") and h,
                           what="/health to name the function the engine is in")
            assert h["status"] == "degraded"
            at = h["reason"].split("which has not returned (at ", 1)[1].split(")", 1)[0]
            assert "holding_functions.py:" in at and at.endswith(", in hold")
            if workers:
                pid = srv.daemon.links[0].process.pid
                assert h["workers"][0]["busy_in"] == {"function": "HOLD", "at": at}
                assert h["workers"][0]["state"] == "not_answering"
                assert (f"engine worker 0 (pid {pid}) has not answered a batch sent" in h["reason"]
                        and "its engine is in the function HOLD, which has not returned" in h["reason"])
                assert c.http.get("/stats").json()["workers"][0]["busy_in"]["function"] == "HOLD"
            else:
                assert "the engine thread has been on one batch for" in h["reason"]
                assert "its engine is in the function HOLD, which has not returned" in h["reason"]
        finally:
            (tmp_path / "go").touch()
        assert [json.loads(w)["P"] for _n, w in logged_witnesses(srv.base_url, sid, 2)] == [2.5, 3.0]
        h = wait_until(lambda: (h := c.health())["status"] == "ok" and all(w["busy_in"] is None for w in h["workers"])
                       and h, what="/health ok again, and nothing said of where the engine is")
        if workers:
            assert h["workers"][0]["state"] == "running" and srv.daemon.links[0].process.pid == pid
    assert_no_cayuga_threads()


def _two_workers_one_stopped(tmp_path: Path, n: int = 3000):
    """Ticks (a file for ``cayuga run``, and the same as dicts to send) and settings of a server
    with 2 workers, Rising row-scaled over both (each batch goes to both)."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, n, 30, seed=5)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    s = make_settings(tmp_path, time="event", engine_workers=2, row_scaling="on", shutdown_timeout=2.0)
    return ticks, sent, s


def test_with_two_workers_only_the_stopped_one_is_said_not_to_answer(tmp_path, monkeypatch):
    """The engine thread takes a batch's results in the workers' order: while worker 0 is stopped,
    worker 1's answers wait behind its own. They are answers all the same: /health names worker 0
    alone, worker 1 runs and owes nothing; once 0 is continued every witness arrives."""
    monkeypatch.setattr(restart, "SILENT_SECONDS", 0.5)
    _ticks, sent, s = _two_workers_one_stopped(tmp_path)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        d = srv.daemon
        sid = c.subscribe(cel=RISING)["id"]
        assert c.subscription(sid)["runs_on"] != "worker 0"  # (row-scaled: every worker)
        pid = d.links[0].process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            with c.sender() as snd:
                snd.send_many(sent[:1000])
                h = wait_until(lambda: "has not answered" in (h := c.health())["reason"] and h,
                               what="/health to say worker 0 has not answered a batch")
                assert h["status"] == "degraded" and f"engine worker 0 (pid {pid})" in h["reason"]
                # worker 1 owes nothing once its last batch's answer is read (it waits behind worker 0's)
                h = wait_until(lambda: (h := c.health())["workers"][1]["oldest_batch_s"] is None and h,
                               what="worker 1 to owe nothing while worker 0 is stopped")
                assert h["workers"][0]["state"] == "not_answering" and h["workers"][1]["state"] == "running"
                assert f"engine worker 0 (pid {pid})" in h["reason"] and "engine worker 1" not in h["reason"]
                os.kill(pid, signal.SIGCONT)
                snd.send_many(sent[1000:])
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: d.events_taken == len(sent), what="every event through the engine")
        wait_until(lambda: c.health()["status"] == "ok", what="/health ok again")
        last = c.subscription(sid)["last_seq"]
        assert last > 0 and len(logged_witnesses(srv.base_url, sid, last)) == last
    assert_no_cayuga_threads()


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def _continue(pid: int | None) -> None:
    """Never leave a stopped process behind (it may have ended: then nothing)."""
    try:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _replayed_exactly(s, sid: str, expected: Counter) -> None:
    """The next start on the same data directory: cayuga run's witnesses, numbered 1..n, none twice."""
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        want = sum(expected.values())
        wait_until(lambda: c.subscription(sid)["last_seq"] >= want, what="every witness, after the replay")
        got = logged_witnesses(srv.base_url, sid, want)
        assert [n for n, _ in got][:want] == list(range(1, want + 1))
        assert Counter(json.dumps(json.loads(w), sort_keys=True) for _, w in got[:want]) == expected
        assert c.subscription(sid)["last_seq"] == want and c.subscription(sid)["exact"]


def test_a_stop_ends_a_worker_that_does_not_answer_and_the_next_start_replays_its_events(tmp_path, caplog):
    """SIGTERM while worker 0 of 2 is stopped (SIGSTOP) with batches out: the stop does not wait
    for an answer that never comes (it waited for ``stop`` to be answered, 10 s, then 10 s more,
    and started the killed worker again meanwhile). After shutdown_timeout it ends that worker with
    SIGKILL, saying so, starts none again, and every process and thread ends; the next start
    replays its events from the journal, and the witnesses are cayuga run's, each once."""
    ticks, sent, s = _two_workers_one_stopped(tmp_path)
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    srv = RunningServer(s).start()
    d = srv.daemon
    pids = [link.process.pid for link in d.links]
    try:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            procs = [link.process for link in d.links]
            os.kill(pids[0], signal.SIGSTOP)
            with c.sender() as snd:
                snd.send_many(sent)
            wait_until(lambda: d.processing.restarter.owed(0) is not None, what="a batch out to worker 0")
    finally:
        with caplog.at_level("INFO", logger="cayuga"):
            srv.stop(timeout=120)  # (it ends: what it did on the way is asserted below)
        for p in pids:
            _continue(p)
    said = _said(caplog)
    assert any(f"engine worker 0 (pid {pids[0]}) has not answered" in m and "SIGKILL" in m for m in said), said
    assert not any("engine worker 1" in m and "SIGKILL" in m for m in said)
    assert not any("starting it again" in m for m in said)  # (none started again while stopping)
    assert all(p.poll() is not None for p in procs) and not d.processing.alive
    _replayed_exactly(make_settings(tmp_path, time="event", engine_workers=2, row_scaling="on"), sid, expected)
    assert_no_cayuga_threads()


def test_a_stop_while_a_restarted_worker_catches_up_ends_it_and_the_next_start_replays(tmp_path, monkeypatch,
                                                                                      caplog):
    """SIGTERM while a worker started again after it died is catching up, itself stopped there
    (SIGSTOP): the stop waited for the catch-up, for ever with a stopped one ("the engine thread
    did not stop", the data directory locked until the process exited). Now, after
    shutdown_timeout, the stop ends it with SIGKILL, saying so, marks nothing inexact and starts
    nothing again; the next start replays the journal: cayuga run's witnesses, each once."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 3000, 10, seed=3)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    s = make_settings(tmp_path, time="event", engine_workers=1, batch_size=100, shutdown_timeout=1.0)
    held = Held(monkeypatch)  # (the catch-up of 30 batches, held after its first)
    srv = RunningServer(s).start()
    d = srv.daemon
    second = None
    try:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            c.post_events(sent)
            wait_until(lambda: d.events_taken == len(sent), what="the events through the worker")
            os.kill(d.links[0].process.pid, signal.SIGKILL)
            assert held.reached.wait(60), "the worker was not started again"
            second = d.links[0].process.pid
            assert c.health()["workers"][0]["state"] == "catching_up"
            os.kill(second, signal.SIGSTOP)
            held.release()  # its next batch is never answered
            proc = d.links[0].process
    finally:
        held.release()
        with caplog.at_level("INFO", logger="cayuga"):
            srv.stop(timeout=120)
        _continue(second)
    said = _said(caplog)
    assert any(f"engine worker 0 (pid {second}) was started again and is catching up" in m and "SIGKILL" in m
               for m in said), said
    assert not any("could not be caught up" in m or "inexact" in m or "did not stop" in m for m in said), said
    assert not d.processing.alive and proc.poll() is not None and not d.processing.budget.inexact
    _replayed_exactly(make_settings(tmp_path, time="event", engine_workers=1), sid, expected)
    assert_no_cayuga_threads()


def test_a_stop_with_a_stopped_worker_that_owes_nothing_does_not_wait_for_it(tmp_path, caplog):
    """SIGTERM while worker 0 of 2 is stopped (SIGSTOP) and owes no batch: the shutdown snapshot
    waited 600 s for its part, then ``stop`` 10 s and 10 s more. Now the snapshot gives up on it
    once it has stayed stopped a second, saying so (the journal covers what it holds), and it is
    ended with SIGKILL; the next start replays: cayuga run's witnesses, each once."""
    ticks, sent, s = _two_workers_one_stopped(tmp_path)
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    srv = RunningServer(s).start()
    d = srv.daemon
    pids = [link.process.pid for link in d.links]
    procs = [link.process for link in d.links]
    try:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            with c.sender() as snd:
                snd.send_many(sent)
            wait_until(lambda: d.processing.processed == len(sent), what="every event through both workers")
            os.kill(pids[0], signal.SIGSTOP)
    finally:
        with caplog.at_level("INFO", logger="cayuga"):
            srv.stop(timeout=120)  # (raises if it does not end)
        for p in pids:
            _continue(p)
    said = _said(caplog)
    assert any("no shutdown snapshot" in m and f"(pid {pids[0]}) is stopped" in m for m in said), said
    assert any(f"(pid {pids[0]}) is stopped" in m and "SIGKILL" in m for m in said), said
    assert not any(f"(pid {pids[1]})" in m and "SIGKILL" in m for m in said), said
    assert all(p.poll() is not None for p in procs) and not d.processing.alive
    _replayed_exactly(make_settings(tmp_path, time="event", engine_workers=2, row_scaling="on"), sid, expected)
    assert_no_cayuga_threads()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sigterm_to_the_whole_group_is_the_servers_graceful_stop(tmp_path, workers):
    """systemd's stop (KillMode=control-group, its default), ``kill -TERM -- -PGID``: SIGTERM
    reaches every process of the server at once, its engine workers too. The server's stop is
    the one that counts: it drains, the workers write the shutdown snapshot, it exits 0, and
    nothing is started again on the way; the next start replays nothing and has cayuga run's
    witnesses, each once."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 5000, 30, seed=7)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    want = sum(expected.values())
    settings = {"CAYUGA_ENGINE_WORKERS": str(workers), "CAYUGA_TIME": "event", "CAYUGA_ROW_SCALING": "on"}
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", settings)
    with srv:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            with c.sender() as snd:
                snd.send_many(sent)
            wait_until(lambda: c.subscription(sid)["last_seq"] >= want, what="every witness")
            pids = [w["pid"] for w in c.health()["workers"]]
        assert len(pids) == workers
        for pid in [*pids, srv.proc.pid]:  # (as the kernel delivers a group's signal: to each; the server
            # last, or on a fast machine it may have stopped a worker before that worker's signal is sent)
            os.kill(pid, signal.SIGTERM)
        assert srv.proc.wait(120) == 0, srv.log_tail()
    said = srv.log.read_text()
    assert "starting it again" not in said and "has ended" not in said, said[-3000:]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with ServerProcess(tmp_path / "data", tmp_path / "server2.log", settings) as srv2, \
            CayugaClient(srv2.base_url) as c:
        assert c.subscription(sid)["last_seq"] == want and c.subscription(sid)["exact"]
        got = logged_witnesses(srv2.base_url, sid, want)
        assert [n for n, _ in got] == list(range(1, want + 1))
        assert Counter(json.dumps(json.loads(w), sort_keys=True) for _, w in got) == expected
    assert "replaying" not in (tmp_path / "server2.log").read_text()  # (the shutdown snapshot holds it all)


def _stopped_before_it_loads(monkeypatch) -> list[int]:
    """Worker 0 stopped (SIGSTOP) just before a start asks it to load the snapshot; its pid, once it is."""
    stopped: list[int] = []
    load = dispatch.WorkerEngineThread.import_snapshot

    def stop_then_load(self, snap_file, snap):
        stopped.append(self.links[0].process.pid)
        os.kill(stopped[0], signal.SIGSTOP)
        return load(self, snap_file, snap)

    monkeypatch.setattr(dispatch.WorkerEngineThread, "import_snapshot", stop_then_load)
    return stopped


def test_a_start_waits_for_a_worker_stopped_before_it_loads_the_snapshot(tmp_path, monkeypatch, caplog):
    """A start whose engine worker is stopped (SIGSTOP, a debugger) before it has loaded the
    snapshot's partial matches waited 600 s, then its recovery failed. Now it waits as long as the
    worker stays stopped, saying so in the log and on /health ("starting", the worker named);
    continued, the worker loads the snapshot, and the witnesses across both lives are cayuga
    run's, numbered 1..n, each once (Rising's partial matches from before the stop complete after it)."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 4000, 30, seed=9)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    want = sum(expected.values())
    s = make_settings(tmp_path, time="event")
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=RISING)["id"]
        with c.sender() as snd:
            snd.send_many(sent[:2000])
        wait_until(lambda: srv.daemon.processing.processed == 2000, what="the first half through the worker")
        assert srv.daemon.processing.instance_count(sid) > 0  # (partial matches the snapshot must carry)
    stopped = _stopped_before_it_loads(monkeypatch)
    srv = RunningServer(s)
    try:
        with caplog.at_level("WARNING", logger="cayuga"):
            srv.start(wait_ready=False)
            with CayugaClient(srv.base_url) as c:
                wait_until(lambda: any(f"(pid {stopped[0]}) is stopped" in m and "SIGCONT" in m for m in _said(caplog)),
                           what="the wait for the stopped worker said in the log")
                health = c.health()
                assert health["status"] == "starting" and f"(pid {stopped[0]}) is stopped" in health["reason"], health
                assert not srv.daemon.ready.is_set()
                os.kill(stopped[0], signal.SIGCONT)
                wait_until(srv.daemon.ready.is_set, what="the start, once the worker is continued")
                with c.sender() as snd:
                    snd.send_many(sent[2000:])
                wait_until(lambda: c.subscription(sid)["last_seq"] >= want, what="every witness")
                got = logged_witnesses(srv.base_url, sid, want)
                assert [n for n, _ in got] == list(range(1, want + 1))
                assert Counter(json.dumps(json.loads(w), sort_keys=True) for _, w in got) == expected
                assert c.subscription(sid)["exact"] and c.health()["status"] == "ok"
    finally:
        for pid in stopped:
            _continue(pid)
        srv.stop(timeout=60)
    assert sum(f"(pid {stopped[0]}) is stopped" in m for m in _said(caplog)) == 1  # (said once, not each second)
    assert_no_cayuga_threads()


def test_a_stop_while_the_start_waits_for_a_stopped_worker_ends_and_loses_nothing(tmp_path, monkeypatch, caplog):
    """SIGTERM while the start waits for a worker stopped before it loaded the snapshot: the wait
    ends, the engine thread is never started, the stopped worker is ended (SIGKILL) and nothing of
    this start is kept; the next start loads the same snapshot: cayuga run's witnesses, each once."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 3000, 30, seed=11)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    s = make_settings(tmp_path, time="event", shutdown_timeout=2.0)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=RISING)["id"]
        with c.sender() as snd:
            snd.send_many(sent)
        wait_until(lambda: srv.daemon.processing.processed == len(sent), what="every event through the worker")
    stopped = _stopped_before_it_loads(monkeypatch)
    srv = RunningServer(s)
    proc = None
    try:
        with caplog.at_level("WARNING", logger="cayuga"):
            srv.start(wait_ready=False)
            proc = srv.daemon.links[0].process
            wait_until(lambda: any(f"(pid {stopped[0]}) is stopped" in m for m in _said(caplog)),
                       what="the wait for the stopped worker said in the log")
            srv.stop(timeout=60)  # (raises if it does not end)
    finally:
        for pid in stopped:
            _continue(pid)
    assert proc is not None and proc.poll() is not None and srv.daemon.processing.thread is None
    monkeypatch.undo()
    _replayed_exactly(s, sid, expected)
    assert_no_cayuga_threads()


def test_a_sigterm_to_one_worker_is_ignored_and_said(tmp_path):
    """``kill PID`` of one engine worker: it goes on (the server stops its workers itself, after
    its drain), and the log says so and how to stop the server instead; events still reach it,
    each witness once, and /health stays ok with the same pid."""
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 3000, 30, seed=13)
    sent = [json.loads(line) for line in ticks.read_text().splitlines()]
    expected = expected_witnesses(ticks, _queries(tmp_path)[:1])["Rising"]
    want = sum(expected.values())
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", {"CAYUGA_TIME": "event"})
    with srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=RISING)["id"]
        with c.sender() as snd:
            snd.send_many(sent[:1500])
        pid = c.health()["workers"][0]["pid"]
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: f"engine worker (pid {pid}): SIGTERM ignored" in srv.log.read_text(),
                   what="the SIGTERM said in the log")
        assert f"send SIGTERM to it (pid {srv.proc.pid})" in srv.log.read_text()
        with c.sender() as snd:
            snd.send_many(sent[1500:])
        wait_until(lambda: c.subscription(sid)["last_seq"] >= want, what="every witness")
        got = logged_witnesses(srv.base_url, sid, want)
        assert Counter(json.dumps(json.loads(w), sort_keys=True) for _, w in got) == expected
        health = c.health()
        assert health["status"] == "ok" and health["workers"][0]["pid"] == pid and \
            health["workers"][0]["restarts"] == 0, health
    assert "starting it again" not in srv.log.read_text()


def test_a_stop_reads_a_workers_state_anew_though_health_reads_a_recent_one(tmp_path, monkeypatch, caplog):
    """``/health`` asks each worker's state and CPU three times a call: a reading of its
    /proc/PID/stat answers for STAT_FRESH seconds (1.05 -> 0.58 ms of the main process a call at 16
    workers). A stop reads it anew: a worker stopped (SIGSTOP) since the last reading is ended with
    SIGKILL at once, as one stopped long ago, not asked to stop and waited for."""
    monkeypatch.setattr(worker_link, "STAT_FRESH", 3600.0)  # (every later reading is the first one's)
    link = worker_link.WorkerLink(worker_link.worker_settings(make_settings(tmp_path, engine_workers=1)))
    link.start()
    try:
        assert link.call("stats", timeout=120) is not None  # (its interpreter is up and answers)
        assert not link.stopped() and link.cpu_seconds() is not None
        pid = link.process.pid
        os.kill(pid, signal.SIGSTOP)

        def state() -> bytes:  # (read here, not through the link: its reading stays the one from before)
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0]

        wait_until(lambda: state() in (b"T", b"t"), timeout=60, what="the worker stopped")
        assert not link.stopped()  # the reading from before the stop, as /health gets it meanwhile
        with caplog.at_level(logging.WARNING, logger="cayuga.daemon"):
            link.stop()
        assert "is stopped (a signal or a debugger): ended with SIGKILL" in caplog.text
        assert link.process.returncode == -signal.SIGKILL
    finally:
        if link.process.poll() is None:  # (an assertion failed before the stop: its pipes and reader end too)
            link.kill()
            link.stop(timeout=10)
