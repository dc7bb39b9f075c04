"""Engine workers that do not answer (issue 32, server/workers/restart.py): a worker
stopped (SIGSTOP) or held in a user function that does not return lives but answers
nothing. /health says degraded and names it, with the function and line where one holds
it; its events wait, and none is lost once it answers again. A stop ends a worker that
does not answer, and the next start replays what it owed; a SIGTERM to the whole process
group is the server's graceful stop, and one to a worker alone is ignored and said."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from clients.client import CayugaClient
from clients.testing import RISING, ServerProcess, logged_witnesses, wait_until, write_ticks
from server.serve import RunningServer
from server.workers import dispatch, link as worker_link, restart
from tests.server.conftest import assert_no_cayuga_threads, make_settings
from tests.server.test_crash import expected_witnesses
from tests.server.test_worker_restart import Held, _queries


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
