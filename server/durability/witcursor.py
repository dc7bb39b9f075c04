"""Reading the witness log (witlog.py) from another thread than its writer.

A :class:`Cursor` reads one subscription's witnesses, or every witness on one
stream, in log order, from where its reader is. What it cannot hand on it says:
retention deleted what it still had to read (:class:`Gone`, raised), or the log
does not hold witnesses that were numbered (a :class:`Gap`, handed on in place
of the witnesses: a gap mark recovery wrote, or a jump in a subscription's
numbers, which appending never makes: a cut or damaged segment).
"""

from __future__ import annotations

import json
import logging
from typing import Iterable

import msgspec

from server.durability.framing import FRAME, BadRecord
from server.durability.witrecords import (BATCH, CHECKPOINT, GAP_MARK, RUNS, SIDE, WITNESS, Gap, Gone, parse,
                                          runs_columns, unpack_batch, unpack_runs, unpack_side)
from server.durability.witside import SideReader

log = logging.getLogger("cayuga.witlog")
#: the kinds of record that hold a batch of witnesses (witrecords.py)
_BATCHES = (BATCH, SIDE, RUNS)


class Cursor:
    """Reads a subscription's (or a stream's) records, in log order, from
    another thread than the writer; :meth:`read` returns the next ones, an
    empty list at the end of what is appended so far, and may be called again
    later for what comes after. Holds one segment file open at a time (a
    segment deleted meanwhile is still read to its end). ``wlog`` is the
    :class:`~server.durability.witlog.WitnessLog`."""

    def __init__(self, wlog, sid: str | None, stream: str | None, after: dict[str, int]) -> None:
        if (sid is None) == (stream is None):
            raise ValueError("a cursor reads one subscription or one stream")
        self.log, self.sid, self.stream = wlog, sid, stream
        self.after = after  # last seq read per subscription
        self.gaps = 0  # gaps handed on so far (a reader may look for them only when this grew)
        self._seg = None
        self._file = None
        self._pos = 0
        #: the number of the last segment read to its end: the log is read in order, and a stream's
        #: reader cannot tell from the index that it has read a segment (a subscription's last seq
        #: there may be on another stream: it went back to it again and again, and never on)
        self._past: int | None = None
        self._elsewhere: set[str] = set()  # subscriptions seen publishing on other streams than this one's
        self._side: SideReader | None = None  # the engine workers' payload files (witside.py), once one is read
        #: the name read, as bytes: a batch's record without them holds none of its witnesses, and is
        #: passed over without being unpacked (thousands of subscriptions' witnesses a record)
        self._needle = (sid if sid is not None else stream).encode()
        self._check_retained(after.keys() if stream is not None else [sid])

    def _check_retained(self, sids) -> None:
        for s in sids:
            want = self.after.get(s, 0) + 1
            if want <= self.log.last_seq(s):
                first = self.log.first_seq(s)
                if want < first:
                    raise Gone(s, want, first)

    def _wanted(self, seg) -> int | None:
        """The offset in ``seg`` to start reading at, or None when it holds nothing wanted."""
        after = self.after
        if self.sid is not None:
            sub = seg.subs.get(self.sid)
            if sub is None or sub.last_seq <= after.get(self.sid, 0):
                return None
            return sub.first_off
        offs = [seg.subs[s].first_off for s in seg.streams.get(self.stream, ())
                if seg.subs[s].last_seq > after.get(s, 0)]
        return min(offs) if offs else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._side is not None:
            self._side.close()
            self._side = None

    def _gap(self, out: list, sid: str, first: int, last: int) -> None:
        out.append((sid, last, Gap(first, last)))
        self.after[sid] = last
        self.gaps += 1

    def _marked(self, out: list, payload) -> None:
        """A gap mark: the subscriptions it names (this cursor's) were numbered
        on to its seqs without the witnesses between being in the log."""
        try:
            marks = json.loads(bytes(payload))
        except ValueError:
            return
        wlog, after = self.log, self.after
        mine = ({self.sid} if self.sid is not None else wlog.publishers(self.stream))
        for s, last in marks.items():
            if s not in mine or not isinstance(last, int):
                continue
            known = after.get(s, 0)
            if last <= known:
                continue
            first = known + 1 if s in after else max(known + 1, wlog.first_seq(s))
            if first <= last:
                self._gap(out, s, first, last)

    def read(self, max_records: int = 2000, max_bytes: int = 1 << 20) -> list[tuple[str, int, bytes | Gap]]:
        """The next records, (sid, seq, payload), at most about ``max_records``
        or ``max_bytes``; [] when there is nothing more yet. Where the log lacks
        witnesses that were numbered, ``(sid, last, Gap(first, last))`` stands
        in their place (and :attr:`gaps` grows). Raises :class:`Gone` when
        retention deleted records it still had to read."""
        out: list = []
        size = 0
        after, sid, stream, wlog = self.after, self.sid, self.stream, self.log
        while len(out) < max_records and size < max_bytes:
            segs = wlog.segments_copy()
            if self._seg is None:
                for seg, _ in segs:
                    if self._past is not None and seg.number <= self._past:
                        continue
                    start = self._wanted(seg)
                    if start is not None and self._enter(seg, start):
                        break
                else:
                    self._check_retained(list(after) if stream is not None else [sid])
                    if sid is not None:  # numbered past the last witness the log holds (a cut segment's tail)
                        held, last = wlog.numbered_past(sid)
                        known = after.get(sid, 0)
                        if held <= known < last:
                            self._gap(out, sid, known + 1, last)
                    return out
            seg, pos = self._seg, self._pos
            end = next((n for s, n in segs if s is seg), seg.size)  # a deleted segment: read it to its end
            if pos >= end:
                if seg is segs[-1][0]:
                    return out  # at the end of the active segment: nothing more yet
                self.close()
                self._seg, self._past = None, seg.number
                self._check_retained(list(after) if stream is not None else [sid])
                continue
            f = self._file
            f.seek(pos)
            buf = f.read(min(end - pos, max(max_bytes - size, 1 << 16)))
            if len(buf) >= FRAME.size:  # a first record longer than that: read it whole
                need = FRAME.size + FRAME.unpack_from(buf, 0)[0]
                if len(buf) < need <= end - pos:
                    buf += f.read(need - len(buf))
            view, p, n = memoryview(buf), 0, len(buf)
            while p < n and len(out) < max_records:
                rec = parse(view, p, n)
                if rec is None:
                    if p == 0:
                        raise OSError(f"witness log {seg.path.name}: unreadable record at offset {pos}")
                    break
                kind, seq, rsid, rstream, payload, p = rec
                if kind in _BATCHES and buf.find(self._needle, p - len(payload), p) < 0:
                    continue  # (not one of its witnesses in it)
                if kind == BATCH:
                    entries = self._mine(unpack_batch(payload))
                elif kind == RUNS:
                    entries = self._runs_entries(unpack_runs(payload), seg)
                elif kind == SIDE:
                    entries = self._side_entries(unpack_side(payload), seg)
                elif kind == WITNESS:
                    entries = ((rsid, seq, rstream, bytes(payload)),)
                else:
                    if kind == CHECKPOINT and seq == GAP_MARK:
                        self._marked(out, payload)
                    continue
                for rsid, seq, rstream, data in entries:
                    if rsid != sid if sid is not None else rstream != stream:
                        continue
                    known = after.get(rsid, 0)
                    if seq <= known:
                        continue
                    if seq > known + 1 and rsid in after and (sid is not None or self._only_here(rsid)):
                        # deleted by retention meanwhile, or never in the log (on a stream, the seqs between
                        # may be its witnesses on another stream: only one that publishes nothing else has a gap)
                        first = wlog.first_seq(rsid)
                        if known + 1 < first:
                            raise Gone(rsid, known + 1, first)
                        self._gap(out, rsid, known + 1, seq - 1)
                    after[rsid] = seq
                    out.append((rsid, seq, data))
                    size += len(data)
            self._pos = pos + p
        return out

    def _mine(self, cols: tuple) -> Iterable[tuple]:
        """A batch record's witnesses (its columns ``cols``) this cursor may want: for a
        subscription's, only its own where they are together (as a batch's are packed: one
        slice, not a pass over the thousands of others')."""
        sids = cols[0]
        if self.sid is not None:
            want = self.sid
            try:
                first = sids.index(want)
            except ValueError:
                return ()
            end = first + sids.count(want)
            if sids[first:end].count(want) == end - first:
                return zip(sids[first:end], *(col[first:end] for col in cols[1:]))
        return zip(*cols)

    def _runs_entries(self, runs: tuple, seg) -> list:
        """A kind 4 record's witnesses: a subscription's cursor takes its own run alone (found by
        its name: not a column of the batch's thousands made); a stream's, the record's columns
        (witrecords.py's ``runs_columns``)."""
        if self.sid is None:
            return self._side_entries(runs_columns(runs), seg)
        owners, firsts, counts, kinds, ref = runs
        try:
            i = owners.index(self.sid)
        except ValueError:
            return []
        n, first, kind = counts[i], firsts[i], kinds[i]
        if n <= 0 or (type(kind) is not str and len(kind) != n):
            raise OSError(f"witness log {seg.path.name}: a record's entry of {self.sid} is not whole")
        mine = ([self.sid] * n, list(range(first, first + n)), [kind] * n if type(kind) is str else kind, ref)
        return self._side_entries(mine, seg, (sum(counts[:i]), sum(counts)))

    def _side_entries(self, cols: tuple, seg, span: tuple[int, int] | None = None) -> list:
        """A kind 3 record's witnesses (or those of a kind 4's columns ``cols``; with ``span``,
        ``(at, total)``, they are the batch's from ``at`` of ``total``): its payloads read from
        the worker's file only when this cursor wants one of them; where they cannot be read (a
        power cut took the end of the file), each wanted witness stands for itself with a
        :class:`Gap` of one for a payload."""
        sids, seqs, streams, ref = cols
        want = self.sid if self.sid is not None else self.stream
        if want not in (sids if self.sid is not None else streams):
            return []
        if self._side is None:
            self._side = self.log.side_reader()
        at, total = (0, len(sids)) if span is None else span
        try:
            payloads = self._side.payloads(ref)
            if len(payloads) != total:
                raise BadRecord(f"{len(payloads)} payloads for {total} witnesses")
            if span is not None:
                payloads = payloads[at:at + len(sids)]
        except (OSError, BadRecord, msgspec.DecodeError) as exc:
            log.error("witness log %s: the payloads of %d witnesses in %s are lost (%s)", seg.path.name, len(sids),
                      ref[0], exc)
            payloads = [Gap(q, q) for q in seqs]
            self.gaps += 1
        return list(self._mine((sids, seqs, streams, payloads)))

    def _only_here(self, sid: str) -> bool:
        """Whether ``sid`` has published on no other stream than this cursor's in the retained log
        (remembered once it has: such a subscription jumps at nearly every witness of a stream)."""
        if sid in self._elsewhere:
            return False
        if self.log.streams_of(sid) <= {self.stream}:
            return True
        self._elsewhere.add(sid)
        return False

    def _enter(self, seg, start: int) -> bool:
        try:
            self._file = open(seg.path, "rb")
        except FileNotFoundError:  # deleted by retention after the index was copied
            return False
        self._seg, self._pos = seg, start
        return True
