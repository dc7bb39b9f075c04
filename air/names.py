"""What a stream, attribute or state name may be: the one rule for CEL, AIR
and the REST API.

A name ends up in URLs (``/streams/{name}``, ``/ws/streams/{name}``), file
paths (a Spark Parquet dataset per output stream), metric labels and log
lines, so it is kept to letters, digits and underscores, at most
:data:`MAX_NAME_LENGTH` characters. Two forms:

- a *name* (:func:`name_problem`): what AIR may carry. The original
  compiler named internal streams by number (``<OutputStreamName Name="94">``),
  so a name may start with a digit.
- an *identifier* (``identifier=True``): a name that does not start with a
  digit, so that a CEL query can write it (``FROM 94`` reads a number). CEL
  identifiers and the streams declared with ``POST /streams`` are identifiers.

>>> name_problem("Stock"), name_problem("94"), name_problem("94", identifier=True) is not None
(None, None, True)
>>> name_problem("a/b", what="stream name")
"the stream name 'a/b' has the character '/'; a name is 1 to 200 letters, digits and underscores (A-Z, a-z, 0-9, _)"
"""

from __future__ import annotations

import re

#: Most characters a stream, attribute or state name may have.
MAX_NAME_LENGTH = 200

#: The rule, as error messages state it.
NAME_RULE = f"a name is 1 to {MAX_NAME_LENGTH} letters, digits and underscores (A-Z, a-z, 0-9, _)"
IDENTIFIER_RULE = NAME_RULE + " and does not start with a digit"

#: The two forms as JSON Schema (ECMA) patterns, for API documents; in Python use
#: :func:`name_problem` (a Python ``$`` also matches before a final newline).
NAME_PATTERN = rf"^[A-Za-z0-9_]{{1,{MAX_NAME_LENGTH}}}$"
IDENTIFIER_PATTERN = rf"^[A-Za-z_][A-Za-z0-9_]{{0,{MAX_NAME_LENGTH - 1}}}$"

_NAME = re.compile(r"[A-Za-z0-9_]+")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9_]")

#: Characters of a bad name an error message quotes at most.
_QUOTE = 40


def shown(name: str) -> str:
    """``name`` quoted for a message, cut short when long (a 10 KB name is not echoed back)."""
    if len(name) <= _QUOTE:
        return repr(name)
    return f"{name[:_QUOTE]!r}... ({len(name)} characters)"


def name_problem(name: str | None, *, what: str = "name", identifier: bool = False) -> str | None:
    """Why ``name`` is not a valid name (or identifier), or ``None`` when it is."""
    rule = IDENTIFIER_RULE if identifier else NAME_RULE
    if not name:
        return f"the {what} is empty; {rule}"
    if len(name) > MAX_NAME_LENGTH:
        return f"the {what} {shown(name)} is too long; {rule}"
    if not _NAME.fullmatch(name):
        bad = _BAD_CHAR.search(name).group()  # type: ignore[union-attr]
        return f"the {what} {shown(name)} has the character {bad!r}; {rule}"
    if identifier and name[0].isdigit():
        return f"the {what} {shown(name)} starts with a digit; {rule}"
    return None


def is_name(name: str, *, identifier: bool = False) -> bool:
    return name_problem(name, identifier=identifier) is None


__all__ = ["MAX_NAME_LENGTH", "NAME_RULE", "IDENTIFIER_RULE", "NAME_PATTERN", "IDENTIFIER_PATTERN",
           "name_problem", "is_name", "shown"]
