"""Random valid CEL queries and random streams, for the differential test of
the CEL compiler against the oracle's CEL (tests/oracle/test_cel_differential.py).

A query is built with the schema of every part known, so that it is valid by
construction (the renaming rules are applied here too; a query whose names
clash after renaming is drawn again). It covers: FILTER with DNF and
parenthesised predicates (arithmetic of every operator, CONTAINS, SIMILARITY,
string tests, ``DUR`` with and without a unit, ``$2.DUR``), SELECT with ``*``,
renamed, computed and constant columns, NEXT with and without braces and
shared names (renaming to ``a_1``, ``a_1_1``), FOLD with filter, rebind and
aggregates (``$1``, ``$2``, ``$``), a FILTER or SELECT on what a chain built so
far (an edge of the automaton, not a filter), right operands that are chains
themselves (resubscription), nested PUBLISH, the ``DUAL`` stream, bare names
where they are unambiguous. No expression can fail (divisors are non-zero
constants, exponents small constants, values small) unless asked for
(``errors``): then some divide by an attribute that may be 0, where
docs/design/semantics.md fixes what a failure means whatever the order of
evaluation (a SELECT column, a FOLD aggregate, a predicate of one clause).

Streams: ``Stock`` and ``Trade`` (no attribute name in common) and ``DUAL``,
point and interval events, many simultaneous.
"""

from __future__ import annotations

import random

from tests.oracle.machine import Event

STREAMS = {
    "Stock": (("Name", "string"), ("Price", "float"), ("Volume", "int")),
    "Trade": (("Sym", "string"), ("Qty", "int"), ("Px", "float")),
}
NAMES = ["IBM", "MSFT", "IBM Corp International", "IBM Corp Internationals", "DELL"]
OPS = ["=", "!=", "<", "<=", ">", ">="]
NUMERIC = ("int", "float")


def _lit(v) -> str:
    return "'" + v.replace("'", "''") + "'" if isinstance(v, str) else repr(v)


class _Gen:
    def __init__(self, rng: random.Random, errors: bool = False) -> None:
        self.rng = rng
        self.errors = errors
        self.may_fail = False  # an expression drawn now may divide by an attribute that may be 0
        self.fresh = 0       # computed column names
        self.pubs = 0        # nested PUBLISH names

    def name(self, prefix: str = "c") -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    # ------------------------------------------------------------- expressions

    @staticmethod
    def refs(scope: list, types: tuple) -> list[str]:
        """Texts that read an attribute of one of ``types``: ``scope`` is
        ``[(decorator text or None for a single input, name, type)]``."""
        bare = {}
        for d, n, t in scope:
            if d != "$":
                bare[n] = bare.get(n, 0) + 1
        out = []
        for d, n, t in scope:
            if t in types:
                out.append(f"{d}.{n}" if d else n)
                if d and d != "$" and bare[n] == 1:
                    out.append(n)                    # undecorated: unambiguous here
        return out

    def num(self, scope: list, typ: str, depth: int = 0) -> str:
        rng = self.rng
        ok = ("int",) if typ == "int" else NUMERIC
        leaves = self.refs(scope, ok)
        ints = [x for x in self.refs(scope, ("int",)) if not x[:1].isdigit()]
        if self.errors and self.may_fail and depth == 0 and ints and rng.random() < 0.35:
            op = rng.choice(["/", "%"])
            left = self.num(scope, "int" if typ == "int" or op == "%" else rng.choice(NUMERIC), 1)
            return f"({left}) {op} ({rng.choice(ints)})"
        if depth >= 2 or rng.random() < 0.45:
            if leaves and rng.random() < 0.75:
                return rng.choice(leaves)
            v = rng.choice([0, 1, 2, 3, -1, 7]) if typ == "int" or rng.random() < 0.5 else rng.choice(
                [0.5, 1.5, 2.0, -2.5, 1e-3])
            return str(v)
        op = rng.choice(["+", "-", "*", "/", "%", "^", "neg", "paren"])
        if op == "neg":
            inner = self.num(scope, typ, depth + 1)  # (never '--': that begins a comment)
            return f"-({inner})" if inner.startswith("-") else f"-{inner}"
        if op == "paren":
            return f"({self.num(scope, typ, depth + 1)})"
        if op in ("/", "%"):
            left = self.num(scope, "int" if op == "%" else typ, depth + 1)
            return f"({left}) {op} {rng.choice([2, 3, -2, 7])}"
        if op == "^":
            return f"({self.num(scope, typ, depth + 1)}) ^ {rng.choice([0, 1, 2])}"
        return f"{self.num(scope, typ, depth + 1)} {op} {self.num(scope, typ, depth + 1)}"

    def atom(self, scope: list, durs: tuple) -> str:
        rng = self.rng
        strs = self.refs(scope, ("string",))
        k = rng.random()
        if k < 0.12 and durs:
            d = rng.choice(durs)
            unit = rng.random() < 0.3
            const = rng.choice([0.001, 0.002, 0.005]) if unit else rng.choice([0, 1, 2, 4, 10])
            return f"{d} {rng.choice(OPS)} {const}{' SEC' if unit else ''}"
        if k < 0.3 and strs:
            a = rng.choice(strs)
            b = rng.choice(strs + [_lit(rng.choice(NAMES))] * 2)
            return f"{a} {rng.choice(['=', '!=', '<', '>='])} {b}"
        if k < 0.37 and strs:
            return f"CONTAINS({rng.choice(strs)}, {_lit(rng.choice(['IBM', 'Corp', 'x']))}) = {rng.choice([0, 1])}"
        if k < 0.42 and strs:
            return f"SIMILARITY({rng.choice(strs)}, {rng.choice(strs + [_lit(NAMES[2])])}) {rng.choice(['>', '<='])} 0.5"
        typ = rng.choice(NUMERIC)
        return f"{self.num(scope, typ)} {rng.choice(OPS)} {self.num(scope, typ)}"

    def pred(self, scope: list, durs: tuple, depth: int = 0) -> str:
        rng = self.rng
        if self.errors and depth == 0 and rng.random() < 0.4:
            # an expression that fails makes the predicate false, whatever the order of evaluation,
            # only in a predicate of one clause: failures go only there
            self.may_fail = True
            try:
                return " AND ".join(self.atom(scope, durs) for _ in range(rng.choice([1, 1, 2])))
            finally:
                self.may_fail = False
        if depth < 1 and rng.random() < 0.12:
            return f"({self.pred(scope, durs, 1)}) AND {self.atom(scope, durs)}"
        clauses = [" AND ".join(self.atom(scope, durs) for _ in range(rng.choice([1, 1, 1, 2])))
                   for _ in range(rng.choice([1, 1, 2, 2, 3]))]
        return " OR ".join(clauses)

    # ------------------------------------------------------------- stream expressions

    def base(self) -> tuple[str, tuple]:
        r = self.rng.random()
        name = "DUAL" if r < 0.04 else "Stock" if r < 0.7 else "Trade"
        return name, STREAMS.get(name, ())

    def single(self, schema: tuple) -> list:
        return [("$1" if self.rng.random() < 0.3 else None, n, t) for n, t in schema]

    def select(self, text: str, schema: tuple) -> tuple[str, tuple]:
        """``(SELECT ... FROM text)``: a projection, renaming or extension."""
        rng = self.rng
        scope = [(None, n, t) for n, t in schema]
        items, out = [], []
        if rng.random() < 0.5 or not schema:
            items.append("*")
            out += list(schema)
        else:
            for n, t in rng.sample(list(schema), rng.randint(1, len(schema))):
                new = n if rng.random() < 0.6 else self.name("r")
                items.append(n if new == n else f"{n} AS {new}")
                out.append((new, t))
        for _ in range(rng.choice([0, 0, 1, 2])):
            new, r = self.name(), rng.random()
            if r < 0.6 and self.refs(scope, NUMERIC):
                typ = rng.choice(NUMERIC)
                self.may_fail = True  # a column that fails drops its event (or, in FOLD, ends the branch)
                e = self.num(scope, typ)
                self.may_fail = False
                # a 'float' expression may have come out int: * 1.0 makes it float whatever it is
                items.append(f"{e if typ == 'int' else f'({e}) * 1.0'} AS {new}")
                out.append((new, typ))
            elif r < 0.8:
                items.append(f"{_lit(rng.choice(NAMES))} AS {new}")
                out.append((new, "string"))
            else:
                items.append(f"{rng.choice([1, 2])} AS {new}")
                out.append((new, "int"))
        return f"(SELECT {', '.join(items)} FROM {text})", tuple(out)

    def source(self, depth: int) -> tuple[str, tuple]:
        """A unary operand: a stream, FILTER, a projection, or (nested) a whole chain."""
        rng = self.rng
        r = rng.random()
        if r < 0.4 or depth >= 2:
            text, schema = self.base()
            if schema and rng.random() < 0.4:
                text = f"FILTER{{{self.pred(self.single(schema), ('DUR',))}}}({text})"
            return text, schema
        if r < 0.75:
            text, schema = self.source(depth + 1)
            if rng.random() < 0.5:
                return self.select(text, schema)
            if not schema:
                return text, schema
            return f"FILTER{{{self.pred(self.single(schema), ('DUR', '$1.DUR'))}}}{text}", schema
        text, schema = self.chain(depth + 1)
        if rng.random() < 0.4:
            self.pubs += 1
            return f"({text} PUBLISH Inner{self.pubs})", schema
        return f"({text})", schema

    def chain(self, depth: int = 0) -> tuple[str, tuple]:
        """A left-deep sequence of NEXT and FOLD (1 to 3 of them)."""
        rng = self.rng
        text, schema = self.source(depth + 1)
        if rng.random() < 0.3 and any(t in NUMERIC for _, t in schema):  # something to aggregate
            n = self.name("agg")
            text, schema = f"(SELECT *, {rng.choice([0, 1])} AS {n} FROM {text})", schema + ((n, "int"),)
        for _ in range(rng.choice([1, 1, 2, 3])):
            made = self.fold(text, schema) if rng.random() < 0.4 else None
            text, schema = made or self.next(text, schema, depth)
            r = rng.random()
            if r < 0.2:
                text = f"FILTER{{{self.pred(self.single(schema), ('DUR',))}}}({text})"
            elif r < 0.3:
                text, schema = self.select(text, schema)
        return text, schema

    def next(self, text: str, schema: tuple, depth: int) -> tuple[str, tuple]:
        rng = self.rng
        for _ in range(20):
            rtext, rschema = self.source(depth + 1)
            shared = {n for n, _ in schema} & {n for n, _ in rschema}
            out = tuple((n + "_1" if shared else n, t) for n, t in schema) + rschema
            if len({n for n, _ in out}) == len(out):
                break
        else:
            rtext, rschema, out = "DUAL", (), schema
        scope = [("$1", n, t) for n, t in schema] + [("$2", n, t) for n, t in rschema]
        if rng.random() < 0.15:
            op = "NEXT"                                      # no braces: NEXT{}
        elif rng.random() < 0.1:
            op = "NEXT{}"
        else:
            op = f"NEXT{{{self.pred(scope, ('DUR', '$2.DUR'))}}}"
        return f"{text} {op} {rtext}", out

    def fold(self, text: str, schema: tuple) -> tuple[str, tuple] | None:
        """``text FOLD{...} S``, S a stream whose attributes the left has (schema
        inclusion), or None when no stream fits."""
        rng = self.rng
        have = dict(schema)
        for base in rng.sample(list(STREAMS), len(STREAMS)):
            fits = [(n, t) for n, t in STREAMS[base] if n in have
                    and (have[n] == t or (have[n] in NUMERIC and t in NUMERIC))]
            if not fits:
                continue
            for _ in range(5):
                part = tuple(rng.sample(fits, rng.randint(1, len(fits))))
                out = tuple((n + "_1" if n in dict(part) else n, t) for n, t in schema)
                running = {n: (t if have[n] == t else "float") for n, t in part}
                out += tuple((n, running[n]) for n, _ in part)
                if len({n for n, _ in out}) == len(out):
                    break
            else:
                continue
            right = base
            if rng.random() < 0.3:
                right = f"FILTER{{{self.pred(self.single(STREAMS[base]), ('DUR',))}}}({base})"
            if len(part) < len(STREAMS[base]) or rng.random() < 0.2:
                right = f"(SELECT {', '.join(n for n, _ in part)} FROM {right})"
            scope = ([("$1", n, t) for n, t in schema] + [("$2", n, t) for n, t in part]
                     + [("$", n, running.get(n, t)) for n, t in schema])
            cond = self.pred(scope, ("DUR", "$2.DUR")) if rng.random() < 0.8 else ""
            rebind = self.pred(scope, ("DUR", "$2.DUR")) if rng.random() < 0.6 else ""
            aggs = []
            for n, t in schema:
                if n not in dict(part) and t in NUMERIC and rng.random() < 0.6:
                    src = [x for x in self.refs([s for s in scope if s[0] != "$1"], ("int",) if t == "int"
                                                else NUMERIC) if x.startswith("$")]
                    step = rng.choice(src + ['1', '2'])
                    if self.errors and rng.random() < 0.4:
                        self.may_fail = True
                        step = f"({self.num(scope, t)})"
                        self.may_fail = False
                    aggs.append(f"$.{n} {rng.choice(['+', '-'])} {step} AS {n}")
            return f"{text} FOLD{{{cond}, {rebind}, {', '.join(aggs)}}} {right}", out
        return None


def query(rng: random.Random, errors: bool = False) -> str:
    """A random query; with ``errors``, some expressions divide by an attribute
    that may be 0 (in SELECT columns, FOLD aggregates and one-clause predicates)."""
    g = _Gen(rng, errors)
    text, schema = g.chain()
    if rng.random() < 0.5:
        text, schema = g.select(text, schema)
        text = text[1:-1]                                  # SELECT ... FROM ..., not parenthesised
    return text + (" PUBLISH Out" if rng.random() < 0.8 else "")


def stream(rng: random.Random, n: int) -> list[Event]:
    """``n`` events of Stock, Trade and DUAL: gaps of 0 (simultaneous) are
    common, some events are intervals (some overlapping what came before)."""
    t, out = 0, []
    for _ in range(n):
        t += rng.choice([0, 0, 1, 1, 2, 3])
        r = rng.random()
        if r < 0.6:
            name, values = "Stock", (rng.choice(NAMES), rng.choice([1.0, 2.5, 3.0, 4.0, 5.5]),
                                     rng.choice([-2, 0, 1, 3, 7, 12]))
        elif r < 0.95:
            name, values = "Trade", (rng.choice(NAMES[:2]), rng.choice([0, 1, 2, 5]), rng.choice([1.0, 2.0, 3.5]))
        else:
            name, values = "DUAL", ()
        dur = rng.choice([0, 0, 0, rng.randint(1, 4)])
        out.append(Event(name, values, t - dur, t))
    return out
