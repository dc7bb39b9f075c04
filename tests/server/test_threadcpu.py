"""The main process's CPU by thread (issue 32, server/observability/threadcpu.py):
which of its threads, sharing one interpreter lock, carries the load, on /metrics,
a TCP connection's CPU kept once it has ended."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx

from clients.testing import wait_until
from server.observability.threadcpu import by_role, role, thread_ended
from tests.server.conftest import stock


def _burn(seconds: float) -> float:
    """Spin until this thread has used ``seconds`` of CPU; its CPU so far."""
    while time.thread_time() < seconds:
        sum(range(1000))
    return time.thread_time()


def test_per_item_threads_are_counted_by_role():
    assert role("cayuga-tcp-41522") == "cayuga-tcp"
    assert role("cayuga-tcp-listener") == "cayuga-tcp-listener"  # one thread, not a connection's
    assert role("cayuga-backfill-s3") == "cayuga-backfill"
    assert role("cayuga-engine") == "cayuga-engine"
    assert role("MainThread") == "MainThread"


def test_a_live_threads_cpu_is_read_and_an_ended_ones_kept_once():
    name = "test-threadcpu-burner"
    burnt: dict[str, float] = {}
    go_on, ended = threading.Event(), threading.Event()

    def work() -> None:
        burnt["live"] = _burn(0.05)
        go_on.wait(30)
        burnt["end"] = _burn(0.1)
        thread_ended()
        ended.set()
        go_on.wait(30)  # (still alive, and already counted as ended: read once, not twice)

    t = threading.Thread(target=work, name=name)
    t.start()
    try:
        wait_until(lambda: "live" in burnt, timeout=30)
        assert by_role()[name] >= burnt["live"]  # read from its CPU clock while it runs
        go_on.set()
        wait_until(ended.is_set, timeout=30)
        kept = by_role()[name]
        assert burnt["end"] <= kept < 1.5 * burnt["end"]  # (counted twice would be twice it)
    finally:
        go_on.set()
        t.join(30)
    assert burnt["end"] <= by_role()[name] == kept  # ended: what it added, no more


def _thread_cpu(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^cayuga_thread_cpu_seconds_total\{thread="([^"]+)"\} (\S+)$', text, re.M)}


def _received(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return float(re.search(r'^cayuga_events_received_total\{source="tcp"\} (\S+)$', text, re.M).group(1))


def test_metrics_say_each_threads_cpu_and_keep_an_ended_connections(start_server):
    srv = start_server()
    before = _thread_cpu(srv.base_url)
    assert {"cayuga-engine", "MainThread"} <= set(before), before
    n = 20000
    lines = "".join(json.dumps(stock("IBM", 1.0, i, i)) + "\n" for i in range(1, n + 1)).encode()
    with socket.create_connection(("127.0.0.1", srv.daemon.receiver.port), timeout=10) as s:
        s.sendall(lines)
        wait_until(lambda: _received(srv.base_url) >= n, timeout=60)
        during = _thread_cpu(srv.base_url)
        assert during["cayuga-tcp"] > before.get("cayuga-tcp", 0.0)  # the live connection's, read from its clock
    wait_until(lambda: not any(re.fullmatch(r"cayuga-tcp-\d+", t.name) for t in threading.enumerate()), timeout=30)
    after = _thread_cpu(srv.base_url)
    assert after["cayuga-tcp"] >= during["cayuga-tcp"]  # ended: its CPU kept (a counter never goes back)
    assert after["cayuga-engine"] > 0
