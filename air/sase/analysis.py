"""Checking a SASE query and planning its automata (docs/design/sase.md).

:func:`analyze` resolves the event types and variables, types every
condition and RETURN value, expands equivalence tests, and sorts the WHERE
clause's conjuncts the way the SASE paper defines their meaning: a conjunct over
positive components only is a condition on the match, tested when its last
component's event arrives; a conjunct over one negated component (and positive
components before it) says which events of that component's types stop the
match. What the automata cannot compute exactly is refused here, with the
reason (:class:`SaseRefused`, docs/design/sase.md#what-is-refused-and-why).

In the :class:`Plan`, a reference to an attribute is ``Ref(attr, source=k)``
with ``k`` the component's position in SEQ as a string ("0", "1", ...).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from air.cel.semantics import BUILTINS, dur_constant
from air.expr import And, Binary, Call, Compare, Expr, Literal, Or, Ref, Unary, walk
from air.model import StreamSchema, normalize_type
from air.names import name_problem
from air.sase import ast
from air.sase.errors import SaseError, SaseNameError, SaseRefused, SaseSyntaxError, SaseTypeError

NUMERIC = ("int", "float")


@dataclass
class Comp:
    """A component of SEQ, resolved."""

    index: int  # position in SEQ, from 0
    negated: bool
    types: tuple[str, ...]  # stream names, in the order written
    var: str  # the variable as written, or x<k> (k from 1) when none is given
    node: ast.Component
    #: attribute -> its type (the same in every one of the component's types that has it)
    attrs: dict[str, str] = field(default_factory=dict)
    #: attribute -> the types (streams) of the component that have it
    has: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ordinal: int = -1  # positives: which positive component (from 0)
    gap: int = -1  # negatives: the ordinal of the positive component just before it
    end: bool = False  # negatives: a negated end (no positive component after it)

    @property
    def any_(self) -> bool:
        return len(self.types) > 1


@dataclass
class Plan:
    """What the compiler (air/sase/compiler.py) builds automata from."""

    text: str
    comps: list[Comp]
    positives: list[Comp]
    #: WITHIN in stream time units (None: no window)
    window: int | float | None
    #: positive ordinal -> conjuncts tested when that component's event arrives
    at: dict[int, list[Expr]]
    #: negated component index -> the comparisons an event of its types must meet to stop a match
    kill: dict[int, list[Compare]]
    #: the output's columns: (name, value, type)
    returns: list[tuple[str, Expr, str]]
    #: every stream the query reads, in order of first mention
    streams: dict[str, StreamSchema]
    output: str
    line: int
    column: int

    def negative_at(self, gap: int, end: bool = False) -> Comp | None:
        for c in self.comps:
            if c.negated and c.gap == gap and c.end == end:
                return c
        return None


def hint(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not close:
        close = [c for c in candidates if c.lower() == name.lower()][:1]
    return f"; did you mean '{close[0]}'?" if close else ""


def risky(e: Expr) -> bool:
    """Whether evaluating ``e`` may fail at run time (arithmetic that overflows or
    divides by zero, a function call: docs/design/semantics.md#arithmetic-and-comparison).
    A comparison of attributes and constants cannot: their types are checked here."""
    return any(isinstance(x, (Binary, Unary, Call)) for x in walk(e))


def refs(e: Expr) -> set[int]:
    return {int(x.source) for x in walk(e) if isinstance(x, Ref)}


class _Analyzer:
    def __init__(self, text: str, streams: Mapping[str, StreamSchema], functions: Mapping[str, str] | None,
                 time_unit_ms: float) -> None:
        self.text = text
        self.streams = streams
        self.functions: dict[str, tuple[tuple[str, ...] | None, str]] = dict(BUILTINS)
        for name, ret in (functions or {}).items():
            self.functions[name.upper()] = (None, normalize_type(ret))
        if time_unit_ms <= 0:
            raise ValueError("time_unit_ms must be positive")
        self.time_unit_ms = time_unit_ms
        self.comps: list[Comp] = []
        self.by_var: dict[str, Comp] = {}

    def error(self, cls: type[SaseError], message: str, node) -> SaseError:
        return cls(message, getattr(node, "line", 0), getattr(node, "column", 0), self.text)

    # ------------------------------------------------------------------ components

    def components(self, q: ast.Query) -> None:
        read: dict[str, StreamSchema] = {}
        for k, c in enumerate(q.components):
            for t in c.types:
                sch = self.streams.get(t.name)
                if sch is None:
                    declared = sorted(self.streams)
                    listing = ", ".join(declared[:20]) + (f" and {len(declared) - 20} more" if len(declared) > 20
                                                          else "") if declared else "none"
                    raise self.error(SaseNameError, f"unknown event type '{t.name}'{hint(t.name, declared)} (an "
                                     f"event type is a declared stream; declared: {listing})", t)
                if [u.name for u in c.types].count(t.name) > 1:
                    raise self.error(SaseNameError, f"ANY names '{t.name}' twice", t)
                read.setdefault(t.name, sch)
            comp = Comp(k, c.negated, tuple(t.name for t in c.types), c.var or f"x{k + 1}", c)
            if c.var is not None:
                problem = name_problem(c.var, what="variable name", identifier=True)
                if problem is not None:
                    raise self.error(SaseNameError, problem, _at(c.var_line, c.var_column))
                if c.var in self.by_var:
                    raise self.error(SaseNameError, f"the variable '{c.var}' names two components; give each "
                                     "its own", _at(c.var_line, c.var_column))
                self.by_var[c.var] = comp
            for t in comp.types:
                for a in read[t].attributes:
                    have = comp.attrs.get(a.name)
                    if have is None:
                        comp.attrs[a.name] = a.type
                    elif have != a.type:
                        comp.attrs[a.name] = "clash"
                    comp.has[a.name] = comp.has.get(a.name, ()) + (t,)
            self.comps.append(comp)
        self.read = read
        first = q.components[0]
        if first.negated:
            raise self.error(SaseRefused, "a negated component cannot start the sequence: the SASE paper's negated "
                             "start needs the absence of an event *before* the first match event, and when the "
                             "last event directly follows the first, nothing an earlier event left in the "
                             "automata can stop the report (docs/design/sase.md#what-is-refused-and-why); start "
                             "with a positive component", first)
        for a, b in zip(q.components, q.components[1:]):
            if a.negated and b.negated:
                raise self.error(SaseRefused, "two consecutive components cannot both be negative (the SASE paper's "
                                 "rule); join them with ANY: !ANY(A, B)", b)
        positives = [c for c in self.comps if not c.negated]
        for i, c in enumerate(positives):
            c.ordinal = i
        last = -1
        for c in self.comps:
            if c.negated:
                c.gap = last
                c.end = c.index == len(self.comps) - 1
            else:
                last = c.ordinal
        self.positives = positives

    # ------------------------------------------------------------------ values

    def value(self, e: Expr) -> tuple[Expr, str]:
        """``e`` with its references resolved (source: the component's index), and its type."""
        if isinstance(e, Literal):
            return e, e.type
        if isinstance(e, Ref):
            comp = self.comp_of(e)
            t = comp.attrs.get(e.name)
            if t is None and e.name.lower() in ("t0", "t1"):
                raise self.error(SaseRefused, f"'{comp.var}.{e.name}': an event's timestamp is not a value an "
                                 "automaton can read or store (AIR's schema maps read attributes only); the witness "
                                 "carries t0 (the first event's time) and t1 (the detection time) itself",
                                 e)
            if t is None:
                types = " or ".join(comp.types)
                names = sorted({a for tp in comp.types for a in self.read[tp].names})
                raise self.error(SaseNameError, f"unknown attribute '{comp.var}.{e.name}'{hint(e.name, names)}: "
                                 f"{types} has {', '.join(names) or 'no attributes'}", e)
            if t == "clash":
                raise self.error(SaseTypeError, f"'{comp.var}.{e.name}' has different types in "
                                 f"{', '.join(comp.has[e.name])}: it cannot be used", e)
            return Ref(e.name, str(comp.index), e.line, e.column), t
        if isinstance(e, Unary):
            x, t = self.value(e.operand)
            if t not in NUMERIC:
                raise self.error(SaseTypeError, f"cannot negate {_a(t)}", e)
            return Unary(e.op, x, e.line, e.column), t
        if isinstance(e, Binary):
            (left, lt), (right, rt) = self.value(e.left), self.value(e.right)
            for t in (lt, rt):
                if t not in NUMERIC:
                    raise self.error(SaseTypeError, f"cannot apply '{e.op}' to {_a(t)}; arithmetic needs int or "
                                     "float operands", e)
            if e.op == "%" and (lt, rt) != ("int", "int"):
                raise self.error(SaseTypeError, "'%' (remainder) needs int operands", e)
            t = "int" if (lt, rt) == ("int", "int") else "float"
            if e.op == "^" and not (isinstance(right, Literal) and isinstance(right.value, int) and right.value >= 0):
                t = "float"
            return Binary(e.op, left, right, e.line, e.column), t
        if isinstance(e, Call):
            if e.name not in self.functions:
                raise self.error(SaseNameError, f"unknown function {e.name}{hint(e.name, self.functions)} "
                                 f"(available: {', '.join(sorted(self.functions))})", e)
            params, ret = self.functions[e.name]
            args = [self.value(a) for a in e.args]
            if params is not None:
                if len(args) != len(params):
                    raise self.error(SaseTypeError, f"{e.name} takes {len(params)} arguments "
                                     f"({', '.join(params)}), not {len(args)}", e)
                for i, ((_, t), want) in enumerate(zip(args, params), 1):
                    if t != want and not (want in NUMERIC and t in NUMERIC):
                        raise self.error(SaseTypeError, f"argument {i} of {e.name} must be {_a(want)}, not "
                                         f"{_a(t)}", e.args[i - 1])
            return Call(e.name, tuple(a for a, _ in args), e.line, e.column), ret
        if isinstance(e, ast.Equivalence):
            raise self.error(SaseSyntaxError, "an equivalence test [...] is a condition of its own: join it to "
                             "the others with AND (not OR, not inside a comparison)", e)
        raise self.error(SaseTypeError, "expected a value, found a condition", e)

    def comp_of(self, e: Ref) -> Comp:
        src = e.source or ""
        if src.startswith("$"):
            k = int(src[1:])
            if not 1 <= k <= len(self.comps):
                raise self.error(SaseNameError, f"'{src}' names no component: the sequence has "
                                 f"{len(self.comps)} (write $1 to ${len(self.comps)})", e)
            return self.comps[k - 1]
        comp = self.by_var.get(src)
        if comp is None:
            named = sorted(self.by_var)
            raise self.error(SaseNameError, f"unknown variable '{src}'{hint(src, named)}: name a component "
                             f"after its type, as in SEQ(SHELF x, EXIT z) (variables: {', '.join(named) or 'none'})",
                             e)
        return comp

    def condition(self, e: Expr) -> Expr:
        if isinstance(e, (And, Or)):
            return type(e)(tuple(self.condition(x) for x in e.items), e.line, e.column)
        if isinstance(e, Compare):
            (left, lt), (right, rt) = self.value(e.left), self.value(e.right)
            if not (lt == rt or (lt in NUMERIC and rt in NUMERIC)):
                raise self.error(SaseTypeError, f"cannot compare {lt} with {rt}", e)
            if lt == "bool" and e.op not in ("=", "!="):
                raise self.error(SaseTypeError, "bool values can only be compared with = or !=", e)
            return Compare(e.op, left, right, e.line, e.column)
        if isinstance(e, ast.Equivalence):
            raise self.error(SaseSyntaxError, "an equivalence test [...] is a condition of its own: join it to "
                             "the others with AND, not OR", e)
        if isinstance(e, Literal) and e.type == "bool":
            return Compare("=", e, Literal(True), e.line, e.column)
        raise self.error(SaseTypeError, "expected a condition (a comparison such as x.id = z.id), found a value", e)

    # ------------------------------------------------------------------ WHERE

    def equivalence(self, eq: ast.Equivalence) -> list[Compare]:
        out: list[Compare] = []
        anchor = self.comps[0]
        for a in eq.attrs:
            for c in self.comps:
                if a not in c.attrs:
                    raise self.error(SaseNameError, f"[{a}]: {' or '.join(c.types)} (component {c.index + 1}, "
                                     f"{c.var}) has no attribute '{a}'{hint(a, c.attrs)}", eq)
            if eq.const is not None:
                for c in self.comps:
                    out.append(self._typed_eq(Ref(a, str(c.index), eq.line, eq.column), eq.const, eq))
            else:
                for c in self.comps[1:]:
                    out.append(self._typed_eq(Ref(a, str(anchor.index), eq.line, eq.column),
                                              Ref(a, str(c.index), eq.line, eq.column), eq))
        return out

    def _typed_eq(self, left: Expr, right: Expr, at) -> Compare:
        def typ(x: Expr) -> str:
            if isinstance(x, Literal):
                return x.type
            t = self.comps[int(x.source)].attrs[x.name]
            if t == "clash":
                c = self.comps[int(x.source)]
                raise self.error(SaseTypeError, f"[{x.name}]: '{c.var}.{x.name}' has different types in "
                                 f"{', '.join(c.has[x.name])}", at)
            return t
        lt, rt = typ(left), typ(right)
        if not (lt == rt or (lt in NUMERIC and rt in NUMERIC)):
            raise self.error(SaseTypeError, f"the equivalence test compares {lt} with {rt}", at)
        return Compare("=", left, right, at.line, at.column)

    def where(self, e: Expr | None) -> tuple[dict[int, list[Expr]], dict[int, list[Compare]]]:
        at: dict[int, list[Expr]] = {c.ordinal: [] for c in self.positives}
        kill: dict[int, list[Compare]] = {c.index: [] for c in self.comps if c.negated}
        conjuncts: list[Expr] = []
        for item in (e.items if isinstance(e, And) else (e,) if e is not None else ()):
            if isinstance(item, ast.Equivalence):
                conjuncts.extend(self.equivalence(item))
            else:
                conjuncts.append(self.condition(item))
        for cj in conjuncts:
            used = refs(cj)
            negs = [self.comps[k] for k in sorted(used) if self.comps[k].negated]
            if len(negs) > 1:
                raise self.error(SaseRefused, f"this condition relates two negated components ({negs[0].var} and "
                                 f"{negs[1].var}); the SASE paper gives it no meaning, and each negated component "
                                 "is tested on its own events", cj)
            if not negs:
                last = max((self.comps[k].ordinal for k in used), default=0)
                at[last].append(cj)
                continue
            y = negs[0]
            if not isinstance(cj, Compare):
                raise self.error(SaseRefused, f"a condition on the negated component {y.var} must be one "
                                 "comparison, joined to the others by AND: under OR, the SASE paper's meaning (the "
                                 "WHERE clause in disjunctive normal form, each disjunct's negation tested apart) is "
                                 "'no such event for one disjunct or another', which is not what it reads as; write "
                                 "the alternatives as ANY(...) types or separate queries", cj)
            later = [self.comps[k] for k in sorted(used) if k > y.index]
            if later:
                raise self.error(SaseRefused, f"this condition relates the negated component {y.var} to "
                                 f"{later[0].var}, which comes after it: an automaton would have to remember every "
                                 f"{'/'.join(y.types)} event until {later[0].var} arrives; relate {y.var} to a "
                                 f"component before it (with [attr], {y.var} is compared with the first)", cj)
            nxt = self.next_positive(y)
            if nxt is not None and risky(cj) and set(y.types) & set(nxt.types):
                raise self.error(SaseRefused, f"a condition with arithmetic or a function call on the negated "
                                 f"component {y.var}, whose type is also {nxt.var}'s: the automaton must test "
                                 "that the condition does *not* hold on an event that may continue the match, and "
                                 "the negation of an expression that can fail (docs/design/semantics.md"
                                 "#arithmetic-and-comparison) is not the opposite comparison; compare attributes "
                                 "and constants only here",
                                 next(x for x in walk(cj) if isinstance(x, (Binary, Unary, Call))))
            kill[y.index].append(cj)
        return at, kill

    def next_positive(self, y: Comp) -> Comp | None:
        return next((c for c in self.comps[y.index + 1:] if not c.negated), None)

    # ------------------------------------------------------------------ RETURN

    def returns(self, items: tuple[ast.ReturnItem, ...] | None) -> list[tuple[str, Expr, str]]:
        out: list[tuple[str, Expr, str]] = []
        if items is None:
            for c in self.positives:
                for a in self.read[c.types[0]].names:
                    if len(c.has[a]) == len(c.types) and c.attrs[a] != "clash":
                        out.append((f"{c.var}_{a}", Ref(a, str(c.index)), c.attrs[a]))
            self._check_names(out, None)
            return out
        plain: list[str] = []
        for it in items:
            e, t = self.value(it.expr)
            for r in walk(e):
                if isinstance(r, Ref):
                    c = self.comps[int(r.source)]
                    if c.negated:
                        raise self.error(SaseNameError, f"'{c.var}' is a negated component: it matches no event, "
                                         "so RETURN cannot use it", it)
                    if len(c.has[r.name]) < len(c.types):
                        lack = [tp for tp in c.types if tp not in c.has[r.name]]
                        raise self.error(SaseNameError, f"'{c.var}.{r.name}': {', '.join(lack)} has no attribute "
                                         f"'{r.name}'; RETURN can use only attributes that every type of "
                                         f"ANY({', '.join(c.types)}) has", it)
            if it.name is None and not isinstance(it.expr, Ref):
                raise self.error(SaseNameError, f"name RETURN value {len(out) + 1} with AS, e.g. "
                                 "RETURN x.price * 2 AS doubled", it)
            out.append((it.name, e, t))  # type: ignore[arg-type]
            plain.append(it.expr.name if it.name is None else "")  # type: ignore[union-attr]
        named = []
        for (name, e, t), p in zip(out, plain):
            if name is None:
                c = self.comps[int(e.source)]  # type: ignore[union-attr]
                name = p if plain.count(p) == 1 and p not in [n for n, *_ in out if n] else f"{c.var}_{p}"
            named.append((name, e, t))
        self._check_names(named, items)
        return named

    def _check_names(self, cols, items) -> None:
        seen: set[str] = set()
        for k, (name, _, _) in enumerate(cols):
            at = items[k] if items else None
            problem = name_problem(name, what="output attribute name", identifier=True)
            if problem is not None:
                raise self.error(SaseNameError, problem + " (name it with AS)", at)
            if name in seen:
                raise self.error(SaseNameError, f"two RETURN values are named '{name}'; rename one with AS", at)
            seen.add(name)

    # ------------------------------------------------------------------ WITHIN

    def window(self, w: ast.Within | None) -> int | float | None:
        if w is None:
            if any(c.negated and c.end for c in self.comps):
                last = self.comps[-1]
                raise self.error(SaseRefused, f"a negated end ({last.var} last) needs WITHIN: without a window "
                                 f"the match waits for the absence of {'/'.join(last.types)} forever, and is "
                                 "never reported (the SASE paper defines negated end under WITHIN)", last.node)
            return None
        value = w.value if w.unit is None else dur_constant(w.value, w.unit, self.time_unit_ms)
        if not value > 0:
            raise self.error(SaseTypeError, "WITHIN needs a positive duration, e.g. WITHIN 12 hours", w)
        if value <= 1 and any(c.negated and c.end for c in self.comps):
            raise self.error(SaseTypeError, f"with a negated end, WITHIN must be longer than one time unit: the "
                             f"match is at t = (first event's time) + {value} - 1, which must come after the "
                             "last positive event (the SASE paper's t-T+1 rule)", w)
        return value


def _a(t: str) -> str:
    return ("an " if t[0] in "aeiou" else "a ") + t


class _at(NamedTuple):
    """A position that no syntax node carries (a component's variable)."""

    line: int
    column: int


def analyze(q: ast.Query, text: str, streams: Mapping[str, StreamSchema], *,
            functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
            output: str = "Q") -> Plan:
    """Check ``q`` (parsed from ``text``) against ``streams``; the plan of its automata."""
    an = _Analyzer(text, streams, functions, time_unit_ms)
    an.components(q)
    window = an.window(q.within)
    at, kill = an.where(q.where)
    returns = an.returns(q.returns)
    if output in an.read:
        line, col = (q.publish_line, q.publish_column) if q.publish else (q.line, q.column)
        raise SaseNameError(f"the query reads the stream '{output}' that it publishes; give the output another "
                            "name", line, col, text)
    return Plan(text, an.comps, an.positives, window, at, kill, returns, an.read, output, q.line, q.column)


__all__ = ["analyze", "Plan", "Comp", "risky", "refs", "NUMERIC"]
