"""Limits on what one client may hand the server, shared by the TCP receivers
and ``POST /events``: events too far ahead of the clock, oversized string
values, and connections per client address. Pure checks: callers report and
count what is refused (README, "Limits"; RELIABILITY.md).

The checks cost almost nothing on well-behaved input: a block whose newest
``t1`` is within bounds, or whose bytes are fewer than the value limit, is
passed without looking at each event.
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Sequence

from air.engine import Event

_t1 = attrgetter("t1")


def refusals(events: Sequence[Event], size: int, *, horizon: float | None, max_value: int) -> dict[int, str]:
    """Index -> reason for each event of a decoded block (``size``: a bound
    on the bytes of any one event, the block's or its longest line's) that
    must be refused: ``t1`` beyond ``horizon`` (None: no bound), or a
    string value longer than ``max_value`` bytes."""
    out: dict[int, str] = {}
    if horizon is not None and events and max(map(_t1, events)) > horizon:
        for i, ev in enumerate(events):
            if ev.t1 > horizon:
                out[i] = (f"t1={ev.t1} is too far ahead of the server clock (at most {horizon:.0f} now: "
                          "the max_future setting); send the right time, or use the setting time: event")
    if size > max_value:
        for i, ev in enumerate(events):
            for v in ev.values:
                if v.__class__ is str and len(v) > max_value // 4 and len(v.encode("utf-8")) > max_value:
                    out.setdefault(i, f"a string value of {len(v.encode('utf-8'))} bytes is longer than "
                                      f"max_value_bytes ({max_value})")
                    break
    return out


def without(events: list[Event], refused: dict[int, str]) -> tuple[list[Event], list[int]]:
    """``events`` without the refused ones, and the original index of each kept one."""
    kept = [i for i in range(len(events)) if i not in refused]
    return [events[i] for i in kept], kept


class AddressSlots:
    """Counts open connections per client address; thread-safe."""

    def __init__(self, per_address: int) -> None:
        self.per_address = per_address
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, address: str) -> bool:
        with self._lock:
            n = self._open.get(address, 0)
            if n >= self.per_address:
                return False
            self._open[address] = n + 1
            return True

    def release(self, address: str) -> None:
        with self._lock:
            n = self._open.get(address, 0) - 1
            if n > 0:
                self._open[address] = n
            else:
                self._open.pop(address, None)


def automaton_size_errors(automata, max_states: int, max_atoms: int) -> list[str]:
    """Why each automaton is too large to register (states, or predicate atoms
    over all its edges), or []."""
    out = []
    for i, auto in enumerate(automata):
        name = auto.name or f"#{i + 1}"
        if len(auto.states) > max_states:
            out.append(f"automaton {name} has {len(auto.states)} states; at most {max_states} "
                       "(the max_states setting)")
        preds = [p for s in auto.states
                 for p in (s.filter, s.rebind.predicate if s.rebind else None, *(f.predicate for f in s.forwards))
                 if p is not None]
        atoms = sum(len(c.atoms) for p in preds for c in p.clauses)
        if atoms > max_atoms:
            out.append(f"automaton {name} has {atoms} predicate atoms; at most {max_atoms} "
                       "(the max_predicate_atoms setting)")
    return out
