"""Issue 33: WebSockets have caps of their own, and the API and the probes
always have room, on real ``cayuga serve`` processes with real WebSocket
clients (the ``websockets`` library, as ``cayuga watch`` uses).

300 idle watchers held 256 connections, the shipped max_http_connections,
which WebSockets counted against: the rest got 503 and so did a plain GET
/health while they were open. Now plain HTTP connections and WebSockets are
counted apart: ``max_websockets`` in all and ``max_websockets_per_address``
from one client address, each refusal a 503 whose ``detail`` names the cap,
its value and its setting (``cayuga watch`` prints it). Also: a WebSocket
URL of 10 KB got no answer at all; now 414, as a plain request does.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess

import httpx
import websockets

from clients.testing import ServerProcess, cayuga_command, stock, wait_until
from server.config import load_settings

WATCHERS = 300


def metric(base_url: str, reason: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    m = re.search(rf'^cayuga_http_connections_refused_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def open_watchers(url: str, n: int, source: str = "127.0.0.1") -> tuple[list, list]:
    """Open ``n`` WebSockets on ``url`` from ``source``, one after the other: (the open ones, the refusals)."""
    opened, refused = [], []
    for _ in range(n):
        try:
            opened.append(await websockets.connect(url, local_addr=(source, 0), open_timeout=30))
        except websockets.exceptions.InvalidStatus as exc:
            refused.append((exc.response.status_code, bytes(exc.response.body or b"")))
    return opened, refused


def detail(body: bytes) -> str:
    return json.loads(body)["detail"]


def test_300_idle_watchers_leave_health_and_the_api_their_room(tmp_path):
    shipped = load_settings()  # the shipped server/config.yaml: the server below runs it as it is
    room = min(WATCHERS, shipped.max_websockets_per_address, shipped.max_websockets)
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as srv:
        sid = srv.http_client.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()["id"]
        url = f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}"

        async def scenario() -> None:
            opened, refused = await open_watchers(url, WATCHERS)
            try:
                assert len(opened) == room and len(refused) == WATCHERS - room
                for status, body in refused:
                    assert status == 503
                    assert (f"this client address (127.0.0.1) holds max_websockets_per_address "
                            f"({shipped.max_websockets_per_address}) WebSockets" in detail(body)), body
                    assert "CAYUGA_MAX_WEBSOCKETS_PER_ADDRESS" in detail(body)
                # while they are open, the probes and the API answer
                with httpx.Client(base_url=srv.base_url, timeout=10) as http:
                    health = http.get("/health")
                    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
                    assert health.json()["clients"] == room
                    assert http.get("/readyz").status_code == 200
                    assert http.get("/livez").status_code == 200
                    assert http.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH More"}
                                     ).status_code == 201
                    assert http.get("/subscriptions").status_code == 200
                    r = http.post("/events", json=[stock("IBM", 1.0, 1, 1)])
                    assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
                    assert metric(srv.base_url, "websockets_per_address") == WATCHERS - room
                # and the watchers that are open get the witness
                got = await asyncio.gather(*(asyncio.wait_for(ws.recv(), 30) for ws in opened))
                assert all(json.loads(g)["Name"] == "IBM" for g in got)
            finally:
                await asyncio.gather(*(ws.close() for ws in opened))

        asyncio.run(scenario())
    assert "Traceback" not in srv.log.read_text()


def test_the_caps_per_address_and_in_all_and_what_a_refused_watcher_is_told(tmp_path):
    settings = {"CAYUGA_MAX_WEBSOCKETS": "5", "CAYUGA_MAX_WEBSOCKETS_PER_ADDRESS": "3",
                "CAYUGA_MAX_HTTP_CONNECTIONS": "2"}
    with ServerProcess(tmp_path / "data", tmp_path / "server.log", settings) as srv:
        sid = srv.http_client.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()["id"]
        url = f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}"

        async def scenario() -> None:
            first, refused = await open_watchers(url, 4, "127.0.0.1")
            assert len(first) == 3 and len(refused) == 1
            assert refused[0][0] == 503 and "max_websockets_per_address (3)" in detail(refused[0][1])
            second, refused = await open_watchers(url, 3, "127.0.0.2")  # another address: room for 2 more
            assert len(second) == 2 and len(refused) == 1
            assert refused[0][0] == 503
            assert detail(refused[0][1]).startswith("the server holds max_websockets (5) WebSockets, its cap for "
                                                    "all clients; retry later, or raise max_websockets "
                                                    "(CAYUGA_MAX_WEBSOCKETS)"), refused[0][1]
            # five WebSockets and max_http_connections 2: plain requests are served all the same
            for _ in range(5):
                assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200
            assert metric(srv.base_url, "websockets") == 1 and metric(srv.base_url, "websockets_per_address") == 1

            # cayuga watch, refused (all five are open), says which cap and which setting
            watch = subprocess.run(cayuga_command("watch", sid, "--url", srv.base_url, "--retry-for", "0"),
                                   env=srv.env, capture_output=True, text=True, timeout=120)
            assert watch.returncode == 1
            assert "the server refused the WebSocket: the server holds max_websockets" in watch.stderr, watch.stderr
            assert "max_websockets (5)" in watch.stderr and "Traceback" not in watch.stderr

            # one closes: its room is free again, for any address
            await first.pop().close()

            async def gets_in():
                got, _ = await open_watchers(url, 1, "127.0.0.2")
                return got

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not (got := await gets_in()):
                assert loop.time() < deadline, "no room after a WebSocket closed"
                await asyncio.sleep(0.05)
            second += got
            await asyncio.gather(*(ws.close() for ws in first + second))

        asyncio.run(scenario())
    assert "Traceback" not in srv.log.read_text()


def test_an_over_long_websocket_url_gets_414_not_silence(tmp_path):
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as srv:
        sid = srv.http_client.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()["id"]
        for size in (8 << 10, 10 << 10, 1 << 20):
            path = f"/ws/subscriptions/{sid}?pad="
            path += "a" * (size - len(path))
            with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = s.recv(4096)  # a timeout here is the silence this test is about
                    assert chunk, f"closed without an answer ({size} bytes)"
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 414 "), (size, answer[:200])
        # a header line over 8 KiB (websockets' own limit): 431, not silence either
        with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as s:
            s.sendall(f"GET /ws/subscriptions/{sid} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {'b' * (9 << 10)}\r\n"
                      "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
        # a WebSocket URL within the limit still opens, and the server is well
        with websockets.sync.client.connect(f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}?p=" + "a" * 7000,
                                            open_timeout=30):
            pass
        assert srv.health()["status"] == "ok"
        wait_until(lambda: metric(srv.base_url, "request_too_large") == 4, what="the refusals counted")
    assert "Traceback" not in srv.log.read_text()
