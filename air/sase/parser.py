"""Recursive-descent parser for SASE (docs/design/sase.md#grammar).

``parse(text)`` returns an :class:`~air.sase.ast.Query` or raises the first
:class:`SaseSyntaxError`, with line, column and a caret excerpt. Conditions and
values are parsed by the shared :class:`air.expr.ExprParser`; this module adds
SASE's tokens (``!``, ``[``, ``]``, double-quoted strings), ``var.attr``
references, equivalence tests and the query-level grammar.
"""

from __future__ import annotations

import math
import re

from air.expr import INT_MAX, INT_MIN, Expr, ExprParser, Literal, Ref, Token, TokenStream
from air.names import IDENTIFIER_RULE, MAX_NAME_LENGTH, shown
from air.sase import ast
from air.sase.errors import SaseSyntaxError

#: Words that cannot name a variable (they end or start a clause).
KEYWORDS = frozenset({"EVENT", "SEQ", "ANY", "WHERE", "WITHIN", "RETURN", "PUBLISH", "AND", "OR", "AS"})

#: Time-unit spellings accepted after a WITHIN constant -> canonical unit (as CEL's, air/cel/parser.py).
UNITS: dict[str, str] = {
    **dict.fromkeys(("MS", "MSEC", "MSECS", "MILLISECOND", "MILLISECONDS"), "MS"),
    **dict.fromkeys(("S", "SEC", "SECS", "SECOND", "SECONDS"), "SEC"),
    **dict.fromkeys(("MIN", "MINS", "MINUTE", "MINUTES"), "MIN"),
    **dict.fromkeys(("H", "HOUR", "HOURS"), "HOUR"),
    **dict.fromkeys(("D", "DAY", "DAYS"), "DAY"),
}

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<comment>--[^\n]*|//[^\n]*|/\*.*?\*/)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*")
  | (?P<dollar>\$\d*)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op><>|!=|<=|>=|==|/(?!\*)|[=<>+\-*%^(){},.;!\[\]])
    """,
    re.X | re.S,
)
#: Characters XML 1.0 cannot carry, even escaped (so neither can the AIR a query compiles to).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens (air.expr's kinds); whitespace and comments are dropped."""
    tokens: list[Token] = []
    pos, line, line_start, n = 0, 1, 0, len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        col = pos - line_start + 1
        if not m:
            ch = text[pos]
            if ch in "'\"":
                raise SaseSyntaxError("unterminated string literal", line, col, text)
            if text.startswith("/*", pos):
                raise SaseSyntaxError("unterminated comment", line, col, text)
            raise SaseSyntaxError(f"unexpected character {ch!r}", line, col, text)
        kind, raw = m.lastgroup, m.group()
        if kind == "number":
            is_float = any(c in raw for c in ".eE")
            if is_float and math.isinf(float(raw)):
                raise SaseSyntaxError(f"the number {raw[:40]} is out of range (beyond a 64-bit float)", line, col,
                                      text)
            tokens.append(Token("NUMBER", raw, float(raw) if is_float else int(raw), line, col, pos))
        elif kind == "string":
            bad = _NOT_XML.search(raw)
            if bad:
                raise SaseSyntaxError(f"a string cannot hold the control character U+{ord(bad.group()):04X}",
                                      line + raw[:bad.start()].count("\n"), col + bad.start(), text)
            q = raw[0]
            tokens.append(Token("STRING", raw, raw[1:-1].replace(q + q, q), line, col, pos))
        elif kind == "dollar":
            tokens.append(Token("DOLLAR", raw, raw[1:], line, col, pos))
        elif kind == "ident":
            if len(raw) > MAX_NAME_LENGTH:
                raise SaseSyntaxError(f"the name {shown(raw)} is too long; {IDENTIFIER_RULE}", line, col, text)
            tokens.append(Token("IDENT", raw, raw.upper(), line, col, pos))
        elif kind == "op":
            tokens.append(Token("OP", raw, {"<>": "!=", "==": "="}.get(raw, raw), line, col, pos))
        newlines = raw.count("\n")
        if newlines:
            line += newlines
            line_start = pos + raw.rindex("\n") + 1
        pos = m.end()
    tokens.append(Token("EOF", "", None, line, pos - line_start + 1, pos))
    return tokens


class _ExprParser(ExprParser):
    """The shared expression parser, with SASE's references (``x.attr``,
    ``$2.attr``) and equivalence tests (``[a]``, ``[a, b]``, ``[a = 'c']``)."""

    def _primary(self) -> Expr:
        ts = self.ts
        tok = ts.peek
        if tok.type == "OP" and tok.value == "[":
            return self._equivalence()
        if tok.type == "DOLLAR":
            ts.next()
            if not tok.value:
                raise ts.error("write $1.attr for the first component's attribute (or name it: SEQ(A x, ...))",
                               tok.line, tok.column, ts.source)
            return self._attr_of(tok, "$" + tok.value)
        if tok.type == "IDENT":
            nxt = ts.peek_at(1)
            if nxt.type == "OP" and nxt.value == "(":
                return self._call()
            if tok.value in ("TRUE", "FALSE") and not (nxt.type == "OP" and nxt.value == "."):
                ts.next()
                return Literal(tok.value == "TRUE", tok.line, tok.column)
            if tok.value in KEYWORDS:
                ts.fail("expected a value")
            ts.next()
            if not (nxt.type == "OP" and nxt.value == "."):
                raise ts.error(f"'{tok.text}' alone is not a value: write variable.attribute "
                               f"(e.g. {tok.text}.id) or a constant ('text' for a string)", tok.line, tok.column,
                               ts.source)
            return self._attr_of(tok, tok.text)
        return super()._primary()

    def _attr_of(self, var: Token, source: str) -> Ref:
        ts = self.ts
        ts.expect_op(".", f" after '{var.text}'")
        name = ts.peek
        if name.type != "IDENT":
            ts.fail(f"expected an attribute name after '{var.text}.'")
        ts.next()
        return Ref(name.text, source, var.line, var.column)

    def _equivalence(self) -> ast.Equivalence:
        ts = self.ts
        open_ = ts.next()
        attrs: list[str] = []
        while True:
            name = ts.peek
            if name.type != "IDENT":
                ts.fail("expected an attribute name in the equivalence test [...]")
            ts.next()
            attrs.append(name.text)
            if not ts.at_op(","):
                break
            ts.next()
        const = None
        if ts.at_op("="):
            ts.next()
            value = self._unary()
            if not isinstance(value, Literal):
                ts.fail("expected a constant after '=' in the equivalence test, e.g. [id = '1']")
            if len(attrs) > 1:
                raise ts.error("an equivalence test with a constant names one attribute: write "
                               f"[{attrs[0]} = ...] AND [{attrs[1]} = ...]", open_.line, open_.column, ts.source)
            const = value
        ts.expect_op("]", " to close the equivalence test")
        return ast.Equivalence(tuple(attrs), const, open_.line, open_.column)


class _Parser:
    def __init__(self, text: str) -> None:
        self.ts = TokenStream(tokenize(text), text, SaseSyntaxError)
        self.expr = _ExprParser(self.ts, "sase")

    def query(self) -> ast.Query:
        ts = self.ts
        if ts.at_kw("EVENT"):
            ts.next()
        start = ts.peek
        if ts.at_kw("SEQ") and ts.peek_at(1).type == "OP" and ts.peek_at(1).value == "(":
            ts.next()
            ts.next()
            comps = [self.component()]
            while ts.at_op(","):
                ts.next()
                comps.append(self.component())
            ts.expect_op(")", " to close SEQ(")
        else:
            comps = [self.component()]
        where = within = returns = publish = None
        pub_at = (0, 0)
        seen: dict[str, Token] = {}
        while ts.at_kw("WHERE", "WITHIN", "RETURN", "PUBLISH"):
            kw = ts.next()
            if kw.value in seen:
                raise ts.error(f"{kw.value} appears twice; give one {kw.value} clause", kw.line, kw.column,
                               ts.source)
            seen[kw.value] = kw
            if kw.value == "RETURN" and "PUBLISH" in seen:
                raise ts.error("RETURN comes before PUBLISH", kw.line, kw.column, ts.source)
            if kw.value == "WHERE":
                where = self.expr.predicate()
            elif kw.value == "WITHIN":
                within = self.within(kw)
            elif kw.value == "RETURN":
                returns = self.returns()
            else:
                name = ts.peek
                if name.type != "IDENT":
                    ts.fail("expected a stream name after PUBLISH")
                ts.next()
                publish, pub_at = name.text, (name.line, name.column)
        if ts.at_op(";"):
            ts.next()
        if ts.peek.type != "EOF":
            ts.fail("expected WHERE, WITHIN, RETURN, PUBLISH or the end of the query")
        return ast.Query(tuple(comps), where, within, returns, publish, start.line, start.column, *pub_at)

    def component(self) -> ast.Component:
        ts = self.ts
        first = ts.peek
        negated = ts.at_op("!")
        if negated:
            ts.next()
        if negated and ts.at_op("("):
            ts.next()
            comp = self.positive(first, True)
            ts.expect_op(")", " to close '!('")
            return comp
        return self.positive(first, negated)

    def positive(self, first: Token, negated: bool) -> ast.Component:
        ts = self.ts
        tok = ts.peek
        if tok.type != "IDENT" or (tok.value in KEYWORDS and tok.value != "ANY"):
            ts.fail("expected an event type (a stream name) or ANY(...)")
        any_ = tok.value == "ANY" and ts.peek_at(1).type == "OP" and ts.peek_at(1).value == "("
        if any_:
            ts.next()
            ts.next()
            types = [self.type_name()]
            while ts.at_op(","):
                ts.next()
                types.append(self.type_name())
            ts.expect_op(")", " to close ANY(")
        else:
            types = [self.type_name()]
        var, at = None, (0, 0)
        v = ts.peek
        if v.type == "IDENT" and v.value not in KEYWORDS:
            ts.next()
            var, at = v.text, (v.line, v.column)
        return ast.Component(tuple(types), negated, any_, var, first.line, first.column, *at)

    def type_name(self) -> ast.TypeName:
        tok = self.ts.peek
        if tok.type != "IDENT" or tok.value in KEYWORDS:
            self.ts.fail("expected an event type (a stream name)")
        self.ts.next()
        return ast.TypeName(tok.text, tok.line, tok.column)

    def within(self, kw: Token) -> ast.Within:
        ts = self.ts
        tok = ts.peek
        if tok.type != "NUMBER":
            ts.fail("expected a duration after WITHIN, e.g. WITHIN 12 hours")
        ts.next()
        if isinstance(tok.value, int) and not INT_MIN <= tok.value <= INT_MAX:
            raise ts.error(f"the number {tok.value} is out of range (beyond a 64-bit int)", tok.line, tok.column,
                           ts.source)
        unit = None
        if ts.peek.type == "IDENT" and ts.peek.value in UNITS:
            unit = UNITS[ts.next().value]
        return ast.Within(tok.value, unit, tok.line, tok.column)

    def returns(self) -> tuple[ast.ReturnItem, ...]:
        ts = self.ts
        items = []
        while True:
            first = ts.peek
            e = self.expr.value()
            name = None
            if ts.at_kw("AS"):
                ts.next()
                n = ts.peek
                if n.type != "IDENT":
                    ts.fail("expected a name after AS")
                ts.next()
                name = n.text
            items.append(ast.ReturnItem(e, name, first.line, first.column))
            if not ts.at_op(","):
                return tuple(items)
            ts.next()


def parse(text: str) -> ast.Query:
    """Parse one SASE query; raises :class:`SaseSyntaxError` at the first error."""
    try:
        return _Parser(text).query()
    except RecursionError:
        raise SaseSyntaxError("the query nests too deeply to read (parentheses or operators thousands deep)",
                              1, 1, text) from None



__all__ = ["parse", "tokenize", "KEYWORDS", "UNITS"]
