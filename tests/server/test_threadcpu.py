"""The main process's CPU by thread (issue 32, server/observability/threadcpu.py):
which of its threads, sharing one interpreter lock, carries the load, on /metrics,
a TCP connection's CPU kept once it has ended; and each thread's (and each engine
worker's) wait for a CPU, seen when a real busy process shares its core."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
from hypothesis import given
from hypothesis import strategies as st

from clients.client import CayugaClient
from clients.testing import wait_until
from server.observability.threadcpu import (ENDED_OTHERS, MAX_ENDED_ROLES, ProcessCpuWait, _Kept, by_role,
                                            cpu_wait, role, thread_ended, wait_by_role)
from tests.conftest import unavailable
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
    # the number Python, a thread pool or asyncio gives a thread is not its role
    assert role("Thread-12 (run)") == "Thread (run)" and role("Thread-7") == "Thread"
    assert role("ThreadPoolExecutor-0_3") == "ThreadPoolExecutor" and role("asyncio_0") == "asyncio"
    assert role("AnyIO worker thread") == "AnyIO worker thread"


# a step of the readings: each live thread by its key grows by its nanoseconds (None: it has ended)
_steps = st.lists(st.dictionaries(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 10**10)), max_size=6),
                  min_size=1, max_size=12)


@given(_steps)
def test_the_kept_totals_in_seconds_never_go_back_whatever_order_threads_end_in(steps):
    """Totals kept as threads end, read in seconds, never go back, not by a rounding step either
    (a plain float sum could: a gone thread's part moved from the live sum to the kept one is
    added in another order; CI once saw 4.935158206 after 4.9351582060000005), and are the one
    float nearest the exact sum of every thread's figure."""
    kept, figures, gone, last = _Kept(), {}, 0, {}
    for step in steps:
        for key, grew in step.items():
            if grew is None:
                gone += figures.pop(key, 0)
            else:
                figures[key] = figures.get(key, 0) + grew
        got = kept.seconds({key: ("g" if key % 2 else "h", ns) for key, ns in figures.items()})
        for group, seconds in got.items():
            assert seconds >= last.get(group, 0.0)
        last.update(got)
        assert sum(kept.update({key: ("g" if key % 2 else "h", ns) for key, ns in figures.items()}).values()) \
            == gone + sum(figures.values())


def test_the_ended_threads_roles_stay_bounded_however_many_end():
    """Threads of names of their own that end keep their figures, but at most MAX_ENDED_ROLES roles
    by name besides the server's own threads' (``cayuga-*``, ``MainThread``: a fixed set): the rest
    under ENDED_OTHERS, so a scrape's series stay bounded; nothing is lost. (The other tests' threads
    are named as the server's are: what they check is kept by name whatever ran before.)"""
    names = [f"test-threadcpu-many-{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(MAX_ENDED_ROLES + 8)]
    go = threading.Event()

    def work() -> None:
        _burn(0.002)
        go.wait(30)

    threads = [threading.Thread(target=work, name=n) for n in names]
    for t in threads:  # (each read alive, then ended: its last reading kept)
        t.start()
    before = by_role()
    assert set(names) <= set(before)
    go.set()
    for t in threads:
        t.join(30)
    for n in names:
        wait_until(lambda: not any(t.name == n for t in threading.enumerate()), timeout=30)
    after = by_role()
    live = {role(t.name) for t in threading.enumerate()}
    foreign = {r for r in set(after) - live if not (r.startswith("cayuga-") or r == "MainThread")}
    assert len(foreign) <= MAX_ENDED_ROLES + 1, sorted(foreign)
    assert ENDED_OTHERS in after and not set(names) <= set(after)
    assert sum(after.values()) >= sum(before.values())  # kept, by name or among the others
    # past the bound, a thread of the server's own names that ends is still kept by its name
    hold = threading.Event()
    own = threading.Thread(target=hold.wait, args=(30,), name="cayuga-test-threadcpu-own")
    own.start()
    assert "cayuga-test-threadcpu-own" in by_role()
    hold.set()
    own.join(30)
    wait_until(lambda: not any(t.name == "cayuga-test-threadcpu-own" for t in threading.enumerate()), timeout=30)
    assert "cayuga-test-threadcpu-own" in by_role()


def test_a_live_threads_cpu_is_read_and_an_ended_ones_kept_once():
    name = "cayuga-test-threadcpu-burner"
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


def test_a_thread_that_ends_without_saying_so_keeps_its_last_reading():
    """A thread that ends without :func:`thread_ended` (an idle pool worker, a snapshot's thread)
    keeps, in its role's total, what it had at the last reading: a counter never goes back."""
    name = "cayuga-test-threadcpu-quiet"
    burnt: dict[str, float] = {}
    go_on = threading.Event()

    def work() -> None:
        burnt["live"] = _burn(0.05)
        go_on.wait(30)

    t = threading.Thread(target=work, name=name)
    t.start()
    try:
        wait_until(lambda: "live" in burnt, timeout=30)
        seen = by_role()[name]
        assert seen >= burnt["live"]
    finally:
        go_on.set()
        t.join(30)
    assert by_role()[name] == seen  # ended unannounced: its last reading kept, once
    assert by_role()[name] == seen


def test_a_thread_that_shares_its_core_with_a_busy_process_is_seen_waiting_for_it():
    """A thread pinned to one core beside a real process spinning on the same core: both are ready
    to run and one core takes turns, so each waits for it, and says so (schedstat's run delay);
    the thread's wait is kept once it ends, once."""
    if cpu_wait("/proc/thread-self/schedstat") is None:
        unavailable("no schedstat in /proc: this kernel does not say how long a thread waited for a CPU")
    core = min(os.sched_getaffinity(0))
    name = "cayuga-test-threadcpu-waiter"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    waited: dict[str, float] = {}
    stop, ended = threading.Event(), threading.Event()

    def work() -> None:
        os.sched_setaffinity(0, {core})  # (this thread only)
        while not stop.is_set():
            sum(range(1000))
        thread_ended()
        ended.set()

    t = threading.Thread(target=work, name=name)
    try:
        os.sched_setaffinity(spinner.pid, {core})
        before = ProcessCpuWait(spinner.pid).read()
        t.start()
        wait_until(lambda: wait_by_role().get(name, 0.0) > 0.05, timeout=60,
                   what="the pinned thread's wait for its core")
        wait_until(lambda: ProcessCpuWait(spinner.pid).read() > before + 0.05, timeout=60,
                   what="the spinning process's wait for the same core")
        stop.set()
        wait_until(ended.is_set, timeout=30)
        waited["kept"] = wait_by_role()[name]
    finally:
        stop.set()
        spinner.kill()
        spinner.wait(30)
        t.join(30)
    assert wait_by_role()[name] == waited["kept"] > 0.05  # ended: what it added, read no more


def test_a_process_wait_keeps_what_an_ended_thread_waited():
    """A process's wait as a counter (what /metrics gives of a worker): a thread that waited for
    its core and then ended keeps its part, so the total never goes back (a plain sum of the live
    threads' would drop by it)."""
    if cpu_wait("/proc/thread-self/schedstat") is None:
        unavailable("no schedstat in /proc: this kernel does not say how long a thread waited for a CPU")
    core = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    waits = ProcessCpuWait(os.getpid())
    stop = threading.Event()

    def work() -> None:
        os.sched_setaffinity(0, {core})
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=work, name="test-threadcpu-ends")
    try:
        os.sched_setaffinity(spinner.pid, {core})
        before = waits.read()
        t.start()
        wait_until(lambda: waits.read() > before + 0.2, timeout=60, what="the pinned thread's wait")
        during = waits.read()
        stop.set()
        t.join(30)
        tid = str(t.native_id)  # (gone from /proc a moment after join() returns)
        wait_until(lambda: tid not in os.listdir("/proc/self/task"), timeout=30, what="the thread gone from /proc")
        after = waits.read()
        live = ProcessCpuWait(os.getpid()).read()  # (a fresh reading: the live threads' alone, just after)
        assert after >= during  # kept
        assert after - live > 0.05  # the ended thread's part, which the live threads' sum has lost
    finally:
        stop.set()
        spinner.kill()
        spinner.wait(30)
        t.join(30)


def _thread_cpu(base_url: str, name: str = "cayuga_thread_cpu_seconds_total") -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf'^{name}\{{thread="([^"]+)"\}} (\S+)$', text, re.M)}


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
    # and each thread's wait for a CPU beside it, the ended connection's kept (where the kernel says it)
    if cpu_wait("/proc/thread-self/schedstat") is not None:
        waits = _thread_cpu(srv.base_url, "cayuga_thread_cpu_wait_seconds_total")
        assert {"cayuga-engine", "cayuga-tcp", "MainThread"} <= set(waits) and min(waits.values()) >= 0, waits


def test_an_engine_worker_that_shares_its_core_is_seen_waiting_for_it(start_server):
    """The worker process pinned to one core beside a real process spinning there: as events keep
    coming, it waits for its core each time it has a batch, and /health, /stats and /metrics say how
    long (the sum over its threads' schedstat run delay)."""
    if cpu_wait("/proc/thread-self/schedstat") is None:
        unavailable("no schedstat in /proc: this kernel does not say how long a process waited for a CPU")
    srv = start_server(engine_workers=1)
    link = srv.daemon.links[0]
    core = min(os.sched_getaffinity(link.process.pid))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {core})
        for tid in os.listdir(f"/proc/{link.process.pid}/task"):
            os.sched_setaffinity(int(tid), {core})
        with CayugaClient(srv.base_url) as c:
            c.subscribe(cel="SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Up")
            start = c.health()["workers"][0]["cpu_wait_seconds"]
            sent = [0]

            def waited() -> bool:  # (another batch each time: the worker wakes for it and waits for its core)
                sent[0] += 1
                c.post_events([stock("A", 2.0, 1, sent[0])])
                return c.health()["workers"][0]["cpu_wait_seconds"] > start + 0.01

            wait_until(waited, timeout=120, what="the pinned worker's wait for its core")
            (st,) = c.http.get("/stats").json()["workers"]
            assert st["cpu_wait_seconds"] > start
            text = c.http.get("/metrics").text
            got = float(re.search(r'^cayuga_engine_worker_cpu_wait_seconds_total\{worker="0"\} (\S+)$',
                                  text, re.M).group(1))
            assert got > start
    finally:
        spinner.kill()
        spinner.wait(30)
