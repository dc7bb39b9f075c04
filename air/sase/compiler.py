"""A SASE plan -> Cayuga automata (docs/design/sase.md#the-automata).

One automaton per stream the query reads republishes its events, as point
events at their ``t1``, on the query's internal union stream
``<prefix>__u`` (a ``sase_type`` column says which stream; the other
streams' columns hold a default that no condition reads). The main automaton
reads only that stream:

* START takes an event of the first positive component (one forward edge per
  type of an ANY) into state ``s0``;
* state ``s_j`` holds a partial match of the first ``j+1`` positive
  components. An event of the next positive component that meets its
  conditions (and the window) *forks* it: a forward edge makes the longer
  match, and a forward edge back to ``s_j`` (the "stay" edge) keeps this one
  for later events: every match, not only the next (the SASE paper's all-matches
  selection). An event of the negated component between them that meets its
  conditions affects the instance and takes no edge: the partial match is
  gone. The window bounds every clause of the filter (``DUR < T``);
* a negated end adds state ``E``: a complete match waits there until an event
  arrives after ``t = t_first + T - 1`` (the SASE paper's rule), and is reported
  then, unless an event of the negated component came first.

Conditions are placed on the edge of their last component, attribute
references rewritten to ``EV`` (the event) and ``NODE`` (stored values
``p<i>_<attr>``); a reference to an attribute that the event's type (of an
ANY) lacks is TRUE, as the SASE paper defines it.
"""

from __future__ import annotations

import itertools
from typing import Iterable

from air.expr import And, Compare, Expr, Literal, Or, Ref, transform, walk
from air.model import (TRUE, Attribute, Automaton, Clause, ComplexAtom, Computed, DurationAtom, DynamicAtom, Edge,
                       OutputStream, Predicate, Rename, State, StaticAtom, StreamSchema)
from air.names import name_problem
from air.sase.analysis import Comp, Plan, risky
from air.sase.errors import SaseError

#: Converting a predicate to disjunctive normal form may multiply clauses; beyond this it is refused.
MAX_CLAUSES = 256
_DEFAULT = {"int": 0, "float": 0.0, "string": "", "bool": False}
_NEGATED = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


class Union:
    """The union stream's columns: one per (attribute, type) of the streams read."""

    def __init__(self, name: str, streams: dict[str, StreamSchema]) -> None:
        self.name = name
        taken = {a.name for s in streams.values() for a in s.attributes}
        kinds: dict[str, set[str]] = {}
        for s in streams.values():
            for a in s.attributes:
                kinds.setdefault(a.name, set()).add(a.type)
        self.type_col = _fresh("sase_type", taken)
        self.cols: dict[tuple[str, str], str] = {}
        for s in streams.values():
            for a in s.attributes:
                if (a.name, a.type) not in self.cols:
                    self.cols[(a.name, a.type)] = a.name if len(kinds[a.name]) == 1 else _fresh(
                        f"{a.name}__{a.type}", taken)
        self.streams = streams
        self.schema = (Attribute(self.type_col, "string"),) + tuple(
            Attribute(c, t) for (_, t), c in self.cols.items())

    def type_of(self, col: str) -> str:
        return next(a.type for a in self.schema if a.name == col)

    def col(self, stream: str, attr: str) -> str:
        return self.cols[(attr, self.streams[stream].type_of(attr))]

    def republisher(self, stream: str, prefix: str) -> Automaton:
        """START on ``stream`` -> an end node publishing its events on the union (as point events: DEL)."""
        sch = self.streams[stream]
        own = {self.col(stream, a.name): a.name for a in sch.attributes}
        smap: list = [Computed(Literal(stream), self.type_col)]
        for a in self.schema[1:]:
            smap.append(Rename("EV", own[a.name], a.name) if a.name in own else
                        Computed(Literal(_DEFAULT[a.type]), a.name))
        start = State("0", True, stream, (), None, None, (Edge("1", TRUE, tuple(smap), resets_start=True),))
        end = State("1", False, None, self.schema, outputs=(OutputStream(self.name, "RESUB"),))
        return Automaton((start, end), f"{prefix}__{stream}")


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


# --------------------------------------------------------------------------- conditions


def dnf(conjuncts: Iterable[Expr], source: str) -> list[list[Compare]]:
    clauses: list[list[Compare]] = [[]]
    for e in conjuncts:
        clauses = [a + b for a in clauses for b in _dnf(e)]
        if len(clauses) > MAX_CLAUSES:
            raise SaseError(f"this condition has more than {MAX_CLAUSES} clauses in disjunctive normal form; "
                            "simplify its AND/OR structure", getattr(e, "line", 0), getattr(e, "column", 0), source)
    return clauses


def _dnf(e: Expr) -> list[list[Compare]]:
    if isinstance(e, Or):
        return [c for item in e.items for c in _dnf(item)]
    if isinstance(e, And):
        out: list[list[Compare]] = [[]]
        for item in e.items:
            out = [a + b for a in out for b in _dnf(item)]
        return out
    assert isinstance(e, Compare), e
    return [[e]]


def negate(clauses: list[list[Compare]]) -> list[list[Compare]]:
    """NOT of a DNF, as a DNF (only of comparisons that cannot fail: analysis.risky)."""
    out: list[list[Compare]] = [[]]
    for clause in clauses:
        out = [a + [Compare(_NEGATED[c.op], c.left, c.right, c.line, c.column)] for a in out for c in clause]
    return out


def _const_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else repr(v)


class _Edges:
    """Rewrites conditions and values for one edge: which component the event
    is (and of which type), and where earlier components' values are stored."""

    def __init__(self, plan: Plan, union: Union) -> None:
        self.plan, self.union = plan, union
        self.window_op = "<"
        #: (positive ordinal, attribute) stored, and the ANY components whose type is stored
        self.stored: set[tuple[int, str]] = set()
        self.typed: set[int] = set()
        uses: list[tuple[int, Expr]] = [(j, e) for j, es in plan.at.items() for e in es]
        uses += [(len(plan.positives), e) for es in plan.kill.values() for e in es]
        uses += [(len(plan.positives), e) for _, e, _ in plan.returns]
        for j, e in uses:
            for r in walk(e):
                if isinstance(r, Ref):
                    c = plan.comps[int(r.source)]
                    if not c.negated and c.ordinal < j:
                        self.stored.add((c.ordinal, r.name))
                        if len(c.has[r.name]) < len(c.types):
                            self.typed.add(c.ordinal)
        # the last positive's values are read from the event, unless a negated end waits
        self.end = plan.negative_at(len(plan.positives) - 1, True)
        if self.end is not None:
            last = len(plan.positives) - 1
            for e in [e for es in plan.kill.values() for e in es] + [e for _, e, _ in plan.returns]:
                for r in walk(e):
                    if isinstance(r, Ref) and plan.comps[int(r.source)].ordinal == last and \
                            not plan.comps[int(r.source)].negated:
                        self.stored.add((last, r.name))

    def schema(self, upto: int) -> tuple[Attribute, ...]:
        """Stored values of a partial match of positives 0..upto."""
        out = []
        for i in range(upto + 1):
            c = self.plan.positives[i]
            if i in self.typed:
                out.append(Attribute(f"k{i}", "string"))
            out += [Attribute(f"p{i}_{a}", c.attrs[a]) for a in sorted(a for k, a in self.stored if k == i)]
        for a in out:
            problem = name_problem(a.name, what="attribute name")
            if problem is not None:
                raise SaseError(f"{problem} (made from an attribute of the query: rename the stream's attribute)")
        return tuple(out)

    def smap(self, dest: tuple[Attribute, ...], ev: Comp | None, ev_type: str | None) -> tuple:
        """The map into ``dest``: stored values kept, the event's taken."""
        out: list = []
        for a in dest:
            kind = a.name[0]
            i, _, attr = a.name[1:].partition("_")
            i = int(i)
            if ev is not None and i == ev.ordinal:
                if kind == "k":
                    out.append(Computed(Literal(ev_type), a.name))
                elif attr in self.plan.streams[ev_type].names:
                    col = self.union.col(ev_type, attr)
                    src_type = self.plan.streams[ev_type].type_of(attr)
                    out.append(Rename("EV", col, a.name) if src_type == a.type else
                               Computed(Ref(col, "EV"), a.name))
                else:
                    out.append(Computed(Literal(_DEFAULT[a.type]), a.name))
            else:
                out.append(Rename("NODE", a.name, a.name))
        return tuple(out)

    def returns(self, ev: Comp | None, ev_type: str | None) -> tuple:
        out = []
        for name, e, t in self.plan.returns:
            x = self.value(e, ev, ev_type, {})
            if isinstance(x, Ref) and x.source in ("EV", "NODE") and self._type_of(x, ev_type) == t:
                out.append(Rename(x.source, x.name, name))
            else:
                out.append(Computed(x, name))
        return tuple(out)

    def _type_of(self, r: Ref, ev_type: str | None) -> str:
        if r.source == "EV":
            return self.union.type_of(r.name)
        i, _, attr = r.name[1:].partition("_")
        return self.plan.positives[int(i)].attrs[attr]

    def value(self, e: Expr, ev: Comp | None, ev_type: str | None, node_types: dict[int, str]) -> Expr | None:
        """``e`` over EV and NODE; None when it reads an attribute that its component's type lacks."""
        missing = False

        def fn(x: Expr):
            nonlocal missing
            if not isinstance(x, Ref):
                return None
            c = self.plan.comps[int(x.source)]
            if ev is not None and c.index == ev.index:
                if x.name not in self.plan.streams[ev_type].names:
                    missing = True
                    return x
                return Ref(self.union.col(ev_type, x.name), "EV", x.line, x.column)
            t = node_types.get(c.ordinal)
            if t is not None and x.name not in self.plan.streams[t].names:
                missing = True
            return Ref(f"p{c.ordinal}_{x.name}", "NODE", x.line, x.column)

        out = transform(e, fn)
        return None if missing else out

    def predicate(self, conjuncts: list[Expr], ev: Comp, ev_type: str, guards: list,
                  negated: bool = False) -> list[list]:
        """Clauses (lists of model atoms) of ``guards`` AND the conjuncts (or, with
        ``negated``, AND NOT the conjuncts), for an event ``ev`` of ``ev_type``."""
        typed = sorted({self.plan.comps[int(r.source)].ordinal for e in conjuncts for r in walk(e)
                        if isinstance(r, Ref) and int(r.source) != ev.index
                        and self.plan.comps[int(r.source)].ordinal in self.typed})
        out: list[list] = []
        for combo in itertools.product(*[self.plan.positives[i].types for i in typed]):
            node_types = dict(zip(typed, combo))
            tguards = [ComplexAtom(Compare("=", Ref(f"k{i}", "NODE"), Literal(t)))
                       for i, t in node_types.items()]
            clauses = []
            for clause in dnf(conjuncts, self.plan.text):
                kept = []
                for c in clause:
                    x = self.value(c, ev, ev_type, node_types)
                    if x is not None:
                        kept.append(x)
                clauses.append(kept)
            if negated:
                clauses = negate(clauses)
            for clause in clauses:
                out.append(guards + tguards + sorted((self.atom(c) for c in clause), key=_rank))
            if len(out) > MAX_CLAUSES:
                raise SaseError(f"this query's conditions have more than {MAX_CLAUSES} clauses in disjunctive "
                                "normal form; simplify them", self.plan.line, self.plan.column, self.plan.text)
        return [_dedup(c) for c in out]

    def atom(self, c: Compare):
        """One comparison as AIR's atom: StaticPred, DynamicPred (what the indexes
        use, docs/design/semantics.md#indexes-and-state-merging) or ComplexPred."""
        left, right, op = c.left, c.right, c.op
        if isinstance(right, Ref) and right.source == "EV" and not (isinstance(left, Ref) and left.source == "EV"):
            left, right, op = right, left, _FLIP[op]
        if isinstance(left, Ref) and left.source == "EV":
            if isinstance(right, Ref) and right.source == "NODE":
                return DynamicAtom(left.name, op, right.name)
            if isinstance(right, Literal):
                col_type = self.union.type_of(left.name)
                if right.type == col_type or (right.type, col_type) == ("int", "float"):
                    return StaticAtom(left.name, op, _const_text(right.value))
        return ComplexAtom(Compare(op, left, right, c.line, c.column))

    def type_guard(self, t: str) -> StaticAtom:
        return StaticAtom(self.union.type_col, "=", t)

    def window(self) -> list:
        w = self.plan.window
        if w is None:
            return []
        return [DurationAtom("COMPOSITE", self.window_op, float(w - 1 if self.end is not None else w))]


def _rank(a) -> tuple:
    """Atoms that cannot fail first, so that Python's short-circuit never
    evaluates an expression that may fail on an event of another type."""
    if isinstance(a, ComplexAtom):
        return (2 if risky(a.expr) else 1,)
    return (0,)


def _dedup(atoms: list) -> list:
    out: list = []
    for a in atoms:
        if a not in out:
            out.append(a)
    return out


def _pred(clauses: list[list]) -> Predicate:
    if any(not c for c in clauses):
        return TRUE
    return Predicate(tuple(Clause(tuple(c)) for c in clauses))


# --------------------------------------------------------------------------- the main automaton


def main_automaton(plan: Plan, union: Union) -> Automaton:
    ed = _Edges(plan, union)
    pos = plan.positives
    m = len(pos)
    end_neg = ed.end
    out_schema = tuple(Attribute(n, t) for n, _, t in plan.returns)
    states: dict[str, dict] = {}
    order: list[str] = []

    def state(sid: str, schema, filt, forwards, outputs=()):
        order.append(sid)
        states[sid] = dict(schema=schema, filter=filt, forwards=forwards, outputs=outputs)

    out_id = "out"

    def dest_of(j: int) -> str:
        """Where an event of positive j (from 0) leads."""
        if j < m - 1:
            return f"s{j}"
        return "E" if end_neg is not None else out_id

    def edges_into(j: int, prev_guard: list) -> list[Edge]:
        """Forward edges taking an event of positive j, from state s_{j-1} (or START)."""
        c = pos[j]
        d = dest_of(j)
        edges = []
        for t in c.types:
            clauses = ed.predicate(plan.at[j], c, t, [ed.type_guard(t)] + prev_guard)
            if d == out_id:
                smap = ed.returns(c, t)
            else:
                smap = ed.smap(ed.schema(j), c, t)
            if clauses:
                edges.append(Edge(d, _pred(clauses), smap))
        return edges

    start_edges = edges_into(0, [])
    state("START", (), None, start_edges)
    for j in range(m - 1):
        nxt = pos[j + 1]
        neg = plan.negative_at(j)
        schema = ed.schema(j)
        win = ed.window()
        theta: list[list] = []
        for t in nxt.types:
            safe = [e for e in plan.at[j + 1] if not risky(e)]
            theta += ed.predicate(safe, nxt, t, [ed.type_guard(t)] + win)
        kills: dict[str, list[list]] = {}
        if neg is not None:
            for t in neg.types:
                kills[t] = ed.predicate(plan.kill[neg.index], neg, t, [ed.type_guard(t)] + win)
                theta += kills[t]
        stay = _stay(ed, plan, nxt, neg, union, theta)
        if stay is not None:
            theta, stay_clauses = stay
        else:
            stay_clauses = [[ed.type_guard(t)] for t in nxt.types if neg is None or t not in neg.types]
            for t in (neg.types if neg is not None else ()):
                if t in nxt.types:
                    stay_clauses += ed.predicate(plan.kill[neg.index], neg, t, [ed.type_guard(t)], negated=True)
            if neg is None:
                stay_clauses = [[]]
        forwards = edges_into(j + 1, win)
        if stay_clauses:
            forwards.append(Edge(f"s{j}", _pred(stay_clauses), ed.smap(schema, None, None)))
        state(f"s{j}", schema, _pred(theta) if theta else Predicate(()), forwards)
    if end_neg is not None:
        schema = ed.schema(m - 1)
        horizon = float(plan.window - 1)  # type: ignore[operator]
        theta = []
        for t in end_neg.types:
            theta += ed.predicate(plan.kill[end_neg.index], end_neg, t,
                                  [ed.type_guard(t), DurationAtom("COMPOSITE", "<=", horizon)])
        after = [DurationAtom("COMPOSITE", ">", horizon)]
        theta.append(after)
        state("E", schema, _pred(theta), [Edge(out_id, _pred([after]), ed.returns(None, None))])
    state(out_id, out_schema, None, [], (OutputStream(plan.output, "OUT"),))
    ids = {sid: str(k) for k, sid in enumerate(order)}
    built = []
    for sid in order:
        s = states[sid]
        fw = tuple(Edge(ids[e.destination], e.predicate, e.schema_map) for e in s["forwards"])
        is_start = sid == "START"
        stream = None if sid == out_id else union.name
        built.append(State(ids[sid], is_start, stream, s["schema"], None if is_start or stream is None else
                           s["filter"], None, fw, s["outputs"]))
    return Automaton(tuple(built), plan.output)


def _stay(ed: _Edges, plan: Plan, nxt: Comp, neg: Comp | None, union: Union, theta: list[list]):
    """An index-friendly filter for a state whose exact filter has several
    clauses: when every clause holds the same ``e.a = I.b`` (an equivalence
    test) and the negated component's conditions cannot fail, the filter is
    that common part alone (one clause: the engine's AI index finds the
    instances of the event's key), and the stay edge is taken exactly when the
    event does not stop the match: every event of the key re-creates the
    instance, which changes nothing else (docs/design/sase.md#indexes).
    Returns (filter clauses, stay clauses), or None to keep the exact filter."""
    if len(theta) < 2:
        return None
    common = [a for a in theta[0] if all(a in c for c in theta[1:])]
    if not any(isinstance(a, DynamicAtom) and a.op == "=" for a in common):
        return None
    kill = plan.kill[neg.index] if neg is not None else []
    if any(risky(e) for e in kill):
        return None
    stay: list[list] = []
    for t in union.streams:
        if neg is None or t not in neg.types:
            stay.append([ed.type_guard(t)])
        else:
            stay += ed.predicate(kill, neg, t, [ed.type_guard(t)], negated=True)
    if neg is None:
        stay = [[]]
    return [common], stay


def compile_plan(plan: Plan, prefix: str) -> tuple[tuple[Automaton, ...], dict[str, StreamSchema]]:
    """The automata of ``plan`` (republishers first, the main automaton last) and
    the schemas of the streams they publish."""
    union = Union(f"{prefix}__u", plan.streams)
    autos = [union.republisher(s, prefix) for s in plan.streams]
    main = main_automaton(plan, union)
    autos.append(main)
    schemas = {union.name: StreamSchema(union.name, union.schema),
               plan.output: StreamSchema(plan.output, tuple(Attribute(n, t) for n, _, t in plan.returns))}
    return tuple(autos), schemas


__all__ = ["compile_plan", "Union", "MAX_CLAUSES"]
