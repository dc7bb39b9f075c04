"""What an engine worker does besides events holds them little: its instance counts (/health,
/metrics, the API) are made a slice at a time between the messages of its pipe
(server/budgetcheck.py's ``Counting``, as the engine thread's: counted at once, 10,000 subscriptions held the
worker's events 40-60 ms every second), and a large registration's slices wait for it
(server/subscriptions/registry.py's WORKER_SLICE_WAIT_S)."""

from __future__ import annotations

import pickle
import socket
import threading
from multiprocessing import Pipe

from air.cel import compile_cel
from air.engine import Engine
from clients.client import CayugaClient
from clients.testing import wait_until
from clients.testing.market import STOCK, random_walk
from server.budgetcheck import Counting
from server.serve import RunningServer
from server.workers import codec, worker
from server.workers.channel import ResultWriter
from tests.server.conftest import assert_no_cayuga_threads, make_settings, stock

RISING = "SELECT * FROM FILTER{{Name = '{s}'}}(Stock) NEXT{{$1.Name = $2.Name AND $2.Price > $1.Price}} Stock"
SYMBOLS = [f"S{i:05d}" for i in range(12)]  # random_walk's names


def _automata(symbol: str):
    return compile_cel(RISING.format(s=symbol), {"Stock": STOCK}).automata


def test_a_pass_counts_a_slice_at_a_time_each_as_it_was_when_counted():
    """With no time to spare, each step counts one subscription: events between two steps
    change the counts still to come, not those made; one removed before its turn is left
    out, one added after the pass began waits for the next."""
    eng = Engine()
    eng.declare(STOCK)
    for s in SYMBOLS:
        eng.add(_automata(s), s)
    walk = random_walk(len(SYMBOLS), 3000, seed=3)
    for e in walk[:1000]:
        eng.feed(e)
    counting = Counting(eng.owners)
    eng.remove(SYMBOLS[5])
    eng.add(_automata("LATE"), "LATE")
    seen: dict[str, int] = {}
    for step in range(len(SYMBOLS)):
        before = set(counting.counts)
        done = counting.step(eng, 0.0)
        new = set(counting.counts) - before
        assert done == (step == len(SYMBOLS) - 1)
        if step == 5:
            assert new == set()  # removed before its turn
        else:
            (owner,) = new
            assert counting.counts[owner] == eng.instance_count(owner)  # as it is now
            seen[owner] = counting.counts[owner]
        for e in walk[1000 + 100 * step:1100 + 100 * step]:
            eng.feed(e)
    assert counting.counts == seen and set(seen) == set(SYMBOLS) - {SYMBOLS[5]}
    assert all(seen.values()) and counting.cost > 0
    top = max(seen.values())
    assert counting.heaviest == (next(o for o in SYMBOLS if seen.get(o) == top), top)


def _command(number: int, name: str, *args) -> bytes:
    return codec.COMMAND + pickle.dumps((number, name, args))


def test_the_worker_answers_other_messages_while_its_count_goes_on_and_then_the_count(monkeypatch):
    """A real worker loop on a real pipe, one subscription counted a slice: a command sent
    after ``counts`` is answered first, between the count's slices, and the count's answer
    then has every subscription's count, the engine's own."""
    monkeypatch.setattr(worker, "COUNT_BUDGET_SECONDS", 0.0)
    ours, theirs = Pipe()
    a, b = socket.socketpair()
    settings = {"functions": {}, "engine_workers": 1, "max_state_bytes": 1 << 30,
                "max_instances_per_subscription": 0}
    w = worker.Worker(theirs, settings, ResultWriter(b))
    ours.send_bytes(_command(0, "declare", STOCK))
    for i, s in enumerate(SYMBOLS, 1):
        ours.send_bytes(_command(i, "add", s, _automata(s)))
    n = len(SYMBOLS) + 1
    # sent before the loop runs: the pass is under way when the next two are taken
    ours.send_bytes(_command(n, "counts"))
    ours.send_bytes(_command(n + 1, "instance_count", SYMBOLS[0]))
    ours.send_bytes(_command(n + 2, "remove", SYMBOLS[-1]))
    loop = threading.Thread(target=w.run, name="test-worker-loop")
    loop.start()
    try:
        answers = []
        while len(answers) < n + 3:
            assert ours.poll(30), f"the worker answered {len(answers)} of {n + 3} commands"
            msg = ours.recv_bytes()
            assert msg[:1] == codec.ANSWER
            answers.append(pickle.loads(msg[1:]))
        assert all(ok for _n, ok, _v in answers), answers
        assert [a[0] for a in answers] == [*range(n), n + 1, n + 2, n]
        counts, cost, collections, cpu_parts = answers[-1][2]
        # the last was removed before its turn (one a slice: the remove was taken after the first)
        assert counts == {s: w.engine.instance_count(s) for s in SYMBOLS[:-1]}
        assert cost >= 0 and len(collections) == 3 and len(cpu_parts) == 3
        assert w.counting is None
        ours.send_bytes(_command(n + 3, "stop"))
        loop.join(30)
        assert not loop.is_alive()
    finally:
        ours.close()
        loop.join(30)
        a.close()
        b.close()


GAP = 0.0123  # INSTALL_GAP_S in these tests: the sleeps of this length are the registration's gaps


def _recording_waits(monkeypatch) -> list[tuple[int, bool]]:
    """Each wait of a registration for its worker's answers: how many it waited for, and
    whether they had all come when it returned; and each of its gaps for events (``(GAP, True)``)."""
    import time

    from server.subscriptions import registry

    calls: list[tuple[int, bool]] = []
    sleep = time.sleep

    def recorded_sleep(seconds: float) -> None:
        if seconds == GAP:
            calls.append((GAP, True))
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded_sleep)
    monkeypatch.setattr(registry, "INSTALL_GAP_S", GAP)
    real = registry.futures_wait

    def recorded(futures, timeout):
        got = real(futures, timeout)
        calls.append((len(futures), not got.not_done))
        return got

    monkeypatch.setattr(registry, "futures_wait", recorded)
    monkeypatch.setattr(registry, "INSTALL_SLICE_S", 0.0)  # one query a slice, whatever the machine's speed
    return calls


def test_a_registration_waits_for_the_worker_before_its_next_slice_but_one(tmp_path, monkeypatch):
    """A large registration is installed a slice at a time, events between; the engine thread
    sends each slice on to the worker and takes the next at once, so a worker slower than it
    had slice after slice queued before the events sent between them (40-140 ms at 10,000
    queries). The request's thread now waits, before each slice, for the worker to have
    installed the slice before the last: every wait found it done, and every query runs. With
    no events flowing, no slice waits for them (INSTALL_GAP_S)."""
    from clients.testing.market import increasing_cel, symbols

    calls = _recording_waits(monkeypatch)
    with RunningServer(make_settings(tmp_path, time="event", engine_workers=1)) as srv, \
            CayugaClient(srv.base_url) as c:
        got = c.subscribe_many([{"cel": increasing_cel(sym, 3)} for sym in symbols(12)])
        assert len(got) == 12
        assert calls[0] == (0, True) and calls[1:] == [(1, True)] * 11  # one wait a slice, for one message each
        # (and no gap for events: none flowed)
        with c.sender() as snd:
            snd.send_many([stock(sym, 10.0 + k, 1, 12 * k + i) for k in range(3)
                           for i, sym in enumerate(symbols(12))])
        for sub in got:
            wait_until(lambda: c.subscription(sub["id"])["last_seq"] == 1, what="each query's one witness")
    assert_no_cayuga_threads()


def test_a_registration_waits_once_for_a_worker_that_does_not_answer(tmp_path, monkeypatch):
    """A worker stopped in a debugger (SIGSTOP) is waited for once, WORKER_SLICE_WAIT_S; the
    rest of the registration goes on without waiting, and the worker installs it all once
    it runs again."""
    import os
    import signal

    from clients.testing.market import increasing_cel, symbols
    from server.subscriptions import registry

    calls = _recording_waits(monkeypatch)
    monkeypatch.setattr(registry, "WORKER_SLICE_WAIT_S", 0.2)
    with RunningServer(make_settings(tmp_path, time="event", engine_workers=1)) as srv, \
            CayugaClient(srv.base_url) as c:
        link = srv.daemon.links[0]
        os.kill(link.process.pid, signal.SIGSTOP)
        try:
            got = c.subscribe_many([{"cel": increasing_cel(sym, 3)} for sym in symbols(6)])
        finally:
            os.kill(link.process.pid, signal.SIGCONT)
        assert len(got) == 6
        assert calls == [(0, True), (1, False)]  # waited once, in vain; not again
        with c.sender() as snd:
            snd.send_many([stock(sym, 10.0 + k, 1, 6 * k + i) for k in range(3) for i, sym in enumerate(symbols(6))])
        for sub in got:
            wait_until(lambda: c.subscription(sub["id"])["last_seq"] == 1, what="each query's one witness")
    assert_no_cayuga_threads()


def test_while_events_flow_a_registration_leaves_the_engine_thread_to_them_between_slices(tmp_path, monkeypatch):
    """Slices back to back took both cores of a 2-core machine (the engine thread installing, the
    worker installing what it sent) and the live events waited 40-150 ms: while events flow, a
    registration leaves the engine thread INSTALL_GAP_S to them before each next slice."""
    import threading

    from clients.testing.market import increasing_cel, symbols

    calls = _recording_waits(monkeypatch)
    with RunningServer(make_settings(tmp_path, time="event", engine_workers=1)) as srv, \
            CayugaClient(srv.base_url) as c:
        d, stop = srv.daemon, threading.Event()

        def send() -> None:
            with CayugaClient(srv.base_url) as feeder:
                k = 0
                while not stop.is_set():
                    feeder.post_events([stock("IBM", 10.0, 1, t) for t in range(k, k + 20)])
                    k += 20

        feeder = threading.Thread(target=send, name="test-feeder")
        feeder.start()
        try:
            wait_until(lambda: d.processing.fed > 100, what="events flowing through the engine")
            got = c.subscribe_many([{"cel": increasing_cel(sym, 3)} for sym in symbols(40)])
        finally:
            stop.set()
            feeder.join(30)
        assert len(got) == 40 and not feeder.is_alive()
        gaps = calls.count((GAP, True))
        assert 1 <= gaps <= 40 - 2, calls  # (none before the third slice: events are judged over two)
    assert_no_cayuga_threads()
