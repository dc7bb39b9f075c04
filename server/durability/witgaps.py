"""What a start checks of the witness log: does it still hold every witness the
recovery's starting point says was numbered?

A snapshot records each subscription's last witness number at its cut
(``witness_seq``), and the witness log was synced before the snapshot was
published; without a snapshot, the store records the numbers where the journal
began (``Store.witness_base``). A log whose last number for a subscription is
below that lost witnesses while the server was stopped (a cut or damaged
newest segment). Witnesses are a function of the events: a replay from an
older starting point (an older snapshot, or the journal's first record) makes
them again with the same numbers, and the log keeps those it lacks
(``WitnessLog.append_columns`` drops only those it holds). :func:`missing`
finds the gaps; :func:`rebuild_point` finds the newest starting point that
rebuilds them all, else the one that rebuilds the most; what cannot be rebuilt
is marked in the log
(``WitnessLog.note_gaps``) and said loudly: /health, and a ``{"control":
"gap"}`` notice to each watcher that reads across it (server/api/ws.py).
Numbering goes on after the starting point's numbers, so no number a client may
have seen is given again.
"""

from __future__ import annotations

import logging
import pickle
from typing import Callable, Iterable

log = logging.getLogger("cayuga.daemon")

#: Why the witnesses of a gap are missing, as /health and the watchers' notices say it.
LOST = ("missing from the witness log (a part of it was cut off or damaged while the server was stopped, and the "
        "journal no longer held their events to make them again)")


def missing(expected: dict[str, int], logged: dict[str, int], sids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Per subscription of ``sids``, (first, last) of the witnesses numbered
    (``expected``: its last number at the starting point) that the log does not
    reach (``logged``: its last number in the log)."""
    return {sid: (logged.get(sid, 0) + 1, expected[sid]) for sid in sids
            if expected.get(sid, 0) > logged.get(sid, 0)}


def left(seqs: dict[str, int], logged: dict[str, int], gaps: dict[str, tuple[int, int]]
         ) -> dict[str, tuple[int, int]]:
    """What of ``gaps`` a replay from a starting point whose numbers are
    ``seqs`` does not make again (it makes every witness after its own numbers)."""
    out = {}
    for sid, (first, last) in gaps.items():
        upto = min(seqs.get(sid, 0), last)
        if upto >= first:
            out[sid] = (first, upto)
    return out


def rebuild_point(files: list, replayable: Callable[[object], bool], decode: Callable[[object], dict],
                  base: Callable[[], dict[str, int]], logged: dict[str, int], gaps: dict[str, tuple[int, int]]
                  ) -> tuple[dict | None, object | None, dict[str, tuple[int, int]]] | None:
    """An older starting point than the snapshot loaded, from which an exact
    replay makes the witnesses of ``gaps`` again: ``(state, file, what it
    cannot make)`` of an older snapshot among ``files`` (newest first), or
    ``(None, None, ...)`` for the journal's first record. The newest one that
    makes them all, else the oldest one the journal still covers (it makes the
    most of them); None when none makes any. ``replayable(file or None)``:
    whether the journal holds every event after it; ``decode(file)`` reads a
    snapshot (one that cannot be read is skipped); ``base()``: the numbers
    where the journal began."""
    best = None
    for f in files:
        if not replayable(f):
            continue
        try:
            state = decode(f)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            log.warning("snapshot %s cannot be read to rebuild lost witnesses: %s", f.path.name, exc)
            continue
        rest = left(dict(state["witness_seq"]), logged, gaps)
        if not rest:
            return state, f, rest
        best = (state, f, rest)
    if replayable(None):
        rest = left(base(), logged, gaps)
        if not rest or best is None or _size(rest) < _size(best[2]):
            return None, None, rest
    if best is not None and _size(best[2]) < _size(gaps):
        return best
    return None


def _size(gaps: dict[str, tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in gaps.values())


def describe(gaps: dict[str, tuple[int, int]], limit: int = 5) -> str:
    """``s1 (68655-135595), s2 (7-9)``, the first ``limit`` of them."""
    parts = [f"{sid} ({a}-{b})" if a != b else f"{sid} ({a})" for sid, (a, b) in sorted(gaps.items())[:limit]]
    more = f" and {len(gaps) - limit} more" if len(gaps) > limit else ""
    return ", ".join(parts) + more
