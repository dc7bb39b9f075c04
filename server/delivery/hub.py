"""Client notifiers: deliver witnesses to WebSocket clients without ever
blocking the engine thread.

Each connected client has a :class:`ClientChannel`: a bounded buffer that the
engine thread appends to and the client's own sender task (on the server's
event loop) drains. It holds a batch's witnesses as :class:`Chunk` s, one per
subscription and batch, encoded once and shared by every channel they go to
(no object per witness for the garbage collector to walk): the sender decides
how a client sees them (with or without its seq) and each format is made once
per chunk, so neither the engine thread nor the event loop formats per client.

A client that cannot keep up fills its buffer; then it **lags**: its buffer is
dropped, the channel remembers where the client is (the last seq it was given
per subscription) and ignores live witnesses, and the client's sender reads
what it missed from the witness log (server/durability/witlog.py) until it has caught
up; then the channel goes live again. The check "caught up?" and the switch
are made under the hub's :attr:`NotifierHub.delivery_lock`, which the engine
thread holds while it appends a batch to the log and offers it to the
channels: a witness is either in the log before the check (and read from it)
or offered after the switch (and buffered), never both, never neither. A
lagging client is disconnected only when what it still needs has been deleted
by the log's retention (close code 4410, see server/api/ws.py).

Control messages (a subscription that lost state: server/budget.py) go to the
same channels as :meth:`NotifierHub.notify` notices, each sent as a message of its
own ahead of the witnesses buffered with it; a channel keeps the newest
:data:`MAX_NOTICES` (each says everything so far, so an older one adds nothing).

Witnesses of internal streams (links between a subscription's own automata)
are not logged; a client of such a stream that overflows its buffer is
closed with 1013 ("try again later"), as every slow client used to be.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import deque
from itertools import repeat
from typing import Callable

from air.engine.convert import numbered_lines

SLOW_CLIENT_CLOSE = 1013
SHUTDOWN_CLOSE = 1001
#: The reason a channel is closed with unless it is given one (the server stops).
SHUTTING_DOWN = "the server is shutting down"
#: Close code for a client whose position is no longer in the witness log.
GONE_CLOSE = 4410
#: Control messages a channel keeps until its client takes them (the newest).
MAX_NOTICES = 8

_ids = itertools.count(1)


class Chunk:
    """Witnesses of one subscription from one engine batch, encoded once and
    shared by every channel they go to (no object per witness): ``seqs`` a
    ``range`` (consecutive, the usual case), a list, or None for an internal
    stream's witnesses (not numbered: seq 0); ``payloads`` the witnesses' JSON.

    :meth:`lines` formats them for a client (plain, ``<seq> ``- or
    ``<sid>:<seq> ``-prefixed) once per format, on the event loop, whichever
    client asks first; :meth:`frame` joins them into one message."""

    __slots__ = ("sid", "seqs", "payloads", "_lines", "_frames")

    def __init__(self, sid: str, seqs: range | list[int] | None, payloads: list[bytes]) -> None:
        self.sid = sid
        self.seqs = seqs
        self.payloads = payloads
        self._lines: dict[str, list[bytes]] = {}
        self._frames: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self.payloads)

    def first_seq(self) -> int:
        return self.seqs[0] if self.seqs else 0

    def after(self, seq: int) -> "Chunk | None":
        """The witnesses above ``seq`` (None when none is); self when all are."""
        seqs = self.seqs
        if not seqs or seqs[0] > seq:
            return self
        keep = [i for i, n in enumerate(seqs) if n > seq]
        if not keep:
            return None
        return Chunk(self.sid, [seqs[i] for i in keep], [self.payloads[i] for i in keep])

    def lines(self, fmt: str) -> list[bytes]:
        """The witnesses as a client sees them: ``fmt`` "plain" (the JSON),
        "seq" (``<seq> <JSON>``) or "sid_seq" (``<sid>:<seq> <JSON>``)."""
        if fmt == "plain":
            return self.payloads
        got = self._lines.get(fmt)
        if got is None:
            seqs = repeat(0, len(self.payloads)) if self.seqs is None else self.seqs
            got = self._lines[fmt] = numbered_lines(b"" if fmt == "seq" else f"{self.sid}:".encode(), seqs,
                                                    self.payloads)
        return got

    def frame(self, fmt: str) -> bytes:
        """All of :meth:`lines` as one newline-delimited message (joined once per format)."""
        got = self._frames.get(fmt)
        if got is None:
            got = self._frames[fmt] = b"\n".join(self.lines(fmt))
        return got


class ClientChannel:
    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int,
                 on_drop: Callable[["ClientChannel", str, int], None] | None = None, label: str = "",
                 batch: int = 1, *, resumable: bool = True,
                 positions: Callable[[], dict[str, int]] | None = None) -> None:
        self.id = next(_ids)
        self.label = label
        self.loop = loop
        self.capacity = capacity
        self.batch = batch  # witnesses per WebSocket message
        self.on_drop = on_drop
        self.resumable = resumable  # its witnesses are in the witness log: it lags instead of being cut
        self.positions = positions  # a stream's channel: the log's last seq per subscription publishing it
        self.notices: deque[bytes] = deque(maxlen=MAX_NOTICES)  # control messages not yet sent
        self.buffer: deque[Chunk] = deque()  # the batches' witnesses, as shared chunks ...
        self.buffered = 0  # ... and how many witnesses they hold
        self.wake = asyncio.Event()
        self.cut = asyncio.Event()  # set once the buffer overflowed on a channel that cannot lag
        self._wake_pending = False
        self._lock = threading.Lock()
        self.overflowed = False
        self.closed = False
        self.close_reason = SHUTTING_DOWN  # what the client is told when it is closed (SHUTDOWN_CLOSE)
        self.lagging = False  # served from the witness log, live witnesses ignored
        self.after: dict[str, int] = {}  # while lagging: the last seq per subscription the client was given
        self.lags = 0  # times it fell behind
        self.sent = 0  # witnesses sent to the client
        self.counted = 0  # of those, added to the server's delivered counter

    # -- engine thread (under the hub's delivery_lock)
    def offer_many(self, chunks: list[Chunk], n: int) -> None:
        """Buffer a batch's ``n`` witnesses (the engine thread hands over all
        of one batch's at once, as chunks shared with the other channels); a
        channel they do not fit in starts lagging (or, when it cannot, is cut)."""
        with self._lock:
            if self.closed or self.overflowed or self.lagging:
                return
            if n > self.capacity - self.buffered:
                if self.resumable:
                    self._start_lagging(chunks)
                else:
                    self.overflowed = True
                    if self.on_drop:
                        self.on_drop(self, "disconnect", 1)
                    try:
                        self.loop.call_soon_threadsafe(self.cut.set)
                    except RuntimeError:
                        self.closed = True
                self._signal()
                return
            self.buffer.extend(chunks)
            self.buffered += n
            self._signal()

    def _start_lagging(self, chunks: list[Chunk]) -> None:
        after = self.positions() if self.positions is not None else {}
        first: dict[str, int] = {}  # the first witness dropped per subscription
        for c in (*self.buffer, *chunks):
            if c.sid not in first and c.seqs:
                first[c.sid] = c.seqs[0] - 1
        after.update(first)
        self.after = after
        self.buffer.clear()
        self.buffered = 0
        self.lagging = True
        self.lags += 1
        if self.on_drop:
            self.on_drop(self, "lag", 1)

    def start_lagging_at(self, after: dict[str, int]) -> None:
        """Start from the log (a client that asked for ``from``): before the
        channel is registered, so no live witness comes first."""
        self.after = dict(after)
        self.lagging = True

    def go_live(self) -> None:
        """Caught up with the log (called under the hub's delivery_lock)."""
        with self._lock:
            self.lagging = False
            self.after = {}

    def _signal(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self.wake.set)
            except RuntimeError:  # the loop is closed: the client is gone
                self.closed = True

    # -- event loop
    def notice(self, message: bytes) -> None:
        """Queue a control message for the client (any thread)."""
        with self._lock:
            if self.closed:
                return
            self.notices.append(message)
            self._signal()

    def take_all(self) -> tuple[list[Chunk], list[bytes]]:
        """What is buffered, as chunks, and the control messages waiting (to send first)."""
        with self._lock:
            self._wake_pending = False
            self.wake.clear()
            taken = list(self.buffer)
            self.buffer.clear()
            self.buffered = 0
            notices = list(self.notices)
            self.notices.clear()
            return taken, notices

    def take_notices(self) -> list[bytes]:
        """The control messages waiting (a client catching up from the log takes them between reads)."""
        with self._lock:
            notices = list(self.notices)
            self.notices.clear()
            return notices

    def close(self, reason: str = SHUTTING_DOWN) -> None:
        with self._lock:
            if not self.closed:
                self.close_reason = reason
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
        #: Held by the engine thread while it logs a batch and offers it to the
        #: channels, and by a lagging client's sender while it checks it has
        #: caught up and goes live (see the module's docstring).
        self.delivery_lock = threading.Lock()
        self._by_owner: dict[str, set[ClientChannel]] = {}
        self._by_stream: dict[str, set[ClientChannel]] = {}
        self._routes: dict[tuple[str, str], tuple[ClientChannel, ...]] = {}
        self.version = 0  # bumped when a client comes or goes (an engine worker learns which streams are watched)

    def _table(self, kind: str) -> dict[str, set[ClientChannel]]:
        return self._by_owner if kind == "subscription" else self._by_stream

    def register(self, kind: str, key: str, ch: ClientChannel) -> None:
        with self._lock:
            self._table(kind).setdefault(key, set()).add(ch)
            self._routes = {}
            self.version += 1

    def unregister(self, kind: str, key: str, ch: ClientChannel) -> None:
        with self._lock:
            chans = self._table(kind).get(key)
            if chans is not None:
                chans.discard(ch)
                if not chans:
                    del self._table(kind)[key]
            self._routes = {}
            self.version += 1

    def invalidate(self) -> None:
        """Forget cached routes (a subscription was added or removed)."""
        with self._lock:
            self._routes = {}

    @property
    def idle(self) -> bool:
        """No client watches anything (a batch's witnesses are then only logged)."""
        return not self._by_owner and not self._by_stream

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

    def watched_owners(self) -> set[str]:
        """The subscriptions some client watches."""
        with self._lock:
            return set(self._by_owner)

    def watched_streams(self) -> set[str]:
        """The streams some client watches (as a stream, not as a subscription)."""
        with self._lock:
            return set(self._by_stream)

    def channels(self) -> list[ClientChannel]:
        with self._lock:
            return [c for t in (self._by_owner, self._by_stream) for cs in t.values() for c in cs]

    def notify(self, owner: str, streams, message: dict) -> None:
        """Queue a control message for the channels watching subscription
        ``owner`` and those watching any of ``streams`` (its outputs)."""
        data = json.dumps(message, separators=(",", ":")).encode()
        with self._lock:
            chans = set(self._by_owner.get(owner, ()))
            for s in streams:
                chans.update(self._by_stream.get(s, ()))
        for c in chans:
            c.notice(data)

    def close_owner(self, owner: str) -> None:
        with self._lock:
            chans = list(self._by_owner.get(owner, ()))
        for c in chans:
            c.close(f"subscription {owner} was deleted")

    def pending(self) -> int:
        """Witnesses buffered for clients, plus one per client catching up from the log."""
        return sum(c.buffered + (c.lagging and not c.closed) for c in self.channels())

    def lagging(self) -> int:
        return sum(c.lagging for c in self.channels())

    @property
    def client_count(self) -> int:
        return len(self.channels())
