"""How long an automaton instance can matter: the time bound a state's filter
predicate puts on its instances (docs/design/semantics.md#automata). No I/O.

An instance at a non-start state is *affected* only by an event that satisfies
the state's filter predicate θ; an instance no event can affect any more does
nothing ever again (no rebind, no forward edge, no witness) and is dead weight.
A ``DUR`` atom of kind COMPOSITE compares ``e.t1 - I.t0``; events come in
non-decreasing ``t1``, so once ``now - I.t0`` has passed the bound of every
clause of θ, no later event can satisfy θ: the engine may drop the instance
(air/engine/footprint.py, ``expire``) without changing any witness. A state
whose θ has a clause without such a bound keeps an instance that no event
affects for as long as the server runs: the registration's warnings say so
(``air/boundwarn.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from air.model import Clause, DurationAtom, Predicate


class Horizon(NamedTuple):
    """An event at time ``t`` can affect an instance that started at ``t0``
    only while ``t - t0 < limit`` (``closed`` False) or ``<= limit``
    (``closed`` True)."""

    limit: float
    closed: bool

    def expired(self, t0, now) -> bool:
        """Whether no event at ``now`` or later can affect an instance that started at ``t0``."""
        d = now - t0
        return d > self.limit or (d == self.limit and not self.closed)


def clause_horizon(clause: Clause) -> Horizon | None:
    """The tightest COMPOSITE ``DUR <`` / ``<=`` / ``=`` bound of one clause
    (an AND of atoms: every bound must hold), or None when it has none."""
    best: Horizon | None = None
    for a in clause.atoms:
        if type(a) is not DurationAtom or a.kind != "COMPOSITE" or a.op not in ("<", "<=", "="):
            continue
        h = Horizon(float(a.const), a.op != "<")
        if best is None or h.limit < best.limit or (h.limit == best.limit and not h.closed):
            best = h
    return best


def filter_horizon(pred: Predicate | None) -> Horizon | None:
    """The time after which no event can affect an instance of a state whose
    filter is ``pred`` (an OR of clauses: the loosest clause decides), or
    None when some clause has no time bound. ``None`` as ``pred`` is TRUE (no
    ``<FilterEdge>``): every event affects the instance; no time bound. A
    predicate with no clause (FALSE) affects nothing: every instance is
    expired at once."""
    if pred is None:
        return None
    if not pred.clauses:
        return Horizon(0.0, False)
    worst: Horizon | None = None
    for clause in pred.clauses:
        h = clause_horizon(clause)
        if h is None:
            return None
        if worst is None or h.limit > worst.limit or (h.limit == worst.limit and h.closed):
            worst = h
    return worst
