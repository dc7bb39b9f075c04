"""Installing a CEL query of a cached shape without building its automata.

A query restored from its stored binding (:meth:`ShapeCache.bound`: shape id
and constants) is a :class:`~air.cel.shapes.BoundQuery`: its automata are
the shape's marker automata with the query's constants and names put in. The
engine stages an automaton through a template per automaton shape
(air/engine/loader.py) and binds it with the texts of its StaticAtoms, in
a fixed order, and the names of its outputs; for queries of one CEL shape
those come straight from the constants:

* which constant (and sign) each StaticAtom site of the marker automata
  holds, in the template's order, is worked out once per shape;
* which template applies depends only on the shape, on which of those texts
  are equal (equal constants bound into one clause merge into one atom, and
  equal texts decide which attributes hold constants), on the constants
  that land anywhere but in a StaticAtom (a DurationAtom, a Literal of a
  computed atom: they are part of the automaton shape), and on the names
  that land anywhere but in an output's or an automaton's name (a stream a
  state reads, published by another automaton of the query): a *plan* per such
  key, made from the first query that has it by building its automata,
  installing them through :meth:`Engine.add`, and checking that the texts
  and outputs worked out from the constants are the automata's own and that
  no atom was merged away;
* a later query with the same key is installed by :meth:`Engine.add_prepared`
  with the plan's templates, its texts and output names: no automata, no
  walk over them. Where the engine cannot (a template no longer holds, a
  constant does not convert, a clash of published streams), the automata
  are built and :meth:`Engine.add` gives its result or its error.
"""

from __future__ import annotations

import dataclasses
from operator import itemgetter

from air.cel.compiler import _const_text
from air.cel.shapes import BoundQuery
from air.engine import Engine
from air.model import Automaton, OutputStream, StreamSchema


class _ShapeInfo:
    """What installing queries of one CEL shape needs (kept on the shape)."""

    __slots__ = ("sites", "other", "named", "outs", "pub", "plans", "n_pub", "get", "neg")

    def __init__(self, sites: list, other: tuple, named: tuple, outs: list, pub: list, part) -> None:
        self.sites = sites  # per automaton: [(constant index, sign)] of its StaticAtom sites, template order
        self.other = other  # constants with a site that is not a StaticAtom's text
        self.named = named  # names that land anywhere but in an output's or an automaton's name
        # per automaton: [(state number, [((marker index or None, suffix or whole name), type)])]
        self.outs = [[(k, [(part(n), t) for n, t in o]) for k, o in own] for own in outs]
        self.pub = [(part(n), attrs) for n, attrs in pub]  # every output, in Engine.add's order
        self.plans: dict[tuple, list | bool] = {}  # key -> templates per automaton, or False
        self.n_pub = len({n for n, _ in pub})
        # per automaton: the texts of its sites from the constants' texts (all signs positive) ...
        self.get = [None if not own else (lambda vt, i=own[0][0]: (vt[i],)) if len(own) == 1
                    else itemgetter(*[i for i, _ in own]) for own in sites]
        self.neg = [own if any(sign < 0 for _, sign in own) else None for own in sites]  # ... or not


def _shape_info(eng: Engine, bq: BoundQuery) -> _ShapeInfo | None:
    shape = bq.shape
    rules = shape.static_rules
    sites = []
    for auto in shape.compiled.automata:
        own = []
        for atom in eng.static_sites(auto):
            found = rules.get(atom.const)
            if not found or len(found) != 1:
                return None  # a constant of the shape's own text, or ambiguous: build the automata
            i, _how, sign = found[0]
            own.append((i, sign))
        sites.append(own)
    other = tuple(sorted({i for i, how in shape.used if how != "static"}))
    named = set()  # names (PUBLISH names, the prefix) that land where staging reads them, e.g. a stream read
    index = shape.names.index

    def walk(x) -> None:
        if isinstance(x, str):
            i = index(x)
            if i is not None:
                named.add(i)
        elif isinstance(x, tuple):
            for y in x:
                walk(y)
        elif dataclasses.is_dataclass(x) and not isinstance(x, OutputStream):
            for f in dataclasses.fields(x):
                if not (isinstance(x, Automaton) and f.name == "name"):
                    walk(getattr(x, f.name))

    walk(shape.compiled.automata)
    outs, pub = [], []
    for auto in shape.compiled.automata:
        outs.append([(k, [(o.name, o.type) for o in s.outputs]) for k, s in enumerate(auto.states) if s.outputs])
        pub.extend((o.name, s.schema) for s, o in auto.outputs)
    def part(name: str) -> tuple:
        i = index(name)
        return (None, name) if i is None else (i, name[len(shape.names.markers[i]):])

    return _ShapeInfo(sites, other, tuple(sorted(named)), outs, pub, part)


def _clause_sizes(autos) -> list[int]:
    out = []
    for a in autos:
        for s in a.states:
            preds = [s.filter] + ([s.rebind.predicate] if s.rebind else []) + [e.predicate for e in s.forwards]
            out.extend(len(c.atoms) for p in preds if p is not None for c in p.clauses)
    return out


class Preparer:
    """Installs :class:`BoundQuery` automata into one engine (its thread only)."""

    def __init__(self) -> None:
        self.prepared = 0  # installed without building automata
        self.built = 0  # installed from built automata

    def add(self, eng: Engine, bq, owner: str) -> list[str]:
        """What ``eng.add(bq, owner)`` does, and returns or raises. An engine
        that sends its changes on to an engine worker (server/workers/mirror.py)
        sends a bound query as its shape and constants (the worker installs it
        the same way, from its own templates), not as built automata."""
        mirror = getattr(eng, "mirror_bound", None)
        if mirror is not None and isinstance(bq, BoundQuery):
            with eng.unmirrored():
                got = self._add(eng, bq, owner)
            mirror(owner, bq)
            return got
        return self._add(eng, bq, owner)

    def _add(self, eng: Engine, bq, owner: str) -> list[str]:
        if not isinstance(bq, BoundQuery):
            return eng.add(bq, owner)
        shape = bq.shape
        info = shape.fast
        if info is None:
            info = shape.fast = _shape_info(eng, bq) or False
        if info is False:
            return self._build(eng, bq, owner)
        values = bq.values
        vt = list(map(_const_text, values))
        first: dict = {}
        key = tuple(map(first.setdefault, vt, range(len(vt))))  # which texts are equal
        if info.other:
            key = (key, tuple([(type(values[i]), values[i]) for i in info.other]))
        if info.named:
            real = bq.real
            key = (key, tuple([real[i] for i in info.named]))
        plan = info.plans.get(key)
        if plan is None:
            return self._first(eng, bq, owner, info, key, self._texts(info, values, vt))
        if plan is False:
            return self._build(eng, bq, owner)
        real = bq.real
        published = {}
        for (i, suffix), attrs in info.pub:
            name = suffix if i is None else real[i] + suffix
            published[name] = StreamSchema(name, attrs)
        if len(published) != info.n_pub:
            return self._build(eng, bq, owner)
        items = []
        for tpl, get, neg, outs in zip(plan, info.get, info.neg, info.outs):
            if neg:
                texts = self._texts_one(neg, values, vt)
            else:
                texts = list(get(vt)) if get is not None else []
            items.append((tpl, texts, {k: [(n if i is None else real[i] + n, ty) for (i, n), ty in o]
                                       for k, o in outs}))
        got = eng.add_prepared(owner, items, published)
        if got is None:
            return self._build(eng, bq, owner)
        self.prepared += 1
        return got

    @staticmethod
    def _texts_one(own: list, values: tuple, vt: list) -> list[str]:
        return [vt[i] if sign > 0 else _const_text(-values[i]) for i, sign in own]

    def _texts(self, info: "_ShapeInfo", values: tuple, vt: list) -> list[list[str]]:
        return [self._texts_one(own, values, vt) for own in info.sites]

    def _build(self, eng: Engine, bq: BoundQuery, owner: str) -> list[str]:
        self.built += 1
        return eng.add(bq.automata, owner)

    def _first(self, eng: Engine, bq: BoundQuery, owner: str, info: _ShapeInfo, key: tuple, texts: list) -> list[str]:
        autos: tuple[Automaton, ...] = bq.automata
        got = self._build(eng, bq, owner)  # raises as Engine.add does: no plan then
        plan: list | bool = []
        if _clause_sizes(autos) != _clause_sizes(bq.shape.compiled.automata):
            plan = False  # constants bound equal merged atoms
        else:
            for auto, t in zip(autos, texts):
                tpl, real = eng.template_of(auto)
                if tpl is None or real != t:
                    plan = False
                    break
                plan.append(tpl)
        if plan:
            real = bq.real

            def name(part: tuple) -> str:
                return part[1] if part[0] is None else real[part[0]] + part[1]

            outs = [[(k, [(name(n), ty) for n, ty in o]) for k, o in own] for own in info.outs]
            mine = [[(k, [(o.name, o.type) for o in a.states[k].outputs]) for k, _ in own]
                    for a, own in zip(autos, info.outs)]
            pub = [(name(n), attrs) for n, attrs in info.pub]
            if (outs != mine or pub != [(o.name, s.schema) for a in autos for s, o in a.outputs]
                    or any(len(a.states) != len(m.states) or [bool(s.outputs) for s in a.states]
                           != [bool(s.outputs) for s in m.states]
                           for a, m in zip(autos, bq.shape.compiled.automata))):
                plan = False
        info.plans[key] = plan
        return got


__all__ = ["Preparer"]
