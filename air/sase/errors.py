"""Errors a user can make in SASE text (docs/design/sase.md).

Like CEL's (air/cel/errors.py), every error carries the 1-based line and column
of the offending token, a message that says what to fix, and an excerpt of
the source line with a caret under the column::

    line 1, column 11: a negated component cannot start the sequence: ...
      EVENT SEQ(!(COUNTER y), EXIT z) WITHIN 1 hour
                ^

:class:`SaseRefused` is the error of a query that is well formed and means
something in the SASE paper's semantics, but that Cayuga automata cannot compute
exactly (docs/design/sase.md#what-is-refused-and-why): the message says why.
"""

from __future__ import annotations

from air.errors import ExprSyntaxError, SourceError


class SaseError(SourceError):
    """Base of every SASE user error."""

    kind = "sase"


class SaseSyntaxError(SaseError, ExprSyntaxError):
    """Malformed text. Also an :class:`ExprSyntaxError`, so that the shared
    expression parser (air/expr.py) can raise it directly."""

    kind = "syntax"


class SaseNameError(SaseError):
    """An unknown stream, variable, attribute or function, or a name used twice."""

    kind = "name"


class SaseTypeError(SaseError):
    """Operands of incompatible types, or a WITHIN that is not a positive duration."""

    kind = "type"


class SaseRefused(SaseError):
    """A construct the automata cannot express exactly; the message says why."""

    kind = "refused"


__all__ = ["SaseError", "SaseSyntaxError", "SaseNameError", "SaseTypeError", "SaseRefused"]
