"""Resumable WebSocket delivery: ?seq, ?from, lagging clients, retention,
and `cayuga watch` across a server restart (real servers, real clients)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from clients.client import CayugaClient
from clients.testing import wait_until
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings, stock
from tests.server.test_hostile import metric

ALL = "SELECT * FROM Stock PUBLISH All"


_wait = wait_until


def _lines(ws, n: int, timeout: float = 20.0) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        out.extend(ws.recv(timeout=timeout).split("\n"))
    return out


def _ws(srv, path: str, **kw):
    return connect(f"ws://127.0.0.1:{srv.http_port}{path}", open_timeout=10, max_size=None, **kw)


def test_seq_prefixes_each_witness_and_plain_frames_are_unchanged(server, client):
    sub = client.subscribe(cel=ALL)
    sid = sub["id"]
    with _ws(server, f"/ws/subscriptions/{sid}?seq=1") as ws1, _ws(server, f"/ws/subscriptions/{sid}") as ws0, \
            _ws(server, "/ws/streams/All?seq=1&batch=10") as ws2:
        _wait(lambda: server.daemon.hub.client_count == 3, what="clients")
        client.post_events([stock("IBM", float(i), 1, i) for i in range(3)])
        plain = _lines(ws0, 3)
        assert [json.loads(x)["Price"] for x in plain] == [0.0, 1.0, 2.0]
        assert _lines(ws1, 3) == [f"{i + 1} {plain[i]}" for i in range(3)]
        assert _lines(ws2, 3) == [f"{sid}:{i + 1} {plain[i]}" for i in range(3)]
    assert client.subscription(sid)["last_seq"] == 3
    assert server.daemon.witnesses.seq == {sid: 3}


def test_from_gets_the_log_then_live_with_no_gap_and_no_duplicate(server, client):
    sid = client.subscribe(cel=ALL)["id"]
    client.post_events([stock("IBM", float(i), 1, i) for i in range(200)])
    _wait(lambda: server.daemon.witlog.last_seq(sid) == 200, what="200 witnesses logged")
    total = 2000
    stop = threading.Event()

    def drive():  # events keep coming while the clients connect and switch from the log to live
        t = 200
        with client.sender() as s:
            while t < total and not stop.is_set():
                for _ in range(50):
                    s.send(stock("IBM", float(t), 1, t))
                    t += 1
                time.sleep(0.002)  # the subject: events keep coming, paced, while the clients switch to live

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        got = {}
        for start in (1, 57, 200):
            with _ws(server, f"/ws/subscriptions/{sid}?from={start}&batch=100") as ws:
                lines = _lines(ws, total - start + 1, timeout=30)
            seqs = [int(x.split(" ", 1)[0]) for x in lines]
            prices = [json.loads(x.split(" ", 1)[1])["Price"] for x in lines]
            assert seqs == list(range(start, total + 1))
            assert prices == [float(i - 1) for i in seqs]
            got[start] = len(lines)
    finally:
        stop.set()
        driver.join(30)
    assert got == {1: 2000, 57: 1944, 200: 1801}


def test_from_a_stream_resumes_each_publisher(server, client):
    a = client.subscribe(cel="SELECT * FROM FILTER{Price > 0}(Stock) PUBLISH Up")["id"]
    b = client.subscribe(cel="SELECT * FROM FILTER{Price > 5}(Stock) PUBLISH Up")["id"]
    client.post_events([stock("IBM", float(i), 1, i) for i in range(10)])
    _wait(lambda: server.daemon.witlog.last_seq(a) == 9 and server.daemon.witlog.last_seq(b) == 4)
    with _ws(server, f"/ws/streams/Up?from={a}:8,{b}:4") as ws:
        lines = _lines(ws, 3)
    seqs = [x.split(" ")[0] for x in lines]
    # each publisher's witnesses in its own order, from where asked; how the two interleave is not promised
    assert [x for x in seqs if x.startswith(f"{a}:")] == [f"{a}:8", f"{a}:9"]
    assert [x for x in seqs if x.startswith(f"{b}:")] == [f"{b}:4"]
    assert len(seqs) == 3


def test_a_client_that_pauses_reading_lags_and_then_gets_every_witness_in_order(start_server):
    srv = start_server(client_buffer=10)
    with CayugaClient(srv.base_url) as c:
        c.declare_stream("Blob", {"Body": "string", "N": "int"})
        sid = c.subscribe(cel="SELECT * FROM Blob PUBLISH Blobs")["id"]
        n = 300
        # max_queue=1: the client library stops reading from the socket while the application does not read
        with _ws(srv, f"/ws/subscriptions/{sid}?seq=1", max_queue=1) as ws:
            _wait(lambda: srv.daemon.hub.client_count == 1, what="client")
            with c.sender() as s:
                for i in range(n):
                    s.send({"stream": "Blob", "t1": i, "Body": "X" * 20_000, "N": i})
            _wait(lambda: metric(c, "cayuga_client_lags_total") >= 1, what="the client to lag")
            lines = _lines(ws, n, timeout=30)  # reads at last
            assert [int(x.split(" ", 1)[0]) for x in lines] == list(range(1, n + 1))
            assert [json.loads(x.split(" ", 1)[1])["N"] for x in lines] == list(range(n))
            _wait(lambda: srv.daemon.hub.lagging() == 0, what="the client to be live again")
            with c.sender() as s:  # live again
                s.send({"stream": "Blob", "t1": n, "Body": "Y", "N": n})
            (last,) = _lines(ws, 1)
            assert last.startswith(f"{n + 1} ")
        assert metric(c, 'cayuga_client_drops_total{policy="disconnect"}') == 0
        assert metric(c, 'cayuga_client_drops_total{policy="retention"}') == 0


def test_from_older_than_retention_is_closed_saying_where_the_log_starts(start_server):
    srv = start_server(witness_log_bytes=16384)  # segments of 4 KiB
    with CayugaClient(srv.base_url) as c:
        c.declare_stream("Blob", {"Body": "string", "N": "int"})
        sid = c.subscribe(cel="SELECT * FROM Blob PUBLISH Blobs")["id"]
        wl = srv.daemon.witlog
        for k in range(0, 40, 4):  # batches of 4 KB: segments fill and old ones go
            c.post_events([{"stream": "Blob", "t1": i, "Body": "X" * 1000, "N": i} for i in range(k, k + 4)])
            _wait(lambda: wl.last_seq(sid) == k + 4, what="witnesses logged")
        srv.daemon.submit(lambda eng: None).result(timeout=10)  # the engine thread is between batches
        first = wl.first_seq(sid)
        assert 1 < first <= 40 and wl.dropped >= first - 1
        with _ws(srv, f"/ws/subscriptions/{sid}?from=1") as ws:
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=10)
        assert info.value.rcvd.code == 4410
        assert info.value.rcvd.reason == f"from 1 is no longer retained: the log of {sid} starts at {first}"
        with _ws(srv, f"/ws/subscriptions/{sid}?from={first}") as ws:
            lines = _lines(ws, 41 - first)
        assert int(lines[0].split(" ")[0]) == first
        with _ws(srv, f"/ws/subscriptions/{sid}?from=x") as ws:
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=10)
        assert info.value.rcvd.code == 4400


def test_cayuga_watch_prints_every_witness_exactly_once_across_a_server_restart(tmp_path):
    settings = make_settings(tmp_path)
    srv = RunningServer(settings).start()
    watcher = None
    try:
        c = CayugaClient(srv.base_url)
        sid = c.subscribe(cel=ALL)["id"]
        http, tcp = srv.http_port, srv.tcp_port
        c.post_events([stock("IBM", float(i), 1, i) for i in range(5)])  # before the watch: not printed
        _wait(lambda: srv.daemon.witlog.last_seq(sid) == 5)
        watcher = subprocess.Popen([sys.executable, "-m", "clients.cli", "watch", sid, "--url", srv.base_url,
                                    "--count", "200", "--retry-for", "60"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait(lambda: srv.daemon.hub.client_count == 1, what="the watcher to connect")
        c.post_events([stock("IBM", float(i), 1, i) for i in range(5, 105)])
        c.close()
        srv.stop()  # graceful: every accepted event is processed (and logged) before it stops
        assert watcher.poll() is None, "the watcher gave up"
        srv = RunningServer(make_settings(tmp_path, http_port=http, tcp_port=tcp)).start()
        with CayugaClient(srv.base_url) as c2:
            assert c2.subscription(sid)["last_seq"] == 105
            with c2.sender() as s:
                for i in range(105, 205):
                    s.send(stock("IBM", float(i), 1, i))
        out, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, err
        prices = [json.loads(x)["Price"] for x in out.decode().splitlines()]
        assert prices == [float(i) for i in range(5, 205)]
        assert "Traceback" not in err.decode()
        # issue 35: it said "connection closed (1012 )"; each reason is said once, not at every retry
        said = err.decode().splitlines()
        assert said[0] == "cayuga: the server is shutting down; reconnecting (for up to 60 s, --retry-for)", said
        assert len(said) == len(set(said)) and all(x.endswith("; reconnecting (for up to 60 s, --retry-for)")
                                                   for x in said), said
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
        srv.stop()
    assert_no_cayuga_threads()


def test_cayuga_watch_gives_up_with_one_line(tmp_path):
    with socket.socket() as closed:  # bound, never listening: a port that refuses connections and stays ours
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        p = subprocess.run([sys.executable, "-m", "clients.cli", "watch", "s1", "--url", url,
                            "--retry-for", "0.5"], capture_output=True, timeout=60)
    assert p.returncode == 1
    # what it retries and for how long, once; then the one line that says why it gave up (no traceback)
    assert p.stderr.decode().splitlines() == [
        f"cayuga: cannot reach the server at {url}: [Errno 111] Connection refused; reconnecting (for up to 0.5 s, "
        "--retry-for)",
        f"cayuga: gave up after 0.5 s of retries: cannot reach the server at {url}: [Errno 111] Connection refused; "
        "is cayuga serve running there? (--url or CAYUGA_URL names another)"]


def test_a_websocket_opened_while_the_server_drains_is_told_so_at_once(server, client):
    """Issue 35: a watcher that reconnected during a graceful stop was cut by uvicorn
    with 1012 and no reason; it is now closed at once with 1001 and the reason."""
    sid = client.subscribe(cel=ALL)["id"]
    server.app.state.draining.set()  # what SIGTERM sets first (server/serve.py); the drain itself is not needed
    try:
        with _ws(server, f"/ws/subscriptions/{sid}") as ws, pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    finally:
        server.app.state.draining.clear()
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1001, "the server is shutting down")


def test_watchers_of_a_deleted_subscription_are_told_it_was_deleted(server, client):
    sid = client.subscribe(cel=ALL)["id"]
    with _ws(server, f"/ws/subscriptions/{sid}") as ws:
        _wait(lambda: server.daemon.hub.client_count == 1, what="the watcher to connect")
        client.unsubscribe(sid)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1001, f"subscription {sid} was deleted")


def test_cayuga_watch_cuts_seq_prefixes_across_digit_widths_and_counts_exactly(server, client):
    """One message holding seqs 8 to 120 (one, two and three digits): `cayuga watch`
    prints the witnesses' bytes without their prefixes (or with them, --seq), exactly
    --count of them, non-ASCII text as sent."""
    sid = client.subscribe(cel=ALL)["id"]
    with client.sender() as s:  # one block: one engine batch, one message
        s.send_lines("".join(f'{{"stream": "Stock", "t1": {i}, "Name": "Zürich{i}", "Price": 1.5, "Volume": {i}}}\n'
                             for i in range(120)).encode(), 120)
    _wait(lambda: server.daemon.witlog.last_seq(sid) == 120)
    logged: list[str] = []
    with client.frames(sid, batch=1000, timeout=10, from_=8) as frames:
        while len(logged) < 113:
            logged.extend(next(frames).split("\n"))
    for args, want in ((["--count", "100"], [x.partition(" ")[2] for x in logged[:100]]),
                       (["--count", "113", "--seq"], logged)):
        p = subprocess.run([sys.executable, "-m", "clients.cli", "watch", sid, "--url", client.base_url,
                            "--from", "8", *args], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode("utf-8").splitlines() == want
    assert [json.loads(x.partition(" ")[2])["Name"] for x in logged[:3]] == ["Zürich7", "Zürich8", "Zürich9"]
