"""The meaning of a CEL query, evaluated directly: every operator of the Cayuga
algebra as a function from the event lists of its inputs to the event list of
its output (docs/design/references.md; tests/oracle/cel.py reads the query).
No automaton, no epoch loop, no instance: each operator is its definition.

An event is ``(values, t0, t1)``, ``values`` a dict by attribute name. A
stream is a list of events (a multiset: order means nothing).

- **Selection** ``FILTER{θ}(X)``: the events of X for which θ holds; ``DUR``
  is the event's ``t1 - t0`` (docs/design/semantics.md#timestamps-and-durations).
- **Projection and renaming** ``SELECT`` (and ``AS``): each event's values
  computed from its own; times kept. An int stored into a float attribute
  becomes a float.
- **Sequencing** ``R NEXT{θ} S`` (the algebra's ``R ;θ S``, the system paper's
  "the next event in S which satisfies the predicate and occurs after the
  detection time of e1"): for each ``r`` of R, of the events ``s`` of S that
  begin after ``r`` ends (``s.t0 > r.t1``: the two do not overlap) and satisfy
  ``θ(r, s)``, those with the least ``t1`` — all of them, when simultaneous
  events tie (docs/design/semantics.md#simultaneity: they all see ``r``) —
  each give ``r ++ s`` with ``t0 = r.t0``, ``t1 = s.t1``. In θ, ``DUR`` is
  that result's duration (``s.t1 - r.t0``), ``$2.DUR`` the event's.
- **Iteration** ``R FOLD{θ, φ, g} S`` (the algebra's ``μ``: ``R ;θ S ;θ S ...``
  with ``F = g ∘ σφ`` applied at each step, remembering R's values and the
  last iteration's): from each ``r`` a chain starts with the last-iteration
  values ``$`` = r's. A chain ``x`` steps to the next events of S as NEXT
  does (after ``x.t1``, θ holding, the least ``t1``, each tie its own branch);
  a step whose φ holds (and whose aggregates ``g`` evaluate) is an output of
  the FOLD — ``$`` now the event's values and the aggregates' — and goes on;
  a step whose φ fails ends that branch. So a FOLD outputs patterns of two
  or more events (the system paper), each prefix of a chain once.
- **PUBLISH** names a (sub-)query's output; the witnesses of every published
  stream and of the query are returned.

Conventions (choices the papers leave, taken from docs/design/semantics.md):

1. An expression that fails (docs/design/semantics.md#arithmetic-and-comparison)
   makes its predicate false for that event, and a SELECT column or FOLD
   aggregate that fails drops that event (or ends that branch); counted in
   ``errors``. (The random queries of tests/oracle/test_cel_differential.py
   make no failing expression: which edges an automaton puts a projection on
   decides what a failure costs, and docs/design/semantics.md says it for
   edges only.)
2. In FOLD, ``$1.a`` is R's value of ``a``; ``$.a`` the last iteration's (R's
   before the first step): for ``a`` of S the event's, for an aggregate its
   value, otherwise R's. The output has ``a_1`` (R's) and ``a`` (the last)
   for ``a`` of S, and for an attribute only R has its last value (an
   aggregate's running value).
3. A value of a shared FOLD attribute whose types differ (int, float) is a
   float; an aggregate into a float attribute makes an int a float.
4. DUR constants with a unit are converted into the time unit
   (``time_unit_ms`` milliseconds; an int when whole).
"""

from __future__ import annotations

from collections import Counter

from tests.oracle.cel import Analyzer, parse
from tests.oracle.expr import BUILTINS, OracleExprError, arith, compare, value

FAILURES = (OracleExprError, ZeroDivisionError, OverflowError, ValueError, TypeError)


class OracleCelTooLarge(RuntimeError):
    """A case whose intermediate streams grow past the limit (FOLD chains branch on
    every tie): too large to evaluate by brute force."""


class Cel:
    """One query over declared streams (``{name: ((attr, type), ...)}``)."""

    def __init__(self, text: str, streams: dict, time_unit_ms: float = 1.0, functions: dict | None = None,
                 max_events: int = 20_000) -> None:
        analyzer = Analyzer(streams, {k: v[0] for k, v in (functions or {}).items()})
        self.plan = analyzer.plan(parse(text, time_unit_ms))
        self.published = list(analyzer.published)
        self.functions = {**BUILTINS, **{k: v[1] for k, v in (functions or {}).items()}}
        self.max_events = max_events
        self.errors = 0
        self.last_error = ""

    @property
    def schema(self) -> tuple:
        """The query's output schema: ``((name, type), ...)``."""
        return self.plan["schema"]

    def schema_of(self, stream: str) -> tuple:
        def find(node):
            if node["op"] == "publish" and node["name"] == stream:
                return node["schema"]
            for k in ("input", "left", "right"):
                if k in node and (got := find(node[k])) is not None:
                    return got
            return None
        return find(self.plan)

    def run(self, events) -> dict:
        """``{stream: Counter((values tuple, t0, t1))}`` for each published
        stream, and the query's own output under ``None``. ``events``:
        ``(stream, values, t0, t1)`` in the order of the declared schemas."""
        self._input: dict[str, list] = {}
        for s, v, t0, t1 in events:
            self._input.setdefault(s, []).append((tuple(v), t0, t1))
        self._out: dict = {}
        top = self._eval(self.plan)
        self._out[None] = top
        return {k: Counter((tuple(vals[n] for n, _ in schema), t0, t1) for vals, t0, t1 in evs)
                for k, (schema, evs) in ((k, (self.plan["schema"] if k is None else self.schema_of(k), evs))
                                         for k, evs in self._out.items())}

    # ------------------------------------------------------------------ expressions

    def _fail(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def _value(self, tree, env: dict, durs: dict):
        tag = tree[0]
        if tag == "lit":
            return tree[1]
        if tag == "ref":
            return env[tree[1]][tree[2]]
        if tag == "dur":
            return durs[tree[1]]
        if tag == "neg":
            x = self._value(tree[1], env, durs)
            if type(x) not in (int, float):
                raise OracleExprError(f"unary minus on {x!r}")
            return value(-x, f"-{x!r}")
        if tag == "bin":
            return arith(tree[1], self._value(tree[2], env, durs), self._value(tree[3], env, durs))
        if tag == "call":
            return self.functions[tree[1]](*(self._value(a, env, durs) for a in tree[2]))
        if tag == "cmp":
            return compare(tree[1], self._value(tree[2], env, durs), self._value(tree[3], env, durs))
        if tag == "and":
            return all(self._value(x, env, durs) for x in tree[1])
        if tag == "or":
            return any(self._value(x, env, durs) for x in tree[1])
        raise OracleExprError(f"bad tree {tree!r}")

    def _holds(self, pred, env: dict, durs: dict) -> bool:
        if pred is None:
            return True
        try:
            return bool(self._value(pred, env, durs))
        except FAILURES as exc:
            self._fail(exc)
            return False

    @staticmethod
    def _store(v, typ: str):
        """A value stored into an attribute of ``typ``: an int becomes a float
        there; any other mismatch is a type clash (the store fails)."""
        if typ == "float" and type(v) is int:
            return float(v)
        if {bool: "bool", int: "int", float: "float", str: "string"}[type(v)] != typ:
            raise OracleExprError(f"a {type(v).__name__} stored into a {typ} attribute")
        return v

    # ------------------------------------------------------------------ operators

    def _eval(self, node) -> list:
        out = getattr(self, "_" + node["op"])(node)
        if len(out) > self.max_events:
            raise OracleCelTooLarge(f"{node['op']} gives more than {self.max_events} events")
        return out

    def _scan(self, node) -> list:
        names = [n for n, _ in node["schema"]]
        return [(dict(zip(names, v)), t0, t1) for v, t0, t1 in self._input.get(node["stream"], ())]

    def _publish(self, node) -> list:
        evs = self._eval(node["input"])
        self._out[node["name"]] = evs
        return evs

    def _filter(self, node) -> list:
        return [e for e in self._eval(node["input"])
                if self._holds(node["pred"], {"in": e[0]}, {"result": e[2] - e[1]})]

    def _select(self, node) -> list:
        out = []
        for vals, t0, t1 in self._eval(node["input"]):
            try:
                row = {n: self._store(self._value(e, {"in": vals}, {}), t) for n, t, e in node["cols"]}
            except FAILURES as exc:
                self._fail(exc)
                continue
            out.append((row, t0, t1))
        return out

    @staticmethod
    def _after(right: list, t1):
        """The events of ``right`` that begin after ``t1``, by their ``t1``."""
        return [e for e in right if e[1] > t1]

    def _next(self, node) -> list:
        left, right = self._eval(node["left"]), sorted(self._eval(node["right"]), key=lambda e: e[2])
        out = []
        for r, r0, r1 in left:
            best = None
            for s, s0, s1 in self._after(right, r1):
                if best is not None and s1 > best:
                    break
                if self._holds(node["pred"], {1: r, 2: s}, {"result": s1 - r0, "event": s1 - s0}):
                    best = s1
                    row = {m: r[n] for m, (n, _) in zip(node["names"], node["left"]["schema"])}
                    row.update(s)
                    out.append((row, r0, s1))
        return out

    def _fold(self, node) -> list:
        left, right = self._eval(node["left"]), sorted(self._eval(node["right"]), key=lambda e: e[2])
        rnames = [n for n, _ in node["right"]["schema"]]
        last_types = node["last"]
        out: list = []
        for r, r0, r1 in left:
            try:
                first = {n: self._store(v, last_types[n]) for n, v in r.items()}
            except FAILURES as exc:  # (cannot happen: an int becomes a float)
                self._fail(exc)
                continue
            frontier = [(first, r1)]                  # (the last iteration's values, t1)
            while frontier:
                new = []
                for last, x1 in frontier:
                    best = None
                    for s, s0, s1 in self._after(right, x1):
                        if best is not None and s1 > best:
                            break
                        env = {1: r, 2: s, "last": last}
                        durs = {"result": s1 - r0, "event": s1 - s0}
                        if not self._holds(node["cond"], env, durs):
                            continue
                        best = s1                     # this tie is the next step, whatever φ says
                        if not self._holds(node["rebind"], env, durs):
                            continue                  # the branch ends
                        try:
                            step = dict(last)
                            step.update({n: self._store(s[n], last_types[n]) for n in rnames})
                            step.update({n: self._store(self._value(e, env, durs), last_types[n])
                                         for n, e in node["aggs"]})
                        except FAILURES as exc:
                            self._fail(exc)
                            continue
                        new.append((step, s1))
                        row = {}
                        for n, _ in node["left"]["schema"]:
                            row[n + "_1" if n in rnames else n] = r[n] if n in rnames else step[n]
                        row.update({n: step[n] for n in rnames})
                        out.append((row, r0, s1))
                        if len(out) > self.max_events:
                            raise OracleCelTooLarge(f"FOLD gives more than {self.max_events} events")
                frontier = new
        return out


def evaluate(text: str, streams: dict, events, time_unit_ms: float = 1.0) -> dict:
    """:meth:`Cel.run` of ``text``."""
    return Cel(text, streams, time_unit_ms).run(events)
