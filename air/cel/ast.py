"""The CEL syntax tree: immutable data, positions excluded from equality.

Predicates and values inside the tree are :mod:`air.expr` nodes (``Ref`` with
source ``"1"``, ``"2"``, ``"LAST"`` or ``None``; ``Dur``; ``Call``; ...), plus
:class:`Quantity` for a time constant written with a unit (``10 MIN``).

    query      := [SELECT selectList FROM] streamExpr [PUBLISH name]
    streamExpr := unary (NEXT{pred} unary | FOLD{pred, pred, aggs} unary)*
    unary      := FILTER{pred} unary | name | '(' query ')'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from air.expr import Expr

_POS = dict(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Quantity:
    """A duration constant with a unit, e.g. ``10 MIN`` in ``DUR > 10 MIN``.
    ``unit`` is the canonical unit name: MS, SEC, MIN, HOUR or DAY."""

    value: int | float
    unit: str
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Star:
    """``*`` in a SELECT list: every attribute of the input."""

    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class SelectItem:
    """``expr [AS alias]`` in a SELECT list or a FOLD aggregate list."""

    expr: Expr
    alias: str | None = None
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class StreamRef:
    name: str
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Filter:
    pred: Expr
    input: "StreamExpr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Next:
    left: "StreamExpr"
    pred: Expr | None
    right: "StreamExpr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Fold:
    left: "StreamExpr"
    cond: Expr | None
    rebind: Expr | None
    aggs: tuple[SelectItem, ...]
    right: "StreamExpr"
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class SubQuery:
    """A parenthesised query with its own SELECT and/or PUBLISH."""

    query: "Query"
    line: int = field(**_POS)
    column: int = field(**_POS)


StreamExpr = Union[StreamRef, Filter, Next, Fold, SubQuery]


@dataclass(frozen=True, slots=True)
class Query:
    """``select`` is ``(Star(),)`` when the SELECT clause is omitted."""

    select: tuple[Union[SelectItem, Star], ...]
    source: StreamExpr
    publish: str | None = None
    line: int = field(**_POS)
    column: int = field(**_POS)
    #: position of the name after PUBLISH (0 when there is none)
    publish_line: int = field(**_POS)
    publish_column: int = field(**_POS)


__all__ = ["Quantity", "Star", "SelectItem", "StreamRef", "Filter", "Next", "Fold",
           "SubQuery", "StreamExpr", "Query"]
