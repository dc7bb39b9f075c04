"""CEL -> Cayuga automata (docs/design/semantics.md#automata), following the original compiler's conventions.

A left-associated stream expression becomes one automaton: a START state
reading the leftmost input, one state per NEXT or FOLD, and an end state that
publishes the result. FILTERs and SELECTs are folded into edges:

* a FILTER (or SELECT) on the *right* input of NEXT/FOLD is pushed into that
  state's filter predicate (and the forward map): it selects which events
  are seen at all;
* a FILTER on the *left* side, i.e. on the output of what was built so far,
  becomes a conjunct of the edge that produces that output, never of a filter
  predicate (it must not change which events consume an instance);
* SELECT items become the schema map of the producing edge (``Computed``
  entries for expressions).

Operands that are not left-associated (a NEXT/FOLD on the right of NEXT/FOLD,
a nested sub-query with its own PUBLISH) are compiled into automata of their
own, connected by resubscription through an internal ``RESUB`` stream (or the
published stream, type ``OUT``). The automata are returned in dependency order.

Inside a FOLD state the first input's attributes are stored as ``a_1`` when
the second input shares them (else under their own name), and the running
values of the second input's attributes and of aggregates as ``a_n``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, NamedTuple

from air.cel.errors import CelError, CelSchemaError
from air.cel.parser import parse, parse_all, too_deep
from air.cel.semantics import (Duration, Iter, Plan, Publish, Scan, Select, Seq, Where,
                               analyze)
from air.expr import FLIPPED, And, Compare, Expr, Literal, Or, Ref, transform, walk
from air.model import (TRUE, Attribute, Automaton, Clause, ComplexAtom, Computed, DurationAtom,
                       DynamicAtom, Edge, OutputStream, Predicate, Rename, State, StaticAtom,
                       StreamSchema)
from air.names import name_problem

#: Converting a predicate to DNF may multiply clauses; beyond this it is refused.
MAX_CLAUSES = 256


class Origin(NamedTuple):
    """Which operator of the text made a state: the ``ordinal``-th NEXT or
    FOLD keyword of the text (0 first, in source order; comments and strings
    hold none). Constants do not move it, so a shape's origins hold for every
    query of the shape (air/cel/shapes.py); air/boundwarn.py turns it into a
    line and column."""

    automaton: int  # index in CompiledQuery.automata
    state: str  # State.id
    operator: str  # "NEXT" or "FOLD"
    ordinal: int
    #: NEXT written with a predicate (NEXT{...}), FOLD with a first (filter) predicate
    has_pred: bool


@dataclass(frozen=True, slots=True)
class CompiledQuery:
    automata: tuple[Automaton, ...]
    #: user-visible output streams (nested PUBLISH first, the query's own last)
    outputs: tuple[str, ...]
    #: schema of every stream the query publishes, internal RESUB ones included
    schemas: dict[str, StreamSchema]
    #: the NEXT or FOLD that made each state of a NEXT or FOLD (not part of the automata: equal
    #: queries whose text differs compile to equal CompiledQuery objects)
    origins: tuple[Origin, ...] = field(default=(), compare=False)


# --------------------------------------------------------------------------- predicates


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


def _const_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else repr(v)


def _atom(c: Compare):
    """Classify one comparison over EV/NODE references (docs/design/air-format.md)."""
    left, right, op = c.left, c.right, c.op
    if isinstance(left, Duration):
        return DurationAtom(left.of, op, float(right.value))  # type: ignore[union-attr]
    if isinstance(right, Ref) and right.source == "EV" and not (
            isinstance(left, Ref) and left.source == "EV"):
        left, right, op = right, left, FLIPPED[op]
    if isinstance(left, Ref) and left.source == "EV":
        if isinstance(right, Literal):
            return StaticAtom(left.name, op, _const_text(right.value))
        if isinstance(right, Ref) and right.source == "NODE":
            return DynamicAtom(left.name, op, right.name)
    return ComplexAtom(c)


def make_predicate(conjuncts: Iterable[Expr], source: str = "") -> Predicate:
    """The conjunction of ``conjuncts`` as a DNF :class:`Predicate`."""
    clauses: list[list[Compare]] = [[]]
    for e in conjuncts:
        clauses = [a + b for a in clauses for b in _dnf(e)]
        if len(clauses) > MAX_CLAUSES:
            raise CelSchemaError(f"this predicate has more than {MAX_CLAUSES} clauses in "
                                 "disjunctive normal form; simplify its AND/OR structure",
                                 getattr(e, "line", 0), getattr(e, "column", 0), source)
    out = []
    for clause in clauses:
        atoms = []
        for c in clause:
            a = _atom(c)
            if a not in atoms:
                atoms.append(a)
        out.append(Clause(tuple(atoms)))
    return Predicate(tuple(out)) if out != [Clause()] else TRUE


def _computable(exprs: Iterable[Expr]) -> tuple[Expr, ...]:
    """``e = e`` for each computed ``e`` (not a reference or a literal): a
    conjunct that holds exactly where ``e`` can be computed, since an
    expression that fails makes its predicate false
    (docs/design/semantics.md#expressions-and-functions)."""
    return tuple(Compare("=", e, e, e.line, e.column) for e in exprs if not isinstance(e, (Ref, Literal)))


def _schema_map(columns: Iterable[tuple[str, Expr]]) -> tuple:
    return tuple(Rename(e.source, e.name, name) if isinstance(e, Ref) and e.source in ("EV", "NODE")
                 else Computed(e, name) for name, e in columns)


def _subst(e: Expr, refs: Mapping[tuple[str, str], Expr], durations: Mapping[str, str]) -> Expr:
    """Replace plan references ``Ref(a, src)`` by ``refs[(src, a)]`` and
    ``Duration(of)`` by ``Duration(durations[of])`` (EVENT or COMPOSITE)."""
    def fn(x: Expr):
        if isinstance(x, Ref):
            return refs[(x.source, x.name)]
        if isinstance(x, Duration):
            return Duration(durations[x.of], x.line, x.column)
        return None
    return transform(e, fn)


# --------------------------------------------------------------------------- builders


@dataclass
class _StateB:
    id: str
    is_start: bool
    input_stream: str | None
    schema: tuple[Attribute, ...] = ()
    filter: Predicate | None = None
    rebind: Edge | None = None
    forwards: list[Edge] = field(default_factory=list)
    outputs: tuple[OutputStream, ...] = ()
    #: (operator, line, column, has_pred) of the NEXT or FOLD that made this state
    origin: tuple[str, int, int, bool] | None = None

    def freeze(self) -> State:
        return State(self.id, self.is_start, self.input_stream, self.schema, self.filter,
                     self.rebind, tuple(self.forwards), self.outputs)


@dataclass
class _AutomatonB:
    states: list[_StateB] = field(default_factory=list)

    def state(self, input_stream: str | None, schema=(), is_start: bool = False) -> _StateB:
        s = _StateB(str(len(self.states)), is_start, input_stream, tuple(schema),
                    None if is_start or input_stream is None else TRUE)
        self.states.append(s)
        return s


@dataclass
class _Open:
    """An automaton under construction whose result is produced by an edge
    (not yet added) leaving ``src``: it exists when ``guard`` holds and has
    the values ``columns`` (expressions over EV and NODE of ``src``)."""

    ab: _AutomatonB
    src: _StateB
    guard: tuple[Expr, ...]
    columns: tuple[tuple[str, Expr], ...]
    composite: bool  # the result spans several events (src is not the START state)

    def refs(self, source: str = "IN") -> dict[tuple[str, str], Expr]:
        return {(source, n): e for n, e in self.columns}


@dataclass(frozen=True, slots=True)
class _Simple:
    """A right operand that reads one stream directly: the stream, the
    conditions an event must meet, and the operand's attributes as
    expressions over EV."""

    stream: str
    conds: tuple[Expr, ...]
    columns: tuple[tuple[str, Expr], ...]

    def refs(self, source: str) -> dict[tuple[str, str], Expr]:
        return {(source, n): e for n, e in self.columns}


class _Compiler:
    def __init__(self, prefix: str, source: str) -> None:
        self.prefix = prefix
        self.source = source
        self.automata: list[Automaton] = []
        self.schemas: dict[str, StreamSchema] = {}
        self.published: list[str] = []
        self._internal = itertools.count(1)
        #: (automaton index, state id, operator, line, column, has_pred) of each NEXT and FOLD state
        self.origins: list[tuple[int, str, str, int, int, bool]] = []

    def emit(self, plan: Plan, name: str, kind: str) -> None:
        """Compile ``plan`` into automata whose last one publishes ``name``."""
        o = self.open(plan)
        schema = tuple(Attribute(a.name, a.type) for a in plan.schema)
        end = o.ab.state(None, schema)
        end.outputs = (OutputStream(name, kind),)  # type: ignore[arg-type]
        o.src.forwards.append(Edge(end.id, make_predicate(o.guard, source=self.source),
                                   _schema_map(o.columns)))
        self.origins.extend((len(self.automata), s.id, *s.origin) for s in o.ab.states if s.origin)
        self.automata.append(Automaton(tuple(s.freeze() for s in o.ab.states), name))
        self.schemas[name] = StreamSchema(name, schema)
        if kind == "OUT":
            self.published.append(name)

    def _as_stream(self, plan: Plan) -> Scan:
        """Compile ``plan`` separately; return a scan of its output stream."""
        if isinstance(plan, Publish):
            self.emit(plan.input, plan.name, "OUT")
            return Scan(plan.name, plan.schema)
        name = f"{self.prefix}__{next(self._internal)}"
        self.emit(plan, name, "RESUB")
        return Scan(name, plan.schema)

    # ------------------------------------------------------------------ left spine

    def open(self, plan: Plan) -> _Open:
        return getattr(self, "_open_" + type(plan).__name__)(plan)

    def _open_Scan(self, p: Scan) -> _Open:
        ab = _AutomatonB()
        start = ab.state(p.stream, is_start=True)
        return _Open(ab, start, (), tuple((a.name, Ref(a.name, "EV")) for a in p.schema), False)

    def _open_Publish(self, p: Publish) -> _Open:
        return self.open(self._as_stream(p))

    def _open_Select(self, p: Select) -> _Open:
        o = self.open(p.input)
        refs = o.refs()
        # a computed column this SELECT drops is still computed: an event for which it fails
        # is not in its input (docs/design/semantics.md#arithmetic-and-comparison), as when the
        # input is compiled apart (a PUBLISH); the edge that makes the result holds only where it
        # can be (a failing expression makes that predicate false)
        used = {x.name for c in p.columns for x in walk(c.expr) if isinstance(x, Ref)}
        return replace(o, guard=o.guard + _computable(e for n, e in o.columns if n not in used),
                       columns=tuple((c.name, _subst(c.expr, refs, {})) for c in p.columns))

    def _open_Where(self, p: Where) -> _Open:
        o = self.open(p.input)
        kind = "COMPOSITE" if o.composite else "EVENT"
        return replace(o, guard=o.guard + (_subst(p.pred, o.refs(), {"RESULT": kind}),))

    def _open_Seq(self, p: Seq) -> _Open:
        o = self.open(p.left)
        r = self.simple(p.right)
        types = [a.type for a in p.left.schema]
        q = o.ab.state(r.stream, (Attribute(n, t) for n, t in zip(p.left_names, types)))
        o.src.forwards.append(Edge(q.id, make_predicate(o.guard, source=self.source), _schema_map(
            (n, e) for n, (_, e) in zip(p.left_names, o.columns))))
        refs = {("1", a): Ref(n, "NODE") for (a, _), n in zip(o.columns, p.left_names)}
        refs.update(r.refs("2"))
        durations = {"RESULT": "COMPOSITE", "EVENT": "EVENT"}
        pred = () if p.pred is None else (_subst(p.pred, refs, durations),)
        q.filter = make_predicate(pred + r.conds, source=self.source)
        q.origin = ("NEXT", p.line, p.column, p.pred is not None)
        columns = tuple((n, Ref(n, "NODE")) for n in p.left_names) + r.columns
        return _Open(o.ab, q, (), columns, True)

    def _open_Iter(self, p: Iter) -> _Open:
        o = self.open(p.left)
        r = self.simple(p.right)
        first, second = dict(o.columns), dict(r.columns)
        aggs = {c.name: c.expr for c in p.aggs}
        updated = [a for a in first if a in aggs and a not in p.shared]  # first-only aggregates
        # slot[a]: where the first input's a is stored (a_1 when the second input shares it,
        # else a_n as the original compiler named it); run[b]: the running value of b
        slot = {a: a + "_1" for a in first if a in p.shared}
        taken = set(slot.values())

        def fresh(base: str) -> str:
            name = base + "_n"
            while name in taken:
                name += "_n"
            taken.add(name)
            return name

        slot.update({a: fresh(a) for a in first if a not in p.shared})
        run = {b: fresh(b) for b in second}
        run.update({a: slot[a] for a in updated})
        # $1.a of a first-only aggregate is the first input's value, not the running one
        # (docs/design/semantics.md#decorators-and-renaming): kept in a slot of its own when
        # read, which the original compiler never did (it had no query that reads it)
        read = {x.name for e in (p.cond, p.rebind, *aggs.values()) if e is not None
                for x in walk(e) if isinstance(x, Ref) and x.source == "1"}
        kept = {a: fresh(a + "_1") for a in updated if a in read}
        types = {a.name: a.type for a in p.left.schema}
        types.update({a.name: a.type for a in p.schema if a.name in second})
        q = o.ab.state(r.stream, [Attribute(slot[a], types[a]) for a in first]
                       + [Attribute(run[b], types[b]) for b in second]
                       + [Attribute(kept[a], types[a]) for a in kept])
        init = ([(slot[a], e) for a, e in first.items()] + [(run[b], first[b]) for b in second]
                + [(kept[a], first[a]) for a in kept])
        o.src.forwards.append(Edge(q.id, make_predicate(o.guard, source=self.source), _schema_map(init)))

        refs = {("1", a): Ref(kept.get(a, slot[a]), "NODE") for a in first}
        refs.update({("LAST", a): Ref(run.get(a, slot[a]), "NODE") for a in first})
        refs.update(r.refs("2"))
        durations = {"RESULT": "COMPOSITE", "EVENT": "EVENT"}

        def sub(e: Expr) -> Expr:
            return _subst(e, refs, durations)

        value = {a: sub(aggs[a]) if a in aggs else second[a] for a in run}  # after this event
        cond = () if p.cond is None else (sub(p.cond),)
        q.filter = make_predicate(cond + r.conds, source=self.source)
        q.origin = ("FOLD", p.line, p.column, p.cond is not None)
        rebind = () if p.rebind is None else (sub(p.rebind),)
        q.rebind = Edge(q.id, make_predicate(rebind, source=self.source), _schema_map(
            [(slot[a], value[a] if a in updated else Ref(slot[a], "NODE")) for a in first]
            + [(run[b], value[b]) for b in second] + [(kept[a], Ref(kept[a], "NODE")) for a in kept]))
        columns = [(slot[a] if a in p.shared else a, value[a] if a in updated else Ref(slot[a], "NODE"))
                   for a in first]
        return _Open(o.ab, q, (), tuple(columns) + tuple((b, value[b]) for b in second), True)

    # ------------------------------------------------------------------ right operands

    def simple(self, plan: Plan) -> _Simple:
        """``plan`` as a right operand; anything but SELECTs and FILTERs over one
        stream is compiled separately (resubscription) and read as a stream."""
        bottom = plan
        while isinstance(bottom, (Select, Where)):
            bottom = bottom.input
        if not isinstance(bottom, Scan):
            plan = self._as_stream(plan)
        if isinstance(plan, Scan):
            return _Simple(plan.stream, (), tuple((a.name, Ref(a.name, "EV")) for a in plan.schema))
        if isinstance(plan, Select):
            s = self.simple(plan.input)
            refs = s.refs("IN")
            columns = tuple((c.name, _subst(c.expr, refs, {})) for c in plan.columns)
            # an event whose computed column fails is not in this operand's stream (as when the
            # operand is compiled apart): it must not affect an instance, so the filter holds
            # only where every column can be computed
            return replace(s, conds=s.conds + _computable(e for _, e in columns), columns=columns)
        if isinstance(plan, Where):
            s = self.simple(plan.input)
            return replace(s, conds=s.conds + (_subst(plan.pred, s.refs("IN"), {"RESULT": "EVENT"}),))
        raise AssertionError(plan)


# --------------------------------------------------------------------------- entry points


def _schemas(streams) -> Mapping[str, StreamSchema]:
    if isinstance(streams, Mapping):
        return streams  # only read (a server passes a live view of many streams: no copy)
    return {s.name: s for s in streams}


def _check_made_names(automata) -> None:
    """Attribute names the compiler makes (``Price_1``, ``cnt_n``) follow the
    name rule too (air/names.py): a name near the length limit can outgrow it."""
    for a in automata:
        for s in a.states:
            for attr in s.schema:
                problem = name_problem(attr.name, what="attribute name")
                if problem is not None:
                    raise CelSchemaError(f"{problem} (the compiler makes it from a shorter name of the query by "
                                         "adding _1 or _n: shorten that name or rename it with AS)")


def compile_cel(text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
                functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
                name_prefix: str | None = None) -> CompiledQuery:
    """Compile one CEL query into automata.

    ``streams`` declares the readable streams; ``functions`` maps the names of
    user functions to their return types; DUR constants with a unit are
    converted into units of ``time_unit_ms`` milliseconds. A query without
    PUBLISH outputs ``name_prefix`` (default ``"Q"``); internal streams are
    named ``<prefix>__<n>``. Raises a :class:`CelError` for any user error.

    >>> from air.model import parse_stream_decl
    >>> q = compile_cel("SELECT Name FROM FILTER{Price > 10}(Stock) PUBLISH Cheap",
    ...                 [parse_stream_decl("Stock(Name string, Price float)")])
    >>> q.outputs, [len(a.states) for a in q.automata]
    (('Cheap',), [2])
    """
    query = parse(text)
    try:
        analysis = analyze(query, _schemas(streams), source=text, functions=functions,
                           time_unit_ms=time_unit_ms)
        out = query.publish or name_prefix or "Q"
        c = _Compiler(name_prefix or out, text)
        c.emit(analysis.plan, out, "OUT")
    except RecursionError:  # e.g. 1 + 1 + ... ten thousand times: a tree too deep to walk
        raise too_deep(text) from None
    _check_made_names(c.automata)
    return CompiledQuery(tuple(c.automata), tuple(c.published), c.schemas, _origins(c.origins))


def _origins(found: list[tuple[int, str, str, int, int, bool]]) -> tuple[Origin, ...]:
    """Each NEXT and FOLD of the text makes exactly one state: the rank of its
    keyword's position among them all is its ordinal."""
    rank = {pos: k for k, pos in enumerate(sorted((line, col) for _, _, _, line, col, _ in found))}
    return tuple(Origin(a, sid, op, rank[(line, col)], has_pred) for a, sid, op, line, col, has_pred in found)


def validate(text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
             functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
             max_errors: int = 10) -> list[CelError]:
    """Every syntax error (up to ``max_errors``), or else every name and type
    error in predicates and SELECT columns (and the first error of any other
    kind), in source order, or ``[]`` when the query compiles."""
    query, errors = parse_all(text, max_errors)
    if errors:
        return errors
    found: list[CelError] = []
    try:
        analyze(query, _schemas(streams), source=text, functions=functions, time_unit_ms=time_unit_ms,
                collect=found)
    except CelError as e:
        found.append(e)
    except RecursionError:
        found.append(too_deep(text))
    if found:
        found.sort(key=lambda e: (e.line, e.column))
        return found[:max_errors]
    try:
        compile_cel(text, streams, functions=functions, time_unit_ms=time_unit_ms)
    except CelError as e:
        return [e]
    return []


__all__ = ["compile_cel", "validate", "CompiledQuery", "Origin", "make_predicate", "MAX_CLAUSES"]
