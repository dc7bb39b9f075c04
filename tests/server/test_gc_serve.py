"""``cayuga serve`` runs with the cyclic collector's young generation raised
(air/engine/memory.py GC_YOUNG_THRESHOLD), as ``cayuga run`` feeds: at Python's
default a young collection ran every few hundred events."""

from __future__ import annotations

import re
import socket

import httpx

from clients.client import CayugaClient
from clients.testing import ServerProcess, wait_until
from server.serve import RunningServer
from tests.server.conftest import make_settings

N = 20_000


def _gen0(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    m = re.search(r'^python_gc_collections_total\{generation="0"\} (\S+)$', text, re.M)
    assert m, "python_gc_collections_total is not in /metrics"
    return float(m.group(1))


def _processed(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return float(re.search(r"^cayuga_events_processed_total (\S+)$", text, re.M).group(1))


def test_a_server_feeding_events_collects_its_young_generation_rarely(tmp_path):
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as srv:
        srv.wait_up()
        r = httpx.post(f"{srv.base_url}/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH Everything"},
                       timeout=10)
        assert r.status_code in (200, 201), r.text
        before = _gen0(srv.base_url)
        lines = _lines(N)
        with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10) as s:
            s.sendall(lines)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # the server has read everything (it closes its side)
                pass
        wait_until(lambda: _processed(srv.base_url) >= N, 60, "every event processed")
        collections = _gen0(srv.base_url) - before
    # at Python's default (700) this took several hundred young collections: one a batch at least
    assert collections < 20, collections


def test_an_engine_worker_collects_its_young_generation_rarely_too(tmp_path):
    """The engine worker process (engine_workers: 1, the default) feeds the engine:
    it raises the young generation's threshold as ``cayuga serve`` does, and says
    its collections on /health (per worker, at each instance count)."""
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        c.subscribe(cel="SELECT * FROM Stock PUBLISH Everything")
        link = srv.daemon.links[0]
        before = link.call("counts")[2]
        with c.sender() as s:
            s.send_lines(_lines(N), N)
        wait_until(lambda: c.health()["events_taken"] >= N, 60, "every event processed")
        collections = link.call("counts")[2][0] - before[0]
        wait_until(lambda: c.health()["workers"][0]["gc_collections"] is not None, 60, "a count on /health")
        assert 'cayuga_engine_worker_gc_collections_total{generation="0",worker="0"}' in c.http.get("/metrics").text
    # at Python's default (700) this took several hundred young collections
    assert collections < 20, collections


def _lines(n: int) -> bytes:
    return "".join(f'{{"stream": "Stock", "t0": {i}, "t1": {i}, "Name": "N{i % 50}", "Price": {i % 7}.5, '
                   f'"Volume": {i}}}\n' for i in range(1, n + 1)).encode()
