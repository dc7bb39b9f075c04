"""The T-delayed priority queue, and backpressure from a stalled engine to TCP senders."""

from __future__ import annotations

import heapq
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.engine import Event
from clients.testing import wait_until
from server.ingest.queue import DelayQueue, QueueClosed
from server.observability.counters import Count
from tests.conftest import examples


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


class _Waits(threading.Condition):
    """The queue's conditions, recording how long a waiter asks to wait (and letting
    the test clock run that long instead: no wall-clock time in the test) and each
    notify, in lists shared by all of them (:func:`_recording_queue`)."""

    clock: Clock
    waits: list
    notified: list

    def wait(self, timeout=None):
        self.waits.append(timeout)
        self.clock.now += timeout * 1000.0 + 1e-6  # ms, just past it (time moves on, as in a real wait)
        return False

    def notify(self, n=1):
        self.notified.append(n)
        super().notify(n)


def _recording_queue(monkeypatch, clock: Clock, delay: float) -> tuple[DelayQueue, list, list]:
    """A queue whose conditions are :class:`_Waits`; returns it, the waits and the notifies."""
    waits, notified = [], []
    recording = type("Recording", (_Waits,), {"clock": clock, "waits": waits, "notified": notified})
    with monkeypatch.context() as m:
        m.setattr(threading, "Condition", recording)
        q = DelayQueue(capacity=10, delay=delay, clock=clock)
    return q, waits, notified


def test_the_engine_sleeps_until_the_head_is_due_and_no_longer(monkeypatch):
    """With a delay T the engine thread waits for the head's release time: not
    half a millisecond past it (that was added to every event's latency)."""
    clock = Clock(1000.0)
    q, waits, _ = _recording_queue(monkeypatch, clock, delay=5)
    q.put(ev(1000.0))  # leaves once now - 5 > 1000
    assert [e.t1 for e in q.get_batch(10, timeout=1.0)] == [1000.0]
    assert waits == [pytest.approx(0.005)]
    assert clock.now == pytest.approx(1005.0)


def test_events_behind_the_head_do_not_wake_the_engine(monkeypatch):
    """While the engine waits for the head's release time, an event behind it
    changes nothing: it is not woken for it (with T, a wake-up per block). An
    empty queue's first event, and one before the head, wake it."""
    clock = Clock(1000.0)
    q, _, notified = _recording_queue(monkeypatch, clock, delay=5)
    q.put(ev(1000.0))
    assert len(notified) == 1  # the first: the engine may be waiting on an empty queue
    q.put(ev(1001.0))
    q.put_batch([ev(1002.0), ev(1003.0)])
    assert len(notified) == 1
    q.put(ev(999.0))  # out of order, before the head: due sooner
    assert len(notified) == 2
    clock.now = 1010.0
    assert [e.t1 for e in q.get_batch(10, timeout=1.0)] == [999.0, 1000.0, 1001.0, 1002.0, 1003.0]
    before = len(notified)  # (releasing notifies the producers that there is room)
    q.put(ev(1010.0))  # the queue was empty again
    assert len(notified) == before + 1


def test_ties_keep_arrival_order_and_batches_are_bounded():
    q = DelayQueue(capacity=10, delay=0, clock=Clock(1000.0))
    events = [Event("Stock", (str(i), 1.0, 1), 5, 5) for i in range(6)]
    for e in events:
        q.put(e)
    assert q.get_batch(4, timeout=0.01) == events[:4]
    assert q.get_batch(4, timeout=0.01) == events[4:]


def test_a_nudge_ends_the_wait_with_what_may_leave_and_a_wake_with_nothing():
    """nudge (an engine worker has ended: server/workers/dispatch.py waits here for events,
    its results or that) ends a get_batch's wait, or the next one's; unlike wake it
    still hands out the events that may leave."""
    q = DelayQueue(capacity=10, delay=0, clock=Clock(1000.0))
    got: list = []
    t = threading.Thread(target=lambda: got.append(q.get_batch(10, timeout=60)))
    t.start()
    wait_until(lambda: len(q._not_empty._waiters) == 1, what="the engine thread waiting")
    q.nudge()
    t.join(10)
    assert not t.is_alive() and got == [[]]  # nothing had come: [] at once, not after 60 s
    q.nudge()  # before the call: the next one returns at once ...
    assert q.get_batch(10, timeout=60) == []
    q.put(ev(7))
    q.nudge()  # ... with the events that may leave, when there are some
    assert [e.t1 for e in q.get_batch(10, timeout=60)] == [7]
    q.wake()
    q.put(ev(9))
    assert q.get_batch(10, timeout=60) == []  # a wake hands out nothing (commands go first)
    assert [e.t1 for e in q.get_batch(10, timeout=60)] == [9]


def test_a_full_queue_blocks_producers_until_there_is_room():
    q = DelayQueue(capacity=2, delay=0, clock=Clock(1000.0))
    q.put(ev(1))
    q.put(ev(2))
    with pytest.raises(TimeoutError):
        q.put(ev(3), timeout=0.05)
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.put(ev(3), timeout=5), done.set()))
    t.start()
    # the subject is a negative (the put stays blocked while the queue is full): it needs a window
    assert not done.wait(0.05)
    assert [e.t1 for e in q.get_batch(1, timeout=0.01)] == [1]
    t.join(5)
    assert done.is_set() and len(q) == 2


def test_a_blocked_producer_takes_the_rest_of_its_block_in_one_part_when_there_is_room_for_it():
    """A producer blocked on a full queue is not woken for each batch that leaves: it waits for
    room for the rest of its block, which then goes in as one part (one journal record, one
    wake-up), in order."""
    q = DelayQueue(capacity=40, delay=0, clock=Clock(1000.0))
    q.put_batch([ev(t) for t in range(40)])
    parts: list[int] = []
    t = threading.Thread(target=q.put_batch, args=([ev(t) for t in range(40, 46)],),
                         kwargs={"timeout": 60, "on_accepted": parts.append})
    t.start()
    try:
        wait_until(lambda: [w for w, in q._waiting] == [6], what="the producer waiting for room for its 6 events")
        assert [e.t1 for e in q.get_batch(2, timeout=0.01)] == [0, 1]
        with q._lock:  # (as the producer changes them: under the lock)
            assert [w for w, in q._waiting] == [6] and len(q) == 38 and parts == []  # room for 2 of its 6
        assert [e.t1 for e in q.get_batch(4, timeout=0.01)] == [2, 3, 4, 5]
        wait_until(lambda: parts == [6], what="the rest of the block in one part")
    finally:
        t.join(30)
    assert len(q) == 40 and not q._waiting
    assert [e.t1 for e in q.get_batch(100, timeout=0.01)] == list(range(6, 46))


def test_producers_waiting_for_room_go_in_the_order_they_came():
    """A producer that came later, wanting less, does not take the room the first is waiting
    for (else a big block could wait forever behind a stream of small ones): each goes in
    whole, first come first in (their events share a t1: ties leave in arrival order)."""
    q = DelayQueue(capacity=40, delay=0, clock=Clock(1000.0))
    q.put_batch([ev(t) for t in range(40)])

    def block(who: str, n: int) -> list:
        return [Event("Stock", (who, 1.0, i), 50, 50) for i in range(n)]

    first = threading.Thread(target=q.put_batch, args=(block("first", 6),), kwargs={"timeout": 60})
    later = threading.Thread(target=q.put_batch, args=(block("later", 2),), kwargs={"timeout": 60})
    first.start()
    try:
        wait_until(lambda: [w for w, in q._waiting] == [6], what="the first producer waiting")
        later.start()
        wait_until(lambda: [w for w, in q._waiting] == [6, 2], what="the later one waiting behind it")
        assert [e.t1 for e in q.get_batch(2, timeout=0.01)] == [0, 1]  # room for the later one's 2 only
        with q._lock:
            assert [w for w, in q._waiting] == [6, 2] and len(q) == 38
        assert [e.t1 for e in q.get_batch(6, timeout=0.01)] == list(range(2, 8))  # room for both
        wait_until(lambda: len(q) == 40 and not q._waiting, what="both blocks in")
    finally:
        first.join(30)
        later.join(30)
    got = q.get_batch(100, timeout=0.01)
    assert [e.t1 for e in got] == [*range(8, 40), *[50] * 8]
    assert [(e.values[0], e.values[2]) for e in got[-8:]] == [*[("first", i) for i in range(6)],
                                                              ("later", 0), ("later", 1)]


def test_a_block_larger_than_the_queue_goes_in_by_parts_of_a_quarter_of_it():
    """A block larger than the queue waits for a quarter of it at a time (ROOM_PARTS), never for
    room the queue cannot have, and every event goes through in order."""
    q = DelayQueue(capacity=8, delay=0, clock=Clock(1000.0))
    q.put_batch([ev(t) for t in range(8)])
    parts: list[int] = []
    t = threading.Thread(target=q.put_batch, args=([ev(t) for t in range(8, 28)],),
                         kwargs={"timeout": 60, "on_accepted": parts.append})
    t.start()
    got: list[float] = []
    try:
        wait_until(lambda: [w for w, in q._waiting] == [2], what="the producer waiting for a quarter of the queue")

        def take_one() -> bool:  # one at a time: the producer wakes at 2
            got.extend(e.t1 for e in q.get_batch(1, timeout=0.01))
            assert len(q) <= 8
            return len(got) == 28

        wait_until(take_one, timeout=60, what="every event through")
    finally:
        t.join(30)
    assert got == list(range(28)) and sum(parts) == 20 and min(parts[:-1]) >= 2


def test_with_event_time_a_producer_takes_any_room_once_nothing_can_leave_without_its_events():
    """With ``time: event`` the newest t1 received is the clock: here the queue's last 35 events
    wait for newer ones, and the room left (5) is less than a quarter of the queue. The engine
    thread, with nothing it may take, waits; the producer then puts in what fits, which lets
    more go, and so on: it does not wait for room that only its own events can make."""
    q = DelayQueue(capacity=40, delay=35, clock=Clock(0.0), event_time=True)
    q.put_batch([ev(t) for t in range(100, 140)])  # newest 139: up to 104 may leave
    got: list[float] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            q.put_batch([ev(t) for t in range(140, 160)], timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    try:
        def take() -> bool:
            got.extend(e.t1 for e in q.get_batch(100, timeout=0.05))
            return len(got) == 25 or bool(errors)  # (events after 159 - 35 = 124 wait for newer ones)

        wait_until(take, timeout=60, what="the producer's events letting the queue's go")
    finally:
        t.join(60)
    assert errors == [] and got == list(range(100, 125)) and len(q) == 35


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
    wait_until(stalled.running, what="the engine thread to take the stalling task")
    try:
        line = '{"stream": "Stock", "t1": %d, "Name": "IBM", "Price": 1.0, "Volume": 1}\n'
        payload = "".join(line % i for i in range(20_000)).encode()
        sock = socket.create_connection(("127.0.0.1", srv.tcp_port))
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        # the receiver fills the bounded queue, then blocks: it stops reading the socket
        wait_until(lambda: len(d.queue) >= 50 and d.counters.get(Count.RECEIVED_TCP) >= 50, what="a full queue")
        assert len(d.queue) == 50
        assert d.counters.get(Count.RECEIVED_TCP) == 50  # the receiver stopped there: it waits for room
    finally:
        release.set()  # never leave the engine thread waiting
    sender.join(30)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(30)
    assert sock.recv(100) == b""  # the server read everything and closed without errors
    sock.close()
    wait_until(lambda: d.engine.stats.events >= 20_000, timeout=60, what="20,000 events processed")
    assert d.engine.stats.events == 20_000


class _Reference:
    """The queue as it was before blocks: one heap entry per event, by (t1, arrival)."""

    def __init__(self, delay, clock) -> None:
        self.heap, self.n, self.delay, self.clock, self.last = [], 0, delay, clock, None

    def put_batch(self, events) -> list[int]:
        late = []
        for i, e in enumerate(events):
            if self.last is not None and e.t1 < self.last:
                late.append(i)
                continue
            heapq.heappush(self.heap, (e.t1, self.n, e))
            self.n += 1
        return late

    def get_batch(self, k) -> list:
        out, horizon = [], self.clock() - self.delay
        while self.heap and len(out) < k and self.heap[0][0] < horizon:
            out.append(heapq.heappop(self.heap)[2])
        if out:
            self.last = out[-1].t1
        return out


_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(0, 30), max_size=12), st.booleans()),
    st.tuples(st.just("get"), st.integers(1, 8), st.integers(0, 40))), max_size=40)


@settings(examples(3))
@given(ops=_OPS, delay=st.sampled_from([0, 5]))
def test_blocks_leave_in_the_order_of_one_heap_entry_per_event(ops, delay):
    """Blocks in order go through runs, others through the heap; what leaves, and
    what is refused as late, is exactly what per-event heap entries gave."""
    clock = Clock(0.0)
    q = DelayQueue(capacity=10_000, delay=delay, clock=clock)
    ref = _Reference(delay, clock)
    serial = iter(range(10_000))
    for op in ops:
        if op[0] == "put":
            _, ts, in_order = op
            block = [Event("Stock", (str(next(serial)), 1.0, 1), t, t) for t in (sorted(ts) if in_order else ts)]
            assert q.put_batch(block) == ref.put_batch(block)
        else:
            _, k, now = op
            clock.now = max(clock.now, now)
            assert q.get_batch(k, timeout=0) == ref.get_batch(k)
        assert len(q) == len(ref.heap)
    q.close(drain=True)
    rest = q.get_batch(10_000, timeout=0)
    assert rest == [e for _, _, e in sorted(ref.heap, key=lambda x: x[:2])]


def test_a_blocks_lines_say_each_parts_progress_in_plain_values():
    """What a reader tells the intake of a sender's block (server/ingest/intake.py's Lines):
    the lines done once the events before a part's end are journaled, whether every line was
    an event or some were refused; plain values, as a reader in another process sends them."""
    import pickle

    from server.ingest.intake import Lines

    dense = Lines("s", 11, 15)  # lines 11-15, five events
    assert [dense.done(end) for end in (0, 1, 4, 5)] == [("s", 10), ("s", 11), ("s", 14), ("s", 15)]
    sparse = Lines("s", 11, 15, [11, 13, 15])  # lines 12 and 14 refused
    assert [sparse.done(end) for end in (0, 1, 2, 3)] == [("s", 10), ("s", 12), ("s", 14), ("s", 15)]
    assert pickle.loads(pickle.dumps(sparse)) == sparse and tuple(sparse) == ("s", 11, 15, [11, 13, 15])
