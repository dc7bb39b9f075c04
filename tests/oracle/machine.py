"""The oracle's run of AIR automata over events: literal set-of-instances
semantics, one epoch at a time (docs/design/semantics.md#automata, docs/design/semantics.md#simultaneity).

Nothing is indexed, merged or cached: every event is offered to every state of
every automaton that reads its stream, and every instance at such a state is
tested. See the package docstring for the conventions this follows.
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from typing import NamedTuple

from tests.oracle import expr
from tests.oracle.air import Automaton, OracleAirError, State

#: Resubscription may feed an automaton its own output; the engine's automata
#: from CEL never loop (docs/design/semantics.md#simultaneity), a hand-written AIR may: stop there.
MAX_EVENTS_PER_EPOCH = 200_000


class Event(NamedTuple):
    stream: str
    values: tuple                  # in the stream's schema order
    t0: int | float
    t1: int | float


class Witness(NamedTuple):
    owner: str
    stream: str
    kind: str                      # "OUT" or "RESUB"
    values: tuple                  # in the output stream's schema order
    t0: int | float
    t1: int | float


class Instance:
    """One automaton instance: its stored values and its interval. Compared by
    identity: two instances with equal contents are two instances."""

    __slots__ = ("values", "t0", "t1")

    def __init__(self, values: dict, t0, t1) -> None:
        self.values, self.t0, self.t1 = values, t0, t1

    def __repr__(self) -> str:
        return f"Instance({self.values}, {self.t0}, {self.t1})"


class OracleRunError(RuntimeError):
    pass


def _convert(value, typ: str):
    if typ == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _stored(value, typ: str | None):
    """A UDF's value for an attribute of ``typ``: a value of another type is
    a type clash (docs/design/semantics.md#arithmetic-and-comparison), but
    an int may go into a float attribute (and becomes a float, see
    ``_convert``)."""
    kind = {bool: "bool", int: "int", float: "float", str: "string"}.get(type(value))
    if typ is None or kind == typ or (typ == "float" and kind == "int"):
        return value
    raise expr.OracleExprError(f"a {kind} value stored into a {typ} attribute")


def _const(text: str, typ: str):
    """A StaticPred's constant, read as the type of the event attribute it is
    compared with."""
    if typ == "string":
        return text
    if typ == "bool":
        return text.strip().lower() in ("1", "true")
    if typ == "int":
        try:
            return int(text)
        except ValueError:
            return float(text)
    return float(text)


class Oracle:
    """Streams declared, automata added (publishers before their readers), then
    :meth:`run` over a whole list of events in non-decreasing ``t1``."""

    def __init__(self, functions: dict | None = None, max_instances: int | None = None) -> None:
        self.max_instances = max_instances   # stop (OracleRunError) when a run holds more
        self.functions = {**expr.BUILTINS, **{k.upper(): v for k, v in (functions or {}).items()}}
        self.streams: dict[str, tuple] = {"DUAL": ()}     # name -> ((attr, type), ...)
        self.automata: list[tuple[str, Automaton]] = []
        self.windows: list[list] = []                     # per automaton: [from t1, until t1) or None
        self.eval_errors = 0
        self.last_eval_error = ""

    def declare(self, name: str, attrs) -> None:
        """``attrs``: ``((name, type), ...)``; types as in AIR."""
        self.streams[name] = tuple(attrs)

    def add(self, automata, owner: str, at=None) -> None:
        """Automata of ``owner``; with ``at``, registered while events flow: they
        take part from the first epoch with ``t1 >= at`` on, starting empty
        (docs/design/semantics.md#indexes-and-state-merging: a subscription never inherits instances made before it)."""
        autos = [automata] if isinstance(automata, Automaton) else list(automata)
        for auto in autos:
            for s in auto.states:
                if s.stream is not None and s.stream not in self.streams:
                    raise OracleAirError(f"{auto.name}: node {s.id} reads undeclared stream {s.stream!r}")
                self._check_static(auto, s)
                for out, _kind in s.outputs:
                    if out in self.streams and self.streams[out] != s.schema:
                        raise OracleAirError(f"{auto.name}: output stream {out!r} exists with another schema")
                    self.streams[out] = s.schema
            self.automata.append((owner, auto))
            self.windows.append([at, None])

    def remove(self, owner: str, at) -> None:
        """``owner``'s automata take no part in epochs with ``t1 >= at``."""
        for (o, _), window in zip(self.automata, self.windows):
            if o == owner:
                window[1] = at

    def _check_static(self, auto: Automaton, s: State) -> None:
        if s.stream is None:
            return
        names = {n for n, _ in self.streams[s.stream]}
        preds = [s.filter] + [e.pred for e in ((s.rebind,) if s.rebind else ()) + s.forwards]
        for pred in preds:
            for clause in pred:
                for atom in clause:
                    if atom[0] in ("static", "dynamic") and atom[1] not in names:
                        raise OracleAirError(f"{auto.name}: node {s.id}: stream {s.stream} has no {atom[1]!r}")
                    typ = dict(self.streams[s.stream]).get(atom[1])
                    if atom[0] == "static" and typ in ("int", "float"):
                        try:  # docs/design/semantics.md#arithmetic-and-comparison: in range, or refused
                            expr.literal(_const(atom[3], typ), atom[3])
                        except (ValueError, expr.OracleExprError) as exc:
                            raise OracleAirError(f"{auto.name}: node {s.id}: constant {atom[3]!r}: {exc}") from None

    # ------------------------------------------------------------------ predicates

    def _atom(self, atom, s: State, ev: dict, e: Event, inst: Instance | None) -> bool:
        kind = atom[0]
        if kind == "static":
            typ = dict(self.streams[s.stream])[atom[1]]
            return expr.compare(atom[2], ev[atom[1]], _const(atom[3], typ))
        if kind == "dynamic":
            return expr.compare(atom[2], ev[atom[1]], inst.values[atom[3]])
        if kind == "duration":
            dur = e.t1 - e.t0 if atom[1] == "EVENT" else e.t1 - inst.t0
            return expr.compare(atom[2], dur, atom[3])
        return bool(expr.evaluate(atom[1], ev, inst.values if inst else None, self.functions))

    def _holds(self, pred: tuple, s: State, ev: dict, e: Event, inst: Instance | None) -> bool:
        """OR of clauses, AND of atoms; TRUE when there are no clauses. An atom
        that fails to evaluate makes the whole predicate false for this event."""
        if not pred:
            return True
        try:
            return any(all(self._atom(a, s, ev, e, inst) for a in clause) for clause in pred)
        except (expr.OracleExprError, KeyError, TypeError, ZeroDivisionError, OverflowError, ValueError) as exc:
            self._error(exc)
            return False

    def _error(self, exc: Exception) -> None:
        self.eval_errors += 1
        self.last_eval_error = f"{type(exc).__name__}: {exc}"

    def _map(self, edge, dest: State, ev: dict, inst: Instance | None) -> dict | None:
        """The new instance's values; None when an expression fails."""
        node = inst.values if inst else None
        out = {}
        types = dict(dest.schema)
        try:
            for src, old, new in edge.mapping:
                if src == "EV":
                    out[new] = ev[old]
                elif src == "NODE":
                    out[new] = node[old]
                else:
                    out[new] = _stored(expr.evaluate(old, ev, node, self.functions), types.get(new))
        except (expr.OracleExprError, KeyError, TypeError, ZeroDivisionError, OverflowError, ValueError) as exc:
            self._error(exc)
            return None
        return {a: _convert(out[a], t) for a, t in dest.schema}

    # ------------------------------------------------------------------ the run

    def run(self, events) -> list[Witness]:
        """Every witness, in the order the oracle produced them (epoch by epoch)."""
        events = list(events)
        for a, b in zip(events, events[1:]):
            if b.t1 < a.t1:
                raise OracleRunError(f"events out of t1 order: {a} then {b}")
        installed: dict[tuple, list[Instance]] = {}   # (automaton index, state id) -> instances
        witnesses: list[Witness] = []
        for t, group in groupby(events, key=lambda e: e.t1):
            live = {ai for ai, (start, end) in enumerate(self.windows)
                    if (start is None or t >= start) and (end is None or t < end)}
            installed = {k: v for k, v in installed.items() if k[0] in live}  # a removed owner's instances go
            installed = self._epoch(list(group), installed, witnesses, live)
        self.final_instances = installed
        return witnesses

    def _epoch(self, group: list, installed: dict, witnesses: list, live: set) -> dict:
        affected: set[int] = set()
        pending: dict[tuple, list[Instance]] = {}
        queue = deque(Event(e.stream, tuple(e.values), e.t0, e.t1) for e in group)
        seen = 0
        while queue:
            e = queue.popleft()
            seen += 1
            if seen > MAX_EVENTS_PER_EPOCH:
                raise OracleRunError(f"more than {MAX_EVENTS_PER_EPOCH} events in epoch {e.t1}: a resubscription loop")
            if e.stream not in self.streams:
                continue
            ev = dict(zip((n for n, _ in self.streams[e.stream]), e.values))
            for ai, (owner, auto) in enumerate(self.automata):
                if ai not in live:
                    continue
                for s in auto.states:
                    if s.stream != e.stream:
                        continue
                    if s.start:
                        for edge in s.forwards:
                            if self._holds(edge.pred, s, ev, e, None):
                                self._create(ai, owner, auto, edge, ev, e, None, pending, queue, witnesses)
                        continue
                    for inst in installed.get((ai, s.id), ()):
                        if e.t0 <= inst.t1:
                            continue                       # overlaps: not affected
                        if not self._holds(s.filter, s, ev, e, inst):
                            continue                       # filtered: survives unchanged
                        affected.add(id(inst))
                        if s.rebind is not None:
                            if not (self._holds(s.rebind.pred, s, ev, e, inst)
                                    and self._create(ai, owner, auto, s.rebind, ev, e, inst, pending, queue,
                                                     witnesses)):
                                continue                   # no rebind: no forward edge either
                        for edge in s.forwards:
                            if self._holds(edge.pred, s, ev, e, inst):
                                self._create(ai, owner, auto, edge, ev, e, inst, pending, queue, witnesses)
        out = {}
        for key in set(installed) | set(pending):
            keep = [i for i in installed.get(key, ()) if id(i) not in affected] + pending.get(key, [])
            if keep:
                out[key] = keep
        if self.max_instances is not None and sum(map(len, out.values())) > self.max_instances:
            raise OracleRunError(f"more than {self.max_instances} instances: the case is too large to run")
        return out

    def _create(self, ai, owner, auto, edge, ev, e, inst, pending, queue, witnesses) -> bool:
        """Traverse ``edge``: the new instance, its witnesses. False when its
        schema map fails (then the edge counts as not taken)."""
        dest = auto.state(edge.dest)
        values = self._map(edge, dest, ev, inst)
        if values is None:
            return False
        if edge.delete:
            t0 = e.t1
        else:
            t0 = e.t0 if inst is None else inst.t0
        new = Instance(values, t0, e.t1)
        if dest.stream is not None:
            pending.setdefault((ai, dest.id), []).append(new)
        row = tuple(values[a] for a in dest.names())
        for name, kind in dest.outputs:
            witnesses.append(Witness(owner, name, kind, row, t0, e.t1))
            queue.append(Event(name, row, t0, e.t1))
        return True
