"""One error family for everything a user can get wrong in CEL or AIR text.

Every error that points into user text carries the line and column (1-based)
and renders an excerpt with a caret under the column, like::

    line 2, column 14: expected '}' but found 'Stock'
      FROM FILTER{Price > 3 Stock
                            ^
"""

from __future__ import annotations


#: Characters of the source line an excerpt shows at most (around the column).
EXCERPT_WIDTH = 120


def excerpt(source: str, line: int, column: int) -> str:
    """Line ``line`` of ``source`` (1-based; 0: none), indented, with a caret
    under ``column`` (1-based; 0: no caret)."""
    if not source or line < 1:
        return ""
    lines = source.splitlines() or [""]
    if line > len(lines):
        text = ""
    else:
        text = lines[line - 1].expandtabs(1)
    if len(text) > EXCERPT_WIDTH:  # a window around the column, cut ends marked with "..."
        start = max(0, min(column - 1 - EXCERPT_WIDTH // 2, len(text) - EXCERPT_WIDTH)) if column > 0 else 0
        head = "..." if start else ""
        tail = "..." if start + EXCERPT_WIDTH < len(text) else ""
        text = head + text[start:start + EXCERPT_WIDTH] + tail
        column = column - start + len(head) if column > 0 else column
    if column <= 0:
        return f"  {text}"
    caret = " " * (column - 1) + "^"
    return f"  {text}\n  {caret}"


def render(message: str, line: int, column: int, excerpt: str = "") -> str:
    """``line L, column C: message`` and the excerpt below it (what a user sees of an error or a warning)."""
    if line and column > 0:
        head = f"line {line}, column {column}: {message}"
    elif line:
        head = f"line {line}: {message}"
    else:
        head = message
    return f"{head}\n{excerpt}" if excerpt else head


class CayugaError(Exception):
    """Base of all user-facing errors raised by the ``air`` package."""


class SourceError(CayugaError):
    """An error at a position in some source text."""

    kind = "error"

    def __init__(self, message: str, line: int = 0, column: int = 0, source: str = "") -> None:
        self.message = message
        self.line = line
        self.column = column
        self.source = source
        super().__init__(self.render())

    @property
    def excerpt(self) -> str:
        """The offending source line with a caret under the column."""
        return excerpt(self.source, self.line, self.column)

    def render(self) -> str:
        return render(self.message, self.line, self.column, self.excerpt)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "message": self.message,
            "line": self.line,
            "column": self.column,
            "excerpt": self.excerpt,
        }


class ExprSyntaxError(SourceError):
    """A malformed expression (in a CEL query or an AIR ``Expr`` attribute)."""

    kind = "syntax"
