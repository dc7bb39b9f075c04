"""Ordering with T > 0, restarts, slow clients, shutdown, and the real
`cayuga serve` / `send` / `watch` processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from clients.client import CayugaClient
from clients.testing import wait_until
from server.serve import RunningServer
from tests.conftest import ROOT
from tests.server.conftest import assert_no_cayuga_threads, cayuga_threads, collect, make_settings, stock

PAIRS = "SELECT Name, Price_1 AS First, Price AS Second FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"


def test_delay_reorders_out_of_order_events_and_drops_too_late_ones(start_server):
    srv = start_server(delay=400)  # T = 400 ms
    with CayugaClient(srv.base_url) as c:
        sub = c.subscribe(cel=PAIRS)
        now = int(time.time() * 1000)
        with c.watch(sub["id"], timeout=10) as m:
            # sent out of order, but within T: the queue puts them back in t1 order
            c.post_events([stock("IBM", 3.0, 1, now + 30), stock("IBM", 1.0, 1, now + 10),
                           stock("IBM", 2.0, 1, now + 20)])
            got = collect(m, 2)
            assert [(w["First"], w["Second"]) for w in got] == [(1.0, 2.0), (2.0, 3.0)]
            # now + 20 has been released: an event before it is too late
            r = c.post_events([stock("IBM", 9.0, 1, now + 15)])
            assert (r["accepted"], r["late"]) == (0, 1)
        text = c.http.get("/metrics").text
        assert "cayuga_events_late_total 1.0" in text


def test_restart_restores_streams_and_subscriptions_with_the_same_ids(tmp_path):
    settings = make_settings(tmp_path)
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        c.declare_stream("Temp", {"Room": "string", "Celsius": "float"})
        hot = c.subscribe(cel="SELECT Room, Celsius FROM FILTER{Celsius > 30}(Temp) PUBLISH Hot")
        pairs = c.subscribe(cel=PAIRS)
        gone = c.subscribe(cel="SELECT * FROM Stock PUBLISH All")
        c.unsubscribe(gone["id"])
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        assert [s["id"] for s in c.subscriptions()] == [hot["id"], pairs["id"]]
        assert c.subscription(hot["id"])["outputs"] == ["Hot"]
        new = c.subscribe(cel="SELECT * FROM Stock PUBLISH All2")
        assert new["id"] not in (hot["id"], pairs["id"], gone["id"])  # ids are never reused
        with c.watch(hot["id"], timeout=10) as m:
            c.post_events([{"stream": "Temp", "t1": 5, "Room": "lab", "Celsius": 31.5}])
            assert collect(m, 1) == [{"stream": "Hot", "t0": 5, "t1": 5, "Room": "lab", "Celsius": 31.5}]


def stalled_websocket(port: int, path: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads,
    with a tiny receive window: the server's buffers for it fill up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    sock.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_slow_websocket_client_does_not_slow_a_fast_one(start_server):
    srv = start_server(client_buffer=20)
    big = "X" * 20_000  # large witnesses fill the slow client's socket buffers quickly
    with CayugaClient(srv.base_url) as c:
        c.declare_stream("Blob", {"Body": "string", "N": "int"})
        sub = c.subscribe(cel="SELECT * FROM Blob PUBLISH Blobs")
        total = 400
        slow = stalled_websocket(srv.http_port, f"/ws/subscriptions/{sub['id']}")
        with c.watch(sub["id"], timeout=20) as fast:
            got: list[dict] = []
            reader = threading.Thread(target=lambda: got.extend(collect(fast, total)))
            reader.start()  # the fast client reads as witnesses arrive
            with c.sender() as s:
                for i in range(total):
                    s.send({"stream": "Blob", "t1": i, "Body": big, "N": i})
                    if i % 5 == 4:
                        time.sleep(0.01)  # the subject: a steady rate, so bursts stay below the fast client's buffer
            reader.join(30)
            assert [w["N"] for w in got] == list(range(total))  # the fast client lost nothing
        # the stalled client was not cut: it lags (served from the witness log once it reads)
        wait_until(lambda: "cayuga_client_lags_total 0.0" not in c.http.get("/metrics").text,
                   what="the stalled client to lag")
        slow.close()
        text = c.http.get("/metrics").text
        assert "cayuga_client_lags_total 0.0" not in text
        assert 'cayuga_client_drops_total{policy="disconnect"} 0.0' in text


def test_a_stalled_client_lags_then_catches_up_from_the_log(start_server):
    """The retired slow_client_policy is still accepted. A client whose
    sender stalls with a buffer of 5 lags when 12 witnesses come: its buffer
    is dropped and it remembers where it was; once its sender runs again it
    gets all 12 in order from the log, then live ones."""
    srv = start_server(client_buffer=5, slow_client_policy="drop_oldest")
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        sub = c.subscribe(cel="SELECT * FROM Stock PUBLISH All")
        with c.watch(sub["id"], timeout=10, batch=1) as m:
            wait_until(lambda: d.hub.client_count == 1, what="the watcher to connect")
            (ch,) = d.hub.channels()
            wake = ch.wake.set
            ch.wake.set = lambda: None  # the sender task is never woken: the client "stalls"
            c.post_events([stock("IBM", float(i), 1, i) for i in range(12)])
            wait_until(lambda: ch.lagging, what="the stalled client to lag")
            assert ch.lagging and not ch.buffer and ch.after == {sub["id"]: 0}
            ch.wake.set = wake
            ch.loop.call_soon_threadsafe(wake)
            assert [w["Price"] for w in collect(m, 12)] == [float(i) for i in range(12)]
            wait_until(lambda: not ch.lagging, what="the client to be live again")
            c.post_events([stock("IBM", 99.0, 1, 100)])
            assert next(m)["Price"] == 99.0


def test_shutdown_drains_the_queue_and_flushes_clients(tmp_path):
    srv = RunningServer(make_settings(tmp_path, delay=60_000)).start()  # events wait a minute in the queue
    try:
        c = CayugaClient(srv.base_url)
        sub = c.subscribe(cel="SELECT * FROM Stock PUBLISH All")
        received = []
        with c.watch(sub["id"], timeout=15) as m:
            now = int(time.time() * 1000)
            c.post_events([stock("IBM", float(i), 1, now + i) for i in range(50)])
            assert len(srv.daemon.queue) == 50
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            for w in m:  # iteration ends when the server closes the socket
                received.append(w["Price"])
            stopper.join(20)
        assert received == [float(i) for i in range(50)]
        c.close()
    finally:
        if cayuga_threads():
            srv.stop()
    assert cayuga_threads() == []


def test_cayuga_serve_send_watch_processes_and_sigterm(tmp_path):
    """The real processes: `cayuga serve` on ports it picks (0) and reports in
    --port-file, `cayuga watch` and `cayuga send` against it, then SIGTERM: a
    clean exit 0."""
    port_file = tmp_path / "ports.json"
    env = dict(os.environ, CAYUGA_LOG_LEVEL="warning", CAYUGA_DELAY="0")
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "serve", "--http-port", "0", "--tcp-port", "0",
                             "--data-dir", str(tmp_path / "d"), "--port-file", str(port_file)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = None
    try:
        def up():
            assert proc.poll() is None, f"the server exited: {proc.communicate()[1]}"
            return port_file.exists()

        wait_until(up, timeout=60, what="cayuga serve to write its port file")
        ports = json.loads(port_file.read_text())
        assert set(ports) == {"http_port", "tcp_port"} and all(p > 0 for p in ports.values()), ports
        url = f"http://127.0.0.1:{ports['http_port']}"
        c = CayugaClient(url)
        assert c.health()["status"] == "ok"
        assert c.tcp_address() == ("127.0.0.1", ports["tcp_port"])  # what /health says matches the file
        sub = c.subscribe(cel=PAIRS)
        watcher = subprocess.Popen([sys.executable, "-m", "clients.cli", "watch", sub["id"], "--url", url,
                                    "--count", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        wait_until(lambda: c.health()["clients"] == 1, timeout=30, what="cayuga watch to connect")
        events = tmp_path / "e.jsonl"
        events.write_text("\n".join(json.dumps(stock("IBM", p, 1, t)) for t, p in [(1, 1.0), (2, 2.0)]) + "\n")
        sent = subprocess.run([sys.executable, "-m", "clients.cli", "send", str(events), "--url", url],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert "sent 2 lines, 0 rejected" in sent.stderr
        out, err = watcher.communicate(timeout=30)
        assert [json.loads(x) for x in out.splitlines()] == [
            {"stream": "Pairs", "t0": 1, "t1": 2, "Name": "IBM", "First": 1.0, "Second": 2.0}]
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # the timeout bounds a hang; how long a drain takes is not judged
    finally:
        for p in (watcher, proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        if proc.stdout:
            proc.stdout.close()
            proc.stderr.close()


def test_http_socket_says_tcp_so_asyncio_turns_nagle_off():
    """asyncio sets TCP_NODELAY only on accepted sockets whose protocol is TCP;
    a listening socket made with the default protocol 0 left Nagle on, and each
    keep-alive HTTP response then waited 40 ms for the client's delayed ACK."""
    import socket

    from server.serve import bind_http

    sock = bind_http("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_subscription_changes_do_not_wait_for_the_event_poll(tmp_path):
    """The engine thread applies subscription changes between batches; a
    submitted change wakes it instead of waiting out the queue's poll."""
    import threading

    from server.ingest.queue import DelayQueue

    q = DelayQueue(10)
    got = []
    waiter = threading.Thread(target=lambda: got.append(q.get_batch(10, timeout=60)), name="test-waiter")
    waiter.start()
    q.wake()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got == [[]]  # woken long before its 60 s poll ends


def _hold_restores(monkeypatch) -> threading.Event:
    """Make each restored subscription wait for the returned event (up to 20 s)."""
    from server.subscriptions.registry import Registrar

    gate = threading.Event()
    install = Registrar.install

    def held_install(self, *args, persist=True, **kw):
        if not persist:  # a restore, not a registration
            gate.wait(20)
        return install(self, *args, persist=persist, **kw)

    monkeypatch.setattr(Registrar, "install", held_install)
    return gate


def test_restore_runs_in_the_background_and_changes_wait_for_it(tmp_path, monkeypatch):
    """While stored subscriptions come back, /health answers "starting",
    changes are refused with 503 (and Retry-After), and events are queued,
    then processed once every subscription is back."""
    from clients.client import CayugaAPIError

    settings = make_settings(tmp_path)
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        ids = [c.subscribe(cel=PAIRS.replace("Pairs", f"P{i}"))["id"] for i in range(3)]
    gate = _hold_restores(monkeypatch)
    srv = RunningServer(make_settings(tmp_path)).start(wait_ready=False)
    try:
        with CayugaClient(srv.base_url) as c:
            health = c.health()
            assert health["status"] == "starting" and health["restored"] == {"done": 0, "total": 3}
            assert c.http.get("/readyz").status_code == 503 and c.http.get("/readyz").json()["status"] == "starting"
            assert c.http.get("/livez").status_code == 200  # starting is not dead: no restart
            with pytest.raises(CayugaAPIError) as info:
                c.subscribe(cel=PAIRS)
            assert info.value.status == 503 and "0 of 3" in info.value.body["detail"]
            assert c.http.post("/subscriptions", json={"cel": PAIRS}).headers["retry-after"] == "5"
            with pytest.raises(CayugaAPIError) as info:
                c.unsubscribe(ids[0])
            assert info.value.status == 503
            assert c.post_events([stock("IBM", 1.0, 1, 1), stock("IBM", 2.0, 1, 2)])["accepted"] == 2
            gate.set()
            assert srv.daemon.ready.wait(20)
            wait_until(lambda: srv.daemon.engine.stats.events >= 2, what="the 2 queued events to be processed")
            assert srv.daemon.engine.stats.events == 2
            assert srv.daemon.engine.stats.witnesses == 3  # one pair per restored subscription
            assert c.health()["status"] == "ok" and [s["id"] for s in c.subscriptions()] == ids
            assert c.http.get("/readyz").status_code == 200
    finally:
        gate.set()
        srv.stop()
    assert_no_cayuga_threads()


def test_stopping_while_restoring_leaves_no_thread(tmp_path, monkeypatch):
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        c.subscribe(cel=PAIRS)
    gate = _hold_restores(monkeypatch)
    srv = RunningServer(make_settings(tmp_path)).start(wait_ready=False)
    # the subject's timing: the stop below begins at once, while the restore is held; the timer
    # releases the hold later in any case, so a stop that waited for it cannot hang the test
    threading.Timer(0.5, gate.set).start()
    srv.stop()
    assert not srv.daemon.ready.is_set()  # the engine thread was never started
    assert_no_cayuga_threads()


def test_what_lives_from_start_up_is_out_of_the_collectors_reach(tmp_path):
    """The modules, the app and the daemon are frozen once the server has started
    (``gc.freeze``): a full collection no longer walks them with every thread of
    the server stopped (55-77 ms each, in the latency's p99, BENCHMARKS.md round 8);
    stopping the server gives them back to the collector."""
    import gc

    assert gc.get_freeze_count() == 0
    srv = RunningServer(make_settings(tmp_path)).start()
    try:
        with CayugaClient(srv.base_url) as c:
            assert c.health()["status"] == "ok"
        assert gc.get_freeze_count() > 10_000  # every module imported, the app, the daemon ...
        daemon = srv.daemon
        assert not any(o is daemon for o in gc.get_objects())  # ... which the collector no longer walks
    finally:
        srv.stop()
    assert gc.get_freeze_count() == 0
    assert_no_cayuga_threads()
