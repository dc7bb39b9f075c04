"""The witness log's holes between segments (witlog.py's :class:`WitnessLog` has these
methods): witnesses a sealed segment lost the end of while the next segment kept its
records (a power cut: nothing orders unsynced writes to two files), found against the
next segment's checkpoint when the log is opened, listed by :meth:`WitnessLog.gaps`, and
set aside for recovery's replay to write again where the journal still gives them."""

from __future__ import annotations

import logging

from server.durability import fsio
from server.durability.seqmap import SeqMap

log = logging.getLogger("cayuga.witlog")


class Holes:
    """The methods of :class:`~server.durability.witlog.WitnessLog` about its holes (its state:
    ``_segments``, ``_holes``, ``_lost_before``; ``_checkpoint_of`` and ``_open`` are its own)."""

    def _find_holes(self) -> None:
        """Witnesses missing between segments: a subscription's last seq in the
        segments up to one is below what the next one's checkpoint says it was
        (the tail of a sealed segment was cut or damaged). A segment's own cut
        tail is found against what recovery knows (server/durability/witgaps.py)."""
        seen: dict[str, int] = {}  # from the oldest one's checkpoint: all a cut tail held may be gone
        for i, seg in enumerate(self._segments):
            try:
                checkpoint = self._checkpoint_of(seg)
            except (OSError, ValueError, AttributeError):
                checkpoint = {}
            for s, v in checkpoint.items():
                had = seen.get(s, 0)
                if isinstance(v, int) and v > had:
                    if i:
                        self._holes.setdefault(s, []).append((had + 1, v))
                        self._lost_before.append((seg.number, s, had + 1))
                        log.error("witness log %s: witnesses %d to %d of %s are missing before it (an earlier "
                                  "segment was cut short or damaged)", seg.path.name, had + 1, v, s)
                    seen[s] = v
            for s, v in seg.subs.items():
                if v.last_seq > seen.get(s, 0):
                    seen[s] = v.last_seq

    def set_aside_after_holes(self, numbered: dict[str, int]) -> int:
        """Set aside (``*.dropped``) the segments from one after a hole that
        begins past ``numbered`` (each subscription's last number at recovery's
        starting point, whose exact replay makes every witness after it again).
        A power cut's, as a rule: a sealed segment lost the end it never synced
        while the next kept what was written to it (nothing orders unsynced
        writes to two files), and readers got a :class:`Gap` for witnesses the
        journal still gives (tests/server/test_powercut.py). All in those
        segments was numbered after the hole began: the replay writes it again
        with the same numbers. A hole up to ``numbered`` was synced: it stays a
        gap. Returns how many were set aside. Recovery, before any append."""
        at = min((n for n, s, first in self._lost_before if first > numbered.get(s, 0)), default=None)
        if at is None:
            return 0
        if self._fd is not None:
            fsio.close(self._fd)
            self._fd = None
        doomed = [seg for seg in self._segments if seg.number >= at]
        lost = sum(seg.path.stat().st_size for seg in doomed)
        for seg in doomed:
            fsio.rename(seg.path, seg.path.with_name(seg.path.name + ".dropped"))
            fsio.remove(seg.index_path)
        kept = {name for seg in self._segments if seg.number < at for name in seg.side}
        moved = self.side.set_aside({name for seg in doomed for name in seg.side}, kept)
        log.error("witness log: %s starts after witnesses the segment before it lost (a power cut?): it and %d "
                  "later segment(s), %d bytes, set aside as *.dropped%s; the journal's replay writes their witnesses "
                  "again", doomed[0].path.name, len(doomed) - 1, lost,
                  f" with the {len(moved)} payload file(s) only they refer to" if moved else "")
        with self._lock:
            self._segments, self._last, self._holes = [], SeqMap(self.numbers), {}
        self._lost_before, self._unsynced = [], []
        self._open()
        self.truncated += lost
        self._dir_dirty = True
        return len(doomed)

    def _link_gaps(self) -> None:
        """List each subscription a segment's gap marks name among the publishers
        of the streams it publishes (stream readers find the mark there)."""
        if not any(seg.gaps for seg in self._segments):
            return
        streams_of: dict[str, set[str]] = {}
        for seg in self._segments:
            for stream, sids in seg.streams.items():
                for s in sids:
                    streams_of.setdefault(s, set()).add(stream)
        for seg in self._segments:
            for s in seg.gaps:
                for stream in streams_of.get(s, ()):
                    seg.streams.setdefault(stream, set()).add(s)
