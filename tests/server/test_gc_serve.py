"""``cayuga serve`` runs with the cyclic collector's young generation raised
(server/serve.py GC_YOUNG_THRESHOLD), as ``cayuga run`` feeds: at Python's
default a young collection ran every few hundred events."""

from __future__ import annotations

import re
import socket

import httpx

from clients.testing import ServerProcess, wait_until

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
        lines = "".join(f'{{"stream": "Stock", "t0": {i}, "t1": {i}, "Name": "N{i % 50}", "Price": {i % 7}.5, '
                        f'"Volume": {i}}}\n' for i in range(1, N + 1)).encode()
        with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10) as s:
            s.sendall(lines)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # the server has read everything (it closes its side)
                pass
        wait_until(lambda: _processed(srv.base_url) >= N, 60, "every event processed")
        collections = _gen0(srv.base_url) - before
    # at Python's default (700) this took several hundred young collections: one a batch at least
    assert collections < 20, collections
