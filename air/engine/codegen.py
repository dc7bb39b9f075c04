"""Compile predicates and schema maps to Python functions, once, at load time.

Generated signatures (``e``: event values, ``n``: instance values, tuples in
schema order; ``et0``/``et1``: event timestamps; ``nt0``: instance start)::

    pred(e, n, et0, et1, nt0) -> bool
    smap(e, n) -> tuple          # the destination's values, in schema order

A TRUE predicate compiles to ``None`` so the engine can skip the call.
Arithmetic and comparisons follow docs/design/semantics.md#arithmetic-and-comparison:
``int op int`` is exact (``/`` truncates toward zero, ``%`` is C's remainder,
never through a float), an int result must fit in 64 bits and a float result
must be finite, and arithmetic on a string or a bool, or a comparison of values
of different kinds, is a type clash. An operation that breaks a rule raises
(``OverflowError``, ``ZeroDivisionError``, ``TypeError``, ``ValueError``), which
the engine counts as an evaluation error: the edge is not taken.

The types of attributes and literals are known when a function is compiled, so
``+ - *`` and unary minus on them compile to the plain operation and an inline
range check (no call); ``/``, ``%``, ``^``, and operands of unknown type (a user
function's result) go through helpers that check at run time.
"""

from __future__ import annotations

import math
import operator
import sys
import types
from typing import Callable, Sequence

from air.expr import And, Binary, Call, Compare, Dur, Expr, Literal, Or, Ref, Unary
from air.model import (
    Attribute, Clause, ComplexAtom, Computed, DurationAtom, DynamicAtom, Predicate, Rename, StaticAtom,
)
from air.engine.functions import FunctionRegistry, contains, similarity


class BindError(ValueError):
    """An automaton refers to something its streams or states do not have."""


_PY_OP = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
FLOAT_MAX = sys.float_info.max

#: ``code`` checked inline: its value if it is an int in 64 bits (a finite float), else _ovf() raises.
#: One local ``_t`` serves every nested check: each reads it right after its own assignment.
_INT_CHECK = f"(_t if {INT_MIN} <= (_t := {{}}) <= {INT_MAX} else _ovf())"
_FLOAT_CHECK = f"(_t if {-FLOAT_MAX!r} <= (_t := {{}}) <= {FLOAT_MAX!r} else _ovf())"


def _ovf():
    raise OverflowError("the result is not a 64-bit int or a finite float")


def _clash(op: str):
    raise TypeError(f"'{op}' on values of the wrong types (a type clash)")


def _kind(x) -> type:
    """int and float are one kind (numbers); str, bool and anything else its own."""
    t = type(x)
    return float if t is int else t


def _num(x) -> type:
    t = type(x)
    if t is int or t is float:
        return t
    raise TypeError(f"arithmetic on a non-number {x!r}")


def _checked(r):
    if type(r) is int:
        if INT_MIN <= r <= INT_MAX:
            return r
        raise OverflowError(f"int overflow: {r} does not fit in 64 bits")
    if -FLOAT_MAX <= r <= FLOAT_MAX:
        return r
    raise OverflowError(f"float result {r} is not finite")


def _add(a, b):
    _num(a), _num(b)
    return _checked(a + b)


def _sub(a, b):
    _num(a), _num(b)
    return _checked(a - b)


def _mul(a, b):
    _num(a), _num(b)
    return _checked(a * b)


def _neg(a):
    _num(a)
    return _checked(-a)


def _div(a, b):
    if _num(a) is int and _num(b) is int:
        q = abs(a) // abs(b)  # ZeroDivisionError on b == 0
        return _checked(q if (a >= 0) == (b >= 0) else -q)
    return _checked(a / b)  # ZeroDivisionError on 0.0; an int operand is converted to float


def _mod(a, b):
    if _num(a) is int and _num(b) is int:
        r = abs(a) % abs(b)  # exact (never through a float); ZeroDivisionError on b == 0
        return r if a >= 0 else -r
    if b == 0:
        raise ZeroDivisionError(f"{a!r} % {b!r}")
    return math.fmod(a, b)


def _pow(a, b):
    if _num(a) is int and _num(b) is int and b >= 0:
        if b >= 64 and (a > 1 or a < -1):
            raise OverflowError(f"int overflow: {a} ^ {b}")  # not computed: it could take all memory
        return _checked(a ** b)
    if a == 0 and b < 0:
        raise ZeroDivisionError(f"{a!r} ^ {b!r}")
    try:
        return _checked(math.pow(a, b))  # OverflowError past the float range
    except ValueError:
        raise ValueError(f"{a!r} ^ {b!r} has no real value") from None


_CMP_FN = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge}


def _cmp(op: str, a, b) -> bool:
    """A comparison whose operand types are not known when it is compiled."""
    if _kind(a) is not _kind(b):
        raise TypeError(f"cannot compare {a!r} {op} {b!r} (a type clash)")
    return _CMP_FN[op](a, b)


def _store(type_: str, x):
    """A value of unknown type stored into an attribute of ``type_`` (an int into a float one is converted)."""
    t = type(x)
    if type_ == "float" and (t is float or t is int):
        return float(x)
    if t is _PY_TYPES.get(type_, t):
        return x
    raise TypeError(f"a {t.__name__} value stored into a {type_} attribute (a type clash)")


_PY_TYPES = {"int": int, "float": float, "string": str, "bool": bool}
_NUMERIC = ("int", "float")
_HELPER_FNS = {"_ovf": _ovf, "_clash": _clash, "_add": _add, "_sub": _sub, "_mul": _mul, "_neg": _neg,
               "_div": _div, "_mod": _mod, "_pow": _pow, "_cmp": _cmp, "_store": _store}
_ARITH_FN = {"+": "_add", "-": "_sub", "*": "_mul"}
_BUILTIN_FNS = (contains, similarity)


def convert_const(text: str, type_: str):
    """An AIR ``Const`` string as a value of the attribute's type (numbers
    and strings interned: thousands of subscriptions repeat their constants)."""
    value = _convert_const(text, type_)
    if value is _OUT_OF_RANGE:
        raise BindError(f"constant {text!r} is out of range for the attribute's type {type_} "
                        "(a 64-bit int, a finite float)")
    t = type(value)
    if t is str:
        return sys.intern(value)
    if (t is float or t is int) and value == value and value != 0 and len(_INTERNED) < _INTERN_MAX:
        return _INTERNED.setdefault((t, value), value)  # not 0: -0.0 == 0.0; not NaN
    return value


_INTERNED: dict = {}
_OUT_OF_RANGE = object()
_INTERN_MAX = 1_000_000


def _convert_const(text: str, type_: str):
    try:
        if type_ in ("int", "float"):
            try:
                value = int(text) if type_ == "int" else float(text)
            except ValueError:
                if type_ == "float":
                    raise
                value = float(text)
            # docs/design/semantics.md#arithmetic-and-comparison: a constant out of range is refused
            if (type(value) is int and not INT_MIN <= value <= INT_MAX) or not math.isfinite(value):
                return _OUT_OF_RANGE
            return value
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
        self.globals: dict[str, object] = dict(_HELPER_FNS)
        self._consts = 0
        #: Global name of each StaticAtom constant compiled -> (atom, attribute type): what a
        #: template (see :class:`FnTemplate`) rebinds for automata differing only in constants.
        self.sites: dict[str, tuple[StaticAtom, str]] = {}
        #: Functions the compiled code calls, by name (a template is valid while they stay registered).
        self.calls: dict[str, object] = {}

    def const(self, value) -> str:
        """A constant as a global name, so that functions differing only in
        their constants share one compiled code object (see :meth:`build`)."""
        i = self._consts
        name = _CONST_NAMES[i] if i < len(_CONST_NAMES) else f"_c{i}"
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
        return self.typed(x)[0]

    def typed(self, x: Expr) -> tuple[str, str | None]:
        """The code of ``x`` and the type of its value (``int``, ``float``,
        ``string``, ``bool``; None where only the run can tell: a user
        function's result, ``int ^ int`` with an exponent that is not a constant)."""
        if isinstance(x, Literal):
            v = x.value
            if (type(v) is int and not INT_MIN <= v <= INT_MAX) or (type(v) is float and not math.isfinite(v)):
                raise BindError(f"{self.where}: the number {v} is out of range (a 64-bit int, a finite float)")
            return self.const(v), x.type
        if isinstance(x, Ref):
            if x.source == "EV":
                return self.ev_ref(x.name), self.ev[x.name][1]
            if x.source == "NODE":
                return self.node_ref(x.name), self.node[x.name][1]
            if x.source is None:  # bare name: the event's if it has it, else the instance's
                if x.name in self.ev:
                    return self.ev_ref(x.name), self.ev[x.name][1]
                return self.node_ref(x.name), self.node[x.name][1]
            raise BindError(f"{self.where}: CEL decorator ${x.source}. is not valid in AIR")
        if isinstance(x, Unary):
            code, t = self.typed(x.operand)
            if t == "int":
                return _INT_CHECK.format(f"-{code}"), t  # -(-2^63) does not fit
            if t == "float":
                return f"(-{code})", t
            if t is None:
                return f"_neg({code})", None
            return "_clash('-')", None
        if isinstance(x, Binary):
            (left, lt), (right, rt) = self.typed(x.left), self.typed(x.right)
            if lt in _NUMERIC and rt in _NUMERIC:
                t = "int" if lt == rt == "int" else "float"
            elif lt is None and rt in (None, *_NUMERIC) or rt is None and lt in _NUMERIC:
                t = None
            else:
                return f"_clash('{x.op}')", None  # a string or a bool operand
            if x.op in _ARITH_FN:
                if t is None:
                    return f"{_ARITH_FN[x.op]}({left}, {right})", None
                return (_INT_CHECK if t == "int" else _FLOAT_CHECK).format(f"{left} {x.op} {right}"), t
            if x.op == "/":
                return f"_div({left}, {right})", t
            if x.op == "%":
                return f"_mod({left}, {right})", t
            if x.op == "^":
                if t == "int" and not (isinstance(x.right, Literal) and x.right.value >= 0):
                    t = None  # 2 ^ n is an int for n >= 0, a float for n < 0
                return f"_pow({left}, {right})", t
            raise BindError(f"{self.where}: unknown operator {x.op!r}")
        if isinstance(x, Call):
            fn = self.functions.get(x.name)
            if fn is None:
                raise BindError(f"{self.where}: unknown function {x.name}")
            if fn.arity is not None and fn.arity != len(x.args):
                raise BindError(f"{self.where}: {x.name} takes {fn.arity} arguments, not {len(x.args)}")
            gname = f"_f_{x.name}"
            self.globals[gname] = fn.fn
            self.calls[x.name] = fn
            # the built-ins return what they declare; a user function's result is checked where it is used
            t = fn.return_type if fn.fn in _BUILTIN_FNS else None
            return f"{gname}(" + ", ".join(self.expr(a) for a in x.args) + ")", t
        if isinstance(x, Compare):
            (left, lt), (right, rt) = self.typed(x.left), self.typed(x.right)
            if lt is None or rt is None:
                return f"_cmp('{x.op}', {left}, {right})", "bool"
            if lt != rt and not (lt in _NUMERIC and rt in _NUMERIC):
                return f"_clash('{x.op}')", "bool"
            return f"({left} {_PY_OP[x.op]} {right})", "bool"
        if isinstance(x, And):
            return "(" + " and ".join(self.expr(i) for i in x.items) + ")", "bool"
        if isinstance(x, Or):
            return "(" + " or ".join(self.expr(i) for i in x.items) + ")", "bool"
        if isinstance(x, Dur):
            raise BindError(f"{self.where}: DUR is only allowed in a DurationPred")
        raise BindError(f"{self.where}: unsupported expression {x!r}")

    def atom(self, a) -> str:
        if isinstance(a, StaticAtom):
            ref = self.ev_ref(a.event_attr)
            type_ = self.ev[a.event_attr][1]
            name = self.const(convert_const(a.const, type_))
            self.sites[name] = (a, type_)
            return f"({ref} {_PY_OP[a.op]} {name})"
        if isinstance(a, DynamicAtom):
            ev, node = self.ev_ref(a.event_attr), self.node_ref(a.node_attr)
            et, nt = self.ev[a.event_attr][1], self.node[a.node_attr][1]
            if et != nt and not (et in _NUMERIC and nt in _NUMERIC):
                return f"_clash('{a.op}')"
            return f"({ev} {_PY_OP[a.op]} {node})"
        if isinstance(a, DurationAtom):
            if a.kind == "COMPOSITE":
                if not self.has_node:
                    raise BindError(f"{self.where}: COMPOSITE duration on a START state's edge")
                return f"((et1 - nt0) {_PY_OP[a.op]} {self.const(a.const)})"
            return f"((et1 - et0) {_PY_OP[a.op]} {self.const(a.const)})"
        if isinstance(a, ComplexAtom):
            return self.expr(a.expr)
        raise BindError(f"{self.where}: unknown atom {a!r}")

    def build(self, name: str, params: str, body: str) -> Callable:
        """A function ``name(params): return body``. Code objects are cached by
        source text: thousands of subscriptions that differ only in constants
        share one, which keeps loading fast and memory small."""
        src = f"def {name}({params}):\n    return {body}\n"
        code = _CODE_CACHE.get(src)
        if code is None:
            module = compile(src, "<cayuga>", "exec")
            code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
            if len(_CODE_CACHE) < _CODE_CACHE_MAX:
                _CODE_CACHE[src] = code
        # Each function gets only the globals it reads (the scope's dict holds
        # every constant of every function compiled in it). Functions without
        # constants (only helpers such as ``_div``) are shared by everything
        # that compiles to the same code: ``e[1] > n[1]`` exists once.
        scope_globals = self.globals
        globs = {n: scope_globals[n] for n in code.co_names if n in scope_globals}
        if all(n in _HELPERS or n.startswith("_f_") for n in globs):
            key = (code, tuple(id(v) for v in globs.values()))
            fn = _SHARED.get(key)
            if fn is None:
                fn = types.FunctionType(code, globs)
                if len(_SHARED) < _CODE_CACHE_MAX:
                    _SHARED[key] = fn  # holds the helpers it names, so their ids stay unique
            return fn
        return types.FunctionType(code, globs)


class FnTemplate:
    """A compiled function whose StaticAtom constants can be swapped: compile
    once per automaton shape, :meth:`make` one per automaton. ``slots`` pairs
    each such constant's global name with an index into the converted
    constants a caller passes (see air/engine/loader.py: templates); every
    other global (helpers, functions, literals of expressions) is fixed, as the
    shape fixes it. Without slots the one function is shared."""

    __slots__ = ("fn", "code", "fixed", "slots")

    def __init__(self, fn: Callable | None, scope: Scope, slot_of: Callable[[StaticAtom, str], int]) -> None:
        self.fn = fn
        self.code = fn.__code__ if fn is not None else None
        names = self.code.co_names if fn is not None else ()
        self.slots = tuple((n, slot_of(*scope.sites[n])) for n in names if n in scope.sites)
        self.fixed = {n: v for n, v in fn.__globals__.items() if n not in scope.sites} if self.slots else {}

    def make(self, values: list) -> Callable | None:
        if not self.slots:
            return self.fn
        g = self.fixed.copy()
        for name, i in self.slots:
            g[name] = values[i]
        return types.FunctionType(self.code, g)


_CODE_CACHE: dict[str, types.CodeType] = {}
_HELPERS = frozenset(_HELPER_FNS)
#: Constant-free functions by (code, ids of the helpers they read).
_SHARED: dict[tuple, Callable] = {}
_CONST_NAMES = tuple(f"_c{i}" for i in range(64))
_CODE_CACHE_MAX = 100_000


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
            by_name[m.attr] = (*scope.typed(m.expr), True)
    items = []
    for a in dest:
        if a.name not in by_name:
            raise BindError(f"{scope.where}: the schema map does not produce {a.name!r}")
        code, src_type, *computed = by_name[a.name]
        if computed and src_type != a.type:  # docs/design/semantics.md#arithmetic-and-comparison
            if src_type is None:
                code = f"_store('{a.type}', {code})"
            elif a.type == "float" and src_type == "int":
                code = f"float({code})"  # an int expression stored in a float attribute
            else:
                code = f"_clash('{a.type} attribute {a.name} := {src_type}')"
        elif a.type == "float" and src_type != "float":
            code = f"float({code})"  # a renamed int attribute stored in a float attribute
        items.append(code)
    body = "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return scope.build("smap", "e, n", body)


def split_clause(clause: Clause, scope: Scope) -> tuple[list[tuple[int, object]], list[tuple[int, int]], list]:
    """Split one conjunctive clause for indexing (docs/design/semantics.md#indexes-and-state-merging).

    Returns ``(static_eq, dynamic_eq, rest)``: ``static_eq`` holds
    ``(event attribute index, typed constant)`` for each ``e.a = CONST`` atom,
    ``dynamic_eq`` holds ``(event attribute index, instance attribute index)``
    for each ``e.a = I.b`` atom, and ``rest`` the remaining atoms in order.
    Attribute references are checked as in :meth:`Scope.atom`."""
    static_eq: list[tuple[int, object]] = []
    dynamic_eq: list[tuple[int, int]] = []
    rest = []
    for a in clause.atoms:
        if isinstance(a, StaticAtom) and a.op == "=":
            scope.ev_ref(a.event_attr)
            idx, type_ = scope.ev[a.event_attr]
            static_eq.append((idx, convert_const(a.const, type_)))
        elif isinstance(a, DynamicAtom) and a.op == "=" and scope.has_node:
            scope.ev_ref(a.event_attr)
            scope.node_ref(a.node_attr)
            dynamic_eq.append((scope.ev[a.event_attr][0], scope.node[a.node_attr][0]))
        else:
            rest.append(a)
    return static_eq, dynamic_eq, rest


def eq_key(static_eq: list[tuple[int, object]]) -> tuple[tuple[int, ...], object] | None:
    """The hash-index signature and key of a clause's static equality atoms:
    ``((attr indexes, ascending), key)`` where the key is the constant for one
    attribute and a tuple of constants for several (as ``operator.itemgetter``
    returns them). ``None`` if there are none or they contradict each other
    (``a = 1 AND a = 2``), in which case the caller must not index the clause."""
    by_attr: dict[int, object] = {}
    for idx, value in static_eq:
        if idx in by_attr:
            old = by_attr[idx]
            if old != value or type(old) is not type(value):
                return None
        by_attr[idx] = value
    if not by_attr:
        return None
    sig = tuple(sorted(by_attr))
    key = by_attr[sig[0]] if len(sig) == 1 else tuple(by_attr[i] for i in sig)
    return sig, key


def compile_atoms(atoms, scope: Scope) -> Callable | None:
    """Compile the conjunction of ``atoms`` (``None`` when there are none: TRUE)."""
    if not atoms:
        return None
    return scope.build("pred", "e, n, et0, et1, nt0", " and ".join(scope.atom(a) for a in atoms))


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _side(x: Expr, scope: Scope) -> str | None:
    """Whether ``x`` reads only the event (``"ev"``), only the instance
    (``"node"``), neither (``"const"``), or cannot be split (``None``: both,
    a function call, a comparison, DUR)."""
    if isinstance(x, Literal):
        return "const"
    if isinstance(x, Ref):
        if x.source == "EV":
            return "ev"
        if x.source == "NODE":
            return "node"
        if x.source is None:
            return "ev" if x.name in scope.ev else "node"
        return None
    if isinstance(x, Unary):
        return _side(x.operand, scope)
    if isinstance(x, Binary):
        a, b = _side(x.left, scope), _side(x.right, scope)
        if a is None or b is None:
            return None
        if a == "const":
            return b
        if b == "const" or a == b:
            return a
        return None
    return None


def split_inequality(atom, scope: Scope):
    """An atom ``ev_expr OP node_expr`` (OP one of ``< <= > >=``; either side
    may be written first) whose one side reads only the event and the other
    only the instance: ``(op, ev_fn, key_fn)`` with ``ev_fn(e)`` and
    ``key_fn(n)`` such that the atom is true iff ``ev_fn(e) op key_fn(n)``.
    ``None`` for any other atom. Used by the sorted instance index."""
    if isinstance(atom, DynamicAtom):
        if atom.op not in _FLIP or not scope.has_node:
            return None
        ev, node, op = scope.ev_ref(atom.event_attr), scope.node_ref(atom.node_attr), atom.op
    elif isinstance(atom, ComplexAtom) and isinstance(atom.expr, Compare) and atom.expr.op in _FLIP:
        if not scope.has_node:
            return None
        left, right = _side(atom.expr.left, scope), _side(atom.expr.right, scope)
        if left == "ev" and right == "node":
            ev, node, op = scope.expr(atom.expr.left), scope.expr(atom.expr.right), atom.expr.op
        elif left == "node" and right == "ev":
            ev, node, op = scope.expr(atom.expr.right), scope.expr(atom.expr.left), _FLIP[atom.expr.op]
        else:
            return None
    else:
        return None
    return op, scope.build("ev_side", "e", ev), scope.build("key", "n", node)
