"""Retention of the event journal beyond what recovery needs, and what it holds
(docs/design/backfill.md): the part of :class:`server.durability.journal.Journal`
that keeps history for backfills and previews.

A segment whose records a kept snapshot covers (before the floor
``truncate_before`` sets) is no longer needed by recovery; it stays while it
holds an event newer than the newest event's time less ``retain_time`` and the
journal holds at most ``retain_bytes``; the oldest goes first, the newest
segment never. A history reader (server/durability/history.py) pins the
segments it has still to read. Retention runs after each snapshot (where the
floor moves), never on the ingest path; a full disk deletes every retained
segment at once (``Journal._shed_retained``), before the append is tried again.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Optional, Union

import msgspec

from air.engine import Event
from air.engine.convert import STRINGS, event_columns, events_of, events_of_rows, shared_values
from server.durability import fsio
from server.durability.framing import FRAME, walk


class Columns(msgspec.Struct):
    """A journal record's events as columns, the arguments of
    :func:`air.engine.convert.events_of` (an engine worker's batch form, as
    :func:`~air.engine.convert.event_columns` makes it): their streams (one name, or one
    an event), values, t1s, and t0s (None: every one a point's, its t1). Packed as a map, so
    that a record's events are this or the rows of earlier versions, told apart by their
    MessagePack type. A third fewer bytes than the rows for ticks, packed in less time and
    read back in about 0.4 of it (BENCHMARKS.md, "Engine workers, round 40"); what a reader process sends
    (server/ingest/remote.py): the main process writes those bytes as they came."""

    s: Union[str, list[str]]
    v: list[tuple]
    t1: list[Any]
    t0: Optional[list[Any]] = None

    @classmethod
    def of(cls, events: list[Event]) -> "Columns":
        """The columns of ``events`` (:func:`~air.engine.convert.event_columns`)."""
        streams, values, t0s, t1s = event_columns(events)
        return cls(streams, values, t1s, t0s)


#: a record's events: :class:`Columns`, or rows ``[stream, values, t0, t1]`` (before round 40; still read)
_Events = Union[list[tuple[str, tuple, Any, Any]], Columns]
_record = msgspec.msgpack.Decoder(tuple[Optional[str], Optional[int], _Events]).decode


def record_events(evs) -> list[Event]:
    """The events of a decoded record's third field (columns or rows)."""
    if isinstance(evs, Columns):  # (the streams' names shared too, as events_of_rows shares them)
        one = isinstance(evs.s, str)
        names = shared_values((evs.s,), STRINGS)[0] if one else list(shared_values(tuple(evs.s), STRINGS))
        return events_of(names, evs.v, evs.t0, evs.t1, STRINGS)
    return events_of_rows(evs)


def record_t1s(evs) -> list:
    """The t1 of each event of a decoded record's third field."""
    return evs.t1 if isinstance(evs, Columns) else [row[3] for row in evs]


class JournalRecord(NamedTuple):
    """One record of the journal, as :meth:`Journal.replay` gives it back."""
    position: int  #: its place in the journal (1, 2, ...; never reused)
    events: list[Event]  #: the events of one accepted block, in arrival order
    sender: str | None  #: the ``#sender`` id of the connection that sent them, if any
    lines_done: int | None  #: that sender's data lines journaled up to and with this record


class RetainedHistory:
    """Retention and the retained range, for :class:`~server.durability.journal.Journal`
    (which holds ``_lock``, ``_segments``, ``_floor``, ``_pins`` and the settings)."""

    def _time_segment(self, seg) -> None:
        """Read ``seg`` once for the smallest and largest event time it holds."""
        lo = hi = None
        try:
            with open(seg.path, "rb") as fh:
                data = fh.read(seg.size)
        except FileNotFoundError:
            return
        payloads = walk(data, seg.start, len(data))
        next(payloads, None)  # the header
        for payload in payloads:
            for t1 in record_t1s(_record(payload)[2]):
                if lo is None or t1 < lo:
                    lo = t1
                if hi is None or t1 > hi:
                    hi = t1
        seg.t_lo, seg.t_hi, seg.timed = lo, hi, True

    def _times(self) -> list:
        """The segments, each with its event times known (older segments are
        read once, outside the lock: they no longer change)."""
        with self._lock:
            segs = list(self._segments)
        for seg in segs:
            if not seg.timed:
                self._time_segment(seg)
        return segs

    @property
    def newest_time(self):
        """The largest event time the journal holds (None: no event)."""
        his = [s.t_hi for s in self._times() if s.t_hi is not None]
        return max(his) if his else None

    def retain(self) -> int:
        """Delete the oldest segments that recovery does not need (before the
        :meth:`truncate_before` floor) and no reader has pinned, while they are
        beyond the retention: all of their events older than the newest less
        ``retain_time``, or the segments together over ``retain_bytes``.
        Oldest first; never the newest. Returns how many went."""
        segs = self._times()
        his = [s.t_hi for s in segs if s.t_hi is not None]
        newest = max(his) if his else None
        with self._lock:
            pin = min(self._pins.values(), default=None)
            total = sum(s.size for s in self._segments)
            doomed = []
            while len(self._segments) > 1 and self._segments[1].first <= self._floor + 1:
                seg = self._segments[0]
                if pin is not None and self._segments[1].first > pin:
                    break  # a history reader still reads it
                too_big = bool(self.retain_bytes) and total > self.retain_bytes
                too_old = not self.retain_time or (
                    seg.t_hi is None or (newest is not None and seg.t_hi < newest - self.retain_time))
                if not (too_big or too_old):
                    break
                doomed.append(self._segments.pop(0))
                total -= seg.size
            if (self.retain_time or self.retain_bytes) and doomed:
                self.retention_dropped += len(doomed)
        self._unlink(doomed)
        return len(doomed)

    def _unlink(self, doomed: list) -> None:
        for s in doomed:
            fsio.remove(s.path)  # (through the seam the power-cut test records)
        if doomed and self.durability == "fsync":
            self._fsync_dir()

    def retained(self) -> dict:
        """What the journal holds now: ``{"from": oldest event time, "to": newest,
        "bytes": n, "segments": k, "first": first position}`` (times None: no event)."""
        segs = self._times()
        los = [s.t_lo for s in segs if s.t_lo is not None]
        his = [s.t_hi for s in segs if s.t_hi is not None]
        with self._lock:
            first = next((s.first for s in self._segments if s.records), self.appended + 1)
            return {"from": min(los) if los else None, "to": max(his) if his else None,
                    "bytes": sum(s.size for s in self._segments), "segments": len(self._segments),
                    "first": first}

    def pin(self, position: int) -> int:
        """Keep the segments holding ``position`` and after from retention until
        :meth:`unpin`; returns the pin's id."""
        with self._lock:
            self._pin_ids += 1
            self._pins[self._pin_ids] = position
            return self._pin_ids

    def move_pin(self, pin: int, position: int) -> None:
        with self._lock:
            if pin in self._pins:
                self._pins[pin] = position

    def unpin(self, pin: int) -> None:
        with self._lock:
            self._pins.pop(pin, None)


    def snapshot(self) -> tuple[list[tuple], int]:
        """The segments (``(first, path, records, size, start)`` each) and the last position
        appended, as one moment saw them: what :func:`follow_segments` reads, here or in
        another process (a backfill's engine: server/backfill/engine.py)."""
        with self._lock:
            return [(s.first, str(s.path), s.records, s.size, s.start) for s in self._segments], self.appended

    def follow(self, after: int, upto: int, cursor: list) -> Iterator:
        """:meth:`replay` of the records above ``after`` up to ``upto``, for a reader that
        comes back for more (:func:`follow_segments`)."""
        return follow_segments(self.snapshot()[0], after, upto, cursor)


def follow_segments(segs: list[tuple], after: int, upto: int, cursor: list) -> Iterator[JournalRecord]:
    """The records above ``after`` up to ``upto`` of the segments ``segs`` (as
    :meth:`RetainedHistory.snapshot` gives them: only their whole records are read),
    for a reader that comes back for more: ``cursor`` (``[]`` at first) is where the
    last call stopped (segment, byte offset, position) and is updated, so that each
    call reads only what is new instead of its segment from the start. Reads files
    only: any process can follow a journal another appends to (a segment deleted
    meanwhile raises FileNotFoundError: pin what is still to be read)."""
    for first, path, records, size, start in segs:
        if not records or first + records - 1 <= after:
            continue
        if first > upto:
            return
        if cursor and cursor[0] == first and cursor[2] == after:  # go on where the last call stopped
            off, nxt, header = cursor[1], after + 1, False
        else:
            off, nxt, header = start, first, True
        with open(path, "rb") as fh:
            fh.seek(off)
            data = fh.read(size - off)
        i, n_data = 0, len(data)
        while i < n_data and nxt <= upto:
            n = FRAME.unpack_from(data, i)[0]
            payload = data[i + FRAME.size:i + FRAME.size + n]
            i += FRAME.size + n
            if header:  # the segment's header takes no position
                header = False
                continue
            pos, nxt = nxt, nxt + 1
            cursor[:] = [first, off + i, pos]
            if pos > after:
                sender, done, evs = _record(payload)
                yield JournalRecord(pos, record_events(evs), sender, done)
