"""Recursive-descent parser for CEL (docs/design/semantics.md#cel).

``parse(text)`` returns a :class:`~air.cel.ast.Query` or raises the first
:class:`CelSyntaxError`. ``parse_all(text)`` collects up to ``max_errors``
errors for a "validate this query" endpoint, recovering at the closing brace of
a predicate, the next SELECT item, or the next NEXT / FOLD / PUBLISH / ')'.
Predicates and values are parsed by the shared :class:`air.expr.ExprParser`;
this module adds the stream-level grammar and time units after ``DUR``.
"""

from __future__ import annotations

from air.cel import ast
from air.cel.errors import CelError, CelSyntaxError
from air.expr import (COMPARISON_OPS, Compare, Expr, ExprParser, Literal, Token, TokenStream,
                       tokenize)

#: Words that cannot name a stream or an attribute.
RESERVED = frozenset({"SELECT", "FROM", "PUBLISH", "FILTER", "NEXT", "FOLD", "AS", "AND", "OR"})

#: Time-unit spellings accepted after a DUR constant -> canonical unit.
UNITS: dict[str, str] = {
    **dict.fromkeys(("MS", "MSEC", "MSECS", "MILLISECOND", "MILLISECONDS"), "MS"),
    **dict.fromkeys(("S", "SEC", "SECS", "SECOND", "SECONDS"), "SEC"),
    **dict.fromkeys(("MIN", "MINS", "MINUTE", "MINUTES"), "MIN"),
    **dict.fromkeys(("H", "HOUR", "HOURS"), "HOUR"),
    **dict.fromkeys(("D", "DAY", "DAYS"), "DAY"),
}


class _CelExprParser(ExprParser):
    """The shared expression parser plus ``<number> <unit>`` time constants."""

    def _compare(self) -> Expr:
        left = self._with_unit(self.value())
        if self.ts.at_op(*COMPARISON_OPS):
            tok = self.ts.next()
            right = self._with_unit(self.value())
            return Compare(tok.value, left, right, tok.line, tok.column)
        return left

    def _with_unit(self, e: Expr) -> Expr:
        tok = self.ts.peek
        if (tok.type == "IDENT" and tok.value in UNITS and isinstance(e, Literal)
                and e.type in ("int", "float")):
            self.ts.next()
            return ast.Quantity(e.value, UNITS[tok.value], e.line, e.column)  # type: ignore[arg-type]
        return e


class _TooManyErrors(Exception):
    pass


def _tokenize(text: str) -> list[Token]:
    return tokenize(text, error=CelSyntaxError)


def _tokenize_collecting(text: str, errors: list[CelError], max_errors: int) -> list[Token]:
    """Tokenize, blanking out each bad character (or the rest of the text after
    an unterminated string or comment) so later errors can still be found."""
    original = text
    while True:
        try:
            return _tokenize(text)
        except CelSyntaxError as e:
            errors.append(CelSyntaxError(e.message, e.line, e.column, original))
            if len(errors) >= max_errors:
                raise _TooManyErrors from None
            lines = text.split("\n")
            pos = sum(len(s) + 1 for s in lines[:e.line - 1]) + e.column - 1
            if e.message.startswith("unterminated"):
                text = text[:pos] + "".join(c if c == "\n" else " " for c in text[pos:])
            else:
                text = text[:pos] + " " + text[pos + 1:]


class _Parser:
    def __init__(self, text: str, tokens: list[Token], collect: bool, max_errors: int,
                 errors: list[CelError]) -> None:
        self.text = text
        self.collect = collect
        self.max_errors = max_errors
        self.errors = errors
        self.ts = TokenStream(tokens, text, error=CelSyntaxError)
        self.ep = _CelExprParser(self.ts, "cel")

    # ------------------------------------------------------------------ helpers

    def _record(self, e: CelSyntaxError) -> None:
        e = keyword_typo(e, self.ts.tokens, self.text)
        if not self.collect:
            raise e
        if not any((x.line, x.column) == (e.line, e.column) for x in self.errors):
            self.errors.append(e)
        if len(self.errors) >= self.max_errors:
            raise _TooManyErrors

    def _sync(self, ops: tuple[str, ...] = (), kws: tuple[str, ...] = ()) -> None:
        """Skip tokens up to one of ``ops``/``kws`` at nesting depth 0, an
        unmatched closing bracket, or the end of the input."""
        ts, depth = self.ts, 0
        while ts.peek.type != "EOF":
            tok = ts.peek
            if depth == 0 and (ts.at_op(*ops) or ts.at_kw(*kws)):
                return
            if tok.type == "OP" and tok.value in "({":
                depth += 1
            elif tok.type == "OP" and tok.value in ")}":
                if depth == 0:
                    return
                depth -= 1
            ts.next()

    def _name(self, what: str) -> ast.StreamRef:
        tok = self.ts.peek
        if tok.type != "IDENT" or tok.value in RESERVED:
            self.ts.fail(f"expected {what}")
        self.ts.next()
        return ast.StreamRef(tok.text, tok.line, tok.column)

    # ------------------------------------------------------------------ grammar

    def parse(self) -> ast.Query | None:
        ts = self.ts
        try:
            try:
                query, _ = self._query()
                if ts.at_op(";"):
                    ts.next()
                if ts.peek.type != "EOF":
                    ts.fail("expected the end of the query (or NEXT, FOLD, PUBLISH)")
            except CelSyntaxError as e:
                self._record(e)
                return None
        except _TooManyErrors:
            return None
        return None if self.errors else query

    def _query(self) -> tuple[ast.Query, bool]:
        ts = self.ts
        start = ts.peek
        has_select = ts.at_kw("SELECT")
        select: tuple = (ast.Star(start.line, start.column),)
        if has_select:
            ts.next()
            select = self._select_list()
            ts.expect_kw("FROM")
        source = self._stream_expr()
        publish = None
        if ts.at_kw("PUBLISH"):
            ts.next()
            publish = self._name("an output stream name after PUBLISH")
        return ast.Query(select, source, publish.name if publish else None, start.line, start.column,
                         publish.line if publish else 0, publish.column if publish else 0), has_select

    def _select_list(self) -> tuple:
        items = [self._guarded_item()]
        while self.ts.at_op(","):
            self.ts.next()
            items.append(self._guarded_item())
        return tuple(items)

    def _guarded_item(self):
        try:
            return self._select_item()
        except CelSyntaxError as e:
            self._record(e)
            self._sync((",",), ("FROM",))
            return ast.Star()

    def _select_item(self):
        ts = self.ts
        tok = ts.peek
        if ts.at_op("*"):
            ts.next()
            return ast.Star(tok.line, tok.column)
        expr = self.ep.value()
        alias = None
        if ts.at_kw("AS"):
            ts.next()
            alias = self._name("a column name after AS").name
        return ast.SelectItem(expr, alias, tok.line, tok.column)

    def _stream_expr(self) -> ast.StreamExpr:
        ts = self.ts
        left = self._unary()
        while True:
            tok = ts.peek
            if ts.at_kw("NEXT"):
                ts.next()
                # the braces may be omitted: "S NEXT S" (docs/design/semantics.md#cel)
                pred = self._braced_pred("NEXT", required=False) if ts.at_op("{") else None
                left = ast.Next(left, pred, self._unary(), tok.line, tok.column)
            elif ts.at_kw("FOLD"):
                ts.next()
                cond, rebind, aggs = self._fold_params()
                left = ast.Fold(left, cond, rebind, aggs, self._unary(), tok.line, tok.column)
            else:
                return left

    def _braced_pred(self, kw: str, required: bool) -> Expr | None:
        ts = self.ts
        try:
            ts.expect_op("{", f" after {kw}")
            pred = None
            if ts.at_op("}"):
                if required:
                    ts.fail(f"{kw}{{}} needs a predicate, e.g. {kw}{{Price > 10}};")
            else:
                pred = self.ep.predicate()
        except CelSyntaxError as e:
            self._record(e)
            self._sync(("}",))
            if ts.at_op("}"):
                ts.next()
            return None
        self._close_brace(kw)
        return pred

    def _close_brace(self, kw: str) -> None:
        """Expect '}'; in collect mode a missing one is reported and assumed."""
        try:
            self.ts.expect_op("}", f" to close {kw}{{")
        except CelSyntaxError as e:
            self._record(e)

    def _fold_params(self) -> tuple[Expr | None, Expr | None, tuple[ast.SelectItem, ...]]:
        ts = self.ts
        try:
            ts.expect_op("{", " after FOLD")
            if ts.at_op("}"):
                ts.next()
                return None, None, ()
            cond = None if ts.at_op(",") else self.ep.predicate()
            ts.expect_op(",", " after FOLD's filter predicate (FOLD{filter, rebind, aggregates})")
            rebind = None if ts.at_op(",") else self.ep.predicate()
            ts.expect_op(",", " after FOLD's rebind predicate (FOLD{filter, rebind, aggregates})")
            aggs = []
            if not ts.at_op("}"):
                aggs.append(self._aggregate())
                while ts.at_op(","):
                    ts.next()
                    aggs.append(self._aggregate())
        except CelSyntaxError as e:
            self._record(e)
            self._sync(("}",))
            if ts.at_op("}"):
                ts.next()
            return None, None, ()
        self._close_brace("FOLD")
        return cond, rebind, tuple(aggs)

    def _aggregate(self) -> ast.SelectItem:
        tok = self.ts.peek
        expr = self.ep.value()
        if not self.ts.at_kw("AS"):
            self.ts.fail("expected AS <attribute> after a FOLD aggregate expression")
        self.ts.next()
        alias = self._name("an attribute name after AS").name
        return ast.SelectItem(expr, alias, tok.line, tok.column)

    def _unary(self) -> ast.StreamExpr:
        try:
            return self._unary_inner()
        except CelSyntaxError as e:
            self._record(e)
            self._sync((")", ";"), ("NEXT", "FOLD", "PUBLISH"))
            return ast.StreamRef("?")

    def _unary_inner(self) -> ast.StreamExpr:
        ts = self.ts
        tok = ts.peek
        if ts.at_kw("FILTER"):
            ts.next()
            pred = self._braced_pred("FILTER", required=True)
            inner = self._unary()
            return ast.Filter(pred if pred is not None else Literal(True), inner,
                              tok.line, tok.column)
        if ts.at_op("("):
            ts.next()
            query, has_select = self._query()
            ts.expect_op(")", " to close '('")
            if not has_select and query.publish is None:
                return query.source
            return ast.SubQuery(query, tok.line, tok.column)
        if tok.type == "IDENT" and tok.value not in RESERVED:
            ts.next()
            return ast.StreamRef(tok.text, tok.line, tok.column)
        ts.fail("expected a stream name, FILTER{...} or '('")
        raise AssertionError("unreachable")


#: Keywords a misspelt word is compared with (AS and OR are too short to guess at).
_GUESSABLE = ("SELECT", "FROM", "PUBLISH", "FILTER", "NEXT", "FOLD", "AND")


def _distance(a: str, b: str) -> int:
    """Edits from ``a`` to ``b``: insertions, deletions, substitutions and swaps of neighbours."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            d = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                d = min(d, prev2[j - 2] + 1)
            cur.append(d)
        prev2, prev = prev, cur
    return prev[-1]


def misspelt_keyword(tok: Token) -> str | None:
    """The keyword a word is one or two slips away from (``SELEC``, ``FORM``,
    ``PUBLSH``), or None: one edit for keywords of up to five letters, two for
    longer ones, and about the keyword's length."""
    if tok.type != "IDENT" or tok.value in RESERVED or len(tok.value) < 3:  # type: ignore[arg-type]
        return None
    word = str(tok.value)
    best = None
    for kw in _GUESSABLE:
        d = _distance(word, kw)
        if abs(len(word) - len(kw)) <= 1 and d <= (1 if len(kw) <= 5 else 2) and (best is None or d < best[0]):
            best = (d, kw)
    return best[1] if best else None


def keyword_typo(e: CelSyntaxError, tokens: list[Token], text: str) -> CelSyntaxError:
    """``e`` with a guess when a misspelt keyword caused it: the token it found
    (``expected FROM but found 'FORM'``: "did you mean FROM?"), or the word
    before it, which was read as a name (``SELEC Name ...`` fails at ``Name``;
    the error then points at ``SELEC``). A word after ``.`` is an attribute:
    never a guess."""
    if " but found " not in e.message:
        return e
    at = next((i for i, t in enumerate(tokens) if (t.line, t.column) == (e.line, e.column)), None)
    if at is None:
        return e

    def named(i: int) -> bool:  # a bare word, not an attribute after '$1.' or '.'
        return i == 0 or not (tokens[i - 1].type == "OP" and tokens[i - 1].value == ".")

    kw = misspelt_keyword(tokens[at]) if named(at) else None
    if kw is not None:
        return CelSyntaxError(f"{e.message}; did you mean {kw}?", e.line, e.column, text)
    before = tokens[at - 1] if at > 0 else None
    kw = misspelt_keyword(before) if before is not None and named(at - 1) else None
    if kw is None:
        return e
    found = "the end of the query" if tokens[at].type == "EOF" else repr(tokens[at].text)
    return CelSyntaxError(f"unknown word {before.text!r}; did you mean {kw}? (read as a name, it cannot be "
                          f"followed by {found})", before.line, before.column, text)


def parse(text: str) -> ast.Query:
    """Parse one CEL query; raise the first :class:`CelSyntaxError`."""
    tokens = _tokenize(text)
    try:
        query = _Parser(text, tokens, collect=False, max_errors=1, errors=[]).parse()
    except RecursionError:
        raise too_deep(text) from None
    assert query is not None
    return query


def too_deep(text: str) -> CelSyntaxError:
    """The refusal of a query nested deeper than Python's stack allows."""
    return CelSyntaxError("the query is nested too deeply (brackets or operators thousands of levels deep); "
                          "simplify it", 1, 1, text)


def parse_all(text: str, max_errors: int = 10) -> tuple[ast.Query | None, list[CelError]]:
    """Parse collecting up to ``max_errors`` syntax errors (in source order of
    discovery). The query is ``None`` when there was any error."""
    max_errors = max(1, max_errors)
    errors: list[CelError] = []
    try:
        tokens = _tokenize_collecting(text, errors, max_errors)
    except _TooManyErrors:
        return None, errors
    cut = [(e.line, e.column) for e in errors if e.message.startswith("unterminated")]
    try:
        query = _Parser(text, tokens, collect=True, max_errors=max_errors, errors=errors).parse()
    except RecursionError:
        return None, [too_deep(text)]
    if cut:  # what follows an unterminated string or comment is not worth reporting
        errors = [e for e in errors if (e.line, e.column) <= cut[0]]
    errors.sort(key=lambda e: (e.line, e.column))
    return (query if not errors else None), errors


__all__ = ["parse", "parse_all", "misspelt_keyword", "RESERVED", "UNITS"]
