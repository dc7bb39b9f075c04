"""The SASE syntax tree (docs/design/sase.md#grammar): immutable data,
positions excluded from equality.

    query     := [EVENT] pattern clause* [';']      clause := WHERE cond | WITHIN n [unit]
                                                               | RETURN items | PUBLISH name
    pattern   := SEQ '(' component (',' component)* ')' | component
    component := ['!'] ( '(' positive ')' | positive )
    positive  := ANY '(' name (',' name)* ')' [var] | name [var]

Conditions and RETURN values are :mod:`air.expr` nodes; an attribute of a
component is ``Ref(attr, source=<variable as written>)``. An equivalence test
``[a]``, ``[a, b]`` or ``[a = 'c']`` is an :class:`Equivalence` node inside the
WHERE condition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from air.expr import Expr, Literal

_POS = dict(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TypeName:
    """An event type: the name of a declared stream."""

    name: str
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Component:
    """One component of SEQ: ``types`` has one name, or several under ANY."""

    types: tuple[TypeName, ...]
    negated: bool
    any_: bool
    var: str | None
    line: int = field(**_POS)
    column: int = field(**_POS)
    var_line: int = field(**_POS)
    var_column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Equivalence:
    """``[a]`` (every component has the first one's ``a``), ``[a, b]`` (two
    such tests) or ``[a = 'c']`` (every component's ``a`` is ``'c'``)."""

    attrs: tuple[str, ...]
    const: Literal | None
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Within:
    """``WITHIN value [unit]``: ``unit`` is MS, SEC, MIN, HOUR, DAY or None
    (the stream time unit)."""

    value: int | float
    unit: str | None
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class ReturnItem:
    expr: Expr
    name: str | None
    line: int = field(**_POS)
    column: int = field(**_POS)


@dataclass(frozen=True, slots=True)
class Query:
    components: tuple[Component, ...]
    where: Expr | None
    within: Within | None
    returns: tuple[ReturnItem, ...] | None  # None: RETURN absent (every attribute of every event)
    publish: str | None
    #: where the pattern starts (SEQ, or the lone component): warnings point there
    line: int = field(**_POS)
    column: int = field(**_POS)
    publish_line: int = field(**_POS)
    publish_column: int = field(**_POS)


__all__ = ["TypeName", "Component", "Equivalence", "Within", "ReturnItem", "Query"]
