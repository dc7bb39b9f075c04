"""Expressions shared by CEL predicates and AIR ``Expr`` attributes.

The tokenizer and the expression parser here serve both languages: AIR writes
``CONTAINS(EV.Name, 'IBM')=1`` and ``(NODE.cnt_n)+(1)``; CEL writes
``$1.Name = $2.Name AND DUR < 10 MIN``. Nodes are frozen dataclasses carrying
their source position (excluded from equality).

Precedence, loosest first: OR, AND, comparison, ``+ -``, ``* /``, ``^ %``,
unary minus. All binary operators are left-associative (as in the original).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Union

from air.errors import ExprSyntaxError
from air.names import IDENTIFIER_RULE, MAX_NAME_LENGTH, shown

#: The int range (docs/design/semantics.md#values); a literal outside it is refused.
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1

# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class Token:
    type: str  # NUMBER, STRING, IDENT, DOLLAR, OP, EOF
    text: str
    value: object
    line: int
    column: int
    pos: int


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<comment>--[^\n]*|//[^\n]*|/\*.*?\*/)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<dollar>\$(?:\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op><>|!=|<=|>=|==|/(?!\*)|[=<>+\-*%^(){},.;])
    """,
    re.X | re.S,
)


#: Characters XML 1.0 cannot carry, even escaped (so neither can AIR).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
#: The placeholder air/cel/shapetext.py puts for a string constant when it compiles a query
#: shape ("\x00<n>\x00"); never written as AIR (the constants are bound in its place).
_SHAPE_MARKER = re.compile("'\x00\\d+\x00'")


def tokenize(text: str, error: type[ExprSyntaxError] = ExprSyntaxError) -> list[Token]:
    """Split ``text`` into tokens; whitespace and comments are dropped."""
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        col = pos - line_start + 1
        if not m:
            ch = text[pos]
            if ch == "'":
                raise error("unterminated string literal", line, col, text)
            if text.startswith("/*", pos):
                raise error("unterminated comment", line, col, text)
            raise error(f"unexpected character {ch!r}", line, col, text)
        kind = m.lastgroup
        raw = m.group()
        if kind == "number":
            is_float = any(c in raw for c in ".eE")
            if is_float and math.isinf(float(raw)):
                raise error(f"the number {raw[:40]} is out of range (beyond a 64-bit float)", line, col, text)
            tokens.append(Token("NUMBER", raw, float(raw) if is_float else int(raw), line, col, pos))
        elif kind == "string":
            bad = _NOT_XML.search(raw)
            if bad and not _SHAPE_MARKER.fullmatch(raw):  # AIR is XML, which cannot carry it: refuse it here rather than write AIR that cannot load
                before = raw[:bad.start()]
                at_line = line + before.count("\n")
                at_col = col + bad.start() if "\n" not in before else bad.start() - before.rfind("\n")
                raise error(f"a string cannot hold the control character U+{ord(bad.group()):04X}",
                            at_line, at_col, text)
            tokens.append(Token("STRING", raw, raw[1:-1].replace("''", "'"), line, col, pos))
        elif kind == "dollar":
            tokens.append(Token("DOLLAR", raw, raw[1:], line, col, pos))
        elif kind == "ident":
            if len(raw) > MAX_NAME_LENGTH:
                raise error(f"the name {shown(raw)} is too long; {IDENTIFIER_RULE}", line, col, text)
            tokens.append(Token("IDENT", raw, raw.upper(), line, col, pos))
        elif kind == "op":
            op = {"<>": "!=", "==": "="}.get(raw, raw)
            tokens.append(Token("OP", raw, op, line, col, pos))
        newlines = raw.count("\n")
        if newlines:
            line += newlines
            line_start = pos + raw.rindex("\n") + 1
        pos = m.end()
    tokens.append(Token("EOF", "", None, line, pos - line_start + 1, pos))
    return tokens


# --------------------------------------------------------------------------- nodes

_POS = dict(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Literal:
    value: object  # int, float, str or bool
    line: int = field(**_POS)
    column: int = field(**_POS)

    @property
    def type(self) -> str:
        v = self.value
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, int):
            return "int"
        if isinstance(v, float):
            return "float"
        return "string"


@dataclass(frozen=True, slots=True)
class Ref:
    """An attribute reference. ``source`` is ``EV`` or ``NODE`` in AIR,
    ``1``, ``2`` or ``LAST`` (``$.``) in CEL, or ``None`` when undecorated."""

    name: str
    source: str | None = None
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Dur:
    """CEL's ``DUR`` pseudo-attribute."""

    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-"
    operand: "Expr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / % ^
    left: "Expr"
    right: "Expr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Call:
    name: str  # upper-cased
    args: tuple["Expr", ...]
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # = != < <= > >=
    left: "Expr"
    right: "Expr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class And:
    items: tuple["Expr", ...]
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple["Expr", ...]
    line: int = field(**_POS)
    column: int = field(**_POS)


Expr = Union[Literal, Ref, Dur, Unary, Binary, Call, Compare, And, Or]

COMPARISON_OPS = ("=", "!=", "<", "<=", ">", ">=")
FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of ``e``, parents first."""
    yield e
    if isinstance(e, Unary):
        yield from walk(e.operand)
    elif isinstance(e, (Binary, Compare)):
        yield from walk(e.left)
        yield from walk(e.right)
    elif isinstance(e, Call):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, (And, Or)):
        for a in e.items:
            yield from walk(a)


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up, replacing each node for which ``fn`` returns a node."""
    if isinstance(e, Unary):
        e = Unary(e.op, transform(e.operand, fn), e.line, e.column)
    elif isinstance(e, Binary):
        e = Binary(e.op, transform(e.left, fn), transform(e.right, fn), e.line, e.column)
    elif isinstance(e, Compare):
        e = Compare(e.op, transform(e.left, fn), transform(e.right, fn), e.line, e.column)
    elif isinstance(e, Call):
        e = Call(e.name, tuple(transform(a, fn) for a in e.args), e.line, e.column)
    elif isinstance(e, And):
        e = And(tuple(transform(a, fn) for a in e.items), e.line, e.column)
    elif isinstance(e, Or):
        e = Or(tuple(transform(a, fn) for a in e.items), e.line, e.column)
    out = fn(e)
    return e if out is None else out


# --------------------------------------------------------------------------- parser

_KEYWORDS_STOP = {"AND", "OR", "AS", "FROM", "NEXT", "FOLD", "PUBLISH", "SELECT", "FILTER"}


class TokenStream:
    """A cursor over tokens with the helpers a recursive-descent parser needs."""

    def __init__(self, tokens: list[Token], source: str,
                 error: type[ExprSyntaxError] = ExprSyntaxError) -> None:
        self.tokens = tokens
        self.i = 0
        self.source = source
        self.error = error

    @property
    def peek(self) -> Token:
        return self.tokens[self.i]

    def peek_at(self, k: int) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        if tok.type != "EOF":
            self.i += 1
        return tok

    def at_op(self, *ops: str) -> bool:
        t = self.peek
        return t.type == "OP" and t.value in ops

    def at_kw(self, *kws: str) -> bool:
        t = self.peek
        return t.type == "IDENT" and t.value in kws

    def expect_op(self, op: str, what: str = "") -> Token:
        if not self.at_op(op):
            self.fail(f"expected '{op}'{what}")
        return self.next()

    def expect_kw(self, kw: str) -> Token:
        if not self.at_kw(kw):
            self.fail(f"expected {kw}")
        return self.next()

    def fail(self, message: str, tok: Token | None = None) -> None:
        tok = tok or self.peek
        found = "end of input" if tok.type == "EOF" else repr(tok.text)
        raise self.error(f"{message} but found {found}", tok.line, tok.column, self.source)


class ExprParser:
    """Recursive-descent parser for predicates and value expressions.

    ``dialect`` is ``"air"`` (``EV.a``/``NODE.a`` references) or ``"cel"``
    (``$1.a``/``$2.a``/``$.a`` and ``DUR`` with units)."""

    def __init__(self, ts: TokenStream, dialect: str = "air") -> None:
        self.ts = ts
        self.dialect = dialect

    def predicate(self) -> Expr:
        return self._or()

    def _or(self) -> Expr:
        first = self.ts.peek
        items = [self._and()]
        while self.ts.at_kw("OR"):
            self.ts.next()
            items.append(self._and())
        return items[0] if len(items) == 1 else Or(tuple(items), first.line, first.column)

    def _and(self) -> Expr:
        first = self.ts.peek
        items = [self._compare()]
        while self.ts.at_kw("AND"):
            self.ts.next()
            items.append(self._compare())
        return items[0] if len(items) == 1 else And(tuple(items), first.line, first.column)

    def _compare(self) -> Expr:
        left = self.value()
        if self.ts.at_op(*COMPARISON_OPS):
            tok = self.ts.next()
            right = self.value()
            return Compare(tok.value, left, right, tok.line, tok.column)
        return left

    def value(self) -> Expr:
        """An arithmetic expression (no comparisons, no AND/OR at top level)."""
        left = self._term()
        while self.ts.at_op("+", "-"):
            tok = self.ts.next()
            left = Binary(tok.value, left, self._term(), tok.line, tok.column)
        return left

    def _term(self) -> Expr:
        left = self._power()
        while self.ts.at_op("*", "/"):
            tok = self.ts.next()
            left = Binary(tok.value, left, self._power(), tok.line, tok.column)
        return left

    def _power(self) -> Expr:
        left = self._unary()
        while self.ts.at_op("^", "%"):
            tok = self.ts.next()
            left = Binary(tok.value, left, self._unary(), tok.line, tok.column)
        return left

    def _unary(self) -> Expr:
        if self.ts.at_op("-"):
            tok = self.ts.next()
            if self.ts.peek.type == "NUMBER":  # -5 is one literal: -9223372036854775808 is an int
                return self._number(-self.ts.next().value, tok)
            operand = self._unary()
            if isinstance(operand, Literal) and operand.type in ("int", "float"):
                return self._number(-operand.value, tok)  # type: ignore[operator]
            return Unary("-", operand, tok.line, tok.column)
        if self.ts.at_op("+"):
            self.ts.next()
            return self._unary()
        return self._primary()

    def _primary(self) -> Expr:
        ts = self.ts
        tok = ts.peek
        if tok.type == "NUMBER":
            ts.next()
            return self._number(tok.value, tok)
        if tok.type == "STRING":
            ts.next()
            return Literal(tok.value, tok.line, tok.column)
        if tok.type == "OP" and tok.value == "(":
            ts.next()
            inner = self.predicate()
            ts.expect_op(")", " to close '('")
            return inner
        if tok.type == "DOLLAR":
            return self._cel_ref()
        if tok.type == "IDENT":
            if tok.value in _KEYWORDS_STOP:
                ts.fail("expected a value")
            if tok.value in ("TRUE", "FALSE") and not ts.peek_at(1).text in ("(", "."):
                ts.next()
                return Literal(tok.value == "TRUE", tok.line, tok.column)
            nxt = ts.peek_at(1)
            if nxt.type == "OP" and nxt.value == "(":
                return self._call()
            if self.dialect == "air" and tok.value in ("EV", "NODE") and nxt.type == "OP" and nxt.value == ".":
                ts.next()
                ts.next()
                name = ts.peek
                if name.type != "IDENT":
                    ts.fail("expected an attribute name after '.'")
                ts.next()
                return Ref(name.text, tok.value, tok.line, tok.column)
            if self.dialect == "cel" and tok.value == "DUR":
                ts.next()
                return Dur(tok.line, tok.column)
            ts.next()
            return Ref(tok.text, None, tok.line, tok.column)
        ts.fail("expected a value")
        raise AssertionError  # unreachable

    def _number(self, value, tok: Token) -> Literal:
        """A number literal (docs/design/semantics.md#arithmetic-and-comparison):
        an int in 64 bits; a float literal that overflows is refused by the tokenizer."""
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise self.ts.error(f"the number {value} is out of range (beyond a 64-bit int)", tok.line, tok.column,
                                self.ts.source)
        return Literal(value, tok.line, tok.column)

    def _cel_ref(self) -> Expr:
        ts = self.ts
        tok = ts.next()
        if self.dialect != "cel":
            ts.fail("'$' decorators are CEL; AIR uses EV. and NODE.", tok)
        digits = tok.value
        if digits not in ("", "1", "2"):
            raise ts.error(f"unknown decorator '{tok.text}'; use $1, $2 or $", tok.line, tok.column, ts.source)
        ts.expect_op(".", f" after decorator '{tok.text}'")
        name = ts.peek
        if name.type != "IDENT":
            ts.fail(f"expected an attribute name after '{tok.text}.'")
        ts.next()
        if name.value == "DUR" and digits == "":
            return Dur(tok.line, tok.column)
        return Ref(name.text, {"": "LAST", "1": "1", "2": "2"}[digits], tok.line, tok.column)

    def _call(self) -> Expr:
        ts = self.ts
        name = ts.next()
        ts.expect_op("(")
        args: list[Expr] = []
        if not ts.at_op(")"):
            args.append(self.value())
            while ts.at_op(","):
                ts.next()
                args.append(self.value())
        ts.expect_op(")", f" to close the arguments of {name.text}")
        return Call(name.value, tuple(args), name.line, name.column)


def parse_air_expr(text: str, *, predicate: bool) -> Expr:
    """Parse an AIR ``Expr`` attribute: a comparison (``predicate=True``) or a value."""
    ts = TokenStream(tokenize(text), text)
    p = ExprParser(ts, "air")
    e = p.predicate() if predicate else p.value()
    if ts.peek.type != "EOF":
        ts.fail("unexpected text after the expression")
    return e


# --------------------------------------------------------------------------- printing


def _lit(v: object) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def _operand(e: Expr) -> str:
    """``e`` as an argument or a comparison's side: arithmetic as it is, a comparison (AND, OR)
    in parentheses, as it had to be written (``CONTAINS((EV.a < 3), 'x')``, ``(EV.a < 3) = TRUE``)."""
    return f"({to_air(e)})" if isinstance(e, (Compare, And, Or)) else to_air(e)


def to_air(e: Expr) -> str:
    """Render ``e`` in AIR's expression syntax (fully parenthesised operands)."""
    if isinstance(e, Literal):
        return _lit(e.value)
    if isinstance(e, Ref):
        return f"{e.source}.{e.name}" if e.source in ("EV", "NODE") else e.name
    if isinstance(e, Unary):
        return f"-({to_air(e.operand)})"
    if isinstance(e, Binary):
        return f"({to_air(e.left)}){e.op}({to_air(e.right)})"
    if isinstance(e, Call):
        return f"{e.name}(" + ", ".join(_operand(a) for a in e.args) + ")"
    if isinstance(e, Compare):
        return f"{_operand(e.left)}{e.op}{_operand(e.right)}"
    if isinstance(e, And):
        return " AND ".join(f"({to_air(a)})" for a in e.items)
    if isinstance(e, Or):
        return " OR ".join(f"({to_air(a)})" for a in e.items)
    if isinstance(e, Dur):
        return "DUR"
    raise TypeError(e)
