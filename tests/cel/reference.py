"""A direct, slow interpreter of CEL's algebra over finite event lists, used
as an independent oracle for the compiled automata.

It evaluates the analysed plan (:mod:`air.cel.semantics`) operator by
operator: ``R NEXT S`` pairs each ``r`` with the satisfying ``s`` events of
the earliest epoch that starts after ``r`` ends; ``R FOLD S`` iterates that
step, continuing while the rebind predicate holds and emitting every step.
"""

from __future__ import annotations

import math
import operator

from air.cel.semantics import Duration, Iter, Plan, Publish, Scan, Select, Seq, Where
from air.expr import And, Binary, Call, Compare, Literal, Or, Ref, Unary
from server.engine import FunctionRegistry

FUNCTIONS = FunctionRegistry.default()
CMP = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge}


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _div,
         "%": lambda a, b: int(math.fmod(a, b)) if isinstance(a, int) and isinstance(b, int) else math.fmod(a, b),
         "^": operator.pow}


def ev(e, env: dict):
    if isinstance(e, Literal):
        return e.value
    if isinstance(e, Ref):
        return env[e.source][e.name]
    if isinstance(e, Duration):
        return env["DUR"][e.of]
    if isinstance(e, Unary):
        return -ev(e.operand, env)
    if isinstance(e, Binary):
        return ARITH[e.op](ev(e.left, env), ev(e.right, env))
    if isinstance(e, Call):
        return FUNCTIONS.get(e.name).fn(*(ev(a, env) for a in e.args))
    if isinstance(e, Compare):
        return CMP[e.op](ev(e.left, env), ev(e.right, env))
    if isinstance(e, And):
        return all(ev(i, env) for i in e.items)
    if isinstance(e, Or):
        return any(ev(i, env) for i in e.items)
    raise TypeError(e)


def holds(pred, env) -> bool:
    return pred is None or ev(pred, env)


def run(plan: Plan, events: dict[str, list]) -> list[tuple[dict, object, object]]:
    """Output events of ``plan``: ``(values, t0, t1)``; ``events`` maps a stream
    to its ``(values dict, t0, t1)`` list in t1 order."""
    if isinstance(plan, Scan):
        return list(events.get(plan.stream, []))
    if isinstance(plan, Publish):
        return run(plan.input, events)
    if isinstance(plan, Select):
        return [({c.name: ev(c.expr, {"IN": v}) for c in plan.columns}, t0, t1)
                for v, t0, t1 in run(plan.input, events)]
    if isinstance(plan, Where):
        return [(v, t0, t1) for v, t0, t1 in run(plan.input, events)
                if ev(plan.pred, {"IN": v, "DUR": {"RESULT": t1 - t0}})]
    left, right = run(plan.left, events), run(plan.right, events)
    out = []
    if isinstance(plan, Seq):
        names = dict(zip((a.name for a in plan.left.schema), plan.left_names))
        for lv, lt0, lt1 in left:
            for rv, _, rt1 in _next_epoch(right, lt1, lambda rv, rt0, rt1: holds(plan.pred, {
                    "1": lv, "2": rv, "DUR": {"RESULT": rt1 - lt0, "EVENT": rt1 - rt0}})):
                out.append(({**{names[k]: x for k, x in lv.items()}, **rv}, lt0, rt1))
    else:
        out = _fold(plan, left, right)
    return sorted(out, key=lambda o: o[2])


def _next_epoch(right, after, pred):
    """The events of the earliest epoch after ``after`` that satisfy ``pred``."""
    found = [(rv, rt0, rt1) for rv, rt0, rt1 in right if rt0 > after and pred(rv, rt0, rt1)]
    if not found:
        return []
    first = min(t1 for _, _, t1 in found)
    return [f for f in found if f[2] == first]


def _fold(plan: Iter, left, right) -> list:
    aggs = {c.name: c.expr for c in plan.aggs}
    second = [a.name for a in plan.right.schema]
    updated = [a.name for a in plan.left.schema if a.name in aggs and a.name not in plan.shared]
    out = []
    for lv, lt0, lt1 in left:
        todo = [(dict(lv), lt1)]  # (last values, t1 of the instance)
        while todo:
            last, t1 = todo.pop()
            first = {**lv, **{a: last[a] for a in updated}}

            def env(rv, rt0, rt1):
                return {"1": first, "2": rv, "LAST": last, "DUR": {"RESULT": rt1 - lt0, "EVENT": rt1 - rt0}}
            for rv, rt0, rt1 in _next_epoch(right, t1, lambda rv, rt0, rt1: holds(plan.cond, env(rv, rt0, rt1))):
                e = env(rv, rt0, rt1)
                if not holds(plan.rebind, e):
                    continue
                new = dict(last)
                new.update({b: rv[b] for b in second})
                new.update({a: ev(x, e) for a, x in aggs.items()})
                values = {(a + "_1" if a in plan.shared else a): (new[a] if a in updated else lv[a]) for a in lv}
                values.update({b: new[b] for b in second})
                out.append((values, lt0, rt1))
                todo.append((new, rt1))
    return out
