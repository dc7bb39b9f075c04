"""The event journal: a write-ahead log of every accepted event, in arrival order.

The queue appends one record per part of a block it accepts, under its lock,
so the journal's order is exactly the queue's arrival order
(:meth:`server.ingest.queue.DelayQueue._insert`). Recovery re-puts the records in
journal order. No sockets, no threads but the flusher, no FastAPI.

**Files.** ``directory/`` holds segments named by the position of their first
record, zero-padded to 20 digits (``00000000000000000001.journal``). A new
segment starts once the current one holds ``segment_bytes`` or more. A segment
is framed by :mod:`server.durability.framing`: the file header ``CAYUGA J`` and
version 2, then records ``<u32 length><u32 CRC32 of length and payload><payload>``.
Segments written before that framing (no file header, the CRC of the payload
alone) are still read; the newest of them is never appended to again: the
journal goes on in a new segment. A payload is MessagePack (msgspec):

- the first record of every segment is its *header*, a map
  ``{"first": position, "senders": {sender: lines_done}}``: the whole sender
  table when the segment was started, so that the table can be recovered from
  the remaining segments alone after older ones are deleted; it takes no position;
- every other record is ``[sender or None, lines_done or None, events]`` with
  events as columns, the map ``{"s": stream or [stream, ...], "v": [values, ...],
  "t1": [t1, ...], "t0": [t0, ...] or None}`` (None: each event a point, its t0 its
  t1; :class:`~server.durability.retention.Columns`), an empty list for none, or, as
  written before round 40 and still read, rows ``[[stream, values, t0, t1], ...]``;
  MessagePack keeps ints, floats, bools and strings apart, so values decode back to
  the same types. Records
  take positions 1, 2, 3, ... in order: a segment's records are numbered from
  its first position; positions keep increasing across restarts (the newest
  segment is never deleted, so its name and record count give the next one).

**Recovery on open.** Every segment is read and each record checked: a length
of 0 or beyond the file's end, a CRC mismatch, or a payload of the wrong shape
(a first record that is not a header, a later one that is not a 3-array, an
undecodable one) makes that record *bad*. The journal is cut at the first bad
record: everything from it on is treated as the torn tail of a crash and
dropped -- the segment is truncated at the last good record, and any later
segments are renamed ``*.journal.dropped`` (kept for inspection, never read
again). A record is never misread: nothing after a bad record is trusted, even
if later records would check out (after a power loss, unsynced pages may be
lost in any order, so a good-looking record after a bad one is no evidence).
A cut logs a warning with the file, offset and bytes dropped (an error when
whole later segments go too) and counts in :attr:`Journal.torn`. A segment
left without a good header is removed (its name is the next position).

**Durability** (the ``durability`` setting):

- ``fsync``: a flusher thread fdatasyncs whatever was written since its last
  sync (group commit), a round at most every ``sync_interval`` seconds while
  nobody waits for one (:meth:`wait_durable`: ``POST /events``, a TCP
  sender's acknowledgement once its input pauses, a snapshot's publication),
  at once when somebody does; :meth:`durable` is the last position synced:
  survives power loss. A round for every TCP block (500-700 a second at 50K
  events/s) cost every event about 0.1 ms at the median on 2 cores
  (BENCHMARKS.md, "Engine workers, round 15").
- ``write``: :meth:`durable` is the last position written with write(2): in
  the OS page cache, it survives kill -9 of the server, not a machine crash.
- ``off`` keeps no journal at all: do not open one (the daemon leaves
  ``queue.journal`` None).

In both journaling modes :meth:`sync` makes everything appended durable on
demand: a snapshot is published only after it (checkpoints.py), so a snapshot
never counts a record that a power cut can take from the journal.

All changes to the files go through server/durability/fsio.py (the seam a
power-cut test records, tests/server/test_powercut.py).

**A full disk.** An append that cannot be written (ENOSPC, EDQUOT, any
OSError; a short write) is cut back to the last whole record -- the segment is
truncated to where the record began, so no half record is ever followed by
later ones -- and raises :class:`~server.durability.diskfull.DiskFull`: the record's
events are *not* accepted (the queue keeps none of them, the sender's progress
stays where it was), those journaled before stay accepted, and the next append
simply tries again. A new segment that cannot be started (its header cannot
be written) is removed and the current one stays in use. A group-commit sync
that fails leaves :meth:`durable` where it was (nothing more is acknowledged),
refuses appends while it lasts and is retried every ``RETRY_SECONDS``; a cut
back that itself fails refuses every append until it succeeds. Each failure
and the end of an episode go to the ``disk`` state given (/health, metrics).
While an append failure lasts, :meth:`probe` (called by the ``disk`` state's
retrier, server/durability/diskfull.py) tries again without a client: it
writes a file the size of the refused record beside the segments (and the cut
back, if that failed), and ends the episode when that works, so a server whose
disk was freed turns ready with no sender writing.

**Sender table.** :attr:`senders` maps a sender id to the data lines of that
sender journaled so far (the ``lines_done`` of its newest record), rebuilt on
open from the oldest remaining header plus every later record.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from bisect import bisect_left
from pathlib import Path
from typing import Iterator, Optional

import msgspec

from air.engine import Event
from air.engine.convert import t1_span
from server.durability import framing, fsio
from server.durability.diskfull import DiskFull, DiskState
from server.durability.framing import Scan, walk
from server.durability.retention import Columns, JournalRecord, RetainedHistory, _record, record_events

log = logging.getLogger("cayuga.journal")

MODES = ("fsync", "write")
SUFFIX = ".journal"
NAMES = framing.SegmentNames("", 20, SUFFIX)
_NEW = ".new"
#: Buckets of the sync latency histogram (seconds).
SYNC_BUCKETS = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
_ARRAY3 = 0x93  # MessagePack fixarray of 3: an event record
#: Seconds between two tries of a journal sync that failed.
RETRY_SECONDS = 0.5
#: The file :meth:`Journal.probe` writes beside the segments (and removes) to see whether
#: a refused append would fit now; never a segment (no ``.journal`` suffix).
PROBE_NAME = "write-probe.tmp"

_encode = msgspec.msgpack.Encoder().encode
_peek = msgspec.msgpack.Decoder(tuple[Optional[str], Optional[int], msgspec.Raw]).decode


class _Header(msgspec.Struct):
    first: int
    senders: dict[str, int]


_header = msgspec.msgpack.Decoder(_Header).decode


def _packed(events: list[Event]):
    """A record's events: their :class:`Columns` (none: an empty list)."""
    return Columns.of(events) if events else []


def segment_name(first: int) -> str:
    return NAMES.name(first)


class _Segment:
    __slots__ = ("first", "path", "records", "size", "start", "t_lo", "t_hi", "timed")

    def __init__(self, first: int, path: Path, records: int = 0, size: int = 0,
                 start: int = framing.HEADER.size) -> None:
        self.first = first  # position of its first record
        self.path = path
        self.records = records
        self.size = size  # bytes of good records (what replay reads)
        self.start = start  # offset of its header record: 0 in a segment of the older framing (version 1)
        # the smallest and largest event time (t1) of its events (None: none, or not known yet);
        # ``timed``: known (a segment this process wrote, or one read since: Journal._time_segments)
        self.t_lo = None
        self.t_hi = None
        self.timed = not records

    @property
    def legacy(self) -> bool:
        return self.start == 0


class Journal(RetainedHistory):
    """A segmented, checksummed write-ahead journal (see the module docstring).

    Thread-safe: :meth:`append` may be called from any thread (the queue calls
    it under its own lock, which is what orders the records)."""

    def __init__(self, directory: Path, durability: str, segment_bytes: int = 64 << 20,
                 disk: DiskState | None = None, retain_time: float | None = None,
                 retain_bytes: int | None = None, sync_interval: float = 0.0) -> None:
        if durability not in MODES:
            raise ValueError(f"durability {durability!r}: a journal is kept with 'fsync' or 'write' "
                             "('off' keeps none: do not open one)")
        self.directory = Path(directory)
        self.durability = durability
        self.segment_bytes = segment_bytes
        self.disk = disk
        #: ``fsync``: seconds at least between the starts of two sync rounds nobody waits for
        self.sync_interval = sync_interval
        self._waiters = 0  # threads in wait_durable: the flusher's next round starts at once
        #: Retention (docs/design/backfill.md): segments recovery no longer needs are kept while they
        #: hold events newer than the newest event's time less ``retain_time`` (time units) and the
        #: segments together hold at most ``retain_bytes``; None/0: kept only while recovery needs them.
        self.retain_time = retain_time
        self.retain_bytes = retain_bytes
        self._floor = 0  # records up to this position are covered by a kept snapshot (truncate_before)
        self._pins: dict[int, int] = {}  # pin id -> the first position a history reader still reads
        self._pin_ids = 0
        self.retention_dropped = 0  # segments retention deleted (the recovery floor's deletions not counted)
        self.retention_shed = 0  # of those, given back to a full disk
        self.failure: DiskFull | None = None  # the write failure that lasts (None: the last append worked)
        self.sync_failure: DiskFull | None = None  # a sync that failed and has not succeeded since
        self._cut_to: int | None = None  # a cut back that failed: the offset the active segment must go back to
        self.write_failures = 0  # appends refused because the journal could not be written or synced
        self._refused_bytes = 0  # the size of the last record refused (what probe() checks room for)
        self.senders: dict[str, int] = {}
        self.appended = 0
        self._synced = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False  # no more appends; the flusher stops
        #: The flusher waits for an append (all synced): the one time an append must wake it. Not
        #: between two rounds: an append's notify woke it then only to wait again, a wake-up of
        #: another thread (a cross-CPU interrupt on a VM) per record: 14% of the main process's
        #: time holding the interpreter lock in `bench server` (BENCHMARKS.md, round 20)
        self._flusher_idle = False
        self._done = False  # closed and synced: waiters give up
        self._retired: list[int] = []  # fds of finished segments the flusher must sync, then close
        self._written: list[Path] = []  # with "write": finished segments not synced yet (see sync)
        self._dir_dirty = False  # a segment was created: the directory needs an fsync too
        # metrics
        self.records = 0
        self.bytes = 0
        self.syncs = 0
        self.sync_seconds = 0.0
        self.sync_buckets = [0] * (len(SYNC_BUCKETS) + 1)  # the last one is +Inf
        self.torn = 0
        self.torn_bytes = 0
        fsio.makedirs(self.directory)
        fsio.remove(self.directory / PROBE_NAME)  # a probe's, left by a crash
        self._segments: list[_Segment] = []
        self._next_first = 1  # where a new journal starts (a removed segment's name, else 1)
        self._recover()
        self._synced = self.appended  # what survived the restart is on disk (synced below)
        last = self._segments[-1] if self._segments else None
        if last is not None and not last.timed:  # appended to from now on: its times are kept up to date
            self._time_segment(last)
        if last is None:
            self.appended = self._next_first - 1
            self._synced = self.appended
            self._fd = self._create(self._next_first)
        elif last.legacy:  # written before framing version 2: go on in a new segment, in version 2
            if durability == "fsync":  # as the active segment would have been
                fd = fsio.open(last.path, os.O_RDONLY)
                try:
                    fsio.fdatasync(fd)
                finally:
                    fsio.close(fd)
            replacing = not last.records  # its name is the next position: the new segment takes its place
            self._fd = self._create(self.appended + 1, replacing)
        else:
            self._fd = framing.open_segment(last.path)
            if durability == "fsync":
                fsio.fdatasync(self._fd)
        self._flusher: threading.Thread | None = None
        if durability == "fsync":
            self._fsync_dir()
            self._flusher = threading.Thread(target=self._flush_loop, name="cayuga-journal-flush", daemon=True)
            self._flusher.start()

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        for p in self.directory.glob("*" + SUFFIX + _NEW):  # a replacement not renamed into place: a crash
            fsio.unlink(p)
        found = NAMES.listing(self.directory)
        table: dict[str, int] | None = None
        expected = None  # the first position the next segment must have
        for k, (first, path) in enumerate(found):
            data = path.read_bytes()
            start = framing.file_kind(data, framing.JOURNAL, str(path))
            good, records, header, problem = self._scan(data, first, start)
            if not data:
                problem = "an empty segment"
            elif header is None and problem is None:
                problem = "no segment header"
            self._next_first = first
            if expected is not None and first != expected and problem is None:
                problem = f"starts at position {first}, but the previous segment ends at {expected - 1}"
                good, records, header = 0, 0, None
            if header is not None:
                if table is None:
                    table = dict(header.senders)
                seg = _Segment(first, path, records, good, start)
                self._fold(data, start, good, table)
            if problem is not None:
                self._cut(path, good, len(data), problem, [p for _, p in found[k + 1:]])
                if header is None:  # nothing good in it: its name will be taken again
                    fsio.unlink(path)
                else:
                    self._segments.append(seg)
                break
            self._segments.append(seg)
            expected = first + records
        self.senders = table or {}
        if self._segments:
            last = self._segments[-1]
            self.appended = last.first + last.records - 1

    def _scan(self, data: bytes, first: int, start: int) -> tuple[int, int, _Header | None, str | None]:
        """(bytes of good records, event records, header, why it stopped or None),
        the records from ``start`` (0: a segment of framing version 1)."""
        records, header = 0, None
        scan = Scan(data, start, legacy=start == 0)
        for off, payload in scan:
            if header is None:
                try:
                    header = _header(payload)
                except msgspec.DecodeError:
                    return off, records, None, "a first record that is not a segment header"
                if header.first != first:
                    return 0, 0, None, f"a header for position {header.first} in the file of {first}"
            else:
                if payload[0] != _ARRAY3:
                    return off, records, header, "a record of the wrong shape"
                try:
                    _peek(payload)
                except msgspec.DecodeError:
                    return off, records, header, "an undecodable record"
                records += 1
        return scan.good, records, header, scan.problem

    @staticmethod
    def _fold(data: bytes, start: int, end: int, table: dict[str, int]) -> None:
        """Fold the (sender, lines_done) of the event records in ``data[start:end]`` into ``table``."""
        records = walk(data, start, end)
        next(records)  # the header
        for payload in records:
            sender, done, _ = _peek(payload)
            if sender is not None and done is not None:
                table[sender] = done

    def _cut(self, path: Path, good: int, size: int, problem: str, later: list[Path]) -> None:
        dropped = size - good
        self.torn += 1
        self.torn_bytes += dropped
        framing.cut_tail(path, good)
        for p in later:
            dropped += p.stat().st_size
            fsio.rename(p, p.with_name(p.name + ".dropped"))
        (log.error if later else log.warning)(
            "journal %s: %s at offset %d; dropped the rest as a torn tail: %d bytes%s", path, problem, good,
            dropped, f", including {len(later)} later segment(s) renamed *.dropped" if later else "")

    # ------------------------------------------------------------------ appending

    def _create(self, first: int, replacing: bool = False) -> int:
        """Start a segment whose first record will be ``first`` (under the lock, or in __init__);
        one that cannot be written is removed again (:class:`DiskFull`). ``replacing``: the
        newest segment, of the older framing and without records, has that name; the new one
        is written beside it (``.new``) and takes its place only once written whole."""
        path = self.directory / segment_name(first)
        target = path.with_name(path.name + _NEW) if replacing else path
        try:
            fd = framing.open_new(target)
        except OSError as exc:
            raise DiskFull.from_os("journal", "a new journal segment could not be created", path, exc) from None
        try:
            size = framing.start_segment(fd, target, framing.JOURNAL,
                                         _encode({"first": first, "senders": self.senders}))
            if replacing:
                try:
                    fsio.replace(target, path)
                except OSError:
                    fsio.close(fd)
                    fsio.remove(target)
                    raise
        except OSError as exc:
            raise DiskFull.from_os("journal", "a new journal segment could not be written", path, exc) from None
        if replacing:
            self._segments.pop()
        self._segments.append(_Segment(first, path, 0, size))
        self._dir_dirty = True
        return fd

    def append(self, events: list[Event], sender: str | None = None, lines_done: int | None = None,
               packed: msgspec.Raw | None = None) -> int:
        """Append one record (written whole, or cut back and refused with
        :class:`DiskFull`); returns its position. ``packed``: ``events`` as their
        :class:`~server.durability.retention.Columns` already packed (a reader process's
        block, server/ingest/remote.py), written as they are."""
        record = framing.frame(_encode((sender, lines_done, _packed(events) if packed is None else packed)))
        lo, hi = t1_span(events)
        with self._lock:
            if self._closed:
                raise ValueError("the journal is closed")
            try:
                if self.sync_failure is not None:
                    raise self.sync_failure
                if self._cut_to is not None:
                    self._cut_back(self._cut_to)
                seg = self._segments[-1]
                if seg.size >= self.segment_bytes and seg.records:
                    self._rotate()
                    seg = self._segments[-1]
                try:
                    framing.write_all(self._fd, record)
                except OSError as exc:
                    self._cut_back(seg.size)
                    raise DiskFull.from_os("journal", "the journal could not be written", seg.path, exc) from None
            except DiskFull as exc:
                self._shed_retained()  # retention gives back its space first: the next try may fit
                self.write_failures += 1
                self.failure = exc
                self._refused_bytes = len(record)
                if self.disk is not None:
                    self.disk.failed(exc)
                raise
            if self.failure is not None:
                self.failure = None
                if self.disk is not None:
                    self.disk.recovered("journal")
            seg.size += len(record)
            seg.records += 1
            if events:
                if seg.t_lo is None or lo < seg.t_lo:
                    seg.t_lo = lo
                if seg.t_hi is None or hi > seg.t_hi:
                    seg.t_hi = hi
            self.appended += 1
            if sender is not None and lines_done is not None:
                self.senders[sender] = lines_done
            self.records += 1
            self.bytes += len(record)
            if self._flusher_idle:
                self._cond.notify_all()
            return self.appended

    def probe(self) -> bool:
        """After an append was refused (a full disk): whether the journal can be
        written again, tried without appending anything -- the cut back that
        failed, if one did, then a file of the refused record's size written
        (and synced, with ``fsync``) beside the segments and removed. When that
        works the episode ends (``disk.recovered``) and the next append goes
        ahead; nothing is ever half written. A failed sync is left to the
        flusher, which retries it itself."""
        with self._lock:
            failure = self.failure
            if self._closed or self.sync_failure is not None:
                return False
            if failure is None:
                return True
            if self._cut_to is not None:
                try:
                    self._cut_back(self._cut_to)
                except DiskFull:
                    return False
            size = max(self._refused_bytes, 1)
        path = self.directory / PROBE_NAME
        try:
            fd = fsio.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                framing.write_all(fd, bytes(size))
                if self.durability == "fsync":
                    fsio.fdatasync(fd)
            finally:
                fsio.close(fd)
        except OSError:
            return False
        finally:
            try:
                fsio.remove(path)
            except OSError:
                pass
        with self._lock:
            if self.failure is not failure:  # an append since: it worked (None) or failed anew
                return self.failure is None
            self.failure = None
            if self.disk is not None:
                self.disk.recovered("journal")
            return True

    def _cut_back(self, offset: int) -> None:
        """Truncate the active segment to ``offset`` (the end of its last whole
        record), after a write that may have left part of a record behind."""
        try:
            fsio.ftruncate(self._fd, offset)
        except OSError as exc:
            self._cut_to = offset  # every append is refused until the cut succeeds
            raise DiskFull.from_os("journal", "a partly written journal record could not be cut off",
                                   self._segments[-1].path, exc) from None
        self._cut_to = None

    def _rotate(self) -> None:
        old, path = self._fd, self._segments[-1].path
        self._fd = self._create(self.appended + 1)
        if self._flusher is not None:
            self._retired.append(old)  # the flusher syncs it, then closes it
        else:
            fsio.close(old)
            self._written.append(path)  # synced by the next sync()

    def oldest(self) -> int | None:
        """Position of the oldest record the journal still holds (None: none)."""
        with self._lock:
            return next((s.first for s in self._segments if s.records), None)

    # ------------------------------------------------------------------ durability

    def durable(self) -> int:
        """The last position durable under the chosen mode."""
        return self._synced if self._flusher is not None else self.appended

    def wait_durable(self, pos: int, timeout: float) -> bool:
        """Wait until ``pos`` is durable (at most ``timeout`` s); whether it is."""
        if self.durable() >= pos:
            return True
        with self._cond:
            self._waiters += 1
            self._cond.notify_all()  # (a flusher between two rounds starts the next now)
            try:
                return self._cond.wait_for(lambda: self.durable() >= pos or self._done or
                                           self.sync_failure is not None, timeout) and self.durable() >= pos
            finally:
                self._waiters -= 1

    def sync(self, timeout: float = 30.0) -> int:
        """Make every record appended so far durable, whatever the mode, and
        return the last one's position: with ``fsync`` the flusher's next round,
        waited for; with ``write`` an fdatasync of the segments written since the
        last call, and of the directory. A snapshot is published only after this
        (server/durability/checkpoints.py): one that counted records a power cut
        can take from the journal would be past the journal's end, and the
        senders, told by ``#resume`` where the journal ends, would send those
        events again. Raises OSError when they cannot be made durable."""
        with self._lock:
            target = self.appended
            if self._flusher is None:
                paths, self._written = self._written + [self._segments[-1].path], []
                dirty, self._dir_dirty = self._dir_dirty, False
        if self._flusher is not None:
            if not self.wait_durable(target, timeout):
                raise OSError(f"the journal could not be made durable up to record {target} "
                              f"({self.sync_failure or 'the sync took too long'})")
            return target
        try:
            for path in paths:
                try:
                    fd = fsio.open(path, os.O_RDONLY)
                except FileNotFoundError:  # deleted meanwhile (truncate_before)
                    continue
                try:
                    fsio.fdatasync(fd)
                finally:
                    fsio.close(fd)
            if dirty:
                self._fsync_dir()
        except OSError:
            with self._lock:  # tried again by the next call
                self._written[:0] = paths[:-1]
                self._dir_dirty = self._dir_dirty or dirty
            raise
        return target

    def _flush_loop(self) -> None:
        began = -math.inf  # when the last round began (monotonic)
        while True:
            with self._cond:
                while not self._closed and self.appended == self._synced and not self._retired:
                    self._flusher_idle = True
                    self._cond.wait()
                self._flusher_idle = False
                pause = began + self.sync_interval - time.monotonic()
                if pause > 0 and not self._waiters:  # what comes meanwhile joins the round
                    self._cond.wait_for(lambda: self._closed or self._waiters, pause)
                if self._closed:
                    return
                target, fd, retired, dirty = self.appended, self._fd, self._retired, self._dir_dirty
                self._retired, self._dir_dirty = [], False
            began = time.monotonic()
            try:
                self._sync(target, fd, retired, dirty)
            except OSError as exc:
                self._sync_failed(exc, retired, dirty)
                continue
            if self.sync_failure is not None:
                with self._cond:
                    self.sync_failure = None
                if self.disk is not None and self.failure is None:
                    self.disk.recovered("journal")

    def _sync_failed(self, exc: OSError, retired: list[int], dirty: bool) -> None:
        """A sync round failed: nothing more is durable; appends are refused
        and the sync is tried again after RETRY_SECONDS (or at close)."""
        failure = DiskFull.from_os("journal", "the journal could not be synced", self.directory, exc)
        if self.disk is not None:
            self.disk.failed(failure)
        with self._cond:
            self.sync_failure = failure
            self._retired[:0] = retired  # those not synced and closed yet
            self._dir_dirty = self._dir_dirty or dirty
            self._cond.notify_all()  # waiters for durability give up
            self._cond.wait_for(lambda: self._closed, RETRY_SECONDS)

    def _sync(self, target: int, fd: int, retired: list[int], dirty: bool) -> None:
        start = time.perf_counter()
        while retired:  # what is left of it when one fails is tried again
            fsio.fdatasync(retired[0])
            fsio.close(retired.pop(0))
        fsio.fdatasync(fd)
        if dirty:
            self._fsync_dir()
        took = time.perf_counter() - start
        with self._cond:
            self._synced = max(self._synced, target)
            self.syncs += 1
            self.sync_seconds += took
            self.sync_buckets[bisect_left(SYNC_BUCKETS, took)] += 1
            self._cond.notify_all()

    def _fsync_dir(self) -> None:
        framing.fsync_dir(self.directory)

    # ------------------------------------------------------------------ reading, trimming, closing

    def replay(self, after: int, upto: int | None = None) -> Iterator[JournalRecord]:
        """Each record with a position above ``after`` (and up to ``upto``), in
        order: those appended before the call. Safe while appends go on (only
        the bytes of whole records known at the call are read); a segment
        deleted meanwhile (retention, a full disk) raises FileNotFoundError
        unless a :meth:`pin` keeps it."""
        with self._lock:
            segs = [(s.first, s.path, s.records, s.size, s.start) for s in self._segments]
        for first, path, records, size, start in segs:
            if not records or first + records - 1 <= after:
                continue
            if upto is not None and first > upto:
                return
            with open(path, "rb") as fh:
                data = fh.read(size)
            payloads = walk(data, start, size)
            next(payloads)  # the header
            for pos, payload in enumerate(payloads, first):
                if upto is not None and pos > upto:
                    return
                if pos > after:
                    sender, done, evs = _record(payload)
                    yield JournalRecord(pos, record_events(evs), sender, done)

    def truncate_before(self, pos: int) -> int:
        """Records before ``pos`` are covered by a snapshot: recovery no longer
        needs them. Their segments go now unless retention keeps them
        (:meth:`retain`); the newest segment always stays. Returns how many went."""
        with self._lock:
            self._floor = max(self._floor, pos - 1)
        return self.retain()

    # ------------------------------------------------------------------ retention and history

    def _shed_retained(self) -> None:
        """A full disk (under the lock): every segment kept only for retention
        goes, pinned or not (a history reader then fails, saying so)."""
        doomed = []
        while len(self._segments) > 1 and self._segments[1].first <= self._floor + 1:
            doomed.append(self._segments.pop(0))
        if doomed:
            self.retention_dropped += len(doomed)
            self.retention_shed += len(doomed)
            log.warning("journal %s: the disk is full: %d retained segment(s) deleted to give back space "
                        "(history before position %d is gone)", self.directory, len(doomed),
                        self._segments[0].first)
            for s in doomed:
                fsio.remove(s.path)
            if self.durability == "fsync":
                self._fsync_dir()

    @property
    def segments(self) -> list[Path]:
        with self._lock:
            return [s.path for s in self._segments]

    @property
    def retained_bytes(self) -> int:
        """Bytes of whole records the journal's segment files hold now (what a
        snapshot has not yet let it delete): its size on disk, near enough."""
        with self._lock:
            return sum(s.size for s in self._segments)

    def close(self) -> None:
        """Sync (fsync mode), stop the flusher, close the files. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            target, fd, retired, dirty = self.appended, self._fd, self._retired, self._dir_dirty
            self._retired = []
        if self._flusher is not None:
            self._flusher.join()
            try:
                self._sync(target, fd, retired, dirty)
            except OSError as exc:
                log.error("journal %s: the last sync at close failed (%s): records after position %d may not "
                          "survive a power loss (they survive a restart)", self.directory, exc, self._synced)
                for old in retired:
                    fsio.close(old)
        fsio.close(fd)
        with self._cond:
            self._done = True
            self._cond.notify_all()
