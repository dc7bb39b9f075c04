"""The oracle's own reading and evaluation of AIR expressions.

AIR carries expressions as text in two places: ``<ComplexPred Expr="...">`` (one
comparison) and ``<UDF Expr="..." Attr="...">`` (a value for the new instance).
The language (docs/design/semantics.md#cel, docs/design/air-format.md): integer, float and
'string' literals; ``EV.a`` (the
event's attribute), ``NODE.a`` (the instance's), a bare ``a`` (the event's if the
event has it, else the instance's); ``+ - * / % ^``, unary minus, parentheses,
function calls ``F(x, ...)`` (each argument arithmetic: a comparison in one is in
parentheses); comparisons ``= != <> < <= > >=``.

Precedence, lowest first: comparison; ``+ -``; ``* /``; ``^ %``; unary minus;
atoms. Every binary operator is left-associative (docs/design/semantics.md#cel).
A unary minus before a number literal is part of the literal; ``TRUE`` and
``FALSE`` are bool literals. Values and failures follow
docs/design/semantics.md#arithmetic-and-comparison: ints stay in 64 bits and
floats finite, or the operation fails.

The syntax tree is plain tuples, evaluated by one recursive function:

    ("lit", value)  ("ref", "EV"|"NODE"|None, name)  ("neg", x)
    ("bin", op, left, right)  ("call", NAME, (args...))  ("cmp", op, left, right)
"""

from __future__ import annotations

import math
import re
from collections import Counter


class OracleExprError(ValueError):
    """An expression the oracle cannot read, or one that fails on some values."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<str>'(?:[^']|'')*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><>|!=|<=|>=|[=<>+\-*/%^(),.])
""", re.VERBOSE)


def tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise OracleExprError(f"cannot read {text!r} at offset {pos}: {text[pos:pos + 10]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise OracleExprError(f"{self.text!r} ends early")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise OracleExprError(f"{self.text!r}: expected {want!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def whole(self):
        tree = self.comparison()
        if self.i != len(self.toks):
            raise OracleExprError(f"{self.text!r}: unexpected {self.peek()!r}")
        return tree

    def comparison(self):
        left = self.additive()
        if self.peek() in ("=", "!=", "<>", "<", "<=", ">", ">="):
            op = self.take()[1]
            return ("cmp", "!=" if op == "<>" else op, left, self.additive())
        return left

    def _left_assoc(self, ops, operand):
        tree = operand()
        while self.peek() in ops:
            op = self.take()[1]
            tree = ("bin", op, tree, operand())
        return tree

    def additive(self):
        return self._left_assoc(("+", "-"), self.multiplicative)

    def multiplicative(self):
        return self._left_assoc(("*", "/"), self.power)

    def power(self):
        return self._left_assoc(("^", "%"), self.unary)

    def unary(self):
        if self.peek() == "-":
            self.take()
            if self.i < len(self.toks) and self.toks[self.i][0] == "num":  # -5 is one literal
                return ("lit", literal(-_number(self.take()[1]), self.text))
            inner = self.unary()
            if inner[0] == "lit" and is_number(inner[1]):
                return ("lit", literal(-inner[1], self.text))
            return ("neg", inner)
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.atom()

    def atom(self):
        kind, text = self.take()
        if kind == "num":
            return ("lit", literal(_number(text), self.text))
        if kind == "str":
            return ("lit", text[1:-1].replace("''", "'"))
        if text == "(":
            tree = self.comparison()
            self.take(")")
            return tree
        if kind == "name":
            if self.peek() == "." and text in ("EV", "NODE"):
                self.take(".")
                return ("ref", text, self.take()[1])
            if self.peek() == "(":
                self.take("(")
                args = []
                if self.peek() != ")":  # (arithmetic: a comparison in an argument is in parentheses)
                    args.append(self.additive())
                    while self.peek() == ",":
                        self.take(",")
                        args.append(self.additive())
                self.take(")")
                return ("call", text.upper(), tuple(args))
            if text.upper() in ("TRUE", "FALSE"):
                return ("lit", text.upper() == "TRUE")
            return ("ref", None, text)
        raise OracleExprError(f"{self.text!r}: unexpected {text!r}")


def _number(text: str):
    return float(text) if any(c in text for c in ".eE") else int(text)


def parse(text: str):
    """The syntax tree of one AIR expression."""
    return _Parser(text).whole()


def refs(tree) -> list[tuple[str | None, str]]:
    """Every ``(source, name)`` attribute reference in ``tree``."""
    tag = tree[0]
    if tag == "ref":
        return [(tree[1], tree[2])]
    if tag == "lit":
        return []
    if tag == "neg":
        return refs(tree[1])
    if tag == "call":
        return [r for a in tree[2] for r in refs(a)]
    return refs(tree[2]) + refs(tree[3])


# --------------------------------------------------------------------------- functions

def contains(text: str, pattern: str) -> int:
    """docs/design/semantics.md#cel: 1 if ``pattern`` occurs in ``text``, else 0."""
    return 1 if pattern in text else 0


def _grams(s: str) -> Counter:
    return Counter(s[i:i + 10] for i in range(len(s) - 9))


def similarity(a: str, b: str) -> float:
    """docs/design/semantics.md#cel: the 10-character substrings common to both strings (as
    multisets), divided by the smaller of their counts; 0 when either string
    is shorter than 10 characters."""
    if len(a) < 10 or len(b) < 10:
        return 0.0
    common = sum((_grams(a) & _grams(b)).values())
    return common / min(len(a) - 9, len(b) - 9)


BUILTINS = {"CONTAINS": contains, "SIMILARITY": similarity}


# --------------------------------------------------------------------------- evaluation

INT_MIN, INT_MAX = -2 ** 63, 2 ** 63 - 1
FLOAT_MAX = 1.7976931348623157e308


def is_number(x) -> bool:
    return type(x) in (int, float)


def literal(value, text: str = ""):
    """A number literal as written (after its minus sign): an int in 64 bits,
    a finite float, or the expression is refused."""
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise OracleExprError(f"{text!r}: the int literal {value} does not fit in 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise OracleExprError(f"{text!r}: the float literal {value} is not finite")
    return value


def value(x, what: str):
    """``x`` if it is a value of the data model, else the operation ``what`` fails."""
    if type(x) is int:
        if INT_MIN <= x <= INT_MAX:
            return x
        raise OracleExprError(f"{what}: int overflow ({x} does not fit in 64 bits)")
    if math.isfinite(x):
        return x
    raise OracleExprError(f"{what}: float result {x} is not finite")


def arith(op: str, a, b):
    """One arithmetic step (docs/design/semantics.md#arithmetic-and-comparison).
    ``int op int`` stays int and is exact: ``/`` truncates toward zero and
    ``%`` takes the dividend's sign (C's rules, which the original engine had);
    ``^`` of ints with a negative exponent, and any operation with a float,
    gives a float (IEEE doubles: Python's float). An int result outside 64
    bits, a float result that is not finite, a zero divisor and a non-number
    operand fail."""
    for x in (a, b):
        if not is_number(x):  # str, bool: a type clash
            raise OracleExprError(f"{op!r} on a non-number {x!r}")
    what = f"{a!r} {op} {b!r}"
    both_int = type(a) is int and type(b) is int
    if op in ("/", "%") and b == 0:
        raise OracleExprError(f"{what}: division by zero")
    if op == "+":
        return value(a + b, what)
    if op == "-":
        return value(a - b, what)
    if op == "*":
        return value(a * b, what)
    if op == "/":
        if both_int:
            q = abs(a) // abs(b)
            return value(q if (a < 0) == (b < 0) else -q, what)
        return value(float(a) / float(b), what)
    if op == "%":
        if both_int:
            r = abs(a) % abs(b)
            return r if a >= 0 else -r
        return value(math.fmod(a, b), what)
    if op == "^":
        if both_int and b >= 0:
            if abs(a) >= 2 and b >= 64:  # at least 2 ^ 64: not an int (and not computed)
                raise OracleExprError(f"{what}: int overflow")
            return value(a ** b, what)
        if a == 0 and b < 0:
            raise OracleExprError(f"{what}: division by zero")
        try:
            return value(math.pow(a, b), what)
        except OverflowError:
            raise OracleExprError(f"{what}: float overflow") from None
        except ValueError:  # a negative base, a non-integral exponent: no real value
            raise OracleExprError(f"{what}: no real value") from None
    raise OracleExprError(f"unknown operator {op!r}")


def _kind(x) -> str:
    return "string" if isinstance(x, str) else "bool" if isinstance(x, bool) else "number"


def compare(op: str, a, b) -> bool:
    """Numbers by exact value (Python compares an int and a float exactly),
    strings by code points, bools with bools; anything else is a type clash."""
    if _kind(a) != _kind(b):
        raise OracleExprError(f"cannot compare {a!r} {op} {b!r}")
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    raise OracleExprError(f"unknown comparison {op!r}")


def evaluate(tree, event: dict, node: dict | None, functions: dict):
    """The value of ``tree`` for an event's values and an instance's (``node``
    is None on a START node's edge)."""
    tag = tree[0]
    if tag == "lit":
        return tree[1]
    if tag == "ref":
        source, name = tree[1], tree[2]
        if source == "EV" or (source is None and name in event):
            if name not in event:
                raise OracleExprError(f"the event has no attribute {name!r}")
            return event[name]
        if node is None or name not in node:
            raise OracleExprError(f"no instance attribute {name!r}")
        return node[name]
    if tag == "neg":
        x = evaluate(tree[1], event, node, functions)
        if not is_number(x):
            raise OracleExprError(f"unary minus on {x!r}")
        return value(-x, f"-{x!r}")
    if tag == "bin":
        return arith(tree[1], evaluate(tree[2], event, node, functions), evaluate(tree[3], event, node, functions))
    if tag == "cmp":
        return compare(tree[1], evaluate(tree[2], event, node, functions), evaluate(tree[3], event, node, functions))
    if tag == "call":
        if tree[1] not in functions:
            raise OracleExprError(f"unknown function {tree[1]}")
        return functions[tree[1]](*(evaluate(a, event, node, functions) for a in tree[2]))
    raise OracleExprError(f"bad tree {tree!r}")
