"""Real servers on free loopback ports; every test checks it leaves no thread behind."""

from __future__ import annotations

import threading

import pytest

from clients.client import CayugaClient
from server.config import load_settings
from server.serve import RunningServer
from tests.waiting import WaitTimeout, wait_until


def cayuga_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("cayuga"))


def assert_no_cayuga_threads(timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` s) for every cayuga thread to end, then check none is left."""
    try:
        wait_until(lambda: not cayuga_threads(), timeout, what="every cayuga thread to end")
    except WaitTimeout:
        raise AssertionError(f"threads left behind: {cayuga_threads()}") from None


def make_settings(tmp_path, **kw):
    base = dict(data_dir=tmp_path / "data", http_port=0, tcp_port=0, log_level="warning", shutdown_timeout=5)
    base.update(kw)
    return load_settings(None, **base)


@pytest.fixture
def start_server(tmp_path):
    """Start servers with setting overrides; all are stopped after the test."""
    started: list[RunningServer] = []

    def start(**kw) -> RunningServer:
        srv = RunningServer(make_settings(tmp_path, **kw)).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
    assert_no_cayuga_threads()


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def client(server):
    with CayugaClient(server.base_url) as c:
        yield c


def stock(name, price, vol, t0, t1=None) -> dict:
    return {"stream": "Stock", "t0": t0, "t1": t0 if t1 is None else t1, "Name": name, "Price": price, "Volume": vol}


def collect(matches, n: int) -> list[dict]:
    out = []
    for w in matches:
        out.append(w)
        if len(out) == n:
            break
    return out
