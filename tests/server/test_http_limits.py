"""The HTTP side under abuse and at shutdown (issue 19), on real sockets and
real ``cayuga serve`` processes: half-header floods (slowloris), the header
timeout and the connection cap, the descriptor limit checked at start, a
refused 64 MB body that the client still reads as 413, and /health while
the server drains after SIGTERM."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from clients.testing import wait_until
from server.api.httpguard import GuardedHttpToolsProtocol
from server.serve import HTTP_CLOSE_SECONDS, descriptors_needed
from tests.server.conftest import make_settings, stock
from tests.server.test_lifecycle import stalled_websocket

ROOT = Path(__file__).resolve().parents[2]
HALF_HEADER = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def metric(base_url: str, name: str) -> float:
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def read_to_eof(sock: socket.socket) -> bytes:
    """What the server sends until it closes (the socket's timeout bounds each read)."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


class Served:
    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc, self.log = proc, log
        self.http = self.tcp = 0  # known once it has written its port file
        self.url = ""


@contextmanager
def cayuga_serve(tmp_path, nofile: tuple[int, int] | None = None, wait: bool = True, **settings):
    """A ``cayuga serve`` process on ports it picks (0) and reports in its
    --port-file (settings as CAYUGA_* variables, ``nofile`` its
    RLIMIT_NOFILE); killed at the end if still running."""
    env = dict(os.environ, CAYUGA_LOG_LEVEL="warning",
               **{f"CAYUGA_{k.upper()}": str(v) for k, v in settings.items()})
    run = tempfile.mkdtemp(prefix="serve-", dir=tmp_path)
    log, port_file = Path(run) / "serve.log", Path(run) / "ports.json"
    preexec = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "serve", "--http-port", "0", "--tcp-port", "0",
                                 "--data-dir", str(Path(run) / "data"), "--port-file", str(port_file)],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=preexec)
    served = Served(proc, log)
    try:
        if wait:
            def up() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"cayuga serve exited: {log.read_text()}")
                if not port_file.exists():
                    return False
                ports = json.loads(port_file.read_text())
                served.http, served.tcp = ports["http_port"], ports["tcp_port"]
                served.url = f"http://127.0.0.1:{served.http}"
                try:
                    return httpx.get(served.url + "/health", timeout=5).json()["status"] == "ok"
                except (httpx.HTTPError, ValueError):
                    return False

            wait_until(up, timeout=60, what=f"cayuga serve to come up ({log})")
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


@contextmanager
def open_files(n: int):
    """This process may hold ``n`` descriptors for the duration (soft limit raised, then restored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.fail(f"the test needs {n} descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def send_acked(tcp_port: int, event: dict) -> str:
    """Send one event on a new TCP connection with ``#ack``; the ack line."""
    with socket.create_connection(("127.0.0.1", tcp_port), timeout=10) as s:
        s.sendall(b"#ack\n" + json.dumps(event).encode() + b"\n")
        got = b""
        while b"#ack 1\n" not in got:
            chunk = s.recv(4096)
            assert chunk, f"the connection ended before #ack 1: {got!r}"
            got += chunk
        return got.decode()


def wait_until_read(srv, url: bytes, timeout: float = 10.0) -> None:
    """Wait until the in-process server has parsed the request line of a connection for ``url``."""
    wait_until(lambda: any(isinstance(p, GuardedHttpToolsProtocol) and getattr(p, "url", None) == url
                           for p in list(srv.server.server_state.connections)),
               timeout, f"the server to read the request line for {url!r}")


def wait_for_connections(srv, n: int, timeout: float = 10.0) -> None:
    """Wait until the in-process server holds ``n`` HTTP connections."""
    wait_until(lambda: len(srv.server.server_state.connections) == n, timeout, f"{n} HTTP connections")


# --------------------------------------------------------------------------- slowloris


def test_a_half_header_flood_beyond_the_descriptor_limit_leaves_health_and_tcp_usable(tmp_path):
    """1,100 connections that each send half a header, against a server that
    may open 1,024 files: it keeps at most max_http_connections of them (the
    oldest waiting one makes room for each new one), /health answers, a TCP
    sender gets its event acknowledged, and the evictions are counted."""
    flood = 1100
    with open_files(flood + 200), cayuga_serve(tmp_path, nofile=(1024, 1024), http_header_timeout=120) as srv:
        cap = 256  # the shipped max_http_connections
        # the oldest connection sends nothing: evicted, it gets the 503 saying why. (One evicted
        # with half a header still unread by the server is reset by the close, its answer lost.)
        socks: list[socket.socket] = [socket.create_connection(("127.0.0.1", srv.http), timeout=10)]
        try:
            for _ in range(flood - 1):
                s = socket.create_connection(("127.0.0.1", srv.http), timeout=10)
                s.sendall(HALF_HEADER)
                socks.append(s)
            r = httpx.get(srv.url + "/health", timeout=10)
            assert r.status_code == 200 and r.json()["status"] == "ok"
            assert "#ack 1" in send_acked(srv.tcp, stock("IBM", 1.0, 1, 1))
            held = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
            assert held <= descriptors_needed(make_settings(tmp_path)) < 1024
            evicted = metric(srv.url, 'cayuga_http_connections_refused_total{reason="evicted"}')
            assert evicted >= flood - cap
            # the oldest connection was closed by the server, with the 503 saying why
            first = socks[0]
            first.settimeout(10)
            answer = read_to_eof(first)  # a timeout here: still open
            assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(
                b'{"detail": "the server holds max_http_connections (256) connections; this one had sent no '
                b'complete request and made room for a new one"}'), answer
        finally:
            for s in socks:
                s.close()
        assert srv.proc.poll() is None


def test_connections_without_complete_headers_are_closed_after_the_header_timeout(start_server):
    srv = start_server(http_header_timeout=0.5)
    silent = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)  # sends nothing at all
    halves = [socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) for _ in range(3)]
    try:
        for s in halves:
            s.sendall(HALF_HEADER)
        for s in [silent, *halves]:
            answer = read_to_eof(s)  # the server closes it (else the 10 s socket timeout fails the test)
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert b"http_header_timeout (0.5 s)" in answer
        # a client that sends its request at once is served, twice on one keep-alive connection
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            assert c.get("/health").status_code == 200
            assert c.get("/health").status_code == 200
        assert metric(srv.base_url, 'cayuga_http_connections_refused_total{reason="header_timeout"}') == 4
    finally:
        for s in [silent, *halves]:
            s.close()


def test_a_request_body_that_stops_arriving_is_closed_after_the_body_timeout(start_server):
    srv = start_server(http_body_timeout=2, http_header_timeout=60)
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as s:
        s.sendall(b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000\r\n\r\n[")
        answer = read_to_eof(s)  # the server closes it (else the 10 s socket timeout fails the test)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"http_body_timeout (2 s)" in answer
    assert metric(srv.base_url, 'cayuga_http_connections_refused_total{reason="body_timeout"}') == 1
    # a body that keeps coming is not cut, though it takes longer than the timeout in all
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=10) as s:
        body = json.dumps([stock("IBM", 1.0, 1, 1)]).encode()
        s.sendall(b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(0, len(body), 2):
            s.sendall(body[i:i + 2])
            time.sleep(0.06)  # the client's pace (not a wait for the server): far below the 2 s timeout
        answer = read_to_eof(s)
    assert answer.startswith(b"HTTP/1.1 202 "), answer


def busy_request(port: int) -> socket.socket:
    """A connection in the middle of a request: complete headers, the body still to come."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n[")
    return sock


def test_at_the_cap_a_waiting_connection_makes_room_and_busy_ones_do_not(start_server):
    srv = start_server(max_http_connections=3, http_header_timeout=60, http_body_timeout=60)
    with httpx.Client(base_url=srv.base_url, timeout=10) as c:
        sub = c.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()
    path = f"/ws/subscriptions/{sub['id']}"
    # WebSockets have caps of their own (max_websockets): these hold no room of the three
    socks = [stalled_websocket(srv.http_port, path) for _ in range(4)]
    try:
        socks += [busy_request(srv.http_port), busy_request(srv.http_port)]
        half = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
        socks.append(half)
        half.sendall(HALF_HEADER)
        wait_until_read(srv, b"/health")  # else its eviction could close it with its bytes unread: a reset
        # the fourth connection evicts the half-header one and is served
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            assert c.get("/health").status_code == 200
        answer = read_to_eof(half)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"made room for a new one" in answer
        wait_for_connections(srv, 4 + 2)  # the client's connection is closed on the server's side too
        # three busy connections (requests whose bodies are coming): a fourth is refused at once
        third = busy_request(srv.http_port)
        socks.append(third)
        wait_for_connections(srv, 4 + 3)
        refused = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
        socks.append(refused)
        answer = read_to_eof(refused)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"all of them busy" in answer
        third.close()

        def metrics_answer() -> str | None:  # once a busy connection is gone, there is room again
            try:
                r = httpx.get(srv.base_url + "/metrics", timeout=10)
            except httpx.HTTPError:
                return None
            return r.text if r.status_code == 200 else None

        text = wait_until(metrics_answer, 10, "room after a busy connection closed", interval=0.05)
        assert 'cayuga_http_connections_refused_total{reason="evicted"} 1.0' in text
        assert re.search(r'cayuga_http_connections_refused_total\{reason="max_connections"\} [1-9]', text)
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------- the descriptor limit


def test_serve_refuses_to_start_when_the_hard_descriptor_limit_is_too_low(tmp_path):
    with cayuga_serve(tmp_path, nofile=(1024, 1024), wait=False, max_http_connections=1000) as srv:
        assert srv.proc.wait(60) != 0
    err = srv.log.read_text()
    assert ("the process may open 1024 files (ulimit -n, hard limit) but the settings need 1704: "
            "max_http_connections (1000) + 2 x max_websockets (256) + max_connections (64) + 128") in err
    assert "Traceback" not in err


def test_serve_raises_a_low_soft_descriptor_limit_to_the_hard_one(tmp_path):
    with cayuga_serve(tmp_path, nofile=(256, 2048)) as srv:
        limits = Path(f"/proc/{srv.proc.pid}/limits").read_text()
        assert re.search(r"Max open files\s+2048\s+2048\s+files", limits), limits


# --------------------------------------------------------------------------- bodies


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_client_that_writes_a_64_mb_body_first_reads_the_413(start_server, declared):
    srv = start_server()  # max_body_bytes: 16 MiB
    data = b" " * (64 << 20)
    body = data if declared else iter([data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)])
    req = urllib.request.Request(srv.base_url + "/events", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=60)
    assert caught.value.code == 413
    detail = json.loads(caught.value.read())["detail"]
    assert "larger than max_body_bytes (16777216)" in detail
    # the server is still fine
    assert httpx.get(srv.base_url + "/health", timeout=10).json()["status"] == "ok"


# --------------------------------------------------------------------------- draining


def test_health_says_draining_while_the_server_drains_after_sigterm(tmp_path):
    """A WebSocket client that reads nothing holds the drain for shutdown_timeout;
    /health, polled all along, answers 503 "draining", never 500, and the
    server then exits 0 although that client is still connected."""
    shutdown = 3
    with cayuga_serve(tmp_path, shutdown_timeout=shutdown, client_buffer=5) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            c.post("/streams", json={"name": "Blob", "schema": {"Body": "string", "N": "int"}}).raise_for_status()
            sub = c.post("/subscriptions", json={"cel": "SELECT * FROM Blob PUBLISH Blobs"}).json()
            ws = stalled_websocket(srv.http, f"/ws/subscriptions/{sub['id']}")
            try:
                big = "X" * 20_000
                for k in range(8):  # more than its socket buffers hold: the client lags
                    c.post("/events", json=[{"stream": "Blob", "t1": k * 50 + i, "Body": big, "N": i}
                                            for i in range(50)]).raise_for_status()
                wait_until(lambda: 'cayuga_lagging_clients 1.0' in c.get("/metrics").text, 20,
                           "the stalled client to lag", interval=0.05)
                srv.proc.send_signal(signal.SIGTERM)
                sigterm = time.monotonic()
                answers: list[tuple[int, str]] = []
                while srv.proc.poll() is None and time.monotonic() - sigterm < shutdown + 30:
                    try:
                        r = httpx.get(srv.url + "/health", timeout=5)
                    except httpx.TransportError:  # refused once the HTTP side closes
                        continue
                    answers.append((r.status_code, r.json()["status"] if r.status_code in (200, 503) else r.text))
                assert {a for a in answers if a != (503, "draining")} <= {(200, "ok")}, answers
                assert answers.count((503, "draining")) >= 10, answers
                # the drained server exits although the stalled client never answers its close frame
                assert srv.proc.wait(shutdown + HTTP_CLOSE_SECONDS + 30) == 0
            finally:
                ws.close()
