"""Render a CEL syntax tree back to CEL text.

``parse(format_query(q)) == q`` for every tree the parser can produce; the
output is fully parenthesised rather than pretty.
"""

from __future__ import annotations

from air.cel import ast
from air.expr import And, Binary, Call, Compare, Dur, Expr, Literal, Or, Ref, Unary

_DECORATOR = {None: "", "1": "$1.", "2": "$2.", "LAST": "$."}


def format_expr(e: Expr) -> str:
    if isinstance(e, Literal):
        v = e.value
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        return repr(v)
    if isinstance(e, ast.Quantity):
        return f"{e.value!r} {e.unit}"
    if isinstance(e, Ref):
        return _DECORATOR[e.source] + e.name
    if isinstance(e, Dur):
        return "DUR"
    if isinstance(e, Unary):
        return f"-({format_expr(e.operand)})"
    if isinstance(e, Binary):
        return f"({format_expr(e.left)}) {e.op} ({format_expr(e.right)})"
    if isinstance(e, Call):
        return f"{e.name}(" + ", ".join(format_expr(a) for a in e.args) + ")"
    if isinstance(e, Compare):
        return f"{format_expr(e.left)} {e.op} {format_expr(e.right)}"
    if isinstance(e, (And, Or)):
        sep = " AND " if isinstance(e, And) else " OR "
        return sep.join(f"({format_expr(i)})" for i in e.items)
    raise TypeError(f"not a CEL expression: {e!r}")


def _opt(e: Expr | None) -> str:
    return "" if e is None else format_expr(e)


def _item(i) -> str:
    if isinstance(i, ast.Star):
        return "*"
    return format_expr(i.expr) + (f" AS {i.alias}" if i.alias else "")


def format_stream(s: ast.StreamExpr) -> str:
    if isinstance(s, ast.StreamRef):
        return s.name
    if isinstance(s, ast.Filter):
        return f"FILTER{{{format_expr(s.pred)}}}({format_stream(s.input)})"
    if isinstance(s, ast.Next):
        return f"({format_stream(s.left)}) NEXT{{{_opt(s.pred)}}} ({format_stream(s.right)})"
    if isinstance(s, ast.Fold):
        aggs = ", ".join(_item(a) for a in s.aggs)
        return (f"({format_stream(s.left)}) FOLD{{{_opt(s.cond)}, {_opt(s.rebind)}, {aggs}}} "
                f"({format_stream(s.right)})")
    if isinstance(s, ast.SubQuery):
        return f"({format_query(s.query)})"
    raise TypeError(f"not a CEL stream expression: {s!r}")


def format_query(q: ast.Query) -> str:
    text = f"SELECT {', '.join(_item(i) for i in q.select)} FROM {format_stream(q.source)}"
    return text + (f" PUBLISH {q.publish}" if q.publish else "")


__all__ = ["format_query", "format_stream", "format_expr"]
