"""The witness log: every witness of every subscription's output streams, in
the order the engine produced them, on disk, so that a client can resume
where it left off (after a disconnect, a restart, or falling behind).

No sockets, no threads of its own. One writer (the engine thread) appends a
batch of records at a time; any number of readers (:class:`Cursor`, witcursor.py,
on other threads) read what is already appended, each with its own file handles.

**Records.** Witnesses ``(subscription id, seq, stream, payload)``; ``seq`` numbers the
witnesses of one subscription 1, 2, 3, ... (the daemon gives them); the payload is the
witness JSON exactly as clients get it. witrecords.py has the records: a batch of witnesses
(one encoding and one CRC per batch), or one whose payloads an engine worker wrote to a file
of its own (witside.py), told per subscription (its first seq, its count, its stream); every
segment starts with a checkpoint, the last seq of every subscription so far (the numbers
survive the deletion of old segments). Segments are framed by
:mod:`server.durability.framing` (``CAYUGA W``, version 4; older ones are read, and the
newest of them sealed when the log is opened).

**Gaps.** The log may lack witnesses that were numbered: a segment cut short or damaged
while the server was stopped. Recovery finds a cut newest segment against the snapshot,
rebuilds what the journal can give again, and marks the rest (:meth:`WitnessLog.note_gaps`,
witgaps.py); a sealed segment's cut tail shows against the next one's checkpoint when the
log is opened; :meth:`WitnessLog.gaps` lists both. A record that refers past the end of a
worker's payload file (a power cut kept the one, not the other) is cut off at opening, as a
torn tail; payloads that fail their CRC are found when read. A reader gets a :class:`Gap`
where the witnesses would be, never a silent jump or wait.

**Segments.** Files ``wit-NNNNNNNNNNNN.log`` under the log's directory, each at most
about ``segment_bytes`` (with the workers' payloads its records refer to); the newest is
appended to. A full one is sealed and gets an index beside it (``.idx``: per subscription
its first seq and offset and last seq, per stream its publishers, the payload files it
refers to, as MessagePack columns: witrecords.py's ``Segment.index_bytes``; one of the JSON
the Cayuga before wrote is read too, and a Cayuga before reads this one as no index and scans
the segment), so opening the log scans only the newest. Nothing is fsynced on the way (an
fsync of a whole segment held the engine thread for up to a second): :meth:`WitnessLog.sync`
makes everything appended so far durable, :meth:`WitnessLog.close` too. A torn or corrupt
tail (a crash in a write, a flipped byte) is found by that scan and cut off there: a record
is read only when its CRC matches.

**A full disk.** An append that cannot be written (ENOSPC, any OSError, a short write) is
cut back to the last whole record and raises :class:`~server.durability.diskfull.DiskFull`;
nothing of the batch is in the log (nor its index), and the writer tries the same batch
again later (the daemon holds it and delivers it to no one meanwhile). A new segment that
cannot be started is removed again; an index that cannot be written is skipped.

**Retention** is over the one shared log, by whole segments, oldest first: when the log
holds more than ``max_bytes`` (the workers' payloads its records refer to counted), or a
sealed segment's newest record is older than ``max_seconds`` (the file's modification time
after a restart), it is deleted, and a worker's payload file once no segment refers to it.
Each subscription's log keeps at least its witnesses of the last ``max_seconds`` or the
last ``max_bytes`` of all witnesses, whichever is less; :meth:`WitnessLog.first_seq` says
where one subscription's retained log starts now.

**Dedupe.** A record whose seq is not above the log's last seq for its
subscription is not appended again (:meth:`WitnessLog.append` returns what it
kept): after a crash the engine may re-produce witnesses the log already
holds, with the same numbers.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import msgspec
import numpy as np

from server.durability import framing, fsio
from server.durability.diskfull import DiskFull, DiskState
from server.durability.framing import FRAME, Scan
from server.durability.seqmap import Numbers, SeqMap
from server.durability.witcursor import Cursor
from server.durability.witholes import Holes
from server.durability.witrecords import (BATCH as _BATCH, BODY as _BODY, CHECKPOINT as _CHECKPOINT, GAP_MARK,
                                          MAX_RECORD, NAMES, RUNS as _RUNS, SIDE as _SIDE, Gap, Gone, Record,
                                          Segment as _Segment, Sub as _Sub, body_of as _body, dump_json as _json,
                                          encode as _encode, encode_parts as _encode_parts, load_index,
                                          pack_batch as _pack, pack_seqs, parse as _parse, runs_checked,
                                          unpack_batch as _unpack,
                                          unpack_runs as _unpack_runs, unpack_side as _unpack_side)
from server.durability.witside import SideFiles, SideReader

__all__ = ["Cursor", "Gap", "Gone", "MAX_RECORD", "NAMES", "Record", "WitnessLog"]

log = logging.getLogger("cayuga.witlog")


def _name(number: int) -> str:
    return NAMES.name(number)


class WitnessLog(Holes):
    """The append-only, segmented witness log under ``directory``.

    ``max_bytes`` and ``max_seconds`` bound what is retained (whole segments,
    oldest first; see the module's docstring); ``segment_bytes`` is the size
    at which a segment is sealed (default: an eighth of ``max_bytes``, between
    4 KiB and 64 MiB); ``clock`` gives the time (seconds) for age retention."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = 1 << 30, max_seconds: float = 86_400.0,
                 segment_bytes: int | None = None, clock: Callable[[], float] = time.time,
                 disk: DiskState | None = None) -> None:
        self.dir = Path(directory)
        fsio.makedirs(self.dir)
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.segment_bytes = segment_bytes or max(4096, min(max_bytes // 8, 64 << 20))
        self.clock = clock
        self.disk = disk
        self.failure: DiskFull | None = None  # the write failure that lasts (None: the last append worked)
        self.write_failures = 0
        self._cut_to: int | None = None  # a cut back that failed: the offset the active segment must go back to
        self._lock = threading.Lock()  # guards the index (segments, their sizes and maps, _last)
        self._segments: list[_Segment] = []
        self.numbers, self.stream_numbers = Numbers(), Numbers()  # subscriptions' and streams' (seqmap.py)
        self._last = SeqMap(self.numbers)  # per subscription: the last seq appended
        self._enc: dict[str, bytes] = {}  # sid and stream names, UTF-8
        self._fd: int | None = None
        self._retain_at = 0.0
        self._unsynced: list[Path] = []  # sealed segments not fsynced yet (see sync)
        self.side = SideFiles(self.dir)  # the engine workers' payload files the records refer to (witside.py)
        self._dir_dirty = False
        # metrics: appended and deduplicated since open; dropped: records deleted by retention
        self.appended = 0
        self.deduplicated = 0
        self.dropped = 0
        self.truncated = 0  # bytes of torn or corrupt tails cut off when opening
        #: per subscription, (first, last) of the witnesses missing between two segments, found when opening:
        #: a segment whose tail was cut, which the next segment's checkpoint numbers past (see gaps())
        self._holes: dict[str, list[tuple[int, int]]] = {}
        self._lost_before: list[tuple[int, str, int]] = []  # each hole: (the segment after it, sid, its first)
        self._open()

    # ------------------------------------------------------------------ opening

    def _open(self) -> None:
        numbers = [n for n, _ in NAMES.listing(self.dir)]
        for p in self.dir.glob("wit-*.idx"):  # indexes of segments deleted before their index
            if not p.with_suffix(".log").exists():
                fsio.remove(p)
        sizes = self.side.sizes()  # (a record that refers past a payload file's end is cut off, as torn)
        for number in numbers:
            seg = _Segment(number, self.dir / _name(number))
            if not self._load_index(seg, sizes):
                seg = _Segment(number, self.dir / _name(number))
                self._scan(seg, sizes)
            seg.newest = seg.path.stat().st_mtime
            self._segments.append(seg)
        last = self._segments[-1] if self._segments else None
        if last is not None and not last.sealed and last.size <= last.start:  # nothing but a file header, if that
            self._segments.pop()
            fsio.unlink(last.path)
            fsio.remove(last.index_path)
        elif (last is not None and not last.sealed
              and framing.file_version(last.path) < framing.VERSIONS[framing.WITNESS_LOG]):  # an older framing:
            self._seal()  # a new one (a reader of it would take a kind 4 record for a torn tail), synced by sync()
            self._unsynced.append(last.path)
        self.side.drop_orphans({name for seg in self._segments for name in seg.side})  # (never logged)
        self._find_holes()
        self._link_gaps()
        if self._segments and not self._segments[-1].sealed:
            self._fd = framing.open_segment(self._segments[-1].path)
        else:
            self._new_segment()

    def _load_index(self, seg: _Segment, sizes: dict[str, int]) -> bool:
        try:
            data = load_index(seg.index_path.read_bytes())
            if data["size"] != seg.path.stat().st_size:
                return False
            seg.take_index(data)
            if seg.refers_past(sizes):
                return False
            for s, v in seg.subs.items():
                if v.last_seq > self._last.get(s, 0):
                    self._last[s] = v.last_seq
            if not self._segments:  # the oldest: its checkpoint holds the seqs of deleted segments
                self._merge_checkpoint(self._checkpoint_of(seg))
            seg.sealed = True
            return True
        except (OSError, ValueError, KeyError, TypeError, IndexError):  # (not an index: the segment is scanned)
            return False

    def _checkpoint_of(self, seg: _Segment) -> dict[str, int]:
        """The checkpoint a segment starts with: the last seq of every subscription before it."""
        with open(seg.path, "rb") as f:
            head = f.read(framing.HEADER.size + FRAME.size)
            seg.start = start = framing.file_kind(head, framing.WITNESS_LOG, str(seg.path))
            if len(head) < start + FRAME.size:
                return {}
            f.seek(start)
            buf = f.read(FRAME.size + FRAME.unpack_from(head, start)[0])
        rec = _parse(buf, 0, len(buf))
        if rec is None or rec[0] != _CHECKPOINT or rec[1] == GAP_MARK:
            return {}
        return json.loads(bytes(rec[4]))

    def _merge_checkpoint(self, last: dict[str, int]) -> None:
        for s, v in last.items():
            if v > self._last.get(s, 0):
                self._last[s] = v

    def _mark(self, seg: _Segment, marks: dict[str, int], off: int) -> dict[str, tuple[int, int]]:
        """Take a gap mark (at ``off`` in ``seg``) into the index: each
        subscription it names was numbered on to its seq; returns the gaps, (first, last)."""
        found = {}
        for s, last in marks.items():
            before = self._last.get(s, 0)
            if not isinstance(last, int) or last <= before:
                continue
            found[s] = (before + 1, last)
            seg.gaps.setdefault(s, []).append(found[s])
            sub = seg.subs.get(s)
            if sub is None:
                seg.subs[s] = _Sub(before + 1, off, last)
            else:
                sub.last_seq = last
            self._last[s] = last
        return found

    def _scan(self, seg: _Segment, sizes: dict[str, int]) -> None:
        """Index a segment by reading it; cut off a torn or corrupt tail."""
        data = seg.path.read_bytes()
        seg.start = framing.file_kind(data, framing.WITNESS_LOG, str(seg.path))
        end = len(data)
        scan = Scan(data, seg.start, min_length=_BODY.size, max_length=MAX_RECORD)
        pos = seg.start
        for pos, body in scan:
            rec = _body(body)
            if rec is None:
                break
            kind, seq, sid, stream, payload = rec
            if kind == _CHECKPOINT:
                try:
                    if seq == GAP_MARK:
                        self._mark(seg, json.loads(bytes(payload)), pos)
                    else:
                        self._merge_checkpoint(json.loads(bytes(payload)))
                except (ValueError, AttributeError, TypeError):
                    break
            elif kind == _BATCH or kind == _SIDE or kind == _RUNS:
                try:
                    if kind == _RUNS:
                        runs = _unpack_runs(payload)
                        runs_checked(runs)
                        payloads = runs[4]
                    else:
                        sids, seqs, streams, payloads = (_unpack if kind == _BATCH else _unpack_side)(payload)
                except (msgspec.DecodeError, ValueError):
                    break
                if kind != _BATCH:
                    name, off, length = payloads
                    if off + length > sizes.get(name, 0):
                        break  # what it refers to was lost with its file's end: cut off, as a torn tail
                    seg.refer(name, off, length)
                if kind == _RUNS:
                    self._index_runs(seg, runs, pos)
                    continue
                for esid, eseq, estream in zip(sids, seqs, streams):
                    self._index(seg, esid, eseq, estream, pos)
            else:
                self._index(seg, sid, seq, stream, pos)
        else:
            pos = scan.good
        if pos < end:
            log.warning("witness log %s: %d bytes of a torn or corrupt tail cut off at offset %d",
                        seg.path.name, end - pos, pos)
            self.truncated += end - pos
            framing.cut_tail(seg.path, pos)
        seg.size = pos

    def _index_runs(self, seg: _Segment, runs: tuple, off: int) -> None:
        """:meth:`_index` of a kind 4 record's witnesses (``runs``: its columns, checked), a
        subscription at a time (a record holds thousands, each a run of witnesses)."""
        owners, firsts, counts, kinds, _ref = runs
        subs, streams, known = seg.subs, seg.streams, self._last
        for sid, first, n, kind in zip(owners, firsts, counts, kinds):
            last = first + n - 1
            sub = subs.get(sid)
            if sub is None:
                subs[sid] = _Sub(first, off, last)
            else:
                sub.last_seq = last
            if last > known.get(sid, 0):
                known[sid] = last
            for stream in ((kind,) if type(kind) is str else set(kind)):
                pubs = streams.get(stream)
                if pubs is None:
                    streams[stream] = {sid}
                else:
                    pubs.add(sid)
        seg.records += sum(counts)

    def _index(self, seg: _Segment, sid: str, seq: int, stream: str, off: int) -> None:
        sub = seg.subs.get(sid)
        if sub is None:
            seg.subs[sid] = _Sub(seq, off, seq)
            seg.streams.setdefault(stream, set()).add(sid)
        else:
            sub.last_seq = seq
            pubs = seg.streams.get(stream)
            if pubs is None:
                seg.streams[stream] = {sid}
            elif sid not in pubs:
                pubs.add(sid)
        seg.records += 1
        if seq > self._last.get(sid, 0):
            self._last[sid] = seq

    def _new_segment(self) -> None:
        number = self._segments[-1].number + 1 if self._segments else 1
        seg = _Segment(number, self.dir / _name(number), newest=self.clock())
        checkpoint = _BODY.pack(_CHECKPOINT, 0, 0, 0) + _json(self._last.copy())
        fd = framing.open_new(seg.path)
        # one that cannot be written is removed: the next append starts it again
        seg.size = framing.start_segment(fd, seg.path, framing.WITNESS_LOG, checkpoint)
        with self._lock:
            self._segments.append(seg)
            self._dir_dirty = True
        self._fd = fd

    def _seal(self) -> None:
        """Close the active segment for writing and write its index."""
        seg = self._segments[-1]
        if self._fd is not None:
            fsio.close(self._fd)  # fsynced by sync(): an fsync of a whole segment here held the engine thread
            with self._lock:
                self._fd = None
                self._unsynced.append(seg.path)
        tmp = seg.index_path.with_suffix(".tmp")
        seg.seal()
        try:
            fsio.write_file(tmp, seg.index_bytes())
            fsio.replace(tmp, seg.index_path)
        except (OSError, ValueError, KeyError) as exc:  # an index only saves a scan when the log is opened
            fsio.remove(tmp)
            log.warning("witness log %s: its index could not be written (%s); it will be scanned when opened",
                        seg.path.name, exc)

    # ------------------------------------------------------------------ writing (one thread)

    def append(self, records: Sequence[Record]) -> Sequence[Record]:
        """Append ``records`` (sid, seq, stream, payload) in one write; returns
        those appended: ``records`` itself, or a list without the ones whose
        seq is not above the log's last seq for their subscription."""
        if not records:
            return records
        sids, seqs, streams, payloads = (list(c) for c in zip(*records))
        dropped = self.append_columns(sids, seqs, streams, payloads)
        gone = set(dropped)
        return [r for i, r in enumerate(records) if i not in gone] if gone else records

    def append_columns(self, sids: list[str], seqs: list[int], streams: list[str],
                       payloads: list[bytes]) -> list[int]:
        """:meth:`append` for a batch given as four parallel lists (what the
        engine thread keeps: no object per witness for the garbage collector
        to walk); returns the indexes of the witnesses not appended (their
        seq is not above the log's last seq for their subscription)."""
        last = self._last
        dropped: list[int] = []
        if not sids:
            return dropped
        lasts = dict(zip(sids, seqs))
        firsts = dict(zip(reversed(sids), reversed(seqs))) if len(lasts) > 1 else {sids[0]: seqs[0]}
        nums = self.numbers.array(list(lasts))
        if self.holds_any(nums, np.array(list(map(firsts.__getitem__, lasts)))):  # re-produced: keep only what is new
            dropped = [j for j, (a, n) in enumerate(zip(sids, seqs)) if n <= last.get(a, 0)]
            gone = set(dropped)
            idx = [j for j in range(len(sids)) if j not in gone]
            sids, seqs = [sids[j] for j in idx], [seqs[j] for j in idx]
            streams, payloads = [streams[j] for j in idx], [payloads[j] for j in idx]
            self.deduplicated += len(dropped)
            if not sids:
                return dropped
            lasts = dict(zip(sids, seqs))
            firsts = dict(zip(reversed(sids), reversed(seqs)))
            nums = self.numbers.array(list(lasts))
        # (the seqs packed as an engine worker's batch has them: the same record, byte for byte)
        rec = _encode_parts(_BATCH, len(sids), (b"\x94", _pack(sids), pack_seqs(np.array(seqs, np.int64)),
                                                _pack(streams), _pack(payloads)))
        self._write(rec, len(sids), nums, np.array(list(map(firsts.__getitem__, lasts))),
                    np.array(list(lasts.values())), self.numbers.array(sids), self.stream_numbers.array(streams))
        return dropped

    def holds_any(self, nums: np.ndarray, firsts: np.ndarray) -> bool:
        """Whether the log holds a seq at least ``firsts[i]`` of any subscription ``nums[i]``
        (:attr:`numbers`: a batch made again)."""
        return bool((self._last.take(nums) >= firsts).any())

    def append_packed(self, body: Sequence[bytes | memoryview], n: int, nums: np.ndarray, firsts: np.ndarray,
                      lasts: np.ndarray, pair_nums: np.ndarray, pair_streams: np.ndarray, side=None,
                      kind: int | None = None) -> None:
        """Append a batch record whose ``body`` an engine worker packed (:meth:`append_columns`'s
        columns of ``n`` witnesses, none held already: :meth:`holds_any`; the parts of the body,
        joined once, into the record), with what the index
        needs: per subscription (numbered ``nums`` by :attr:`numbers`, each once) its first and
        last seq, and which subscriptions published on which streams (``pair_nums[i]`` on the
        stream :attr:`stream_numbers` numbers ``pair_streams[i]``; each pair once or more). ``side``:
        the body's last part is where the worker wrote the payloads (witside.py's ``Ref``): by
        default a kind 4 record (witrecords.py: the body told per subscription), ``kind`` 3 where
        the body is a witness's entry each (as the Cayuga before wrote them)."""
        if kind is None:
            kind = _BATCH if side is None else _RUNS
        self._write(_encode_parts(kind, n, body), n, nums, firsts, lasts, pair_nums, pair_streams, side)

    def _write(self, rec: bytes, n_kept: int, nums: np.ndarray, firsts: np.ndarray, lasts: np.ndarray,
               pair_nums: np.ndarray, pair_streams: np.ndarray, side=None) -> None:  # (DiskFull: not written)
        seg = self._segments[-1]
        try:
            if self._cut_to is not None:
                self._cut_back(self._cut_to)
            if seg.sealed or self._fd is None:  # a new segment that could not be started before
                self._new_segment()
            elif seg.records and seg.weight >= self.segment_bytes:
                self._roll()
            seg = self._segments[-1]
            off = seg.size
            try:
                framing.write_all(self._fd, rec)
            except OSError:
                self._cut_back(off)
                raise
        except OSError as exc:
            failure = self.failure = DiskFull.from_os("witness_log", "the witness log could not be written",
                                                      seg.path, exc)
            self.write_failures += 1
            if self.disk is not None:
                self.disk.failed(failure)
            raise failure from None
        if self.failure is not None:
            self.failure = None
            if self.disk is not None:
                self.disk.recovered("witness_log")
        now = self.clock()
        with self._lock:
            seg.take_batch(off, len(rec), n_kept, (self.numbers, self.stream_numbers), nums, firsts, lasts,
                           pair_nums, pair_streams, now)
            self._last.put(nums, lasts)  # (every seq written is above the log's last for its subscription)
            if side is not None:
                seg.refer(*side)
                self._dir_dirty |= self.side.referred(side[0])  # (a file the worker created: its entry synced)
        self.appended += n_kept
        if seg.weight >= self.segment_bytes or now >= self._retain_at:
            try:
                self.retain(now)
            except OSError as exc:  # the batch is in: the next append starts the segment (or fails itself)
                log.debug("witness log retention: %s", exc)

    def note_gaps(self, marks: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Write a gap mark: each subscription of ``marks`` was numbered on to
        its seq there, though the log lacks the witnesses after its last one
        (recovery found them lost: server/durability/witgaps.py). Readers get a
        :class:`Gap` in their place, :meth:`gaps` lists them, and numbering goes
        on after the mark. Returns the gaps, (first, last) per subscription
        (those already numbered past are left out). From the writer's thread;
        raises :class:`DiskFull` as :meth:`append_columns` does."""
        marks = {s: v for s, v in marks.items() if v > self._last.get(s, 0)}
        if not marks:
            return {}
        rec = _encode(_CHECKPOINT, GAP_MARK, b"", b"", _json(marks))
        seg = self._segments[-1]
        try:
            if self._cut_to is not None:
                self._cut_back(self._cut_to)
            if seg.sealed or self._fd is None:
                self._new_segment()
            seg = self._segments[-1]
            off = seg.size
            try:
                framing.write_all(self._fd, rec)
            except OSError:
                self._cut_back(off)
                raise
        except OSError as exc:
            failure = DiskFull.from_os("witness_log", "the witness log could not be written", seg.path, exc)
            if self.disk is not None:
                self.disk.failed(failure)
            raise failure from None
        streams_of: dict[str, set[str]] = {}
        with self._lock:
            for old in self._segments:
                for stream, sids in old.streams.items():
                    for s in sids:
                        if s in marks:
                            streams_of.setdefault(s, set()).add(stream)
            found = self._mark(seg, marks, off)
            for s in found:
                for stream in streams_of.get(s, ()):
                    seg.streams.setdefault(stream, set()).add(s)
            seg.size = off + len(rec)
        return found

    def _cut_back(self, offset: int) -> None:
        """Truncate the active segment to ``offset`` (its last whole record)."""
        try:
            fsio.ftruncate(self._fd, offset)
        except OSError:
            self._cut_to = offset  # appends are refused until the cut succeeds
            raise
        self._cut_to = None

    def _roll(self) -> None:
        self._seal()
        self._new_segment()

    def retain(self, now: float | None = None) -> int:
        """Delete whole segments, oldest first, beyond ``max_bytes`` or older
        than ``max_seconds`` (the active one is sealed first when it is full
        or too old); returns the witness records deleted. Called by
        :meth:`append` at most once a second of ``clock`` (and when a segment
        fills); callable any time from the writer's thread."""
        now = self.clock() if now is None else now
        self._retain_at = now + 1.0
        active = self._segments[-1]
        if active.records and (active.weight >= self.segment_bytes or active.newest < now - self.max_seconds):
            self._roll()
        dropped = 0
        while len(self._segments) > 1:
            oldest = self._segments[0]
            total = sum(s.weight for s in self._segments)
            if total <= self.max_bytes and oldest.newest >= now - self.max_seconds:
                break
            with self._lock:
                self._segments.pop(0)
                self._dir_dirty = True
            dropped += oldest.records
            fsio.remove(oldest.path)
            fsio.remove(oldest.index_path)
            if oldest.side:
                self.side.drop(oldest.side, {name for seg in self._segments for name in seg.side})
        if dropped:
            self.dropped += dropped
        return dropped

    def sync(self) -> None:
        """Make what was appended durable: fsync the segments sealed since the
        last call, the active one, and the directory (new or deleted files).
        From any thread (a snapshot's, before it is published): what to sync is
        taken under the lock and synced through descriptors of its own, so a
        segment sealed meanwhile is never missed (tests/server/test_powercut.py)."""
        with self._lock:  # a worker's payloads first: a record never outlives what it refers to
            paths = self.side.take_unsynced() + self._unsynced
            paths += [s.path for s in self._segments[-1:] if s.path not in self._unsynced]
            self._unsynced, dirty, self._dir_dirty = [], self._dir_dirty, False
        try:
            for path in paths:
                try:
                    fd = fsio.open(path, os.O_RDONLY)
                except FileNotFoundError:  # deleted by retention meanwhile
                    continue
                try:
                    fsio.fsync(fd)
                finally:
                    fsio.close(fd)
            if dirty:
                framing.fsync_dir(self.dir)
        except OSError:
            with self._lock:  # tried again by the next call
                self._unsynced[:0] = [p for p in paths if NAMES.number(p.name) is not None]
                self.side.put_back(paths)
                self._dir_dirty = self._dir_dirty or dirty
            raise

    def close(self) -> None:
        """Sync, and close for writing (cursors still read what they have)."""
        self.sync()
        if self._fd is not None:
            fsio.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ reading (any thread)

    def last_seq(self, sid: str) -> int:
        """The last seq appended for ``sid`` (0: none)."""
        return self._last.get(sid, 0)

    def last_seqs(self) -> dict[str, int]:
        """A copy of the last seq of every subscription the log has seen."""
        with self._lock:
            return self._last.copy()

    def first_seq(self, sid: str) -> int:
        """The first seq of ``sid`` still retained; ``last_seq(sid) + 1`` when
        none is (everything before it was deleted, or there was nothing)."""
        with self._lock:
            for seg in self._segments:
                sub = seg.subs.get(sid)
                if sub is not None:
                    return sub.first_seq
            return self._last.get(sid, 0) + 1

    def numbered_past(self, sid: str) -> tuple[int, int]:
        """``sid``'s last seq in the retained segments and its last seq numbered, read together."""
        with self._lock:
            held = max((seg.subs[sid].last_seq for seg in self._segments if sid in seg.subs), default=0)
            return held, self._last.get(sid, 0)

    def publishers(self, stream: str) -> set[str]:
        """The subscriptions that have published ``stream`` in the retained log."""
        with self._lock:
            return {s for seg in self._segments for s in seg.streams.get(stream, ())}

    def streams_of(self, sid: str) -> set[str]:
        """The streams ``sid`` has published on in the retained log."""
        with self._lock:
            return {st for seg in self._segments for st, sids in seg.streams.items() if sid in sids}

    def gaps(self) -> dict[str, list[tuple[int, int]]]:
        """Per subscription, (first, last) of each run of witnesses the retained
        log lacks though they were numbered (readers get a :class:`Gap` there):
        gap marks, and holes between segments found when the log was opened."""
        out: dict[str, list[tuple[int, int]]] = {}
        with self._lock:
            for seg in self._segments:
                for s, runs in seg.gaps.items():
                    out.setdefault(s, []).extend(runs)
        for s, runs in self._holes.items():
            out.setdefault(s, []).extend(runs)
        kept = {s: sorted({g for g in runs if g[1] >= first}) for s, runs in out.items()
                for first in (self.first_seq(s),)}
        return {s: runs for s, runs in kept.items() if runs}

    def stream_last(self, stream: str) -> dict[str, int]:
        """The last seq of each subscription that has published ``stream`` in the retained log."""
        return {s: self._last.get(s, 0) for s in self.publishers(stream)}

    def caught_up(self, after: dict[str, int], sid: str | None = None, stream: str | None = None) -> bool:
        """Whether ``after`` (a reader's last seq per subscription) holds all the log has of ``sid`` or ``stream``."""
        if sid is not None:
            return self._last.get(sid, 0) <= after.get(sid, 0)
        return all(v <= after.get(s, 0) for s, v in self.stream_last(stream).items())

    def side_reader(self) -> "SideReader":
        """A reader of the engine workers' payload files (witside.py) that lets go of each one
        this log deletes (one per thread)."""
        return self.side.reader()

    def cursor(self, sid: str | None = None, stream: str | None = None,
               after: dict[str, int] | None = None) -> "Cursor":
        """A reader of ``sid``'s records or of every one on ``stream``, above ``after[sid]`` (0 when
        absent); :class:`Gone` when one of them is no longer retained."""
        return Cursor(self, sid, stream, dict(after or {}))

    def read(self, sid: str, from_seq: int = 1) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of ``sid`` from ``from_seq`` to what is appended now."""
        cur = self.cursor(sid=sid, after={sid: from_seq - 1})
        try:
            while batch := cur.read():
                yield from ((seq, p) for _, seq, p in batch if type(p) is not Gap)
        finally:
            cur.close()

    def read_stream(self, stream: str, after: dict[str, int] | None = None) -> Iterator[tuple[str, int, bytes]]:
        """(sid, seq, payload) of every record on ``stream`` above ``after``."""
        cur = self.cursor(stream=stream, after=after)
        try:
            while batch := cur.read():
                yield from (r for r in batch if type(r[2]) is not Gap)
        finally:
            cur.close()

    def segments_copy(self) -> list[tuple[_Segment, int]]:
        """Each retained segment and the bytes of it a reader may read now (for :class:`Cursor`)."""
        with self._lock:
            return [(s, s.size) for s in self._segments]

    @property
    def segments(self) -> int:
        return len(self._segments)

    @property
    def records(self) -> int:
        """Witness records retained."""
        return sum(s.records for s in self._segments)

    @property
    def bytes(self) -> int:
        """Bytes retained (with the workers' payloads the records refer to)."""
        return sum(s.weight for s in self._segments)
