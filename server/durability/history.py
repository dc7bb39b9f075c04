"""Reading the retained journal as history: the events from an event time T
on, in exactly the order the live engine took them (docs/design/backfill.md).

**The order.** The queue (server/ingest/queue.py) releases events in
``(t1, arrival)`` order and refuses (never journals) an event older than one
already released; recovery puts the journal back into the queue in journal
(arrival) order and the engine takes them in that same order again
(recovery.py). So the events the engine has taken are always a prefix of the
journal's events sorted stably by ``t1``, and the events still queued are the
rest: :class:`HistoryReader` sorts what it reads stably by ``t1`` (Python's
sort is stable: arrival order breaks ties), and gives out only events the
queue has released for sure: those with ``t1`` below the queue's
``last_released``, read before the journal's position (any event accepted
later has ``t1`` at least that: :meth:`HistoryReader.below`).
:meth:`HistoryReader.take_cut`, at the point :func:`cut_point` takes on the
engine thread between two batches, gives out the rest of what the engine has
taken: all but the queued events, which are the sorted tail.

**From.** :func:`resolve_from` turns a registration's or a preview's ``from``
into an event time, or refuses it (:class:`FromError`) with the retained range.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import attrgetter
from typing import Iterator

from server.config import parse_duration
from server.durability.journal import Journal
from server.durability.retention import follow_segments

_t1 = attrgetter("t1")
#: Events sorted at once while reading history (see HistoryReader._merge).
SORT_PIECE = 65536


class FromError(ValueError):
    """A ``from`` that cannot be served: ``retained`` is the range that can."""

    def __init__(self, message: str, retained: dict | None) -> None:
        super().__init__(message)
        self.retained = retained


def resolve_from(value, journal: Journal | None, newest, time_unit_ms: float):
    """The event time a ``from`` means: a number (an event time), ``"retained"``
    (the oldest retained event), or ``"-24h"`` (before ``newest``, the newest
    accepted event's time). Raises :class:`FromError` for a bad one, one before
    the oldest retained event, or when no journal is kept."""
    if journal is None:
        raise FromError("the server keeps no history: durability is off (set durability to fsync or write, and "
                        "retain_duration / retain_bytes, to register or preview with from)", None)
    kept = journal.retained()
    rng = {"from": kept["from"], "to": kept["to"]}
    if isinstance(value, bool) or value is None:
        raise FromError(f"from: {value!r} is not an event time, 'retained' or a duration such as '-24h'", rng)
    if isinstance(value, (int, float)):
        t = value
    elif isinstance(value, str) and value.strip() == "retained":
        return kept["from"] if kept["from"] is not None else (newest if newest is not None else 0)
    elif isinstance(value, str) and value.strip().startswith("-"):
        try:
            seconds = parse_duration(value.strip()[1:], what="from")
        except ValueError as exc:
            raise FromError(f"{exc} (a duration before the newest event, e.g. '-24h', '-90m', '-30s', '-2d')",
                            rng) from None
        base = newest if newest is not None else kept["to"]
        if base is None:
            base = 0
        t = base - seconds * 1000.0 / time_unit_ms
        if isinstance(base, int) and t == int(t):
            t = int(t)
    else:
        raise FromError(f"from: {value!r} is not an event time, 'retained' or a duration such as '-24h'", rng)
    if kept["from"] is not None and t < kept["from"]:
        raise FromError(f"from {t} is before the history the server retains: events from {kept['from']} to "
                        f"{kept['to']} (retain_duration, retain_bytes); use a later from, or 'retained'", rng)
    return t


class HistoryReader:
    """The retained events from event time ``start`` on, in the live engine's
    order (see the module's docstring), read from journal position ``first`` as
    the journal grows. ``journal`` is anything that follows the journal's files
    (:class:`Journal`; in a backfill's engine process, a :class:`SegmentsView` of
    it); whoever owns the journal pins what is still to be read against retention
    and samples the queue for :meth:`below` (server/backfill/engine.py)."""

    def __init__(self, journal: "Journal | SegmentsView", start, first: int) -> None:
        self.journal = journal
        self.start = start
        self.pos = first - 1  # journal records read up to here
        self._cursor: list = []  # where in the journal's files (Journal.follow)
        self._order: list = []  # from _at on: the events read and not given out, sorted stably by t1 (see _merge)
        self._at = 0
        self.scanned = 0  # events read from the journal (t1 >= start)
        self.given = 0  # events given out

    @property
    def left(self) -> int:
        """Events read and not given out yet."""
        return self.scanned - self.given

    def _read_to(self, upto: int) -> None:
        """Read the records up to ``upto`` and put their events in order (:meth:`_merge`)."""
        if upto <= self.pos:
            return
        start, new = self.start, []
        for rec in self.journal.follow(self.pos, upto, self._cursor):
            new += [e for e in rec.events if e.t1 >= start]
        self.pos = upto
        self.scanned += len(new)
        for i in range(0, len(new), SORT_PIECE):
            self._merge(new[i:i + SORT_PIECE])

    def _merge(self, piece: list) -> None:
        """Put ``piece`` (events read after every event in the order) in order. The journal
        is in arrival order and the queue kept every event within its delay of those
        released before (older ones refused): a piece sorted by t1 (stably: arrival breaks
        ties) mostly starts after the order's last event and is appended; else only the
        order's tail later than the piece's first event is merged with it (a stable sort of
        two sorted runs, the earlier arrivals first: linear). Pieces of SORT_PIECE: no sort
        of a million events holds the interpreter's lock for long (the live engine thread waits)."""
        if not piece:
            return
        piece.sort(key=_t1)
        order = self._order
        cut = bisect_right(order, piece[0].t1, self._at, key=_t1)
        if cut == len(order):
            order += piece
        else:
            tail = order[cut:]
            tail += piece
            tail.sort(key=_t1)
            order[cut:] = tail

    def _give(self, k: int, below=None) -> list:
        """Up to ``k`` events in order (those with t1 below ``below``, when given)."""
        order, at = self._order, self._at
        end = min(at + k, len(order))
        if below is not None and end > at and order[end - 1].t1 >= below:
            end = bisect_left(order, below, at, end, key=_t1)
        out = order[at:end]
        self._at = end
        if end >= SORT_PIECE and end * 2 >= len(order):  # given out: dropped (not every batch: a copy each time)
            del order[:end]
            self._at = 0
        self.given += len(out)
        return out

    def below(self, upto: int, last, limit: int) -> list:
        """Up to ``limit`` events, in order, of those with t1 below ``last`` once the records
        up to ``upto`` are read: ``last`` the queue's last release, sampled before ``upto``
        was (every record after it has t1 at least that)."""
        self._read_to(upto)
        if last is None or not self.left:
            return []
        return self._give(limit, below=last)

    def take_cut(self, upto: int, queued: int) -> list:
        """At the hand-over, with what :func:`cut_point` took: the rest of the events the
        live engine has taken (every event read up to ``upto`` but the ``queued`` ones, the
        sorted tail). Raises LookupError when the queue holds events the retained journal lacks."""
        self._read_to(upto)
        n = self.left - queued
        if n < 0:
            raise LookupError(f"the queue holds {queued} events from {self.start} on but the retained journal "
                              f"only {self.left} not yet taken: retention deleted history still queued")
        return self._give(n)


def cut_point(journal: Journal, queue, start) -> tuple[int, int]:
    """On the engine thread, between two batches (the live engine has taken every event
    the queue gave out): the journal's last position and how many events from ``start``
    on the queue still holds, at one moment (under the queue's lock)."""
    with queue.lock:
        upto = journal.appended
        queued = sum(1 for ev in queue.export_state()["events"] if ev[3] >= start)
    return upto, queued


class SegmentsView:
    """A journal as another process sees it (server/backfill/engine.py): the segments of
    the last :meth:`Journal.snapshot` it was sent, followed by reading the files."""

    def __init__(self) -> None:
        self.segments: list[tuple] = []

    def follow(self, after: int, upto: int, cursor: list) -> Iterator:
        return follow_segments(self.segments, after, upto, cursor)
