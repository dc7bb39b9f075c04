"""Engine workers, stage 1 (issue 32, server/workers/): with ``engine_workers:
1`` the automata run in a process of their own, and the server's answers are
exactly those of the engine thread (``engine_workers: 0``): every
subscription's witnesses, with the same numbers, whatever the queries do —
resubscription, a FOLD, a time bound that expires instances, a cap that sheds;
a snapshot taken by the worker's child and a crash recovered from it go on
exactly; the worker's death is said on /health; and nothing is left running."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from clients.client import CayugaClient
from clients.testing import logged_witnesses, wait_until
from clients.testing.market import random_walk
from server.budgetcheck import CAP_CHECK_EVENTS, CHECK_EVENTS
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings, stock

QUERIES = [
    ("rising", "SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
               "$2.Price >= 1.02 * $1.Price} Stock PUBLISH Rising", {}),
    ("soon", "SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
             "$2.Price >= 1.01 * $1.Price AND DUR < 300} Stock PUBLISH Soon", {}),
    ("runs", "SELECT Name, Price FROM Stock FOLD{$2.Name = $1.Name, $2.Price > $.Price, } Stock PUBLISH Runs", {}),
    ("reads", "SELECT * FROM Rising NEXT{$1.Name = $2.Name} Rising PUBLISH Twice", {}),
    ("capped", "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND $2.Price > 1.5 * $1.Price} Stock PUBLISH Never",
     {"max_instances": 40}),
]


def _ticks(n: int) -> list[dict]:
    return [stock(e.values[0], round(e.values[1], 4), e.values[2], e.t0)
            for e in random_walk(30, n, seed=5, down=0.01, up=0.01)]


def _run(tmp_path, workers: int, events: list[dict], **settings) -> dict:
    """Each subscription's numbered witnesses and whether it is exact, after ``events``."""
    s = make_settings(tmp_path / f"w{workers}", time="event", engine_workers=workers, **settings)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = {name: c.subscribe(cel=q, **caps)["id"] for name, q, caps in QUERIES}
        with c.sender() as snd:
            snd.send_many(events)
        d = srv.daemon
        wait_until(lambda: d.events_taken == len(events), what="every event through the engine")
        subs = {name: c.subscription(i) for name, i in ids.items()}
        got = {name: logged_witnesses(srv.base_url, i, subs[name]["last_seq"]) for name, i in ids.items()}
        exact = {name: sub["exact"] for name, sub in subs.items()}
        if workers:
            assert d.link.process.poll() is None and d.engine_error is None
    return {"witnesses": got, "exact": exact}


def test_a_worker_gives_the_engine_threads_witnesses_and_numbers(tmp_path):
    events = _ticks(3 * CHECK_EVENTS + 77)
    thread = _run(tmp_path, 0, events)
    worker = _run(tmp_path, 1, events)
    assert worker == thread
    assert thread["exact"] == {"rising": True, "soon": True, "runs": True, "reads": True, "capped": False}
    assert all(thread["witnesses"][q] for q in ("rising", "soon", "runs", "reads"))
    assert_no_cayuga_threads()


def _counts(base_url: str, sid: str) -> int:
    with CayugaClient(base_url) as c:
        return c.subscription(sid)["instances"]


def test_a_crash_after_a_workers_snapshot_recovers_exactly(tmp_path):
    """The worker's child writes the snapshot; a crash (no shutdown snapshot)
    after more events; the restart loads it into a new worker, replays the
    journal after it, and every subscription's witnesses are those of a run
    without the crash (and its cap's sheddings are applied again where they were)."""
    events = _ticks(2 * CHECK_EVENTS + CAP_CHECK_EVENTS + 13)
    cut = CHECK_EVENTS + 5
    expected = _run(tmp_path, 1, events)
    s = make_settings(tmp_path / "crash", time="event", engine_workers=1, snapshot_seconds=0,
                      snapshot_events=10_000_000)
    srv = RunningServer(s).start()
    try:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            ids = {name: c.subscribe(cel=q, **caps)["id"] for name, q, caps in QUERIES}
            c.post_events(events[:cut])
            wait_until(lambda: d.events_taken == cut, what="the first events")
            d.submit(lambda eng: d.checkpoints.take(0.0)).result(timeout=30)
            wait_until(lambda: d.snapshotter.taken == 1 and not d.snapshotter.running,
                       what=f"the worker's snapshot ({d.snapshotter.last_error})")
            c.post_events(events[cut:])
            wait_until(lambda: d.events_taken == len(events), what="the rest")
    finally:
        d.checkpoints.final = lambda: None  # no shutdown snapshot: as after kill -9
        srv.stop()
    srv = RunningServer(s).start()
    try:
        d = srv.daemon
        wait_until(lambda: d.caught_up and d.events_taken == len(events), what="the recovery")
        assert d.recovered.get("snapshot") and d.recovered.get("replayed_events") == len(events) - cut
        with CayugaClient(srv.base_url) as c:
            subs = {name: c.subscription(i) for name, i in ids.items()}
        got = {name: logged_witnesses(srv.base_url, i, subs[name]["last_seq"]) for name, i in ids.items()}
        assert got == expected["witnesses"]
        assert {name: sub["exact"] for name, sub in subs.items()} == expected["exact"]
    finally:
        srv.stop()
    assert_no_cayuga_threads()


def test_the_workers_death_is_said_and_nothing_is_left_running(tmp_path):
    s = make_settings(tmp_path, engine_workers=1)
    srv = RunningServer(s).start()
    pid = srv.daemon.link.process.pid
    try:
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
            os.kill(pid, signal.SIGKILL)
            h = wait_until(lambda: (h := c.health())["status"] == "degraded" and h, what="/health to say it")
            assert "engine worker" in h["reason"] and "restart the server" in h["reason"]
            assert c.http.get("/livez").status_code == 503
    finally:
        srv.stop()
    srv = RunningServer(s).start()  # a restart gets a new worker
    try:
        pid2 = srv.daemon.link.process.pid
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
    finally:
        srv.stop()
    for p in (pid, pid2):
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    assert_no_cayuga_threads()


def test_cayuga_serve_with_a_worker_stops_cleanly_and_leaves_no_process(tmp_path):
    from clients.testing import ServerProcess

    with ServerProcess(tmp_path / "data", settings={"CAYUGA_ENGINE_WORKERS": "1"}) as srv:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel="SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH P")["id"]
            c.post_events([stock("A", 1.0, 1, 1), stock("A", 2.0, 1, 2)])
            wait_until(lambda: c.subscription(sid)["last_seq"] == 1, what="the witness")
        children = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1  # the engine worker
    assert srv.proc.returncode == 0
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(int(child), 0)
    assert "Traceback" not in srv.log.read_text()


def test_health_metrics_and_the_api_say_where_the_automata_run(start_server, tmp_path):
    for workers in (0, 1):
        srv = start_server(engine_workers=workers, data_dir=tmp_path / f"d{workers}")
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel="SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Up")["id"]
            h = c.health()
            assert h["engine_workers"] == workers and len(h["workers"]) == workers
            assert c.subscription(sid)["runs_on"] == ("worker 0" if workers else "engine thread")
            metrics = c.http.get("/metrics").text
            if workers:
                (w,) = h["workers"]
                assert w["alive"] and w["pid"] == srv.daemon.link.process.pid and w["in_flight_events"] == 0
                assert 'cayuga_engine_worker_up{worker="0"} 1.0' in metrics
            else:
                assert "cayuga_engine_worker_up{" not in metrics
        srv.stop()
