"""The T-delayed priority queue between event receivers and the engine thread.

Events are ordered by detection time ``t1`` (ties keep arrival order). An
event may leave only when ``t1 < now - T``, so events that arrive out of order
by less than ``T`` are put back in order (000 §4.2). An event older than one
already released is dropped and counted. The queue is bounded: producers block
(TCP backpressure) while it is full.

``heapq`` was chosen over ``sortedcontainers.SortedList`` by measurement
(``python bench/queue_choice.py``: 1M nearly-ordered pushes with a standing
depth of 1000, then a full drain — heapq 0.39 s, SortedList 0.88 s on the
2-core development machine); the queue never needs more than its smallest
element.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

from server.engine import Event


class QueueClosed(Exception):
    """The queue no longer accepts events (the server is shutting down)."""


class DelayQueue:
    def __init__(self, capacity: int, delay: float = 0.0, time_unit_ms: float = 1.0,
                 clock: Callable[[], float] | None = None) -> None:
        """``delay`` (T) and timestamps are in time units of ``time_unit_ms``
        milliseconds; ``clock`` returns the current time in those units."""
        self.capacity = capacity
        self.delay = delay
        self.unit_s = time_unit_ms / 1000.0
        self.clock = clock or (lambda: time.time() / self.unit_s)
        self._heap: list[tuple] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._closed = False
        self._draining = False
        self._woken = False
        self.last_released = None
        self.late = 0
        self.accepted = 0

    def __len__(self) -> int:
        return len(self._heap)

    def put(self, ev: Event, timeout: float | None = None) -> bool:
        """Enqueue ``ev``; blocks while the queue is full. Returns False (and
        counts it) when ``ev`` is older than an event already released."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._not_full:
            while len(self._heap) >= self.capacity and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("the event queue stayed full")
                self._not_full.wait(remaining if remaining is not None else 0.5)
            if self._closed:
                raise QueueClosed("the server is shutting down")
            if self.last_released is not None and ev.t1 < self.last_released:
                self.late += 1
                return False
            heapq.heappush(self._heap, (ev.t1, next(self._seq), ev))
            self.accepted += 1
            self._not_empty.notify()
            return True

    def get_batch(self, max_items: int, timeout: float) -> list[Event]:
        """Up to ``max_items`` events whose release time has come, in t1 order.
        Waits at most ``timeout`` seconds for the first one; [] on timeout or
        when :meth:`wake` was called."""
        deadline = time.monotonic() + timeout
        with self._not_empty:
            while True:
                if self._woken:
                    self._woken = False
                    return []
                if self._heap:
                    horizon = self.clock() - self.delay
                    if self._heap[0][0] < horizon or self._draining:
                        return self._pop_ready(max_items, horizon)
                    wait = (self._heap[0][0] - horizon) * self.unit_s + 0.0005
                else:
                    wait = None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._not_empty.wait(remaining if wait is None else min(wait, remaining))

    def _pop_ready(self, max_items: int, horizon: float) -> list[Event]:
        out = []
        heap = self._heap
        while heap and len(out) < max_items and (heap[0][0] < horizon or self._draining):
            out.append(heapq.heappop(heap)[2])
        if out:
            self.last_released = out[-1].t1
            self._not_full.notify_all()
        return out

    def wake(self) -> None:
        """Make the waiting (or the next) :meth:`get_batch` return at once,
        so that its caller can do other work (the engine thread applies
        subscription changes between batches)."""
        with self._lock:
            self._woken = True
            self._not_empty.notify_all()

    def close(self, drain: bool = True) -> None:
        """Refuse new events; with ``drain`` the remaining ones are released
        at once (shutdown), otherwise they are discarded."""
        with self._lock:
            self._closed = True
            self._draining = drain
            if not drain:
                self._heap.clear()
            self._not_full.notify_all()
            self._not_empty.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def oldest_age(self) -> float:
        """now - t1 of the oldest queued event (0 when empty), in time units."""
        with self._lock:
            return self.clock() - self._heap[0][0] if self._heap else 0.0
