"""What a TCP connection's reader asks of the rest of the server.

A connection (server/ingest/connection.py) reads, decodes and acknowledges its
lines; everything it needs beyond its socket goes through one :class:`Intake`:
the sender table (one connection a sender, its journaled progress), the queue
and the journal's positions (for ``#ack``), the counters, the tokens, the
streams' declarations (its decoders) and the clock's horizon. This one calls
them in this process. The plan for receivers in processes of their own
(docs/design/receivers.md) puts a connection's reader in another process and
this interface across a channel: nothing else of the server is reached from
a connection.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, NamedTuple

from air.formats import make_decoder
from server.ingest.queue import DelayQueue, QueueClosed
from server.observability.counters import Count, Counters


class Lines(NamedTuple):
    """Which of a sender's lines a block's events are (plain values: a reader in
    another process sends them as they are): event ``i`` is line ``first + i``
    where ``numbers`` is None (every line of the block an event, the usual
    case), else line ``numbers[i]``; the block's lines end at ``last``."""

    sender: str
    first: int
    last: int
    numbers: list[int] | None = None

    def done(self, end: int) -> tuple[str, int]:
        """The sender and its lines done once the events before ``end`` are
        journaled: what a part of the block ending there records."""
        if end >= (len(self.numbers) if self.numbers is not None else self.last - self.first + 1):
            return self.sender, self.last
        return self.sender, (self.first + end if self.numbers is None else self.numbers[end]) - 1


class Intake:
    """The main process's side of the TCP connections, in this process.

    ``catalog`` maps a stream name to its schema (or None); ``streams()`` names
    the streams a connection's decoder prepares typed decoding for; ``horizon()``
    the latest t1 accepted now (None: no bound); ``stamp`` whether events without
    timestamps get ``clock``'s time (else refused); ``security``
    (server/security), None: no tokens."""

    def __init__(self, queue: DelayQueue, catalog: Callable, clock: Callable[[], float], counters: Counters, *,
                 time_unit_ms: float = 1.0, streams: Callable[[], Iterable[str]] = tuple, security=None,
                 horizon: Callable[[], float | None] = lambda: None, stamp: bool = True) -> None:
        self.queue = queue
        self.catalog = catalog
        self.clock = clock
        self.counters = counters
        self.time_unit_ms = time_unit_ms
        self.streams = streams
        self.security = security
        self._horizon = horizon
        self.stamp = stamp
        self._senders: set[str] = set()  # sender ids of the open connections
        self._stopping = threading.Event()  # a put waiting for room gives up once it is set
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ tokens

    @property
    def auth(self) -> bool:
        """Whether a ``#token`` line with the ``ingest`` scope is due first."""
        return self.security is not None and self.security.enabled

    def authenticate(self, token: bytes | None, address: str) -> None:
        """Raises :class:`server.security.AuthRefused` unless ``token`` may send events."""
        who = self.security.authenticate(token, address, "tcp", "sending events over TCP")
        self.security.authorize(who, "ingest", address, "tcp", "sending events over TCP")

    # ------------------------------------------------------------------ senders

    def claim(self, sender: str) -> bool:
        """Take ``sender`` for one connection; False while another holds it."""
        with self._lock:
            if sender in self._senders:
                return False
            self._senders.add(sender)
            return True

    def release(self, sender: str) -> None:
        with self._lock:
            self._senders.discard(sender)

    def progress(self, sender: str) -> int:
        """The lines of ``sender`` journaled (or queued) so far."""
        return self.queue.progress(sender)

    def record_progress(self, sender: str, lines_done: int) -> None:
        """Lines up to ``lines_done`` handled with nothing to queue (raises
        DiskFull; OSError once the server is stopping)."""
        try:
            self.queue.record_progress(sender, lines_done)
        except QueueClosed:
            raise OSError("server stopping") from None

    # ------------------------------------------------------------------ events

    def horizon(self) -> float | None:
        """The latest t1 accepted now (None: no bound)."""
        return self._horizon()

    def decoder(self, fmt: str):
        """A decoder of ``fmt`` for one connection."""
        return make_decoder(fmt, self.catalog, clock=self.clock if self.stamp else None,
                            time_unit_ms=self.time_unit_ms, streams=self.streams())

    def put(self, events, lines: Lines | None = None, packed=None) -> list[int]:
        """Queue a decoded block (blocking while the queue is full); the indexes
        of late events. ``lines``: a sender's lines they are (its progress is
        journaled with them); ``packed``: the events as the journal packs them
        (a reader process's block, server/ingest/remote.py). Raises DiskFull;
        OSError once the server is stopping."""
        try:
            return self.queue.put_batch(events, on_accepted=self._count_received, cancel=self._stopping,
                                        meta=lines.done if lines is not None else None, packed=packed)
        except QueueClosed:
            raise OSError("server stopping") from None

    def stop(self) -> None:
        """The server stops: a put waiting for room gives up."""
        self._stopping.set()

    def _count_received(self, n: int) -> None:
        self.counters.add(Count.RECEIVED_TCP, n)

    def count(self, what: Count, n: int = 1) -> None:
        self.counters.add(what, n)

    # ------------------------------------------------------------------ acknowledgements

    @property
    def journaled(self) -> bool:
        """Whether events are journaled (else what is queued is acknowledged at once)."""
        return self.queue.journal is not None

    def position(self) -> int:
        """The journal's position after what was put so far (0 without a journal)."""
        journal = self.queue.journal
        return journal.appended if journal is not None else 0

    def durable(self) -> int:
        return self.queue.journal.durable()

    def wait_durable(self, position: int, wait: float) -> None:
        self.queue.journal.wait_durable(position, wait)
