"""Client notifiers: deliver witnesses to WebSocket clients without ever
blocking the engine thread.

Each connected client has a :class:`ClientChannel`: a bounded buffer that the
engine thread appends to and the client's own sender task (on the server's
event loop) drains. A client that cannot keep up fills its buffer; then the
configured policy applies:

- ``disconnect`` (default): the client is closed with WebSocket code 1013
  ("try again later") and a reason naming the buffer size; the drop is counted.
  Nothing is lost silently: the client learns it was cut off.
- ``drop_oldest``: the oldest buffered witness is discarded to make room and
  counted; the client stays connected.

A client that keeps up never loses a witness.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from typing import Callable

SLOW_CLIENT_CLOSE = 1013
SHUTDOWN_CLOSE = 1001

_ids = itertools.count(1)


class ClientChannel:
    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int, policy: str = "disconnect",
                 on_drop: Callable[["ClientChannel", str, int], None] | None = None, label: str = "",
                 batch: int = 1) -> None:
        self.id = next(_ids)
        self.label = label
        self.loop = loop
        self.capacity = capacity
        self.policy = policy
        self.batch = batch  # witnesses per WebSocket message
        self.on_drop = on_drop
        self.buffer: deque[bytes] = deque()  # encoded witnesses (UTF-8 JSON)
        self.wake = asyncio.Event()
        self.cut = asyncio.Event()  # set once the buffer overflowed under "disconnect"
        self._wake_pending = False
        self._lock = threading.Lock()
        self.overflowed = False
        self.closed = False
        self.dropped = 0
        self.sent = 0  # witnesses sent to the client
        self.counted = 0  # of those, added to the server's delivered counter

    # -- engine thread
    def offer_many(self, payloads: list[bytes]) -> None:
        """Buffer encoded witnesses (the engine thread hands over all of one
        batch's at once); applies the slow-client policy when they do not fit."""
        with self._lock:
            if self.closed or self.overflowed:
                return
            room = self.capacity - len(self.buffer)
            if len(payloads) > room:
                if self.policy == "drop_oldest":  # discard the oldest, buffered or new
                    excess = len(self.buffer) + len(payloads) - self.capacity
                    from_buffer = min(excess, len(self.buffer))
                    for _ in range(from_buffer):
                        self.buffer.popleft()
                    if excess > from_buffer:
                        payloads = payloads[excess - from_buffer:]
                    self.dropped += excess
                    if self.on_drop:
                        self.on_drop(self, "drop_oldest", excess)
                else:
                    self.overflowed = True
                    if self.on_drop:
                        self.on_drop(self, "disconnect", 1)
                    self._signal()
                    try:
                        self.loop.call_soon_threadsafe(self.cut.set)
                    except RuntimeError:
                        self.closed = True
                    return
            self.buffer.extend(payloads)
            self._signal()

    def _signal(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self.wake.set)
            except RuntimeError:  # the loop is closed: the client is gone
                self.closed = True

    # -- event loop
    def take_all(self) -> list[bytes]:
        with self._lock:
            self._wake_pending = False
            self.wake.clear()
            items = list(self.buffer)
            self.buffer.clear()
            return items

    def close(self) -> None:
        with self._lock:
            self.closed = True
        try:
            self.loop.call_soon_threadsafe(self.wake.set)
        except RuntimeError:
            pass


class NotifierHub:
    """Routes witnesses to the channels listening to a subscription or a stream.

    The engine thread asks :meth:`route` for every witness; the answer is
    cached per (subscription, stream) and the cache is dropped whenever a
    client comes or goes or a subscription changes, so routing a witness costs
    one dictionary lookup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[str, set[ClientChannel]] = {}
        self._by_stream: dict[str, set[ClientChannel]] = {}
        self._routes: dict[tuple[str, str], tuple[ClientChannel, ...]] = {}

    def _table(self, kind: str) -> dict[str, set[ClientChannel]]:
        return self._by_owner if kind == "subscription" else self._by_stream

    def register(self, kind: str, key: str, ch: ClientChannel) -> None:
        with self._lock:
            self._table(kind).setdefault(key, set()).add(ch)
            self._routes = {}

    def unregister(self, kind: str, key: str, ch: ClientChannel) -> None:
        with self._lock:
            chans = self._table(kind).get(key)
            if chans is not None:
                chans.discard(ch)
                if not chans:
                    del self._table(kind)[key]
            self._routes = {}

    def invalidate(self) -> None:
        """Forget cached routes (a subscription was added or removed)."""
        with self._lock:
            self._routes = {}

    def route(self, owner: str, stream: str, deliver_to_owner: Callable[[str, str], bool]) -> tuple[ClientChannel, ...]:
        """The channels a witness of ``owner`` on ``stream`` goes to: those
        watching the stream, and those watching the subscription when
        ``deliver_to_owner(owner, stream)`` (the stream is one of its outputs)."""
        routes = self._routes
        chans = routes.get((owner, stream))
        if chans is None:
            with self._lock:
                chans = tuple(self._by_stream.get(stream, ()))
                if self._by_owner.get(owner) and deliver_to_owner(owner, stream):
                    chans += tuple(self._by_owner[owner])
                if routes is self._routes:  # not invalidated meanwhile
                    routes[(owner, stream)] = chans
        return chans

    def channels(self) -> list[ClientChannel]:
        with self._lock:
            return [c for t in (self._by_owner, self._by_stream) for cs in t.values() for c in cs]

    def close_owner(self, owner: str) -> None:
        with self._lock:
            chans = list(self._by_owner.get(owner, ()))
        for c in chans:
            c.close()

    def pending(self) -> int:
        return sum(len(c.buffer) for c in self.channels())

    @property
    def client_count(self) -> int:
        return len(self.channels())
