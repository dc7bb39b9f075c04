"""The shape of an automaton: what staging reads of it, with the constants of
its StaticAtoms and its names left out.

The loader (air/engine/loader.py) stages automata through one template per
shape (:func:`automaton_key`: per-symbol subscriptions, thousands of automata
that differ only in a symbol, share one) and merges a state into an existing
node when their merge keys (``Loader._merge_key``, made of :func:`pred_key`,
:func:`map_key` and :func:`schema_key`) are equal. Keys keep literal types
(:func:`literal_types`): model equality says ``1 == 1.0 == True``, but
``x / 2`` and ``x / 2.0`` differ. Pure functions of the model, run for every
state loaded.
"""

from __future__ import annotations

from air.expr import Literal, walk
from air.model import (
    Attribute, Automaton, ComplexAtom, Computed, DurationAtom, DynamicAtom, Edge, Predicate, Rename, StaticAtom,
)


def automaton_key(auto: Automaton, sites: list) -> tuple:
    """Everything of ``auto`` that staging reads, except the constants of
    its StaticAtoms (appended to ``sites``, in a fixed order) and its names
    (automaton, outputs): automata with equal keys differ only in those."""
    out = []
    for s in auto.states:
        r = s.rebind
        out.append((
            s.id, s.is_start, s.input_stream, schema_key(s.schema), pred_key(s.filter, sites),
            None if r is None else (r.destination, pred_key(r.predicate, sites), map_key(r.schema_map),
                                    r.has_map, r.resets_start),
            tuple([(e.destination, pred_key(e.predicate, sites), map_key(e.schema_map), e.has_map,
                    e.resets_start) for e in s.forwards])))
    return tuple(out)


def pred_key(p: Predicate | None, sites: list) -> tuple | None:
    """The shape of a predicate: its atoms with the constants of StaticAtoms
    left out (appended to ``sites``, in order) and literal types kept."""
    if p is None:
        return None
    out = []
    for cl in p.clauses:
        atoms = []
        for a in cl.atoms:
            t = type(a)
            if t is StaticAtom:
                sites.append(a)
                c = a.const
                atoms.append(("S", a.event_attr, a.op) if type(c) is str else ("S", a.event_attr, a.op, type(c)))
            elif t is DynamicAtom:
                atoms.append(("D", a.event_attr, a.op, a.node_attr))
            elif t is DurationAtom:
                atoms.append(("U", a.kind, a.op, a.const, type(a.const)))
            else:  # ComplexAtom, or what the compiler rejects: by value, with literal types
                atoms.append(("X", t, a, literal_types((a,))))
        out.append(tuple(atoms))
    return tuple(out)


def map_key(entries: tuple) -> tuple:
    return tuple([("R", m.source, m.old, m.new) if type(m) is Rename else ("X", type(m), m, literal_types((m,)))
                  for m in entries])


def schema_key(attrs: tuple) -> tuple:
    return tuple([(a.name, a.type) for a in attrs])


def literal_types(parts) -> tuple:
    """Types of the literals in the expressions of ``parts``: model equality
    says ``1 == 1.0 == True``, but ``x / 2`` and ``x / 2.0`` differ. (Dispatch
    on the exact type: this runs for every state loaded.)"""
    out: list[str] = []
    stack = list(parts)
    pop, push = stack.pop, stack.extend
    while stack:
        x = pop()
        t = type(x)
        if t is tuple or t is list:
            push(x)
        elif t in _NO_LITERALS:
            continue
        elif t is Predicate:
            for cl in x.clauses:
                push(cl.atoms)
        elif t is ComplexAtom or t is Computed:
            out.extend(type(n.value).__name__ for n in walk(x.expr) if isinstance(n, Literal))
        elif t is Edge:
            push((x.predicate, x.schema_map))
        elif isinstance(x, (tuple, list)):  # a subclass, e.g. a named tuple
            push(x)
    return tuple(out)


_NO_LITERALS = frozenset({str, bool, type(None), int, float, StaticAtom, DynamicAtom, DurationAtom, Rename,
                          Attribute})
