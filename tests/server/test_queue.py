"""The T-delayed priority queue, and backpressure from a stalled engine to TCP senders."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from server.engine import Event
from server.queue import DelayQueue, QueueClosed


def ev(t1, t0=None):
    return Event("Stock", ("IBM", 1.0, 1), t1 if t0 is None else t0, t1)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_releases_in_t1_order_only_after_the_delay():
    clock = Clock(100.0)
    q = DelayQueue(capacity=10, delay=10, clock=clock)
    for t in (95, 91, 93, 89):
        assert q.put(ev(t))
    assert [e.t1 for e in q.get_batch(10, timeout=0.01)] == [89]  # only 89 < 100 - 10
    clock.now = 104
    assert [e.t1 for e in q.get_batch(10, timeout=0.01)] == [91, 93]
    assert q.get_batch(10, timeout=0.01) == []
    # an event older than one already released is dropped and counted; an equal one is kept
    assert q.put(ev(92)) is False and q.late == 1
    assert q.put(ev(93)) is True
    clock.now = 200
    assert [e.t1 for e in q.get_batch(10, timeout=0.01)] == [93, 95]


def test_ties_keep_arrival_order_and_batches_are_bounded():
    q = DelayQueue(capacity=10, delay=0, clock=Clock(1000.0))
    events = [Event("Stock", (str(i), 1.0, 1), 5, 5) for i in range(6)]
    for e in events:
        q.put(e)
    assert q.get_batch(4, timeout=0.01) == events[:4]
    assert q.get_batch(4, timeout=0.01) == events[4:]


def test_a_full_queue_blocks_producers_until_there_is_room():
    q = DelayQueue(capacity=2, delay=0, clock=Clock(1000.0))
    q.put(ev(1))
    q.put(ev(2))
    with pytest.raises(TimeoutError):
        q.put(ev(3), timeout=0.05)
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.put(ev(3), timeout=5), done.set()))
    t.start()
    time.sleep(0.05)
    assert not done.is_set()
    assert [e.t1 for e in q.get_batch(1, timeout=0.01)] == [1]
    t.join(5)
    assert done.is_set() and len(q) == 2


def test_close_with_drain_releases_everything_and_refuses_new_events():
    q = DelayQueue(capacity=5, delay=1e9, clock=Clock(0.0))
    q.put(ev(10))
    q.put(ev(5))
    q.close(drain=True)
    with pytest.raises(QueueClosed):
        q.put(ev(20))
    assert [e.t1 for e in q.get_batch(10, timeout=0.01)] == [5, 10]


def test_a_stalled_engine_blocks_the_receivers_and_the_queue_stays_bounded(start_server):
    srv = start_server(queue_capacity=50, batch_size=10)
    d = srv.daemon
    release = threading.Event()
    stalled = d.submit(lambda eng: release.wait(30))  # the engine thread waits here
    deadline = time.monotonic() + 5
    while not stalled.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        line = '{"stream": "Stock", "t1": %d, "Name": "IBM", "Price": 1.0, "Volume": 1}\n'
        payload = "".join(line % i for i in range(20_000)).encode()
        sock = socket.create_connection(("127.0.0.1", srv.tcp_port))
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        # the receiver fills the bounded queue, then blocks: it stops reading the socket
        deadline = time.monotonic() + 10
        while len(d.queue) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert len(d.queue) == 50
        assert d.counters.get("received_tcp") == 50
    finally:
        release.set()  # never leave the engine thread waiting
    sender.join(30)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(30)
    assert sock.recv(100) == b""  # the server read everything and closed without errors
    sock.close()
    deadline = time.monotonic() + 30
    while d.engine.stats.events < 20_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.engine.stats.events == 20_000
