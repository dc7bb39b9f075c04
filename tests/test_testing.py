"""clients.testing, the public helpers for tests: its docstring example runs,
its servers start on free ports and leave nothing behind, a server process
killed with SIGKILL comes back on the same ports with its witnesses, and its
generators are deterministic."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import clients.testing
from clients.client import CayugaClient
from clients.testing import (
    RISING, STOCK, ServerProcess, WaitTimeout, cayuga_env, collect, free_ports, increasing_cel, logged_witnesses,
    random_walk, running_server, stock, symbols, wait_until, write_queries, write_ticks,
)



def _cayuga_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cayuga")]


def test_the_module_docstring_example_runs():
    result = doctest.testmod(clients.testing, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
    wait_until(lambda: not _cayuga_threads(), 10, what="the example's server threads to end")


def test_running_server_serves_on_free_ports_and_stops_its_threads(tmp_path):
    with running_server(tmp_path / "data", max_connections=50) as srv:
        assert srv.http_port > 0 and srv.tcp_port > 0 and srv.settings.max_connections == 50
        assert srv.settings.data_dir == tmp_path / "data"
        with CayugaClient(srv.base_url) as client:
            sub = client.subscribe(cel=RISING)
            with client.watch(sub["id"], timeout=10) as matches:
                with client.sender() as s:
                    s.send_many([stock("IBM", 80.0, 1, 1), stock("IBM", 85.0, 1, 2)])
                assert collect(matches, 1) == [{"stream": "Rising", "t0": 1, "t1": 2, "Name": "IBM",
                                                "Before": 80.0, "After": 85.0}]
    wait_until(lambda: not _cayuga_threads(), 10, what="every cayuga thread to end")


def test_free_ports_asked_for_together_are_different_and_a_server_process_gets_two(tmp_path):
    """Two ports picked one after the other could be the same port (the kernel's pick): a
    power-cut test's restarted server once got one port for both, and could not start."""
    for _ in range(50):
        ports = free_ports(4)
        assert len(set(ports)) == 4 and all(p > 0 for p in ports)
    for given in ({}, {"http_port": ports[0]}, {"tcp_port": ports[0]}):
        srv = ServerProcess(tmp_path / "data", **given)
        try:
            assert srv.http_port != srv.tcp_port and srv.http_port > 0 and srv.tcp_port > 0
            assert all(getattr(srv, k) == v for k, v in given.items())
        finally:
            srv.stop()


def test_a_server_process_killed_comes_back_on_its_ports_with_its_witnesses(tmp_path):
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log")
    try:
        srv.start()
        assert srv.wait_up()["status"] in clients.testing.UP
        with CayugaClient(srv.base_url) as client:
            sid = client.subscribe(cel=RISING)["id"]
            client.post_events([stock("IBM", 80.0, 1, 1), stock("IBM", 90.0, 1, 2), stock("IBM", 99.0, 1, 3)])
            # 80 -> 90 and 90 -> 99 (the instance at 80 ended at 90); the one at 99 waits
            wait_until(lambda: client.subscription(sid)["last_seq"] == 2, 30, what="two witnesses logged")
        port, first = srv.http_port, srv.proc.pid
        srv.kill()
        assert srv.proc.returncode == -9
        srv.start()
        health = srv.wait_up()
        assert srv.proc.pid != first and srv.http_port == port
        assert health["recovered"].get("replayed_events") == 3, health["recovered"]
        assert srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"] == 2
        with CayugaClient(srv.base_url) as client:  # the instance at 99 was restored: 104 is a new witness
            client.post_events([stock("IBM", 104.0, 1, 4)])
            wait_until(lambda: client.subscription(sid)["last_seq"] == 3, 30, what="the third witness logged")
        got = logged_witnesses(srv.base_url, sid, 3)
        assert [n for n, _ in got] == [1, 2, 3]
        assert [(json.loads(w)["Before"], json.loads(w)["After"]) for _, w in got] == [
            (80.0, 90.0), (90.0, 99.0), (99.0, 104.0)]
    finally:
        srv.stop()
    assert srv.proc.poll() is not None
    log = srv.log.read_text()
    assert log.count("---- start") == 2 and "Traceback" not in log


def test_a_server_process_that_exits_is_reported_with_its_log(tmp_path):
    (tmp_path / "data").write_text("a file where the data directory should be")
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log")
    try:
        srv.start()
        with pytest.raises(RuntimeError, match="cayuga serve is not running"):
            srv.wait_up(30)
    finally:
        srv.stop()


def test_wait_until_returns_the_value_or_names_what_it_waited_for():
    assert wait_until(lambda: 7, 1) == 7
    with pytest.raises(WaitTimeout, match="timed out after 0.05 s waiting for the answer .last value: 0."):
        wait_until(lambda: 0, 0.05, what="the answer")


def test_the_generators_are_seeded_and_their_files_read_back(tmp_path):
    assert random_walk(3, 50, seed=4) == random_walk(3, 50, seed=4) != random_walk(3, 50, seed=5)
    events = random_walk(3, 50, seed=4)
    assert {e.values[0] for e in events} <= set(symbols(3)) and [e.t1 for e in events] == list(range(1, 51))
    write_ticks(tmp_path / "ticks.jsonl", 50, 3, seed=4)
    lines = [json.loads(x) for x in (tmp_path / "ticks.jsonl").read_text().splitlines()]
    assert [(x["Name"], x["Price"], x["Volume"], x["t1"]) for x in lines] == [(*e.values, e.t1) for e in events]
    assert all(set(x) == {"stream", "t0", "t1"} | {a.name for a in STOCK.attributes} for x in lines)
    paths = write_queries(tmp_path / "q", 2, length=3)
    assert [p.name for p in paths] == ["S00000.cel", "S00001.cel"]
    assert paths[1].read_text() == increasing_cel("S00001", 3)


def test_collect_stops_at_n():
    assert collect(iter([{"a": 1}, {"a": 2}, {"a": 3}]), 2) == [{"a": 1}, {"a": 2}]
    assert collect(iter([{"a": 1}]), 5) == [{"a": 1}]
    assert collect(iter([]), 0) == []


def test_the_generators_load_neither_the_server_nor_the_http_clients():
    """``cayuga bench`` takes its events from here: importing them must not add
    the server, httpx or websockets to the benchmark process (its peak RSS is
    part of every summary)."""
    code = ("import sys; from clients.testing import STOCK, random_walk; import clients.bench.cli; "
            "random_walk(2, 5); print(sorted(m for m in ('server', 'httpx', 'websockets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=cayuga_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_public_name_is_what_it_names_once_every_submodule_is_loaded():
    """A submodule named like a public name would shadow it once imported."""
    import importlib
    import types

    for sub in ("market", "servers", "waiting", "witnesses"):
        importlib.import_module(f"clients.testing.{sub}")
    assert not [n for n in clients.testing.__all__ if isinstance(getattr(clients.testing, n), types.ModuleType)]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'; it has RISING, STOCK, "):
        clients.testing.nothing  # noqa: B018


def test_rising_is_the_query_of_the_readme_and_of_the_server_benchmark():
    root = Path(__file__).resolve().parents[1]
    assert (root / "clients" / "bench" / "queries" / "rising.cel").read_text() == RISING + "\n"
    assert RISING in (root / "README.md").read_text().replace("\n", " ")


#: Test files that still poll with a loop of their own (a deadline and a sleep) instead
#: of wait_until: test_runaway.py is being rewritten; the others are left for later.
OWN_POLLING = {"tests/server/test_runaway.py", "tests/server/test_crash.py", "tests/server/test_witlog.py",
               "tests/server/test_diskfull.py", "tests/test_readme_walkthrough.py",
               "tests/spark/test_stream_recovery.py", "tests/ui/readme_screenshot.py"}


def test_tests_wait_with_wait_until_not_a_polling_loop_of_their_own():
    """A private copy of wait_until (a deadline, a condition and a sleep in a loop)
    repeats its timeout and failure message in its own way; test_send_cli,
    test_diskfull_serve and test_http_limits each had one."""
    root = Path(__file__).resolve().parents[1]
    deadline, sleep = "deadline = time." + "monotonic()", "time." + "sleep("  # (not this file's own text)
    own = sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("*.py")
                 if deadline in p.read_text() and sleep in p.read_text())
    assert set(own) <= OWN_POLLING, f"use clients.testing.wait_until in {sorted(set(own) - OWN_POLLING)}"
