"""Compile predicates and schema maps to Python functions, once, at load time.

Generated signatures (``e``: event values, ``n``: instance values, tuples in
schema order; ``et0``/``et1``: event timestamps; ``nt0``: instance start)::

    pred(e, n, et0, et1, nt0) -> bool
    smap(e, n) -> tuple          # the destination's values, in schema order

A TRUE predicate compiles to ``None`` so the engine can skip the call.
Arithmetic follows the original: ``int / int`` truncates toward zero and ``%``
is the C remainder; both raise ``ZeroDivisionError`` on a zero divisor, which
the engine counts as an evaluation error.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from air.expr import And, Binary, Call, Compare, Dur, Expr, Literal, Or, Ref, Unary
from air.model import (
    Attribute, ComplexAtom, Computed, DurationAtom, DynamicAtom, Predicate, Rename, StaticAtom,
)
from server.engine.functions import FunctionRegistry


class BindError(ValueError):
    """An automaton refers to something its streams or states do not have."""


_PY_OP = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        q = abs(a) // abs(b)  # ZeroDivisionError on b == 0
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return int(math.fmod(a, b)) if b else a % b  # a % 0 raises
    return math.fmod(a, b)


def _pow(a, b):
    return a ** b


def convert_const(text: str, type_: str):
    """An AIR ``Const`` string as a value of the attribute's type."""
    try:
        if type_ == "int":
            try:
                return int(text)
            except ValueError:
                return float(text)
        if type_ == "float":
            return float(text)
        if type_ == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "t", "yes"):
                return True
            if low in ("0", "false", "f", "no"):
                return False
            raise ValueError(text)
    except ValueError:
        raise BindError(f"constant {text!r} is not a valid {type_}") from None
    return text


class Scope:
    """What a compiled function can see: the event's and the instance's schemas."""

    def __init__(self, event: Sequence[Attribute], node: Sequence[Attribute] | None,
                 functions: FunctionRegistry, where: str) -> None:
        self.ev = {a.name: (i, a.type) for i, a in enumerate(event)}
        self.node = {a.name: (i, a.type) for i, a in enumerate(node or ())}
        self.has_node = node is not None
        self.functions = functions
        self.where = where
        self.globals: dict[str, object] = {"_div": _div, "_mod": _mod, "_pow": _pow}
        self._consts = 0

    def const(self, value) -> str:
        if isinstance(value, (int, float, bool)) and not isinstance(value, str):
            return repr(value)
        name = f"_c{self._consts}"
        self._consts += 1
        self.globals[name] = value
        return name

    def ev_ref(self, name: str) -> str:
        if name not in self.ev:
            raise BindError(f"{self.where}: the event has no attribute {name!r} "
                            f"(it has {', '.join(self.ev) or 'none'})")
        return f"e[{self.ev[name][0]}]"

    def node_ref(self, name: str) -> str:
        if name not in self.node:
            what = "a START state has no stored attributes" if not self.has_node else \
                f"the state has {', '.join(self.node) or 'none'}"
            raise BindError(f"{self.where}: no stored attribute {name!r} ({what})")
        return f"n[{self.node[name][0]}]"

    def expr(self, x: Expr) -> str:
        if isinstance(x, Literal):
            return self.const(x.value)
        if isinstance(x, Ref):
            if x.source == "EV":
                return self.ev_ref(x.name)
            if x.source == "NODE":
                return self.node_ref(x.name)
            if x.source is None:  # bare name: the event's if it has it, else the instance's
                return self.ev_ref(x.name) if x.name in self.ev else self.node_ref(x.name)
            raise BindError(f"{self.where}: CEL decorator ${x.source}. is not valid in AIR")
        if isinstance(x, Unary):
            return f"(-{self.expr(x.operand)})"
        if isinstance(x, Binary):
            left, right = self.expr(x.left), self.expr(x.right)
            if x.op == "/":
                return f"_div({left}, {right})"
            if x.op == "%":
                return f"_mod({left}, {right})"
            if x.op == "^":
                return f"_pow({left}, {right})"
            return f"({left} {x.op} {right})"
        if isinstance(x, Call):
            fn = self.functions.get(x.name)
            if fn is None:
                raise BindError(f"{self.where}: unknown function {x.name}")
            if fn.arity is not None and fn.arity != len(x.args):
                raise BindError(f"{self.where}: {x.name} takes {fn.arity} arguments, not {len(x.args)}")
            gname = f"_f_{x.name}"
            self.globals[gname] = fn.fn
            return f"{gname}(" + ", ".join(self.expr(a) for a in x.args) + ")"
        if isinstance(x, Compare):
            return f"({self.expr(x.left)} {_PY_OP[x.op]} {self.expr(x.right)})"
        if isinstance(x, And):
            return "(" + " and ".join(self.expr(i) for i in x.items) + ")"
        if isinstance(x, Or):
            return "(" + " or ".join(self.expr(i) for i in x.items) + ")"
        if isinstance(x, Dur):
            raise BindError(f"{self.where}: DUR is only allowed in a DurationPred")
        raise BindError(f"{self.where}: unsupported expression {x!r}")

    def atom(self, a) -> str:
        if isinstance(a, StaticAtom):
            ref = self.ev_ref(a.event_attr)
            return f"({ref} {_PY_OP[a.op]} {self.const(convert_const(a.const, self.ev[a.event_attr][1]))})"
        if isinstance(a, DynamicAtom):
            return f"({self.ev_ref(a.event_attr)} {_PY_OP[a.op]} {self.node_ref(a.node_attr)})"
        if isinstance(a, DurationAtom):
            if a.kind == "COMPOSITE":
                if not self.has_node:
                    raise BindError(f"{self.where}: COMPOSITE duration on a START state's edge")
                return f"((et1 - nt0) {_PY_OP[a.op]} {a.const!r})"
            return f"((et1 - et0) {_PY_OP[a.op]} {a.const!r})"
        if isinstance(a, ComplexAtom):
            return self.expr(a.expr)
        raise BindError(f"{self.where}: unknown atom {a!r}")

    def build(self, name: str, params: str, body: str) -> Callable:
        src = f"def {name}({params}):\n    return {body}\n"
        code = compile(src, f"<cayuga {self.where}>", "exec")
        ns = dict(self.globals)
        exec(code, ns)  # noqa: S102 - source is generated from the validated model only
        fn = ns[name]
        fn.__cayuga_source__ = src
        return fn


def compile_predicate(pred: Predicate, scope: Scope) -> Callable | None:
    if pred.is_true:
        return None
    if not pred.clauses:
        return lambda e, n, et0, et1, nt0: False
    parts = []
    for clause in pred.clauses:
        atoms = [scope.atom(a) for a in clause.atoms]
        parts.append("(" + " and ".join(atoms) + ")")
    return scope.build("pred", "e, n, et0, et1, nt0", " or ".join(parts))


def compile_schema_map(entries, dest: Sequence[Attribute], scope: Scope) -> Callable:
    by_name: dict[str, tuple[str, str | None]] = {}  # attr -> (code, known source type)
    for m in entries:
        if isinstance(m, Rename):
            if m.source == "EV":
                by_name[m.new] = (scope.ev_ref(m.old), scope.ev[m.old][1])
            else:
                by_name[m.new] = (scope.node_ref(m.old), scope.node[m.old][1])
        elif isinstance(m, Computed):
            by_name[m.attr] = (scope.expr(m.expr), None)
    items = []
    for a in dest:
        if a.name not in by_name:
            raise BindError(f"{scope.where}: the schema map does not produce {a.name!r}")
        code, src_type = by_name[a.name]
        if a.type == "float" and src_type != "float":
            code = f"float({code})"  # an int expression stored in a float attribute
        items.append(code)
    body = "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return scope.build("smap", "e, n", body)
