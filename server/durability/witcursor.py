"""Reading the witness log (server/durability/witlog.py) from other threads
than its writer: a :class:`Cursor` over one subscription's or one stream's
records, in log order."""

from __future__ import annotations

from typing import Protocol

from server.durability.framing import FRAME
from server.durability.witformat import BATCH, WITNESS, Gone, Segment, parse, unpack


class _Log(Protocol):
    """What a cursor asks of the log (:class:`~server.durability.witlog.WitnessLog`)."""

    def retained_segments(self) -> list[tuple[Segment, int]]: ...

    def last_seq(self, sid: str) -> int: ...

    def first_seq(self, sid: str) -> int: ...


class Cursor:
    """Reads a subscription's (or a stream's) records, in log order, from
    another thread than the writer; :meth:`read` returns the next ones, an
    empty list at the end of what is appended so far, and may be called again
    later for what comes after. Holds one segment file open at a time (a
    segment deleted meanwhile is still read to its end)."""

    def __init__(self, wlog: _Log, sid: str | None, stream: str | None, after: dict[str, int]) -> None:
        if (sid is None) == (stream is None):
            raise ValueError("a cursor reads one subscription or one stream")
        self.log, self.sid, self.stream = wlog, sid, stream
        self.after = after  # last seq read per subscription
        self._seg: Segment | None = None
        self._file = None
        self._pos = 0
        self._check_retained(after.keys() if stream is not None else [sid])

    def _check_retained(self, sids) -> None:
        for s in sids:
            want = self.after.get(s, 0) + 1
            if want <= self.log.last_seq(s):
                first = self.log.first_seq(s)
                if want < first:
                    raise Gone(s, want, first)

    def _wanted(self, seg: Segment) -> int | None:
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

    def read(self, max_records: int = 2000, max_bytes: int = 1 << 20) -> list[tuple[str, int, bytes]]:
        """The next records, (sid, seq, payload), at most about ``max_records``
        or ``max_bytes``; [] when there is nothing more yet. Raises :class:`Gone`
        when retention deleted records it still had to read."""
        out: list[tuple[str, int, bytes]] = []
        size = 0
        after, sid, stream, wlog = self.after, self.sid, self.stream, self.log
        while len(out) < max_records and size < max_bytes:
            segs = wlog.retained_segments()
            if self._seg is None:
                for seg, _ in segs:
                    start = self._wanted(seg)
                    if start is not None and self._enter(seg, start):
                        break
                else:
                    self._check_retained(list(after) if stream is not None else [sid])
                    return out
            seg, pos = self._seg, self._pos
            end = next((n for s, n in segs if s is seg), seg.size)  # a deleted segment: read it to its end
            if pos >= end:
                if seg is segs[-1][0]:
                    return out  # at the end of the active segment: nothing more yet
                self.close()
                self._seg = None
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
                if kind == BATCH:
                    cols = unpack(payload)
                    entries = zip(cols[0], cols[1], cols[2], cols[3])
                elif kind == WITNESS:
                    entries = ((rsid, seq, rstream, bytes(payload)),)
                else:
                    continue
                for rsid, seq, rstream, data in entries:
                    if rsid != sid if sid is not None else rstream != stream:
                        continue
                    known = after.get(rsid, 0)
                    if seq <= known:
                        continue
                    if seq > known + 1 and rsid in after:  # a gap: deleted by retention meanwhile?
                        first = wlog.first_seq(rsid)
                        if known + 1 < first:
                            raise Gone(rsid, known + 1, first)
                    after[rsid] = seq
                    out.append((rsid, seq, data))
                    size += len(data)
            self._pos = pos + p
        return out

    def _enter(self, seg: Segment, start: int) -> bool:
        try:
            self._file = open(seg.path, "rb")
        except FileNotFoundError:  # deleted by retention after the index was copied
            return False
        self._seg, self._pos = seg, start
        return True
