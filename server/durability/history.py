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
later has ``t1`` at least that). :meth:`HistoryReader.cut`, on the engine
thread between two batches, gives out the rest of what the engine has taken:
all but the queued events, which are the sorted tail.

**From.** :func:`resolve_from` turns a registration's or a preview's ``from``
into an event time, or refuses it (:class:`FromError`) with the retained range.
"""

from __future__ import annotations

import heapq
import itertools
from operator import attrgetter
from typing import Iterator

from server.config import parse_duration
from server.durability.journal import Journal

_t1 = attrgetter("t1")
_END = object()
#: Events sorted at once while reading history (see HistoryReader._read_to).
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
    order (see the module's docstring); reads the journal as it grows. Pins
    what it has still to read against retention; :meth:`close` unpins."""

    def __init__(self, journal: Journal, start, queue=None) -> None:
        self.journal = journal
        self.queue = queue
        self.start = start
        first = journal.retained()["first"]
        self.pos = first - 1  # journal records read up to here
        self._cursor: list = []  # where in the journal's files (Journal.follow)
        self._pin = journal.pin(first)
        self._order: Iterator = iter(())  # the events read and not given out, in order (see _read_to)
        self._next = _END  # the first of them, taken out of _order
        self._in_order = 0  # how many _order holds (with _next)
        self._later: list = []  # events read since, all at least _later_floor, merged in when it is reached
        self._later_floor = None
        self._floor = None  # every record after pos has t1 at least this (the queue's last_released before)
        self.scanned = 0  # events read from the journal (t1 >= start)
        self.given = 0  # events given out

    def close(self) -> None:
        self.journal.unpin(self._pin)

    @property
    def left(self) -> int:
        """Events read and not given out yet."""
        return self.scanned - self.given

    def _read_to(self, upto: int) -> None:
        """Read the records up to ``upto``. Sorting a million events at once would hold the
        interpreter's lock for a quarter second (the live engine thread waiting): new events
        are sorted in pieces of SORT_PIECE and merged lazily (heapq.merge is stable across
        its inputs, given in arrival order); while much is left, a few new ones (all at
        least the queue's last_released before they were accepted) wait aside until the
        order reaches that time (:meth:`_give`), instead of one more merge each."""
        if upto <= self.pos:
            return
        start, new = self.start, []
        for rec in self.journal.follow(self.pos, upto, self._cursor):
            new += [e for e in rec.events if e.t1 >= start]
        floor, self.pos = self._floor, upto
        self.journal.move_pin(self._pin, upto + 1)
        if not new:
            return
        self.scanned += len(new)
        if self._later:
            self._later += new
            if len(self._later) >= SORT_PIECE:
                self._merge_later()
        elif self._in_order > SORT_PIECE and floor is not None and len(new) < SORT_PIECE:
            self._later, self._later_floor = new, floor
        else:
            self._merge(new)

    def _merge(self, new: list) -> None:
        head = [] if self._next is _END else [self._next]
        if self._in_order + len(new) <= SORT_PIECE:
            merged = head + list(self._order) + new
            merged.sort(key=_t1)
            self._order = iter(merged)
        else:
            pieces = [sorted(new[i:i + SORT_PIECE], key=_t1) for i in range(0, len(new), SORT_PIECE)]
            self._order = heapq.merge(itertools.chain(head, self._order), *pieces, key=_t1)
        self._in_order += len(new)
        self._next = next(self._order, _END)

    def _merge_later(self) -> None:
        later, self._later, self._later_floor = self._later, [], None
        if later:
            self._merge(later)

    def _give(self, k: int, below=None) -> list:
        """Up to ``k`` events in order (those with t1 below ``below``, when given)."""
        out: list = []
        while True:
            limit = below
            if self._later:
                limit = self._later_floor if limit is None else min(limit, self._later_floor)
            nxt, order, had = self._next, self._order, len(out)
            while len(out) < k and nxt is not _END and (limit is None or nxt.t1 < limit):
                out.append(nxt)
                nxt = next(order, _END)
            self._next = nxt
            self._in_order -= len(out) - had
            if self._later and len(out) < k and (nxt is _END or nxt.t1 >= self._later_floor):
                self._merge_later()  # the order has reached the events set aside
                continue
            break
        self.given += len(out)
        return out

    def everything(self, chunk: int = 4096):
        """Preview: every retained event from ``start`` (queued ones too), in order, in chunks."""
        self._read_to(self.journal.appended)
        while self.left:
            yield self._give(chunk)

    def released(self, limit: int) -> list:
        """Up to ``limit`` events the live queue has certainly released, in order (maybe none)."""
        last = self.queue.last_released  # before the journal's position: later events are at least this
        self._read_to(self.journal.appended)
        self._floor = last
        if last is None or not self.left:
            return []
        return self._give(limit, below=last)

    def cut(self) -> list:
        """On the engine thread, between two batches: the rest of the events the
        live engine has taken (every event read but the queued ones). Raises
        LookupError when the queue holds events the retained journal lacks."""
        with self.queue.lock:
            upto = self.journal.appended
            queued = sum(1 for ev in self.queue.export_state()["events"] if ev[3] >= self.start)
        self._read_to(upto)
        self._merge_later()
        n = self.left - queued
        if n < 0:
            raise LookupError(f"the queue holds {queued} events from {self.start} on but the retained journal "
                              f"only {self.left} not yet taken: retention deleted history still queued")
        return self._give(n)
