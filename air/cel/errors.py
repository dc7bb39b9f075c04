"""Errors a user can make in CEL text.

Every error carries the 1-based line and column of the offending token, a
message that says what to fix, and (inherited from :class:`SourceError`) an
excerpt of the source line with a caret under the column::

    line 2, column 20: unknown stream 'Stok'; did you mean 'Stock'? (declared: Stock)
      FROM FILTER{x > 1}(Stok)
                         ^
"""

from __future__ import annotations

from air.errors import ExprSyntaxError, SourceError


class CelError(SourceError):
    """Base of every CEL user error."""

    kind = "cel"


class CelSyntaxError(CelError, ExprSyntaxError):
    """Malformed text: a missing brace, a stray token, an unterminated string.

    It is also an :class:`ExprSyntaxError` so the shared tokenizer and
    expression parser can raise it directly."""

    kind = "syntax"


class CelNameError(CelError):
    """An unknown stream, attribute or function, an ambiguous attribute name,
    or a decorator that is not valid where it is used."""

    kind = "name"


class CelTypeError(CelError):
    """Operands of incompatible types (string compared with a number, arithmetic
    on strings, a predicate that is not a comparison, ...)."""

    kind = "type"


class CelSchemaError(CelError):
    """A schema that cannot be built: duplicate output names, a remaining
    duplicate after automatic renaming, a violated FOLD schema-inclusion
    invariant, an aggregate on an attribute the first input does not have."""

    kind = "schema"


__all__ = ["CelError", "CelSyntaxError", "CelNameError", "CelTypeError", "CelSchemaError"]
