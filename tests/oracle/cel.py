"""The oracle's CEL: its own reading of a query (this module) and a direct,
denotational evaluation of the Cayuga algebra the query means over a list of
events (tests/oracle/celeval.py). Imports nothing of the product, and builds
no automaton: what it checks is the product's translation of CEL into automata
*and* the automata's run, together, against the algebra.

Written from the system paper's CEL section and the algebra paper
(docs/design/references.md) and docs/design/semantics.md#cel:

- the grammar of docs/design/semantics.md#grammar; keywords are
  case-insensitive; ``NEXT`` without braces is ``NEXT{}``; a FOLD's three
  parts (filter, rebind, aggregates) may each be empty;
- expressions (docs/design/semantics.md#expressions-and-functions): ``^`` and
  ``%`` above ``*`` and ``/`` above ``+`` and ``-``, left-associative; unary
  minus binds tighter than all (a minus before a number is part of the
  literal); AND above OR; ``DUR op constant [unit]`` with the units of
  docs/design/semantics.md#timestamps-and-durations;
- names (docs/design/semantics.md#decorators-and-renaming): ``$1.a`` the first
  (or only) input, ``$2.a`` the second, ``$.a`` the last iteration inside
  FOLD; an undecorated name must be unambiguous; in SELECT no decorator;
- renaming: ``R NEXT S`` renames every attribute ``a`` of R to ``a_1`` when R
  and S share any name; ``R FOLD S`` (R's schema must include S's) keeps R's
  value of a shared ``a`` as ``a_1`` and the last iteration's as ``a``; an
  attribute only R has keeps its name; a duplicate left is an error. The
  output schema is R's (renamed) attributes, then S's.

Where the papers leave a choice, the contract of docs/design/semantics.md and
the product's documented behaviour (its error messages in tests/cel) decide;
each such choice is listed in tests/oracle/celeval.py.
"""

from __future__ import annotations

import re

from tests.oracle.expr import INT_MAX, INT_MIN, literal

UNIT_MS = {**dict.fromkeys(("MS", "MSEC", "MSECS", "MILLISECOND", "MILLISECONDS"), 1),
           **dict.fromkeys(("S", "SEC", "SECS", "SECOND", "SECONDS"), 1000),
           **dict.fromkeys(("MIN", "MINS", "MINUTE", "MINUTES"), 60_000),
           **dict.fromkeys(("H", "HOUR", "HOURS"), 3_600_000),
           **dict.fromkeys(("D", "DAY", "DAYS"), 86_400_000)}
KEYWORDS = {"SELECT", "FROM", "PUBLISH", "FILTER", "NEXT", "FOLD", "AS", "AND", "OR"}
FUNCTIONS = {"CONTAINS": (("string", "string"), "int"), "SIMILARITY": (("string", "string"), "float")}
NUMERIC = ("int", "float")

_TOKEN = re.compile(r"""(?P<ws>\s+|--[^\n]*|//[^\n]*|/\*.*?\*/)
    |(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    |(?P<str>'(?:[^']|'')*')
    |(?P<deco>\$[12]?(?=\s*\.))
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op><>|!=|<=|>=|==|[=<>+\-*/%^(){},.])""", re.X | re.S)


class OracleCelError(ValueError):
    """A query the oracle cannot read or that breaks a rule of CEL."""


def tokens(text: str) -> list[tuple[str, object]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise OracleCelError(f"cannot read {text[pos:pos + 12]!r}")
        pos = m.end()
        kind, raw = m.lastgroup, m.group()
        if kind == "num":
            out.append(("num", float(raw) if any(c in raw for c in ".eE") else int(raw)))
        elif kind == "str":
            out.append(("str", raw[1:-1].replace("''", "'")))
        elif kind == "name":
            out.append(("kw", raw.upper()) if raw.upper() in KEYWORDS else ("name", raw))
        elif kind == "deco":
            out.append(("deco", {"$": "last", "$1": 1, "$2": 2}[raw]))
        elif kind == "op":
            out.append(("op", {"<>": "!=", "==": "="}.get(raw, raw)))
    out.append(("end", None))
    return out


# --------------------------------------------------------------------------- syntax
#
# Stream expressions:  ("stream", name) | ("filter", pred, x) | ("select", items, x)
#   | ("next", left, pred, right) | ("fold", left, cond, rebind, aggs, right) | ("publish", name, x)
# items: [("*",) | (tree, alias or None)]; aggs: [(tree, alias)]
# Value and predicate trees: ("lit", v) | ("ref", deco, name) | ("dur", deco) | ("neg", x)
#   | ("bin", op, a, b) | ("call", NAME, [args]) | ("cmp", op, a, b) | ("and", [..]) | ("or", [..])

class _Reader:
    def __init__(self, text: str, time_unit_ms: float) -> None:
        self.t, self.i, self.unit = tokens(text), 0, time_unit_ms

    def peek(self, k: int = 0):
        return self.t[min(self.i + k, len(self.t) - 1)]

    def take(self):
        tok = self.t[self.i]
        self.i += 1
        return tok

    def kw(self, *words) -> bool:
        return self.peek()[0] == "kw" and self.peek()[1] in words

    def op(self, *ops) -> bool:
        return self.peek()[0] == "op" and self.peek()[1] in ops

    def need(self, o: str) -> None:
        if not self.op(o):
            raise OracleCelError(f"expected {o!r}, found {self.peek()}")
        self.take()

    def name(self) -> str:
        k, v = self.take()
        if k != "name":
            raise OracleCelError(f"expected a name, found {v!r}")
        return v

    def whole(self):
        q = self.query()
        if self.peek()[0] != "end":
            raise OracleCelError(f"unexpected {self.peek()}")
        return q

    def query(self):
        items = None
        if self.kw("SELECT"):
            self.take()
            items = [self.item()]
            while self.op(","):
                self.take()
                items.append(self.item())
            if not self.kw("FROM"):
                raise OracleCelError("SELECT without FROM")
            self.take()
        x = self.stream()
        if items is not None:
            x = ("select", items, x)
        if self.kw("PUBLISH"):
            self.take()
            x = ("publish", self.name(), x)
        return x

    def item(self):
        if self.op("*"):
            self.take()
            return ("*",)
        e = self.value()
        alias = None
        if self.kw("AS"):
            self.take()
            alias = self.name()
        return (e, alias)

    def stream(self):
        x = self.unary()
        while self.kw("NEXT", "FOLD"):
            if self.take()[1] == "NEXT":
                pred = None
                if self.op("{"):
                    self.take()
                    pred = None if self.op("}") else self.pred()
                    self.need("}")
                x = ("next", x, pred, self.unary())
            else:
                self.need("{")
                parts: list = [None, None, []]
                for k in range(3):
                    if self.op("}"):
                        break
                    if not self.op(","):
                        if k < 2:
                            parts[k] = self.pred()
                        else:
                            parts[2] = [self.item()]
                            while self.op(","):
                                self.take()
                                parts[2].append(self.item())
                    if k < 2 and self.op(","):
                        self.take()
                self.need("}")
                for e, alias in parts[2]:
                    if e == "*" or alias is None:
                        raise OracleCelError("a FOLD aggregate is 'expression AS name'")
                x = ("fold", x, parts[0], parts[1], parts[2], self.unary())
        return x

    def unary(self):
        if self.kw("FILTER"):
            self.take()
            self.need("{")
            pred = self.pred()
            self.need("}")
            return ("filter", pred, self.unary())
        if self.op("("):
            self.take()
            q = self.query()
            self.need(")")
            return q
        return ("stream", self.name())

    # predicates and values

    def pred(self):
        items = [self.conj()]
        while self.kw("OR"):
            self.take()
            items.append(self.conj())
        return items[0] if len(items) == 1 else ("or", items)

    def conj(self):
        items = [self.atom()]
        while self.kw("AND"):
            self.take()
            items.append(self.atom())
        return items[0] if len(items) == 1 else ("and", items)

    def atom(self):
        if self.op("("):  # a parenthesised predicate, or a value that starts with '('
            save = self.i
            self.take()
            try:
                inner = self.pred()
                if self.op(")") and inner[0] in ("cmp", "and", "or"):
                    self.take()
                    return inner
            except OracleCelError:
                pass
            self.i = save
        left = self.with_unit(self.value())
        for o in ("<=", ">=", "!=", "=", "<", ">"):
            if self.op(o):
                self.take()
                return ("cmp", o, left, self.with_unit(self.value()))
        if left[0] == "lit" and isinstance(left[1], bool):
            return ("cmp", "=", left, ("lit", True))
        raise OracleCelError(f"expected a comparison at {self.peek()}")

    def with_unit(self, e):
        k, v = self.peek()
        if k == "name" and v.upper() in UNIT_MS and e[0] == "lit" and type(e[1]) in (int, float):
            self.take()
            ms = e[1] * UNIT_MS[v.upper()] / self.unit
            return ("qty", int(ms) if float(ms).is_integer() else ms)
        return e

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
        left = self.unary_value()
        while self.op("^", "%"):
            left = ("bin", self.take()[1], left, self.unary_value())
        return left

    def unary_value(self):
        if self.op("-"):
            self.take()
            if self.peek()[0] == "num":
                return self.number(-self.take()[1])
            return ("neg", self.unary_value())
        return self.primary()

    @staticmethod
    def number(v):
        if isinstance(v, int) and not INT_MIN <= v <= INT_MAX:
            raise OracleCelError(f"the int literal {v} does not fit in 64 bits")
        try:
            return ("lit", literal(v))
        except ValueError as exc:
            raise OracleCelError(str(exc)) from None

    def primary(self):
        k, v = self.take()
        if k == "num":
            return self.number(v)
        if k == "str":
            return ("lit", v)
        if k == "op" and v == "(":
            e = self.value()
            self.need(")")
            return e
        if k == "deco":
            self.need(".")
            attr = self.name()
            return ("dur", v) if attr.upper() == "DUR" else ("ref", v, attr)
        if k == "name":
            if v.upper() in ("TRUE", "FALSE"):
                return ("lit", v.upper() == "TRUE")
            if v.upper() == "DUR":
                return ("dur", None)
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
            return ("ref", None, v)
        raise OracleCelError(f"unexpected {v!r}")


def parse(text: str, time_unit_ms: float = 1.0):
    return _Reader(text, time_unit_ms).whole()


# --------------------------------------------------------------------------- names and schemas
#
# A plan node is a dict: {"op": ..., "schema": ((name, type), ...), ...}. Resolved trees
# read ("ref", slot, name) with slot "in" (FILTER, SELECT), 1, 2 or "last" (NEXT, FOLD),
# and ("dur", "result" | "event").

class Scope:
    """The names one expression sees: ``inputs`` maps a decorator (1, 2,
    "last") to ``{name: type}``; a bare name is looked up in ``bare``."""

    def __init__(self, context: str, inputs: dict, bare: tuple, decorators: bool = True,
                 durs: tuple = (None,)) -> None:
        self.context, self.inputs, self.bare, self.decorators, self.durs = context, inputs, bare, decorators, durs


def _type_of_bin(op: str, a: str, b: str) -> str:
    for t in (a, b):
        if t not in NUMERIC:
            raise OracleCelError(f"{op!r} on a {t}")
    if op == "%" and "float" in (a, b):
        raise OracleCelError("'%' needs int operands")
    return "int" if a == b == "int" else "float"


def resolve(tree, scope: Scope, functions: dict):
    """(resolved tree, type) of a value; ("cmp"/"and"/"or", "bool") of a predicate."""
    tag = tree[0]
    if tag == "lit":
        v = tree[1]
        return tree, {bool: "bool", int: "int", float: "float", str: "string"}[type(v)]
    if tag == "qty":
        raise OracleCelError("a time unit is only allowed on a constant compared with DUR")
    if tag == "ref":
        deco, name = tree[1], tree[2]
        if deco is None:
            found = [d for d in scope.bare if name in scope.inputs[d]]
            if len(found) != 1:
                raise OracleCelError(f"{name!r} is {'ambiguous' if found else 'unknown'} in {scope.context}")
            deco = found[0]
        elif not scope.decorators:
            raise OracleCelError(f"no decorators in {scope.context}")
        if deco not in scope.inputs or name not in scope.inputs[deco]:
            raise OracleCelError(f"no attribute {deco}.{name} in {scope.context}")
        return ("ref", "in" if scope.bare == ("in",) else deco, name), scope.inputs[deco][name]
    if tag == "dur":
        raise OracleCelError("DUR can only be compared directly with a constant")
    if tag == "neg":
        x, t = resolve(tree[1], scope, functions)
        if t not in NUMERIC:
            raise OracleCelError(f"cannot negate a {t}")
        return ("neg", x), t
    if tag == "bin":
        (a, ta), (b, tb) = resolve(tree[2], scope, functions), resolve(tree[3], scope, functions)
        return ("bin", tree[1], a, b), _type_of_bin(tree[1], ta, tb)
    if tag == "call":
        if tree[1] not in functions:
            raise OracleCelError(f"unknown function {tree[1]}")
        want, ret = functions[tree[1]]
        args = [resolve(a, scope, functions) for a in tree[2]]
        if len(args) != len(want) or any(t != w for (_, t), w in zip(args, want)):
            raise OracleCelError(f"{tree[1]} takes {want}")
        return ("call", tree[1], [a for a, _ in args]), ret
    if tag in ("and", "or"):
        return (tag, [resolve(x, scope, functions)[0] for x in tree[1]]), "bool"
    if tag == "cmp":
        op, left, right = tree[1], tree[2], tree[3]
        if left[0] == "dur" or right[0] == "dur":
            if right[0] == "dur":
                op, left, right = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op), right, left
            if left[1] not in scope.durs:
                raise OracleCelError(f"DUR of {left[1]} is not available in {scope.context}")
            const = right[1] if right[0] in ("qty", "lit") else None
            if type(const) not in (int, float):
                raise OracleCelError("DUR is compared with a number")
            return ("cmp", op, ("dur", "event" if left[1] == 2 else "result"), ("lit", const)), "bool"
        (a, ta), (b, tb) = resolve(left, scope, functions), resolve(right, scope, functions)
        if not (ta == tb or (ta in NUMERIC and tb in NUMERIC)):
            raise OracleCelError(f"cannot compare {ta} with {tb}")
        return ("cmp", op, a, b), "bool"
    raise OracleCelError(f"bad tree {tree!r}")


def _pred(tree, scope: Scope, functions: dict):
    if tree is None:
        return None
    out, t = resolve(tree, scope, functions)
    if t != "bool" or out[0] not in ("cmp", "and", "or"):
        raise OracleCelError(f"a predicate in {scope.context} must be a comparison")
    return out


def _unique(schema, what: str) -> None:
    names = [n for n, _ in schema]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OracleCelError(f"{what}: duplicate attribute(s) {dup}")


class Analyzer:
    """Turns a parsed query into a plan over ``streams`` (``{name: ((attr, type), ...)}``)."""

    def __init__(self, streams: dict, functions: dict | None = None) -> None:
        self.streams = {"DUAL": (), **{k: tuple(v) for k, v in streams.items()}}
        self.functions = {**FUNCTIONS, **(functions or {})}
        self.published: list[str] = []

    def plan(self, x) -> dict:
        return getattr(self, "_" + x[0])(x)

    def _stream(self, x) -> dict:
        if x[1] not in self.streams:
            raise OracleCelError(f"unknown stream {x[1]!r}")
        if x[1] in self.published:
            raise OracleCelError(f"the query reads {x[1]!r}, which it publishes")
        return {"op": "scan", "stream": x[1], "schema": self.streams[x[1]]}

    def _publish(self, x) -> dict:
        inner = self.plan(x[2])
        if x[1] in self.published:
            raise OracleCelError(f"the query publishes {x[1]!r} twice")
        self.published.append(x[1])
        return {"op": "publish", "name": x[1], "input": inner, "schema": inner["schema"]}

    def _filter(self, x) -> dict:
        inner = self.plan(x[2])
        scope = Scope("FILTER", {1: dict(inner["schema"])}, ("in",), durs=(None, 1))
        scope.inputs["in"] = scope.inputs[1]
        return {"op": "filter", "pred": _pred(x[1], scope, self.functions), "input": inner,
                "schema": inner["schema"]}

    def _select(self, x) -> dict:
        inner = self.plan(x[2])
        scope = Scope("SELECT", {"in": dict(inner["schema"])}, ("in",), decorators=False, durs=())
        cols = []
        for item in x[1]:
            if item == ("*",):
                cols += [(n, t, ("ref", "in", n)) for n, t in inner["schema"]]
                continue
            tree, alias = item
            if alias is None and tree[0] != "ref":
                raise OracleCelError("a computed SELECT column needs AS")
            e, t = resolve(tree, scope, self.functions)
            if t == "bool":
                raise OracleCelError("a SELECT column is a value")
            cols.append((alias or tree[2], t, e))
        schema = tuple((n, t) for n, t, _ in cols)
        _unique(schema, "SELECT")
        return {"op": "select", "cols": cols, "input": inner, "schema": schema}

    def _next(self, x) -> dict:
        left, right = self.plan(x[1]), self.plan(x[3])
        scope = Scope("NEXT", {1: dict(left["schema"]), 2: dict(right["schema"])}, (1, 2), durs=(None, 2))
        pred = _pred(x[2], scope, self.functions)
        shared = {n for n, _ in left["schema"]} & {n for n, _ in right["schema"]}
        names = [n + "_1" if shared else n for n, _ in left["schema"]]
        schema = tuple((m, t) for m, (_, t) in zip(names, left["schema"])) + right["schema"]
        _unique(schema, "NEXT")
        return {"op": "next", "left": left, "right": right, "pred": pred, "names": names, "schema": schema}

    def _fold(self, x) -> dict:
        left, right = self.plan(x[1]), self.plan(x[5])
        lt, rt = dict(left["schema"]), dict(right["schema"])
        if any(n not in lt for n in rt):
            raise OracleCelError("FOLD: the first input's schema must include the second's")
        running = {}
        for n in rt:
            if lt[n] != rt[n] and not (lt[n] in NUMERIC and rt[n] in NUMERIC):
                raise OracleCelError(f"FOLD: {n!r} has two types")
            running[n] = rt[n] if lt[n] == rt[n] else "float"
        last = {n: running.get(n, t) for n, t in lt.items()}
        scope = Scope("FOLD", {1: lt, 2: rt, "last": last}, (1, 2), durs=(None, 2))
        cond, rebind = _pred(x[2], scope, self.functions), _pred(x[3], scope, self.functions)
        aggs = []
        for tree, alias in x[4]:
            if alias not in lt or alias in [a for a, _ in aggs]:
                raise OracleCelError(f"FOLD aggregate {alias!r}: not an attribute of the first input, or twice")
            e, t = resolve(tree, scope, self.functions)
            if not (t == last[alias] or (last[alias] == "float" and t == "int")):
                raise OracleCelError(f"FOLD aggregate {alias!r} is {last[alias]}, its expression {t}")
            aggs.append((alias, e))
        schema = tuple((n + "_1" if n in rt else n, t) for n, t in left["schema"])
        schema += tuple((n, running[n]) for n, _ in right["schema"])
        _unique(schema, "FOLD")
        return {"op": "fold", "left": left, "right": right, "cond": cond, "rebind": rebind, "aggs": aggs,
                "last": last, "schema": schema}
