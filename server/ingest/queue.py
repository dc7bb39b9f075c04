"""The T-delayed priority queue between event receivers and the engine thread.

Events are ordered by detection time ``t1`` (ties keep arrival order). An
event may leave only when ``t1 < now - T``, so events that arrive out of order
by less than ``T`` are put back in order
(docs/design/semantics.md#the-priority-queue). An event older than one already
released is dropped and counted. The queue is bounded: producers block (TCP
backpressure) while it is full.

Receivers hand over whole decoded blocks (:meth:`DelayQueue.put_batch`). A
block already in ``t1`` order that starts no earlier than the queue's newest
in-order event -- what a live feed or a replayed file sends -- is appended as
it is to a FIFO of *runs*, and released by slicing: no per-event heap work.
A producer that finds too little room waits for room for the rest of its block
(at most a quarter of the queue), not for the first event to leave: the rest
goes in as one part, one journal record and one wake-up (:data:`ROOM_PARTS`).
Producers that wait go in the order they came.
Only events that arrive out of order go through a heap: ``heapq``, which
takes less than half the time of ``sortedcontainers.SortedList`` on nearly
ordered input (BENCHMARKS.md, "The event queue: heapq against SortedList").
Release merges the two by ``(t1, arrival)``.

With ``event_time`` the clock is the events' own: the watermark is the newest
``t1`` received, and an event leaves once ``t1 <= newest - T`` (replays of old
events; the ``time: event`` setting).

**The journal.** With :attr:`DelayQueue.journal` set (by the daemon), every
part of a block the queue accepts is appended to it as one record *under the
queue lock, in* :meth:`DelayQueue._insert`, with the events actually kept
(late ones dropped): the journal's order is the queue's arrival order, which
recovery relies on when it puts the records back in journal order. A part
whose events were all late still writes a record when it has a sender, to
keep the sender's progress. Without a journal (``durability: off``) the
senders' progress is kept in memory (:meth:`DelayQueue.progress`).

The engine thread waits on a condition and is woken by new events that
change the head (the next event to release: an empty queue's first, or one
earlier than it), by :meth:`DelayQueue.wake` (a subscription change to apply)
or when the head's release time comes; it never polls.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import select
import threading
import time
import weakref
from bisect import bisect_left
from collections import deque
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Callable, Sequence

from air.engine import Event, untrack_events
from air.engine.convert import t1_ordered
from server.durability.diskfull import DiskFull

if TYPE_CHECKING:  # pragma: no cover
    from server.durability.journal import Journal

#: ``meta(end)`` -> (sender, lines_done) of the record of a part ending at input index ``end``.
Meta = Callable[[int], "tuple[str | None, int | None]"]


#: A producer that finds less room than the rest of its block waits for room for it, or for
#: 1/ROOM_PARTS of the queue if that is less (the rest then waits again), after those that waited
#: before it: a bigger part is one journal record and one wake-up, and a smaller want wakes it
#: sooner. (4: at most a quarter of the queue held back for one producer.) Only while the engine
#: thread is taking events: once it waits for more (or for the head's time), the first producer
#: takes what room there is, as the events it holds may be what lets the queue's go (``time:
#: event``, where the newest t1 received is the clock).
ROOM_PARTS = 4


class QueueClosed(Exception):
    """The queue no longer accepts events (the server is shutting down)."""


_t1 = attrgetter("t1")
_release_key = itemgetter(0, 1, 2)


class DelayQueue:
    def __init__(self, capacity: int, delay: float = 0.0, time_unit_ms: float = 1.0,
                 clock: Callable[[], float] | None = None, event_time: bool = False) -> None:
        """``delay`` (T) and timestamps are in time units of ``time_unit_ms``
        milliseconds; ``clock`` returns the current time in those units
        (unused with ``event_time``: the newest t1 received is the clock)."""
        self.capacity = capacity
        self.delay = delay
        self.unit_s = time_unit_ms / 1000.0
        self.clock = clock or (lambda: time.time() / self.unit_s)
        self._runs: deque[list] = deque()  # [seq, events, start]: in-order blocks, t1 never decreasing
        self._tail_t1 = None  # t1 of the newest event in _runs
        self._heap: list[tuple] = []  # (t1, seq, event): events that came out of order
        self._size = 0
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._waiting: deque[list] = deque()  # producers waiting for room, oldest first: [want] each (_wait_for_room)
        self._engine_idle = False  # the engine thread waits in get_batch: a producer takes what room there is
        self._not_empty = threading.Condition(self._lock)
        self._closed = False
        self._draining = False
        self._woken = False
        self._nudged = False
        self._waker: tuple[int, int] | None = None  # a pipe the engine thread also waits on (get_batch(fds=...))
        self._poller: tuple[tuple[int, ...], object] | None = None  # (the fds, a poll object watching them and it)
        self._fd_waiting = False  # it waits on it now: a notify writes to it
        self.last_released = None
        self.released_at = time.monotonic()  # when events last left (for /health's stall report)
        self.event_time = event_time
        self.newest = None  # the largest t1 accepted (the watermark with event_time)
        self.late = 0
        self.accepted = 0
        #: The write-ahead journal every accepted part goes to (None: durability off).
        self.journal: Journal | None = None
        self._progress: dict[str, int] = {}  # sender -> lines handled, when there is no journal

    def progress(self, sender: str) -> int:
        """Data lines of ``sender`` handled so far (journaled, or queued without a journal)."""
        table = self.journal.senders if self.journal is not None else self._progress
        return table.get(sender, 0)

    def record_progress(self, sender: str, lines_done: int) -> None:
        """Note that ``sender``'s lines up to ``lines_done`` are handled, with no
        event to queue (a block of refused lines): an event-less journal record."""
        with self._lock:
            if self._closed:
                raise QueueClosed("the server is shutting down")
            if self.journal is not None:
                self.journal.append([], sender, lines_done)
            else:
                self._progress[sender] = lines_done

    def __len__(self) -> int:
        return self._size

    # ------------------------------------------------------------------ producers

    def put(self, ev: Event, timeout: float | None = None) -> bool:
        """Enqueue ``ev``; blocks while the queue is full. Returns False (and
        counts it) when ``ev`` is older than an event already released."""
        return not self.put_batch([ev], timeout)

    def put_batch(self, events: Sequence[Event], timeout: float | None = None,
                  on_accepted: Callable[[int], None] | None = None,
                  cancel: threading.Event | None = None, meta: Meta | None = None,
                  packed=None) -> list[int]:
        """Enqueue ``events`` (in the order given), blocking while the queue is
        full; returns the indexes of those refused as late (older than an
        event already released; counted). ``on_accepted(n)`` is called as each
        part of the block is accepted. While the queue is full it waits for room
        for the rest of the block (:data:`ROOM_PARTS`). Raises TimeoutError when
        no such room came for ``timeout`` seconds (the part before stays queued) and
        QueueClosed when the server is shutting down or ``cancel`` is set while
        waiting for room; :class:`~server.durability.diskfull.DiskFull` when the journal
        cannot be written: its ``first_refused`` is the index of the first
        event not accepted (the parts before it stay accepted).

        Each part inserted, ending at input index ``end`` (exclusive), is one
        journal record (under the lock); ``meta(end)`` gives its ``(sender,
        lines_done)``: the sender's data lines fully handled once that part is in.
        ``packed``: ``events`` as the journal packs them, already packed (a reader
        process's block: :meth:`server.durability.journal.Journal.append`), written as
        they are when the whole block goes in as one part with none late."""
        deadline = None if timeout is None else time.monotonic() + timeout
        late: list[int] = []
        done = 0
        n = len(events)
        while done < n:
            with self._not_full:
                # a full queue takes the rest of the block at once when room for it (or for a quarter
                # of the queue) has come, not a batch's worth at a time: one journal record and one
                # wake-up where there were several (BENCHMARKS.md, round 33)
                want = min(n - done, max(1, self.capacity // ROOM_PARTS))
                if self._waiting or not self._room_for(want):
                    self._wait_for_room(want, deadline, cancel)
                if self._closed:
                    raise QueueClosed("the server is shutting down")
                room = self.capacity - self._size
                part = events[done:done + room] if done or room < n else events
                done += len(part)
                head = self._head_t1()
                try:
                    accepted = self._insert(part, done - len(part), late, meta(done) if meta is not None else None,
                                            packed if part is events else None)
                except DiskFull as exc:  # the part is not in (nor any late mark of it)
                    del late[bisect_left(late, done - len(part)):]
                    raise exc.refusing_from(done - len(part)) from None
                if accepted and (self.event_time or head is None or self._head_t1() < head):
                    # the engine thread waits for the head's release time: events behind the
                    # head change nothing for it (with a delay T, a wake-up per block for nothing)
                    self._notify()
            if on_accepted is not None and accepted:
                on_accepted(accepted)
        return late

    def _room_for(self, want: int) -> bool:
        """Under the lock: room for ``want`` events, or for some while the engine thread waits for
        events (it takes none until more come or time passes: with ``time: event`` the events a
        producer holds may be what lets the queue's go)."""
        room = self.capacity - self._size
        return room >= want or room > 0 and self._engine_idle

    def _wait_for_room(self, want: int, deadline: float | None, cancel: threading.Event | None) -> None:
        """Under the lock: wait until this producer is the first of those waiting and there is
        :meth:`_room_for` its ``want`` (or the queue is closed). First come, first in: one that came
        later, or wants less, does not take the room the first is waiting for."""
        ticket = [want]
        self._waiting.append(ticket)
        try:
            while not self._closed and not (self._waiting[0] is ticket and self._room_for(want)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("the event queue stayed full")
                if cancel is not None and cancel.is_set():
                    raise QueueClosed("stopped while the queue was full")
                self._not_full.wait(min(remaining, 0.25) if remaining is not None else 0.25)
        finally:
            self._waiting.remove(ticket)
            if self._waiting:  # the next one may go now (it is first, and may find room left)
                self._not_full.notify_all()

    def _insert(self, part: Sequence[Event], offset: int, late: list[int],
                record: tuple[str | None, int | None] | None = None, packed=None) -> int:
        """Add ``part`` (under the lock); late ones go to ``late`` by index.
        What is kept is journaled first, as one record with ``record``'s
        (sender, lines_done) (and ``packed``, ``part`` packed, unless some are late);
        a journal that fails leaves the queue as it was."""
        floor = self.last_released
        ordered = t1_ordered(part)
        if floor is not None and part and (part[0].t1 if ordered else min(map(_t1, part))) < floor:
            kept = []
            for i, ev in enumerate(part):
                if floor is not None and ev.t1 < floor:
                    late.append(offset + i)
                else:
                    kept.append(ev)
            dropped = len(part) - len(kept)
            part, packed = kept, None
        else:
            dropped = 0
        sender, lines_done = record if record is not None else (None, None)
        if self.journal is not None:
            if part or sender is not None:
                self.journal.append(part, sender, lines_done, packed)
        elif sender is not None and lines_done is not None:
            self._progress[sender] = lines_done
        self.late += dropped
        if not part:
            return 0
        untrack_events(part)
        seq = next(self._seq)
        tail = self._tail_t1
        top = part[-1].t1 if ordered else max(map(_t1, part))
        if self.newest is None or top > self.newest:
            self.newest = top
        if ordered and (tail is None or part[0].t1 >= tail):
            self._runs.append([seq, list(part), 0])
            self._tail_t1 = part[-1].t1
        else:  # out of order: each event by (t1, arrival); the block's own order breaks ties
            heap = self._heap
            seqs = self._seq
            for ev in part:
                heapq.heappush(heap, (ev.t1, next(seqs), ev))
        self._size += len(part)
        self.accepted += len(part)
        return len(part)

    # ------------------------------------------------------------------ snapshots and recovery

    @property
    def lock(self) -> threading.Lock:
        """The queue's lock: whoever holds it sees the queue (and the journal,
        appended under it) stand still — a snapshot forks holding it."""
        return self._lock

    def export_state(self) -> dict:
        """What a snapshot keeps of the queue (hold :attr:`lock`, or call it
        in a forked copy): the waiting events in release order, as tuples,
        and what decides lateness and release."""
        keyed = [(ev.t1, seq, i, ev) for seq, evs, start in self._runs for i, ev in enumerate(evs[start:])]
        keyed += [(t1, seq, 0, ev) for t1, seq, ev in self._heap]
        keyed.sort(key=_release_key)
        return {"events": [(ev.stream, ev.values, ev.t0, ev.t1) for _t, _s, _i, ev in keyed],
                "last_released": self.last_released, "newest": self.newest}

    def restore(self, events: Sequence[Event], state: dict | None = None) -> list[int]:
        """Recovery, before the engine thread and the receivers start: put
        back ``events`` (a snapshot's waiting events, then the journal's
        records after it, in journal order) as if they were arriving now,
        past the capacity bound and without journaling them again; with
        ``state``, first the snapshot's lateness and release marks. Returns
        the indexes refused as late (none, when the journal and snapshot agree)."""
        late: list[int] = []
        with self._lock:
            if state is not None:
                self.last_released = state["last_released"]
                self.newest = state["newest"]
            journal = getattr(self, "journal", None)
            self.journal = None
            try:
                if events:
                    self._insert(events, 0, late)
            finally:
                self.journal = journal
            self._notify()
        return late

    # ------------------------------------------------------------------ the engine thread

    def get_batch(self, max_items: int, timeout: float, fds: Sequence[int] = ()) -> list[Event]:
        """Up to ``max_items`` events whose release time has come, in t1 order.
        Waits at most ``timeout`` seconds for the first one; [] on timeout, when
        :meth:`wake` was called, or when :meth:`nudge` was and none may leave yet.
        With ``fds`` (descriptors: an engine worker's results, server/workers/channel.py)
        it waits for one of them to be readable too, which acts as :meth:`nudge`."""
        deadline = time.monotonic() + timeout
        ready = False
        with self._not_empty:
            while True:
                if self._woken:
                    self._woken = False
                    return []
                head = self._head_t1()
                if head is not None:
                    horizon = self.horizon()
                    if head < horizon or self._draining:
                        self._nudged = False
                        return self._pop_ready(max_items, horizon)
                    # until the head's release time, no later: a wake-up a little early waits again
                    # for the rest (an added half millisecond made every event with a delay T later)
                    wait = None if self.event_time else (head - horizon) * self.unit_s
                else:  # empty (closed or not): wait for events, wake() or the timeout
                    wait = None
                if self._nudged or ready:
                    self._nudged = False
                    return []
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if self._waiting and self._size < self.capacity:  # nothing leaves until more comes or time passes
                    self._not_full.notify_all()
                self._engine_idle = True
                try:
                    if fds:
                        ready = self._wait_on(fds, remaining if wait is None else min(wait, remaining))
                    else:
                        self._not_empty.wait(remaining if wait is None else min(wait, remaining))
                finally:
                    self._engine_idle = False

    def _wait_on(self, fds: Sequence[int], timeout: float) -> bool:
        """Under the lock: release it until :meth:`_notify`, one of ``fds`` is readable (True)
        or ``timeout`` seconds have passed. One wait on both instead of a thread that reads
        the descriptors and notifies: a hand-over of the interpreter lock fewer on the path
        of every engine worker's result (BENCHMARKS.md, "Engine workers, round 15")."""
        if self._waker is None:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._waker = (r, w)
            weakref.finalize(self, _close_all, r, w)
        waker = self._waker[0]
        watched = tuple(fd for fd in fds if fd >= 0)
        if self._poller is None or self._poller[0] != watched:  # (made again only when a worker's descriptor changes)
            poller = select.poll()  # (not select(): a server's descriptors may be past FD_SETSIZE)
            for fd in (waker, *watched):
                poller.register(fd, select.POLLIN)
            self._poller = (watched, poller)
        poller = self._poller[1]
        self._fd_waiting = True
        self._lock.release()
        got: list = []
        try:
            got = poller.poll(timeout * 1000)
        finally:
            self._lock.acquire()
            self._fd_waiting = False
            # read only where the poll saw it written: a read is a call that lets go of the interpreter
            # lock, on the path of every batch. A write after the poll ended (under the lock, before it
            # was taken again here) is read by the next wait, which then ends at once, as it should.
            if any(fd == waker for fd, _ in got):
                try:
                    os.read(waker, 512)  # (under the lock: every write to it came before, under it too)
                except BlockingIOError:
                    pass
        return any(fd != waker for fd, _ in got)

    def _notify(self, everyone: bool = False) -> None:
        """Under the lock: wake the engine thread where it waits for events."""
        if everyone:
            self._not_empty.notify_all()
        else:
            self._not_empty.notify()
        if self._fd_waiting:
            self._fd_waiting = False
            os.write(self._waker[1], b"\0")

    def horizon(self) -> float:
        """Events with t1 below this may leave (under the lock, or approximate)."""
        if self.event_time:  # t1 <= newest - T, as a strict bound
            return -math.inf if self.newest is None else math.nextafter(self.newest - self.delay, math.inf)
        return self.clock() - self.delay

    def _head_t1(self):
        """t1 of the next event to release, or None when empty (under the lock)."""
        runs, heap = self._runs, self._heap
        if runs:
            _seq, evs, start = runs[0]
            t = evs[start].t1
            return heap[0][0] if heap and heap[0][0] < t else t
        return heap[0][0] if heap else None

    def _pop_ready(self, max_items: int, horizon: float) -> list[Event]:
        out: list[Event] = []
        runs, heap = self._runs, self._heap
        everything = self._draining
        while len(out) < max_items and (runs or heap):
            if runs and not heap:  # the common case: slices of in-order runs
                run = runs[0]
                _seq, evs, start = run
                stop = min(len(evs), start + max_items - len(out))
                if not everything and evs[stop - 1].t1 >= horizon:
                    stop = bisect_left(evs, horizon, start, stop, key=_t1)
                    if stop == start:
                        break
                out.extend(evs[start:stop] if start or stop < len(evs) else evs)
                if stop == len(evs):
                    runs.popleft()
                else:
                    run[2] = stop
                continue
            # merge the heap with the head run by (t1, arrival)
            if runs:
                seq, evs, start = runs[0]
                from_run = not heap or (evs[start].t1, seq) < heap[0][:2]
            else:
                from_run = False
            if from_run:
                ev = evs[start]
                if not everything and ev.t1 >= horizon:
                    break
                out.append(ev)
                if start + 1 == len(evs):
                    runs.popleft()
                else:
                    runs[0][2] = start + 1
            else:
                if not everything and heap[0][0] >= horizon:
                    break
                out.append(heapq.heappop(heap)[2])
        if out:
            self._size -= len(out)
            self.released_at = time.monotonic()
            self.last_released = out[-1].t1
            if not runs:
                self._tail_t1 = None
            if self._waiting and self.capacity - self._size >= self._waiting[0][0]:
                self._not_full.notify_all()
        return out

    def nudge(self) -> None:
        """Make the waiting (or the next) :meth:`get_batch` return now, with the events
        that may leave if there are any (unlike :meth:`wake`), [] otherwise: an engine
        worker has ended (server/workers/dispatch.py waits here for events, its results or that)."""
        with self._lock:
            self._nudged = True
            self._notify(everyone=True)

    def wake(self) -> None:
        """Make the waiting (or the next) :meth:`get_batch` return at once,
        so that its caller can do other work (the engine thread applies
        subscription changes between batches)."""
        with self._lock:
            self._woken = True
            self._notify(everyone=True)

    def close(self, drain: bool = True) -> None:
        """Refuse new events; with ``drain`` the remaining ones are released
        at once (shutdown), otherwise they are discarded."""
        with self._lock:
            self._closed = True
            self._draining = drain
            if not drain:
                self._heap.clear()
                self._runs.clear()
                self._size = 0
                self._tail_t1 = None
            self._not_full.notify_all()
            self._notify(everyone=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def head_wait(self) -> float | None:
        """Time units until the next event may leave (0 when due; None when
        empty, or with event_time when it waits for newer events)."""
        with self._lock:
            head = self._head_t1()
            if head is None:
                return None
            ahead = head - self.horizon()
            if ahead < 0:
                return 0.0
            return None if self.event_time else ahead

    def oldest_age(self) -> float:
        """now - t1 of the oldest queued event (0 when empty), in time units."""
        with self._lock:
            head = self._head_t1()
            return self.clock() - head if head is not None else 0.0


def _close_all(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
