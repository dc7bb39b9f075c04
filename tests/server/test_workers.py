"""Engine workers, stage 1 (issue 32, server/workers/): with ``engine_workers:
1`` the automata run in a process of their own, and the server's answers are
exactly those of the engine thread (``engine_workers: 0``): every
subscription's witnesses, with the same numbers, whatever the queries do —
resubscription, a FOLD, a time bound that expires instances, a cap that sheds;
a snapshot taken by the worker's child and a crash recovered from it go on
exactly; the worker's death is said on /health; and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from clients.client import CayugaClient
from clients.testing import logged_witnesses, wait_until
from clients.testing.market import random_walk
from server.budgetcheck import CAP_CHECK_EVENTS, CHECK_EVENTS
from server.durability.witside import listing
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, assert_numbered_alike, make_settings, stock

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
            assert d.links[0].process.poll() is None and d.engine_error is None
            # the worker wrote the payloads of its batches of several subscriptions itself, and the
            # witnesses above were read through the records that refer to them (witside.py)
            assert listing(d.witnesses.witlog.dir)
    assert_numbered_alike(srv)  # (and it numbered them as the main process did)
    return {"witnesses": got, "exact": exact}


def test_a_worker_gives_the_engine_threads_witnesses_and_numbers(tmp_path):
    events = _ticks(3 * CHECK_EVENTS + 77)
    thread = _run(tmp_path, 0, events)
    worker = _run(tmp_path, 1, events)
    assert worker == thread
    assert thread["exact"] == {"rising": True, "soon": True, "runs": True, "reads": True, "capped": False}
    assert all(thread["witnesses"][q] for q in ("rising", "soon", "runs", "reads"))
    assert_no_cayuga_threads()


UP = ("SELECT Name, Price_1 AS Before, Price AS After FROM FILTER{{Name = '{s}'}}(Stock) "
      "NEXT{{$1.Name = $2.Name AND $2.Price > 1.002 * $1.Price}} Stock")


def test_a_client_watching_one_of_a_workers_many_subscriptions_gets_its_witnesses_read_alone(tmp_path,
                                                                                         monkeypatch):
    """A worker writes the payloads of its batches of many subscriptions to its own file; the
    main process reads a watched subscription's alone there, by the sizes the worker sends
    (witnesses.py's read_parts), not the whole batch's. The client gets every witness once, in
    order, equal to what the witness log serves, and the other subscriptions' are logged."""
    from server.delivery import witnesses as delivery

    alone = []

    def counted(*args):
        got = read_parts(*args)
        alone.append(got is not None)
        return got

    read_parts = delivery.read_parts
    monkeypatch.setattr(delivery, "read_parts", counted)
    # (whatever share of a batch the watched subscription's witnesses are: a batch's size here is the
    # machine's pace, and the share rule is test_witside.py's)
    monkeypatch.setattr(delivery, "SPAN_SHARE", 1.0)
    events = _ticks(3000)
    names = sorted({e["Name"] for e in events})
    s = make_settings(tmp_path, time="event", engine_workers=1)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = [x["id"] for x in c.subscribe_many([UP.format(s=name) for name in names])]
        watched = ids[3]
        with c.watch(watched, timeout=30) as live:
            with c.sender() as snd:
                snd.send_many(events)
            wait_until(lambda: srv.daemon.events_taken == len(events), what="every event through the engine")
            n = c.subscription(watched)["last_seq"]
            assert n > 0
            got = [next(live) for _ in range(n)]
        logged = logged_witnesses(srv.base_url, watched, n)
        assert [seq for seq, _ in logged] == list(range(1, n + 1))
        assert got == [{k: v for k, v in json.loads(w).items() if k != "replay"} for _, w in logged]
        assert all(c.subscription(i)["last_seq"] > 0 for i in ids[:10])
        assert listing(srv.daemon.witnesses.witlog.dir)  # (the payloads were in the worker's file)
    assert any(alone)  # read alone there, at least for the batches where it is a few of many
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
    assert_numbered_alike(srv)  # (the new worker numbered on from the snapshot's seqs, as told)
    assert_no_cayuga_threads()


def test_changes_sent_together_are_each_made_and_a_failure_is_said_with_its_place(tmp_path):
    """A registration's slice reaches a worker as one ``many`` message (server/workers/mirror.py's
    ``together``): each change made in order as if sent alone; one that fails does not stop the
    others and is raised, with how many failed and the first, once all were made."""
    from air.cel import compile_cel
    from air.engine import EngineError
    from clients.testing.market import STOCK

    autos = compile_cel("SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Over", [STOCK]).automata
    with RunningServer(make_settings(tmp_path, engine_workers=1)) as srv:
        link = srv.daemon.links[0]
        with pytest.raises(EngineError) as err:
            link.call("many", [("shape", (99, "not a shape")), ("add", ("probe1", autos)),
                               ("remove", ("probe1",)), ("add", ("probe2", autos))])
        assert "1 of 4 changes failed, the first (shape 99)" in str(err.value)
        assert link.call("instance_count", "probe2") == 0  # (made after the failure)
        with pytest.raises(EngineError, match="no automata loaded for owner 'probe1'"):
            link.call("instance_count", "probe1")  # (added, then removed: in their order)
        link.call("remove", "probe2")
    assert_no_cayuga_threads()


def test_the_workers_death_is_said_and_nothing_is_left_running(tmp_path):
    """A worker killed is started again (tests/server/test_worker_restart.py has the rest), and
    counted; the dead one and the new one are both gone once the server stops."""
    s = make_settings(tmp_path, engine_workers=1)
    srv = RunningServer(s).start()
    pid = srv.daemon.links[0].process.pid
    try:
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
            os.kill(pid, signal.SIGKILL)
            h = wait_until(lambda: (h := c.health())["workers"][0]["restarts"] == 1 and h["status"] == "ok" and h,
                           what="/health to say it was started again")
            (w,) = h["workers"]
            assert w["state"] == "running" and w["pid"] != pid and "exit code -9" in w["last_death"]
            assert c.http.get("/livez").status_code == 200
            restarted = w["pid"]
    finally:
        srv.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(restarted, 0)
    srv = RunningServer(s).start()  # a restart gets a new worker
    try:
        pid2 = srv.daemon.links[0].process.pid
        # the graceful stop after the worker's restart wrote its shutdown snapshot (the restarted worker
        # outlived the engine thread that started it again): nothing to replay
        assert srv.daemon.recovered.get("snapshot") and srv.daemon.recovered.get("replayed_events") == 0
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
    finally:
        srv.stop()
    for p in (pid, pid2):
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    assert_no_cayuga_threads()


def test_events_go_to_the_worker_while_its_batches_are_out(tmp_path):
    """Events that come while a batch is out at the worker are sent at once (up to
    MAX_IN_FLIGHT batches), not once it is back: with the worker stopped (SIGSTOP) the
    first batch stays out and the second goes anyway; once the worker goes on, both
    witnesses come, in order."""
    s = make_settings(tmp_path, time="event", engine_workers=1)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT * FROM FILTER{Price > 0}(Stock) PUBLISH Up")["id"]
        pid = srv.daemon.links[0].process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            c.post_events([stock("A", 1.0, 1, 1)])
            wait_until(lambda: c.health()["workers"][0]["in_flight_batches"] == 1, what="the first batch out")
            c.post_events([stock("B", 2.0, 1, 2)])
            wait_until(lambda: c.health()["workers"][0]["in_flight_batches"] == 2,
                       what="the second batch sent while the first is out")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: c.subscription(sid)["last_seq"] == 2, what="both witnesses")
        got = logged_witnesses(srv.base_url, sid, 2)
        assert [(n, json.loads(w)["Name"]) for n, w in got] == [(1, "A"), (2, "B")]
        assert c.health()["workers"][0]["in_flight_batches"] == 0


def test_with_n_workers_a_batch_holds_n_times_batch_size(tmp_path, monkeypatch):
    """A batch is dealt out over the workers, so the engine thread takes up to N x
    ``batch_size`` events at once (about ``batch_size`` for each): with 2 workers and a
    batch size of 4, a block of 100 events goes out 8 at a time, and every witness still
    comes once, in order."""
    from server.workers.dispatch import WorkerEngineThread

    sizes: list[int] = []
    send = WorkerEngineThread._send

    def spying(self, batch):
        sizes.append(len(batch))
        send(self, batch)

    monkeypatch.setattr(WorkerEngineThread, "_send", spying)
    s = make_settings(tmp_path, engine_workers=2, batch_size=4, row_scaling="off")
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT * FROM FILTER{Price > 0}(Stock) PUBLISH Up")["id"]
        c.post_events([stock(f"S{i}", 1.0 + i, 1, i + 1) for i in range(100)])
        wait_until(lambda: c.subscription(sid)["last_seq"] == 100, what="every witness")
        got = logged_witnesses(srv.base_url, sid, 100)
    assert [(n, json.loads(w)["Name"]) for n, w in got] == [(i + 1, f"S{i}") for i in range(100)]
    assert sum(sizes) == 100 and max(sizes) == 8 and sizes.count(8) >= 10


def test_workers_that_read_the_whole_batch_are_sent_one_message_made_once(tmp_path):
    """Column scaling: every worker that reads a stream gets each batch of it whole, so the
    engine thread encodes a batch once and sends those bytes to each of them (it encoded it
    once per worker: BENCHMARKS.md, "Engine workers, round 23"); the witnesses are still
    every one, in order, from both workers."""
    s = make_settings(tmp_path, engine_workers=2, row_scaling="off")
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = [c.subscribe(cel=f"SELECT * FROM FILTER{{Price > {k}}}(Stock) PUBLISH Up{k}")["id"] for k in (0, 1)]
        d = srv.daemon
        assert {c.subscription(i)["runs_on"] for i in ids} == {"worker 0", "worker 1"}
        sent: list[list] = [[], []]
        for w, link in enumerate(d.links):  # (what each link sends, recorded as it goes out)
            def recording(data, w=w, send=link.send):
                sent[w].append(data)
                send(data)
            link.send = recording
        c.post_events([stock(f"S{i}", 1.5 + i, 1, i + 1) for i in range(50)])
        wait_until(lambda: [c.subscription(i)["last_seq"] for i in ids] == [50, 50], what="every witness")
        got = [logged_witnesses(srv.base_url, i, 50) for i in ids]
    batches = [[m for m in mine if m[:1] == b"B"] for mine in sent]
    assert batches[0] and len(batches[0]) == len(batches[1])
    assert all(a is b for a, b in zip(*batches))  # the same bytes, made once
    assert [[json.loads(w)["Name"] for _, w in g] for g in got] == [[f"S{i}" for i in range(50)]] * 2


def test_cayuga_serve_with_a_worker_stops_cleanly_and_leaves_no_process(tmp_path):
    from clients.testing import ServerProcess

    with ServerProcess(tmp_path / "data", settings={"CAYUGA_ENGINE_WORKERS": "1"}) as srv:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel="SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH P")["id"]
            c.post_events([stock("A", 1.0, 1, 1), stock("A", 2.0, 1, 2)])
            wait_until(lambda: c.subscription(sid)["last_seq"] == 1, what="the witness")
            reader = c.health()["tcp_reader"]  # (receivers: 1, as CAYUGA_RECEIVERS=1 runs the suite: a process more)
        children = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1 + (reader is not None)  # the engine worker, and the TCP reader process
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
                assert w["alive"] and w["pid"] == srv.daemon.links[0].process.pid and w["in_flight_events"] == 0
                assert 'cayuga_engine_worker_up{worker="0"} 1.0' in metrics
                # item 6: per worker, events (a rate from two readings), instances, queue depth, CPU, restarts
                c.post_events([stock("A", 2.0, 1, 1), stock("B", 3.0, 1, 2)])
                wait_until(lambda: c.health()["workers"][0]["events"] == 2, what="the events counted on the worker")
                (w,) = c.health()["workers"]
                assert w["state"] == "running" and w["restarts"] == 0 and w["in_flight_batches"] == 0
                assert w["cpu_seconds"] > 0 and w["instances"] == 0
                assert w["cpu_wait_seconds"] is None or w["cpu_wait_seconds"] >= 0  # (None: no schedstat in /proc)
                (st,) = c.http.get("/stats").json()["workers"]
                assert st["events"] == 2 and st["worker"] == 0 and st["restarts"] == 0 and st["cpu_seconds"] > 0
                assert "cpu_wait_seconds" in st
                metrics = c.http.get("/metrics").text
                for name in ("cayuga_engine_worker_events_total", "cayuga_engine_worker_instances",
                             "cayuga_engine_worker_in_flight_batches", "cayuga_engine_worker_cpu_seconds_total",
                             "cayuga_engine_worker_restarts_total", "cayuga_engine_worker_stopped"):
                    assert f'{name}{{worker="0"}}' in metrics, name
                assert 'cayuga_engine_worker_events_total{worker="0"} 2.0' in metrics
                # where its batches' CPU time went, by part, as the next count tells it
                parts = wait_until(lambda: (p := c.http.get("/stats").json()["workers"][0]["cpu_parts"])
                                   and all(p[k] > 0 for k in ("decode", "engine", "witnesses")) and p,
                                   what="the worker's CPU by part, counted after its batch")
                assert sum(parts.values()) <= c.health()["workers"][0]["cpu_seconds"]
                metrics = c.http.get("/metrics").text
                for part in ("decode", "engine", "witnesses"):
                    assert f'cayuga_engine_worker_batch_cpu_seconds_total{{part="{part}",worker="0"}}' in metrics
            else:
                assert "cayuga_engine_worker_up{" not in metrics
        srv.stop()


SLOW_START = """
import os, sys, time

if os.path.basename(sys.argv[0]) == "worker.py":  # in an engine worker only: its start is slow
    time.sleep(1.5)


def twice(x):
    return 2 * x
"""


def test_the_server_is_ready_once_its_workers_have_started(start_server, tmp_path, monkeypatch):
    """"Ready" means the engine workers are up: a worker whose start is slow (a user function's
    module that takes 1.5 s to import there) holds the start back, instead of the first events
    waiting in its pipe while /health says ok (the start-of-run stalls `bench latency` showed)."""
    (tmp_path / "slow_start_functions.py").write_text(SLOW_START)
    monkeypatch.syspath_prepend(str(tmp_path))
    srv = start_server(engine_workers=2, functions={"TWICE": {"path": "slow_start_functions:twice",
                                                              "returns": "float"}})
    with CayugaClient(srv.base_url) as c:
        h = c.health()
        assert h["status"] == "ok" and [w["started"] for w in h["workers"]] == [True, True]
        sid = c.subscribe(cel="SELECT Name, TWICE(Price) AS P FROM Stock PUBLISH Doubled")["id"]
        c.post_events([stock("A", 2.5, 1, 1)])
        ((number, witness),) = logged_witnesses(srv.base_url, sid, 1)
        assert number == 1 and json.loads(witness)["P"] == 5.0


#: What the main process needs and a worker does not, each a large part of an interpreter's start
#: (the settings' model, the arrays of the witness log's index, the event loop of the hub).
NOT_IN_A_WORKER = ("pydantic", "numpy", "asyncio", "server.config", "server.delivery.hub",
                   "server.durability.witlog", "server.delivery.witnesses")


def test_a_worker_imports_what_it_runs_and_not_the_main_processs_rooms():
    """Every start waits for its workers' interpreters: a worker imports the engine, the encoder
    and its pipe's codec, not the settings' model, the witness log or the hub (numpy, pydantic and
    asyncio were 150 ms of its 200 ms of imports)."""
    code = ("import json, sys, server.workers.worker; "
            f"print(json.dumps([m for m in {NOT_IN_A_WORKER!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert json.loads(out) == []


def test_two_workers_give_one_engines_witnesses_with_the_linked_subscriptions_together(tmp_path):
    """Column scaling (stage 2): the subscriptions are dealt to two workers; one
    that reads another's output runs with it; each event goes only to the workers
    that read its stream; every subscription's witnesses and numbers are those
    of the engine thread. (Row scaling, which would split the keyed ones over
    both workers, is off here: tests/server/test_worker_rows.py tests it.)"""
    events = _ticks(2 * CHECK_EVENTS + 91)
    assert _run(tmp_path, 2, events, row_scaling="off") == _run(tmp_path, 0, events)
    s = make_settings(tmp_path / "where", engine_workers=2, row_scaling="off")
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = {name: c.subscribe(cel=q, **caps)["id"] for name, q, caps in QUERIES}
        where = {name: c.subscription(i)["runs_on"] for name, i in ids.items()}
        assert where["reads"] == where["rising"]  # it reads Rising: with the one that publishes it
        assert set(where.values()) == {"worker 0", "worker 1"}
        assert [w["subscriptions"] for w in c.health()["workers"]] != [len(QUERIES), 0]
        # a query linking subscriptions that run on two workers is refused, with the reason
        other = next(n for n, w in where.items() if w != where["rising"] and n != "capped")
        c.subscribe(cel=f"SELECT * FROM Stock PUBLISH Mirror{other}")  # (a plain one: placed anywhere)
        pub = {"soon": "Soon", "runs": "Runs"}.get(other)
        if pub is not None:
            r = c.http.post("/subscriptions", json={"cel": f"SELECT * FROM Rising NEXT{{$1.Name = $2.Name}} {pub}"})
            assert r.status_code == 400 and "different engine workers" in r.text and "engine_workers: 1" in r.text
    assert_no_cayuga_threads()


def test_a_batch_refused_after_events_reached_part_of_it_leaves_no_witness_to_a_later_subscription(tmp_path,
                                                                                                 monkeypatch):
    """A large batch is installed a slice of the engine thread's time at a time, events between
    (server/subscriptions/registry.py's INSTALL_SLICE_S): when a query late in it is refused at
    install (it would link two workers), none of the batch is registered, and the ids of those
    that events already reached are not given again: a later subscription's numbers and
    witnesses are its own, not those of a refused one that ran a while."""
    import threading

    import server.subscriptions.registry as registry
    from clients.testing.market import increasing_cel, symbols

    monkeypatch.setattr(registry, "INSTALL_SLICE_S", 0.0)  # one query a slice, whatever the machine's speed
    s = make_settings(tmp_path, time="event", engine_workers=2, row_scaling="off")
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        first = c.subscribe(cel="SELECT * FROM FILTER{Volume < 0}(Stock) PUBLISH Nothing")["id"]
        batch = ["SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH EveryX",  # worker 0, every event
                 "SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH EveryY"]  # worker 1
        batch += [increasing_cel(sym, 10) for sym in symbols(200)]  # (while events flow)
        batch.append("SELECT * FROM EveryX NEXT{$2.Volume > $1.Volume} EveryY PUBLISH Both")  # links the two
        stop = threading.Event()

        def send() -> None:
            with CayugaClient(srv.base_url) as feeder:
                k = 0
                while not stop.is_set():
                    feeder.post_events([stock("IBM", 10.0 + i % 7, i, i) for i in range(k, k + 20)])
                    k += 20

        feeder = threading.Thread(target=send, name="test-feeder")
        feeder.start()
        try:
            r = c.http.post("/subscriptions/batch", json={"subscriptions": [{"cel": q} for q in batch]}, timeout=120)
        finally:
            stop.set()
            feeder.join(30)
        assert r.status_code == 400 and "different engine workers" in r.text
        assert [sub["id"] for sub in c.subscriptions()] == [first]
        d = srv.daemon
        wait_until(lambda: d.events_taken == d.queue.accepted, what="every event through the workers")
        later = c.subscribe(cel="SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH Later")["id"]
        assert later not in (f"s{int(first[1:]) + k}" for k in (1, 2))  # (EveryX's and EveryY's ran)
        assert c.subscription(later)["last_seq"] == 0
        c.post_events([stock("IBM", 99.0, 1, 10**9)])
        wait_until(lambda: c.subscription(later)["last_seq"] == 1, what="the later subscription's one witness")
        assert [json.loads(w)["Price"] for _n, w in logged_witnesses(srv.base_url, later, 1)] == [99.0]
    assert_no_cayuga_threads()


@pytest.mark.parametrize("before, after", [(2, 2), (1, 2), (2, 1)])
def test_a_restart_keeps_the_partial_matches_across_worker_counts_or_says_it_did_not(tmp_path, before, after):
    """A snapshot of two workers (the file and a part) restores into two workers
    exactly; one of one engine is given whole to each of two workers, which keep
    their own subscriptions' instances; a two-worker snapshot cannot be carried
    to one worker: the subscriptions that held instances are marked inexact.
    (Column placement: row scaling off; tests/server/test_worker_rows.py has the
    row-scaled case.)"""
    events = _ticks(CHECK_EVENTS + 333)
    expected = _run(tmp_path / "ref", 0, events)
    data = tmp_path / "data"
    with RunningServer(make_settings(tmp_path, data_dir=data, time="event", engine_workers=before,
                                     row_scaling="off")) as srv:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            ids = {name: c.subscribe(cel=q, **caps)["id"] for name, q, caps in QUERIES}
            c.post_events(events[:CHECK_EVENTS])
            wait_until(lambda: d.events_taken == CHECK_EVENTS, what="the first events")
    # a graceful stop wrote the shutdown snapshot (with a part when there were two workers)
    parts = sorted(p.name for p in (data / "snapshots").iterdir())
    assert any(p.endswith(".w1") for p in parts) == (before == 2)
    with RunningServer(make_settings(tmp_path, data_dir=data, time="event", engine_workers=after,
                                     row_scaling="off")) as srv:
        d = srv.daemon
        with CayugaClient(srv.base_url) as c:
            c.post_events(events[CHECK_EVENTS:])
            wait_until(lambda: d.events_taken == len(events), what="the rest")
            subs = {name: c.subscription(i) for name, i in ids.items()}
        got = {name: logged_witnesses(srv.base_url, i, subs[name]["last_seq"]) for name, i in ids.items()}
        health = CayugaClient(srv.base_url).health()
    assert_numbered_alike(srv)  # (moved between workers: numbered on where each stood)
    if (before, after) == (2, 1):
        assert {n for n, s in subs.items() if not s["exact"]} >= {"rising", "soon", "runs"}
        assert "could not be loaded" in health["reason"] and "engine_workers 2" in health["reason"]
    else:
        assert got == expected["witnesses"]
        assert {n: s["exact"] for n, s in subs.items()} == expected["exact"]
