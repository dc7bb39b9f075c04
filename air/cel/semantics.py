"""Semantic analysis of CEL: names, types, renaming, invariants.

:func:`analyze` checks a parsed :class:`~air.cel.ast.Query` against declared
stream schemas and returns a *logical plan*: a small tree of :class:`Scan`,
:class:`Select`, :class:`Where`, :class:`Seq` (NEXT), :class:`Iter` (FOLD)
and :class:`Publish` nodes, each with its output schema. Expressions in the
plan are :mod:`air.expr` trees whose references are resolved and typed:

* ``Ref(a, "IN")``: attribute ``a`` of the single input (SELECT, FILTER);
* ``Ref(a, "1")`` / ``Ref(a, "2")``: first / second input of NEXT or FOLD;
* ``Ref(a, "LAST")``: the last iteration's value of ``a`` inside FOLD;
* :class:`Duration`: ``DUR``, always the left operand of a comparison with a
  numeric literal already converted to the configured time unit.

Renaming (docs/design/semantics.md#cel): in ``R NEXT S`` every attribute ``a`` of R becomes
``a_1`` when R and S share any name; in ``R FOLD S`` shared attributes keep
R's value as ``a_1`` and the last iteration's as ``a``. A remaining duplicate
is a :class:`CelSchemaError`, as is a violated FOLD schema inclusion.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Mapping, Union

from air.cel import ast
from air.cel.errors import CelError, CelNameError, CelSchemaError, CelTypeError
from air.expr import FLIPPED, And, Binary, Call, Compare, Dur, Expr, Literal, Or, Ref, Unary
from air.model import Attribute, StreamSchema, normalize_type

#: Milliseconds per canonical time unit (see :data:`air.cel.parser.UNITS`).
UNIT_MS: dict[str, float] = {"MS": 1.0, "SEC": 1e3, "MIN": 60e3, "HOUR": 3600e3, "DAY": 86400e3}

#: Built-in functions: argument types and return type.
BUILTINS: dict[str, tuple[tuple[str, ...], str]] = {
    "CONTAINS": (("string", "string"), "int"),
    "SIMILARITY": (("string", "string"), "float"),
}

#: A stream that need not be declared: no attributes (``SELECT 0 AS x FROM DUAL``).
DUAL = StreamSchema("DUAL", ())

NUMERIC = ("int", "float")
_POS = dict(default=0, compare=False, repr=False)


def dur_constant(value: int | float, unit: str, time_unit_ms: float) -> int | float:
    """A DUR constant written with ``unit``, in units of ``time_unit_ms``
    milliseconds (an int when it is a whole number)."""
    v = value * UNIT_MS[unit] / time_unit_ms
    return int(v) if float(v).is_integer() else v


@dataclass(frozen=True, slots=True)
class Duration:
    """DUR after analysis. ``of="RESULT"``: the duration of the operator's
    result (in FILTER the filtered event, in NEXT/FOLD the composite being
    built); ``of="EVENT"``: the second input's event (``$2.DUR``)."""

    of: str
    line: int = field(**_POS)
    column: int = field(**_POS)


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    expr: Expr


@dataclass(frozen=True, slots=True)
class Scan:
    stream: str
    schema: tuple[Attribute, ...]


@dataclass(frozen=True, slots=True)
class Select:
    input: "Plan"
    columns: tuple[Column, ...]

    @property
    def schema(self) -> tuple[Attribute, ...]:
        return tuple(Attribute(c.name, c.type) for c in self.columns)


@dataclass(frozen=True, slots=True)
class Where:
    input: "Plan"
    pred: Expr

    @property
    def schema(self) -> tuple[Attribute, ...]:
        return self.input.schema


@dataclass(frozen=True, slots=True)
class Seq:
    """``left NEXT{pred} right``; ``left_names[i]`` is the output name of the
    i-th attribute of ``left`` (``a`` or ``a_1``)."""

    left: "Plan"
    right: "Plan"
    pred: Expr | None
    left_names: tuple[str, ...]
    schema: tuple[Attribute, ...]
    #: position of the NEXT keyword (air/boundwarn.py points there)
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Iter:
    """``left FOLD{cond, rebind, aggs} right``. ``shared`` are the names in
    both inputs; ``aggs`` maps target names (attributes of ``left``) to
    expressions over ``"1"``, ``"2"`` and ``"LAST"``."""

    left: "Plan"
    right: "Plan"
    cond: Expr | None
    rebind: Expr | None
    aggs: tuple[Column, ...]
    shared: frozenset[str]
    schema: tuple[Attribute, ...]
    #: position of the FOLD keyword (air/boundwarn.py points there)
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Publish:
    """A nested sub-query with its own PUBLISH: its output is a stream."""

    input: "Plan"
    name: str

    @property
    def schema(self) -> tuple[Attribute, ...]:
        return self.input.schema


Plan = Union[Scan, Select, Where, Seq, Iter, Publish]


# --------------------------------------------------------------------------- scopes


@dataclass(frozen=True, slots=True)
class _Scope:
    """What names an expression can see. ``inputs`` maps a decorator
    ("1", "2", "LAST") to that input's attribute types; bare names are looked
    up in ``bare`` (decorators, in order); ``resolved`` says which source a
    decorator's references get in the plan."""

    context: str
    inputs: Mapping[str, Mapping[str, str]]
    bare: tuple[str, ...]
    resolved: Mapping[str, str]
    decorators_ok: bool = True
    dur: Mapping[str, str] = field(default_factory=dict)  # decorator of DUR -> Duration.of


_DECORATOR_TEXT = {"1": "$1", "2": "$2", "LAST": "$"}
_INPUT_TEXT = {"1": "the first input", "2": "the second input", "LAST": "the last iteration"}


def _types(schema: tuple[Attribute, ...]) -> dict[str, str]:
    return {a.name: a.type for a in schema}


def _single(schema, context: str, decorators_ok: bool = True) -> _Scope:
    return _Scope(context, {"1": _types(schema)}, ("1",), {"1": "IN"}, decorators_ok,
                  {"": "RESULT", "1": "RESULT"})


def _binary(left, right, context: str, last: Mapping[str, str] | None = None) -> _Scope:
    inputs = {"1": _types(left), "2": _types(right)}
    if last is not None:
        inputs["LAST"] = last
    return _Scope(context, inputs, ("1", "2"), {"1": "1", "2": "2", "LAST": "LAST"}, True,
                  {"": "RESULT", "2": "EVENT"})


def _hint(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not close:
        low = [c for c in candidates if c.lower() == name.lower()]
        close = low[:1]
    return f"; did you mean '{close[0]}'?" if close else ""


def _a(t: str) -> str:
    return ("an " if t[0] in "aeiou" else "a ") + t


def _listing(names) -> str:
    names = list(names)
    return ", ".join(names) if names else "no attributes"


# --------------------------------------------------------------------------- analyzer


class Analyzer:
    """Checks one query. Raises the first :class:`CelError` found, or with
    ``collect`` set, records errors in predicates and SELECT columns there and
    goes on with the next comparison or column (for "validate": every error
    at once); the plan is then meaningless and only the errors count."""

    collect: list | None = None

    def __init__(self, streams: Mapping[str, StreamSchema], source: str = "",
                 functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0) -> None:
        self.streams = streams
        self.source = source
        self.functions: dict[str, tuple[tuple[str, ...] | None, str]] = {
            k: (args, ret) for k, (args, ret) in BUILTINS.items()}
        for name, ret in (functions or {}).items():
            self.functions[name.upper()] = (None, normalize_type(ret))
        if time_unit_ms <= 0:
            raise ValueError("time_unit_ms must be positive")
        self.time_unit_ms = time_unit_ms
        self.published: list[tuple[str, ast.Query]] = []
        self.read: set[str] = set()

    def error(self, cls: type[CelError], message: str, node) -> CelError:
        return cls(message, getattr(node, "line", 0), getattr(node, "column", 0), self.source)

    def _recover(self, exc: CelError) -> None:
        """In collect mode, record ``exc`` (the caller goes on); otherwise raise it."""
        if self.collect is None:
            raise exc
        self.collect.append(exc)

    # ------------------------------------------------------------------ streams

    def query(self, q: ast.Query) -> Plan:
        plan = self.stream(q.source)
        if not (len(q.select) == 1 and isinstance(q.select[0], ast.Star)):
            plan = self.select(q.select, plan)
        return plan

    def stream(self, e: ast.StreamExpr) -> Plan:
        return getattr(self, "_" + type(e).__name__)(e)

    def _StreamRef(self, e: ast.StreamRef) -> Plan:
        schema = self.streams.get(e.name)
        if schema is None and e.name.upper() == "DUAL":
            schema = DUAL
        if schema is None:
            hint = _hint(e.name, self.streams)
            # no near name: it may not be declared yet (the README's Temp), so say how
            todo = "" if hint else "; declare it first (POST /streams on a server, --stream for cayuga run)"
            raise self.error(CelNameError, f"unknown stream '{e.name}'{hint}"
                             f" (declared streams: {_listing(sorted(self.streams)) or 'none'}){todo}", e)
        self.read.add(e.name)
        return Scan(e.name, schema.attributes)

    def _SubQuery(self, e: ast.SubQuery) -> Plan:
        plan = self.query(e.query)
        if e.query.publish is None:
            return plan
        self.published.append((e.query.publish, e.query))
        return Publish(plan, e.query.publish)

    def _Filter(self, e: ast.Filter) -> Plan:
        inp = self.stream(e.input)
        return Where(inp, self.pred(e.pred, _single(inp.schema, "FILTER")))

    def _Next(self, e: ast.Next) -> Plan:
        left, right = self.stream(e.left), self.stream(e.right)
        pred = None if e.pred is None else self.pred(e.pred, _binary(left.schema, right.schema, "NEXT"))
        right_names = {a.name for a in right.schema}
        rename = any(a.name in right_names for a in left.schema)
        left_names = tuple(a.name + "_1" if rename else a.name for a in left.schema)
        schema = tuple(Attribute(n, a.type) for n, a in zip(left_names, left.schema)) + right.schema
        self._unique(schema, e, "NEXT", "after renaming the first input's attributes to *_1")
        return Seq(left, right, pred, left_names, schema, e.line, e.column)

    def _Fold(self, e: ast.Fold) -> Plan:
        left, right = self.stream(e.left), self.stream(e.right)
        ltypes, rtypes = _types(left.schema), _types(right.schema)
        missing = [n for n in rtypes if n not in ltypes]
        if missing:
            raise self.error(CelSchemaError, (
                "FOLD needs the first input to have every attribute of the second "
                f"(schema inclusion); the first input lacks {_listing(missing)}: add them to it "
                "with SELECT ... AS, or drop them from the second input with SELECT"), e)
        shared = frozenset(rtypes)
        running: dict[str, str] = {}
        for n in shared:
            lt, rt = ltypes[n], rtypes[n]
            if lt != rt and not (lt in NUMERIC and rt in NUMERIC):
                raise self.error(CelTypeError, f"FOLD: attribute '{n}' is {lt} in the first input "
                                 f"but {rt} in the second; the iteration needs one type", e)
            running[n] = rt if lt == rt else "float"
        last = {n: running.get(n, t) for n, t in ltypes.items()}
        scope = _binary(left.schema, right.schema, "FOLD", last)
        cond = None if e.cond is None else self.pred(e.cond, scope)
        rebind = None if e.rebind is None else self.pred(e.rebind, scope)
        aggs: list[Column] = []
        for item in e.aggs:
            target = item.alias or ""
            if target not in ltypes:
                raise self.error(CelSchemaError, (
                    f"FOLD aggregate '{target}' must name an attribute of the first input "
                    f"({_listing(ltypes)}); add it there first, e.g. SELECT *, <initial value> "
                    f"AS {target}"), item)
            if any(c.name == target for c in aggs):
                raise self.error(CelSchemaError, f"FOLD computes '{target}' twice", item)
            expr, t = self.value(item.expr, scope)
            want = last[target]
            if not (t == want or (want == "float" and t == "int")):
                raise self.error(CelTypeError, f"FOLD aggregate '{target}' is {want} but its "
                                 f"expression is {t}", item)
            aggs.append(Column(target, want, expr))
        schema = tuple(Attribute(a.name + "_1" if a.name in shared else a.name, a.type)
                       for a in left.schema)
        schema += tuple(Attribute(a.name, running[a.name]) for a in right.schema)
        self._unique(schema, e, "FOLD", "after renaming the first input's shared attributes to *_1")
        return Iter(left, right, cond, rebind, tuple(aggs), shared, schema, e.line, e.column)

    def _unique(self, schema, node, what: str, why: str) -> None:
        seen: set[str] = set()
        for a in schema:
            if a.name in seen:
                raise self.error(CelSchemaError, f"{what} output would have two attributes named "
                                 f"'{a.name}' {why}; rename one of them with SELECT ... AS", node)
            seen.add(a.name)

    def select(self, items, inp: Plan) -> Select:
        scope = _single(inp.schema, "SELECT", decorators_ok=False)
        columns: list[Column] = []
        for item in items:
            if isinstance(item, ast.Star):
                new = [Column(a.name, a.type, Ref(a.name, "IN")) for a in inp.schema]
            else:
                expr, t = self._side(item.expr, scope)
                if t is None:
                    continue
                name = item.alias or (item.expr.name if isinstance(item.expr, Ref) else None)
                if name is None:
                    raise self.error(CelSchemaError, "give this computed column a name with "
                                     "AS, e.g. SELECT Price * 2 AS DoublePrice", item)
                new = [Column(name, t, expr)]
            for c in new:
                if any(c.name == o.name for o in columns):
                    raise self.error(CelSchemaError, f"duplicate output attribute '{c.name}' in "
                                     "SELECT; rename one of them with AS", item)
                columns.append(c)
        return Select(inp, tuple(columns))

    # ------------------------------------------------------------------ expressions

    def pred(self, e: Expr, scope: _Scope) -> Expr:
        """A predicate: AND/OR of comparisons (a bool value ``x`` means ``x = TRUE``)."""
        if isinstance(e, (And, Or)):
            return type(e)(tuple(self.pred(i, scope) for i in e.items), e.line, e.column)
        try:
            return self._atom(e, scope)
        except CelError as exc:
            self._recover(exc)
            return Compare("=", Literal(True, e.line, e.column), Literal(True, e.line, e.column), e.line, e.column)

    def _atom(self, e: Expr, scope: _Scope) -> Expr:
        if isinstance(e, Compare):
            return self._compare(e, scope)
        expr, t = self.value(e, scope)
        if t != "bool":
            raise self.error(CelTypeError, f"a predicate must be a comparison such as "
                             f"Price > 10, not a value of type {t}", e)
        return Compare("=", expr, Literal(True, e.line, e.column), e.line, e.column)

    def _compare(self, e: Compare, scope: _Scope) -> Expr:
        ldur, rdur = self._duration(e.left, scope), self._duration(e.right, scope)
        if ldur and rdur:
            raise self.error(CelTypeError, "compare DUR with a constant, not with DUR", e)
        if ldur or rdur:
            dur, other = (ldur, e.right) if ldur else (rdur, e.left)
            const = self._dur_const(other)
            op = e.op if ldur else FLIPPED[e.op]
            return Compare(op, dur, const, e.line, e.column)
        left, lt = self._side(e.left, scope)
        right, rt = self._side(e.right, scope)
        if lt is None or rt is None:  # collect mode: the side's error is recorded
            return Compare(e.op, left, right, e.line, e.column)
        if not (lt == rt or (lt in NUMERIC and rt in NUMERIC)):
            raise self.error(CelTypeError, f"cannot compare {lt} with {rt}", e)
        if lt == "bool" and e.op not in ("=", "!="):
            raise self.error(CelTypeError, "bool values can only be compared with = or !=", e)
        return Compare(e.op, left, right, e.line, e.column)

    def _side(self, e: Expr, scope: _Scope) -> tuple[Expr, str | None]:
        """One side of a comparison; in collect mode its error is recorded
        (type None) so that the other side is checked too."""
        try:
            return self.value(e, scope)
        except CelError as exc:
            self._recover(exc)
            return e, None

    def _duration(self, e: Expr, scope: _Scope) -> Duration | None:
        if isinstance(e, Dur):
            key = ""
        elif isinstance(e, Ref) and e.name.upper() == "DUR" and e.source is not None:
            key = e.source
        else:
            return None
        if key and key not in scope.inputs:
            raise self.error(CelNameError, self._bad_decorator(key, scope, "DUR"), e)
        if key not in scope.dur:
            where = {"1": "the first input", "LAST": "the last iteration"}[key]
            raise self.error(CelNameError, f"the duration of {where} is not available in "
                             f"{scope.context}; use DUR (the result's duration)"
                             + (" or $2.DUR (the event's)" if "2" in scope.dur else ""), e)
        return Duration(scope.dur[key], e.line, e.column)

    def _dur_const(self, e: Expr) -> Literal:
        if isinstance(e, ast.Quantity):
            return Literal(dur_constant(e.value, e.unit, self.time_unit_ms), e.line, e.column)
        if isinstance(e, Literal) and e.type in NUMERIC:
            return e
        raise self.error(CelTypeError, "DUR must be compared with a number, optionally with a "
                         "unit: e.g. DUR > 10 MIN", e)

    def value(self, e: Expr, scope: _Scope) -> tuple[Expr, str]:
        """Resolve and type a value expression."""
        handler = getattr(self, "_v_" + type(e).__name__, None)
        if handler is None:
            raise self.error(CelTypeError, "expected a value, found a comparison; comparisons "
                             "belong in FILTER, NEXT and FOLD predicates", e)
        return handler(e, scope)

    def _v_Literal(self, e: Literal, scope: _Scope):
        return e, e.type

    def _v_Quantity(self, e: ast.Quantity, scope: _Scope):
        raise self.error(CelTypeError, f"a time unit ({e.unit}) is only allowed on a constant "
                         "compared with DUR, e.g. DUR > 10 MIN", e)

    def _v_Dur(self, e: Dur, scope: _Scope):
        raise self.error(CelTypeError, "DUR can only be compared directly with a constant, "
                         "e.g. DUR > 10 MIN", e)

    _v_Duration = _v_Dur

    def _v_Ref(self, e: Ref, scope: _Scope):
        if e.source is not None and e.name.upper() == "DUR":
            return self._v_Dur(e, scope)  # type: ignore[arg-type]
        if e.source is None:
            found = [d for d in scope.bare if e.name in scope.inputs[d]]
            if len(found) > 1:
                opts = " or ".join(f"{_DECORATOR_TEXT[d]}.{e.name}" for d in found)
                raise self.error(CelNameError, f"attribute '{e.name}' is ambiguous: both inputs "
                                 f"of {scope.context} have it; write {opts}", e)
            if not found:
                every = {n for d in scope.bare for n in scope.inputs[d]}
                listing = "; ".join(f"{_INPUT_TEXT[d] if len(scope.bare) > 1 else 'the input'} "
                                    f"has {_listing(scope.inputs[d])}" for d in scope.bare)
                raise self.error(CelNameError, f"unknown attribute '{e.name}' in {scope.context}"
                                 f"{_hint(e.name, every)} ({listing})", e)
            d = found[0]
        else:
            d = e.source
            if not scope.decorators_ok:
                raise self.error(CelNameError, f"decorators are not allowed in {scope.context}; "
                                 f"write {e.name}", e)
            if d not in scope.inputs:
                raise self.error(CelNameError, self._bad_decorator(d, scope, e.name), e)
            if e.name not in scope.inputs[d]:
                names = scope.inputs[d]
                raise self.error(CelNameError, f"unknown attribute '{_DECORATOR_TEXT[d]}.{e.name}'"
                                 f"{_hint(e.name, names)}: {_INPUT_TEXT[d]} of {scope.context} "
                                 f"has {_listing(names)}", e)
        return Ref(e.name, scope.resolved[d], e.line, e.column), scope.inputs[d][e.name]

    @staticmethod
    def _bad_decorator(d: str, scope: _Scope, name: str) -> str:
        if d == "LAST":
            return f"'$.{name}' (the last iteration) is only valid inside FOLD"
        return (f"'{_DECORATOR_TEXT[d]}.{name}': {scope.context} has a single input; "
                f"write $1.{name} or {name}")

    def _v_Unary(self, e: Unary, scope: _Scope):
        operand, t = self.value(e.operand, scope)
        if t not in NUMERIC:
            raise self.error(CelTypeError, f"cannot negate {_a(t)}", e)
        return Unary(e.op, operand, e.line, e.column), t

    def _v_Binary(self, e: Binary, scope: _Scope):
        left, lt = self.value(e.left, scope)
        right, rt = self.value(e.right, scope)
        for t in (lt, rt):
            if t not in NUMERIC:
                raise self.error(CelTypeError, f"cannot apply '{e.op}' to {_a(t)}; arithmetic "
                                 "needs int or float operands", e)
        if e.op == "%" and (lt, rt) != ("int", "int"):
            raise self.error(CelTypeError, "'%' (remainder) needs int operands", e)
        t = "int" if (lt, rt) == ("int", "int") else "float"
        if e.op == "^" and not (isinstance(right, Literal) and isinstance(right.value, int)
                                and right.value >= 0):
            t = "float"  # int ^ int is an int only for a constant exponent >= 0 (2 ^ -1 = 0.5)
        return Binary(e.op, left, right, e.line, e.column), t

    def _v_Call(self, e: Call, scope: _Scope):
        if e.name not in self.functions:
            raise self.error(CelNameError, f"unknown function {e.name}{_hint(e.name, self.functions)}"
                             f" (available: {', '.join(sorted(self.functions))})", e)
        params, ret = self.functions[e.name]
        args = [self.value(a, scope) for a in e.args]
        if params is not None:
            if len(args) != len(params):
                raise self.error(CelTypeError, f"{e.name} takes {len(params)} arguments "
                                 f"({', '.join(params)}), not {len(args)}", e)
            for i, ((_, t), want) in enumerate(zip(args, params), 1):
                if t != want and not (want in NUMERIC and t in NUMERIC):
                    raise self.error(CelTypeError, f"argument {i} of {e.name} must be {_a(want)}, "
                                     f"not {_a(t)}", e.args[i - 1])
        return Call(e.name, tuple(a for a, _ in args), e.line, e.column), ret

    def _v_And(self, e, scope):
        raise self.error(CelTypeError, "AND/OR are only allowed in predicates", e)

    _v_Or = _v_And


@dataclass(frozen=True, slots=True)
class Analysis:
    plan: Plan
    #: nested ``(SELECT ... PUBLISH X)`` sub-queries, in source order
    published: tuple[str, ...]


def analyze(query: ast.Query, streams: Mapping[str, StreamSchema], *, source: str = "",
            functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
            collect: list | None = None) -> Analysis:
    """Check ``query`` against ``streams`` and return its logical plan. With
    ``collect`` (a list), errors in predicates and SELECT columns are appended
    to it and the analysis goes on; the first other error is raised."""
    an = Analyzer(streams, source, functions, time_unit_ms)
    an.collect = collect
    plan = an.query(query)
    names = [n for n, _ in an.published] + ([query.publish] if query.publish else [])
    seen: set[str] = set()
    for (name, q) in an.published + ([(query.publish, query)] if query.publish else []):
        at = ast.StreamRef(name, q.publish_line, q.publish_column)  # point at the PUBLISH name
        if name in seen:
            raise an.error(CelSchemaError, f"the query publishes '{name}' twice", at)
        if name in an.read:
            raise an.error(CelSchemaError, f"the query reads the stream '{name}' that it "
                           "publishes; give the output another name", at)
        seen.add(name)
    return Analysis(plan, tuple(n for n in names if n != query.publish))


__all__ = ["analyze", "Analysis", "Analyzer", "Plan", "Scan", "Select", "Where", "Seq", "Iter",
           "Publish", "Column", "Duration", "UNIT_MS", "dur_constant", "BUILTINS", "DUAL"]
