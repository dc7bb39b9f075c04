"""The oracle's SASE: its own reading of a query and the SASE paper's semantics by
brute force (docs/design/sase.md#semantics). Imports nothing of the product.

For a small stream it enumerates every combination of events in time order,
one per positive component, and keeps those that meet the window, the WHERE
clause and every negation, as the SASE paper (section 2.2) defines them:

- an event's time is its ``t1``; the positive events are strictly in time
  order (``t_1 < ... < t_m``), and with ``WITHIN T``, ``t_m - t_1 < T``;
- WHERE is put in disjunctive normal form; a match needs one disjunct whose
  atoms over positive components hold, and, for each negated component, no
  event of its types in its interval whose atoms of that disjunct (over it
  and the positive components) hold: between positive ``j`` and ``j+1`` the
  interval is ``(t_j, t_{j+1})``; after the last (negated end, under WITHIN)
  it is ``(t_m, t]`` with ``t = t_1 + T - 1``, and ``t_m < t`` (the paper's
  ``t - T + 1`` rule);
- ``[a]`` is ``x_1.a = x_k.a`` for every other component ``k`` (the paper's
  expansion); ``[a = c]`` is ``x_k.a = c`` for every component;
- an atom that reads an attribute its component's event lacks (an ANY) is
  TRUE; an atom whose expression fails (docs/design/semantics.md
  #arithmetic-and-comparison) is FALSE; a match whose RETURN value fails is
  not reported;
- a match is reported with ``t0 = t_1`` and ``t1 =`` its detection time:
  ``t_m``, or for a negated end the ``t1`` of the first event after ``t`` on
  any stream the query reads (none in the input: not reported).

RETURN absent gives every attribute of every positive component as
``<var>_<attr>`` (the variable as written, or ``x<k>`` for component k from
1; an ANY's attributes its types all have). A RETURN item ``v.a`` without AS
is named ``a``, or ``v_a`` when another item would also be ``a``.
"""

from __future__ import annotations

import re

from tests.oracle.expr import BUILTINS, OracleExprError, arith, compare, value

UNIT_MS = {"MS": 1, "MSEC": 1, "MSECS": 1, "MILLISECOND": 1, "MILLISECONDS": 1, "S": 1e3, "SEC": 1e3,
           "SECS": 1e3, "SECOND": 1e3, "SECONDS": 1e3, "MIN": 6e4, "MINS": 6e4, "MINUTE": 6e4, "MINUTES": 6e4,
           "H": 3.6e6, "HOUR": 3.6e6, "HOURS": 3.6e6, "D": 8.64e7, "DAY": 8.64e7, "DAYS": 8.64e7}
_KEYWORDS = {"EVENT", "SEQ", "ANY", "WHERE", "WITHIN", "RETURN", "PUBLISH", "AND", "OR", "AS"}
_TOKEN = re.compile(r"""(?P<ws>\s+|--[^\n]*|//[^\n]*|/\*.*?\*/)|(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    |(?P<str>'(?:[^']|'')*'|"(?:[^"]|"")*")|(?P<dollar>\$\d+)|(?P<name>[A-Za-z_]\w*)
    |(?P<op><>|!=|<=|>=|==|[=<>+\-*/%^(),.;!\[\]])""", re.X | re.S)


class OracleSaseError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, object]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise OracleSaseError(f"cannot read {text[pos:pos + 10]!r}")
        pos = m.end()
        kind, raw = m.lastgroup, m.group()
        if kind == "num":
            out.append(("num", float(raw) if any(c in raw for c in ".eE") else int(raw)))
        elif kind == "str":
            out.append(("str", raw[1:-1].replace(raw[0] * 2, raw[0])))
        elif kind == "name":
            out.append(("name", raw))
        elif kind in ("op", "dollar"):
            out.append(("op", {"<>": "!=", "==": "="}.get(raw, raw)))
    out.append(("end", None))
    return out


class Query:
    """components: [(negated, (types...), var)]; where: a tree; window: T in time
    units or None; returns: [(name, tree)] or None; publish: a name or None."""

    def __init__(self, components, where, window, returns, publish) -> None:
        self.components, self.where, self.window, self.returns, self.publish = (
            components, where, window, returns, publish)


class _Reader:
    def __init__(self, text: str, time_unit_ms: float) -> None:
        self.t, self.i, self.unit = _tokens(text), 0, time_unit_ms

    def peek(self, k=0):
        return self.t[min(self.i + k, len(self.t) - 1)]

    def take(self):
        tok = self.t[self.i]
        self.i += 1
        return tok

    def word(self, *words) -> bool:
        k, v = self.peek()
        return k == "name" and v.upper() in words

    def op(self, *ops) -> bool:
        return self.peek() in [("op", o) for o in ops]

    def need(self, o):
        if not self.op(o):
            raise OracleSaseError(f"expected {o!r} at {self.peek()}")
        self.take()

    def query(self) -> Query:
        if self.word("EVENT"):
            self.take()
        comps = []
        if self.word("SEQ") and self.peek(1) == ("op", "("):
            self.take(), self.take()
            comps.append(self.component())
            while self.op(","):
                self.take()
                comps.append(self.component())
            self.need(")")
        else:
            comps.append(self.component())
        where = window = returns = publish = None
        while self.word("WHERE", "WITHIN", "RETURN", "PUBLISH"):
            kw = self.take()[1].upper()
            if kw == "WHERE":
                where = self.cond()
            elif kw == "WITHIN":
                n = self.take()[1]
                if self.word(*UNIT_MS):
                    n = n * UNIT_MS[self.take()[1].upper()] / self.unit
                window = n
            elif kw == "RETURN":
                returns = [self.item()]
                while self.op(","):
                    self.take()
                    returns.append(self.item())
            else:
                publish = self.take()[1]
        if self.op(";"):
            self.take()
        if self.peek()[0] != "end":
            raise OracleSaseError(f"unexpected {self.peek()}")
        return Query(comps, where, window, returns, publish)

    def component(self):
        neg = self.op("!")
        if neg:
            self.take()
        paren = neg and self.op("(")
        if paren:
            self.take()
        if self.word("ANY") and self.peek(1) == ("op", "("):
            self.take(), self.take()
            types = [self.take()[1]]
            while self.op(","):
                self.take()
                types.append(self.take()[1])
            self.need(")")
        else:
            types = [self.take()[1]]
        var = None
        k, v = self.peek()
        if k == "name" and v.upper() not in _KEYWORDS:
            var = self.take()[1]
        if paren:
            self.need(")")
        return (neg, tuple(types), var)

    def item(self):
        e = self.value()
        name = None
        if self.word("AS"):
            self.take()
            name = self.take()[1]
        return (name, e)

    def cond(self):
        items = [self.conj()]
        while self.word("OR"):
            self.take()
            items.append(self.conj())
        return items[0] if len(items) == 1 else ("or", items)

    def conj(self):
        items = [self.atom()]
        while self.word("AND"):
            self.take()
            items.append(self.atom())
        return items[0] if len(items) == 1 else ("and", items)

    def atom(self):
        if self.op("["):
            self.take()
            attrs = [self.take()[1]]
            while self.op(","):
                self.take()
                attrs.append(self.take()[1])
            const = None
            if self.op("="):
                self.take()
                const = self.primary()
            self.need("]")
            return ("equiv", attrs, const)
        if self.op("("):  # a parenthesised condition or value: try a condition first
            save = self.i
            self.take()
            try:
                inner = self.cond()
                if self.op(")") and not self._is_value(inner):
                    self.take()
                    return inner
            except OracleSaseError:
                pass
            self.i = save
        left = self.value()
        for o in ("<=", ">=", "!=", "=", "<", ">"):
            if self.op(o):
                self.take()
                return ("cmp", o, left, self.value())
        if left == ("lit", True) or left == ("lit", False):
            return ("cmp", "=", left, ("lit", True))
        raise OracleSaseError(f"expected a comparison at {self.peek()}")

    @staticmethod
    def _is_value(tree) -> bool:
        return tree[0] not in ("cmp", "and", "or", "equiv")

    def value(self):
        left = self.term()
        while self.op("+", "-"):
            left = ("bin", self.take()[1], left, self.term())
        return left

    def term(self):
        left = self.power()
        while self.op("*", "/"):
            left = ("bin", self.take()[1], left, self.power())
        return left

    def power(self):
        left = self.unary()
        while self.op("^", "%"):
            left = ("bin", self.take()[1], left, self.unary())
        return left

    def unary(self):
        if self.op("-"):
            self.take()
            if self.peek()[0] == "num":
                return ("lit", -self.take()[1])
            x = self.unary()
            return ("lit", -x[1]) if x[0] == "lit" and not isinstance(x[1], (str, bool)) else ("neg", x)
        if self.op("+"):
            self.take()
            return self.unary()
        return self.primary()

    def primary(self):
        k, v = self.take()
        if k == "num":
            return ("lit", v)
        if k == "str":
            return ("lit", v)
        if k == "op" and v == "(":
            e = self.value()
            self.need(")")
            return e
        if k == "op" and str(v).startswith("$"):
            self.need(".")
            return ("ref", int(v[1:]) - 1, self.take()[1])
        if k == "name":
            if v.upper() in ("TRUE", "FALSE") and not self.op("."):
                return ("lit", v.upper() == "TRUE")
            if self.op("("):
                self.take()
                args = []
                if not self.op(")"):
                    args.append(self.value())
                    while self.op(","):
                        self.take()
                        args.append(self.value())
                self.need(")")
                return ("call", v.upper(), args)
            self.need(".")
            return ("ref", v, self.take()[1])
        raise OracleSaseError(f"unexpected {k} {v!r}")


def parse(text: str, time_unit_ms: float = 1.0) -> Query:
    return _Reader(text, time_unit_ms).query()


# --------------------------------------------------------------------------- semantics


class Sase:
    """One query over declared streams (``{name: ((attr, type), ...)}``)."""

    def __init__(self, text: str, streams: dict, time_unit_ms: float = 1.0) -> None:
        self.q = parse(text, time_unit_ms)
        self.streams = {k: dict(v) for k, v in streams.items()}
        comps = self.q.components
        self.var_of = {c[2]: k for k, c in enumerate(comps) if c[2]}
        self.names = [c[2] or f"x{k + 1}" for k, c in enumerate(comps)]
        self.pos = [k for k, c in enumerate(comps) if not c[0]]
        self.errors = 0

    def comp(self, ref) -> int:
        return ref if isinstance(ref, int) else self.var_of[ref]

    # the WHERE clause, in DNF, with equivalence tests expanded
    def clauses(self) -> list[list]:
        def dnf(t):
            if t is None:
                return [[]]
            if t[0] == "or":
                return [c for x in t[1] for c in dnf(x)]
            if t[0] == "and":
                out = [[]]
                for x in t[1]:
                    out = [a + b for a in out for b in dnf(x)]
                return out
            if t[0] == "equiv":
                atoms = []
                for a in t[1]:
                    if t[2] is not None:
                        atoms += [("cmp", "=", ("ref", k, a), t[2]) for k in range(len(self.q.components))]
                    else:
                        atoms += [("cmp", "=", ("ref", 0, a), ("ref", k, a))
                                  for k in range(1, len(self.q.components))]
                return [atoms]
            return [[t]]
        return dnf(self.q.where)

    def refs(self, t) -> set:
        if t[0] == "ref":
            return {self.comp(t[1])}
        if t[0] in ("neg",):
            return self.refs(t[1])
        if t[0] in ("bin", "cmp"):
            return self.refs(t[2]) | self.refs(t[3])
        if t[0] == "call":
            return set().union(*[self.refs(a) for a in t[2]]) if t[2] else set()
        return set()

    def eval(self, t, bound: dict):
        tag = t[0]
        if tag == "lit":
            return t[1]
        if tag == "ref":
            stream, values = bound[self.comp(t[1])]
            if t[2] not in values:
                raise _Missing
            return values[t[2]]
        if tag == "neg":
            x = self.eval(t[1], bound)
            if type(x) not in (int, float):
                raise OracleExprError("unary minus on a non-number")
            return value(-x, "-x")
        if tag == "bin":
            return arith(t[1], self.eval(t[2], bound), self.eval(t[3], bound))
        if tag == "call":
            return BUILTINS[t[1]](*(self.eval(a, bound) for a in t[2]))
        raise OracleSaseError(f"bad tree {t!r}")

    def holds(self, atom, bound: dict) -> bool:
        try:
            return compare(atom[1], self.eval(atom[2], bound), self.eval(atom[3], bound))
        except _Missing:
            return True
        except (OracleExprError, ZeroDivisionError, OverflowError, ValueError, TypeError):
            self.errors += 1
            return False

    def output_columns(self) -> list[tuple[str, object]]:
        comps = self.q.components
        if self.q.returns is None:
            cols = []
            for k in self.pos:
                types = comps[k][1]
                for a in self.streams[types[0]]:
                    if all(self.streams[t].get(a) == self.streams[types[0]][a] for t in types):
                        cols.append((f"{self.names[k]}_{a}", ("ref", k, a)))
            return cols
        plain = [t[2] for n, t in self.q.returns if n is None]
        explicit = [n for n, _ in self.q.returns if n is not None]
        return [(n if n is not None else t[2] if plain.count(t[2]) == 1 and t[2] not in explicit
                 else f"{self.names[self.comp(t[1])]}_{t[2]}", t) for n, t in self.q.returns]

    def run(self, events) -> list[tuple[tuple, object, object]]:
        """Every match: ``(RETURN values, t0, t1)``. ``events``: (stream, values, t0, t1)."""
        comps, T = self.q.components, self.q.window
        read = {t for c in comps for t in c[1]}
        evs = [(s, dict(zip(self.streams[s], v)), t1) for s, v, _t0, t1 in events if s in read]
        clauses = self.clauses()
        m = len(self.pos)
        end = comps[-1][0]
        cols = self.output_columns()
        out = []

        def combos(i, last_t, first_t, chosen):
            if i == m:
                yield list(chosen)
                return
            for k, (s, vals, t) in enumerate(evs):
                if s not in comps[self.pos[i]][1] or (last_t is not None and t <= last_t):
                    continue
                if T is not None and first_t is not None and not (t - first_t < (T - 1 if end else T)):
                    continue
                chosen.append(k)
                yield from combos(i + 1, t, t if first_t is None else first_t, chosen)
                chosen.pop()

        for chosen in combos(0, None, None, []):
            bound = {self.pos[i]: (evs[k][0], evs[k][1]) for i, k in enumerate(chosen)}
            times = [evs[k][2] for k in chosen]
            horizon = times[0] + T - 1 if end else None
            if not any(self._clause_ok(cl, bound, times, horizon, evs) for cl in clauses):
                continue
            try:
                row = tuple(self.eval(e, bound) for _, e in cols)
            except (OracleExprError, ZeroDivisionError, OverflowError, ValueError, TypeError, _Missing):
                self.errors += 1
                continue
            if end:
                later = [t for _, _, t in evs if t > horizon]
                if not later:
                    continue
                out.append((row, times[0], min(later)))
            else:
                out.append((row, times[0], times[-1]))
        return out

    def _clause_ok(self, clause, bound, times, horizon, evs) -> bool:
        comps = self.q.components
        negs = {k for k, c in enumerate(comps) if c[0]}
        plus = [a for a in clause if not (self.refs(a) & negs)]
        if not all(self.holds(a, bound) for a in plus):
            return False
        for k in negs:
            atoms = [a for a in clause if k in self.refs(a)]
            before = max(i for i, p in enumerate(self.pos) if p < k)
            lo = times[before]
            hi = horizon if k == len(comps) - 1 else times[before + 1]
            for s, vals, t in evs:
                if s not in comps[k][1] or not (lo < t and (t <= hi if k == len(comps) - 1 else t < hi)):
                    continue
                if all(self.holds(a, {**bound, k: (s, vals)}) for a in atoms):
                    return False
        return True


class _Missing(Exception):
    """An attribute the component's event lacks: the atom is TRUE (the SASE paper)."""


__all__ = ["Sase", "parse", "Query", "OracleSaseError"]
