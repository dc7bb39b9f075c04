"""Real servers on free loopback ports; every test checks it leaves no thread behind."""

from __future__ import annotations

import threading

import pytest

from clients.client import CayugaClient
from clients.testing import WaitTimeout, server_settings, wait_until
from clients.testing import collect, stock  # noqa: F401  (the tests of this folder take them from here)
from server.observability.counters import Count
from server.serve import RunningServer


def cayuga_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("cayuga"))


def assert_no_cayuga_threads(timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` s) for every cayuga thread to end, then check none is left."""
    try:
        wait_until(lambda: not cayuga_threads(), timeout, what="every cayuga thread to end")
    except WaitTimeout:
        raise AssertionError(f"threads left behind: {cayuga_threads()}") from None


def make_settings(tmp_path, **kw):
    """:func:`clients.testing.server_settings` with the data in ``tmp_path/data`` unless ``data_dir`` is given."""
    return server_settings(kw.pop("data_dir", tmp_path / "data"), **kw)


#: What a server logs when an engine worker numbered witnesses otherwise than its main process (witnesses.py's
#: ``_check_told``): the tests that start servers as processes look for it in their logs, over every restart.
NUMBERED_OTHERWISE = "witnesses otherwise than the main process"


def assert_numbered_alike(srv: RunningServer) -> None:
    """Every first seq the server's engine workers gave their subscriptions' witnesses was the one
    the main process gave them (server/delivery/witnesses.py's ``_check_told``)."""
    wrong = srv.daemon.counters.get(Count.WORKER_SEQS_TOLD_WRONG)
    assert wrong == 0, f"an engine worker numbered {wrong} subscriptions' batches otherwise than the main process"


@pytest.fixture
def start_server(tmp_path):
    """Start servers with setting overrides; all are stopped after the test, which checks that
    they left no thread behind and that their workers numbered witnesses as the main process did."""
    started: list[RunningServer] = []

    def start(**kw) -> RunningServer:
        srv = RunningServer(make_settings(tmp_path, **kw)).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
    assert_no_cayuga_threads()
    for srv in started:
        assert_numbered_alike(srv)


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture
def client(server):
    with CayugaClient(server.base_url) as c:
        yield c


def kept_by_cap(keys: list[str], cap: int, workers: int) -> set[str]:
    """Which of a keyed subscription's instances a cap of ``cap`` keeps at a check, one
    instance per key in ``keys`` (oldest first): one engine keeps the newest
    ``int(cap * SHED_TO)``; over ``workers`` engine workers (it is row-scaled) each keeps
    the newest ``int(ceil(cap / workers) * SHED_TO)`` of its own key group
    (server/budgetcheck.py), so that the cap holds for the subscription."""
    from air.partitioning import key_group
    from server.budget import SHED_TO

    if workers <= 1:
        return set(keys[len(keys) - int(cap * SHED_TO):])
    each = int(-(-cap // workers) * SHED_TO)
    kept: set[str] = set()
    for w in range(workers):
        mine = [k for k in keys if key_group(k, workers) == w]
        kept.update(mine[len(mine) - each:] if each else ())
    return kept
