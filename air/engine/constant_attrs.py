"""Stored attributes that hold the same constant in every instance of a state,
found before an automaton is bound, so that a filter atom on one can go into
the AN index (:func:`constant_attrs`, :func:`derived_sites`; the loader,
air/engine/loader.py, uses them when it makes a template). A static analysis
of the automaton: no engine state.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from air.model import Automaton, Clause, DynamicAtom, Edge, Predicate, Rename, State, StaticAtom, StreamSchema

if TYPE_CHECKING:
    from air.engine.codegen import Scope


def constant_attrs(auto: Automaton, by_id: dict[str, State], ev_schema: dict[str, StreamSchema | None]
                    ) -> dict[str, dict[str, tuple[str, str]]]:
    """Stored attributes that hold the same constant in every instance of a
    state: ``{state id: {attribute: (AIR constant, type)}}``.

    ``FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name ...} Stock`` copies
    ``EV.Name`` into ``Name_1`` on an edge that requires ``Name = 'IBM'``, so
    every instance of the NEXT state has ``Name_1 = 'IBM'`` and its filter atom
    ``Name = NODE.Name_1`` can go into the AN index as ``Name = 'IBM'``: the
    state is then visited only for IBM events instead of for every event (one
    subscription per symbol written in CEL would otherwise cost every event a
    visit to every subscription). Sound by induction over the ways an instance
    is made: each incoming forward edge must produce the constant (from a static
    equality atom of the edge or of its source's filter, both of which hold when
    it fires, or by copying a constant attribute of its source), and the rebind
    edge must copy it unchanged. Types must agree exactly; anything unsure
    (OR-predicates, computed values, a rebind from elsewhere) gives no constant.
    States on cycles are seen before all their predecessors and so get fewer
    constants, never wrong ones."""

    types_of: dict[int, dict[str, str]] = {}  # by id of an attribute tuple: name -> type

    def types(attrs: tuple) -> dict[str, str]:
        got = types_of.get(id(attrs))
        if got is None:
            got = types_of[id(attrs)] = {a.name: a.type for a in attrs}
        return got

    def ev_type(state: State, attr: str) -> str | None:
        sch = ev_schema.get(state.id)
        return types(sch.attributes).get(attr) if sch else None

    def attr_type(state: State, attr: str) -> str | None:
        return types(state.schema).get(attr)

    def holding(src: State, src_consts: dict, pred: Predicate) -> dict[str, tuple[str, str]]:
        """Event attributes equal to a constant whenever an edge of ``src`` fires."""
        atoms: list = []
        if not src.is_start and src.filter is not None:
            if len(src.filter.clauses) != 1:
                return {}
            atoms.extend(src.filter.clauses[0].atoms)
        if len(pred.clauses) == 1:
            atoms.extend(pred.clauses[0].atoms)
        out: dict[str, tuple[str, str]] = {}
        for a in atoms:
            t = ev_type(src, a.event_attr) if isinstance(a, (StaticAtom, DynamicAtom)) else None
            if t is None or a.op != "=":
                continue
            if isinstance(a, StaticAtom):
                out[a.event_attr] = (a.const, t)
            elif a.node_attr in src_consts and src_consts[a.node_attr][1] == t:
                out[a.event_attr] = src_consts[a.node_attr]
        return out

    def produced(src: State, src_consts: dict, edge: Edge, dest: State) -> dict[str, tuple[str, str]]:
        ev = holding(src, src_consts, edge.predicate)
        out: dict[str, tuple[str, str]] = {}
        for m in edge.schema_map:  # a later entry for the same attribute wins, as in compile_schema_map
            if isinstance(m, Rename):
                got = ev.get(m.old) if m.source == "EV" else src_consts.get(m.old)
                if got is not None and attr_type(dest, m.new) == got[1]:
                    out[m.new] = got
                    continue
            out.pop(m.new if isinstance(m, Rename) else m.attr, None)
        return out

    incoming: dict[str, list[tuple[State, Edge]]] = {s.id: [] for s in auto.states}
    for s in auto.states:
        for e in s.forwards:
            if e.destination in incoming:
                incoming[e.destination].append((s, e))
        if s.rebind is not None and s.rebind.destination != s.id and s.rebind.destination in incoming:
            incoming[s.rebind.destination].append((s, None))  # a rebind from elsewhere: give up
    result: dict[str, dict[str, tuple[str, str]]] = {}
    order = deque(s for s in auto.states if s.is_start)
    seen = {s.id for s in order}
    while order:
        s = order.popleft()
        if not s.is_start:
            got: dict | None = None
            for src, e in incoming[s.id]:
                part = {} if e is None else produced(src, result.get(src.id, {}), e, s)
                got = part if got is None else {k: v for k, v in got.items() if part.get(k) == v}
                if not got:
                    break
            got = got or {}
            if got and s.rebind is not None:  # a rebind must keep each one
                keeps = produced(s, got, s.rebind, s)
                got = {k: v for k, v in got.items() if keeps.get(k) == v}
            if got:
                result[s.id] = got
        for e in s.forwards:
            d = by_id.get(e.destination)
            if d is not None and d.id not in seen:
                seen.add(d.id)
                order.append(d)
    return result


def derived_sites(clause: Clause, consts: dict[str, tuple[int, str]] | None, scope: Scope
                   ) -> list[tuple[int, int, str]]:
    """``e.a = I.b`` atoms of a filter clause whose ``b`` is a constant of the
    state (see :func:`constant_attrs`; here ``{attribute: (constant number,
    type)}``), as ``(event attribute index, constant number, type)`` for the AN
    index (a constant that does not convert is skipped when bound)."""
    out = []
    for a in clause.atoms:
        if consts and isinstance(a, DynamicAtom) and a.op == "=" and a.node_attr in consts and a.event_attr in scope.ev:
            slot, t = consts[a.node_attr]
            idx, ev_t = scope.ev[a.event_attr]
            if ev_t == t:
                out.append((idx, slot, t))
    return out
