"""What the commands say: counted nouns ("1 witness", "2 witnesses") and a
query's warnings on standard error."""

from __future__ import annotations

import sys
from typing import Callable

#: Plurals that are not the singular plus "s".
_IRREGULAR = {"witness": "witnesses", "query": "queries", "entry": "entries"}


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, singular for exactly one: ``plural(1, "witness")`` is
    "1 witness", ``plural(3, "line")`` "3 lines"."""
    return f"{n} {word if n == 1 else _IRREGULAR.get(word, word + 's')}"


def noun(n: int, word: str) -> str:
    """``word`` alone, in the number ``n`` asks for ("of 1 line", "of 5 lines")."""
    return plural(n, word).split(" ", 1)[1]


def unreachable(url: str, exc: BaseException) -> str:
    """What a client command says when no server answers at ``url``: why, and what to check."""
    return (f"cannot reach the server at {url}: {exc}; is cayuga serve running there? (--url or CAYUGA_URL "
            "names another)")


#: A command prints at most this many warnings (as a batch reports at most 100 errors), then how many more.
MAX_WARNINGS = 100


class QueryWarnings:
    """Writes the warnings of queries (air/boundwarn.py, as the API gives them)
    for ``cayuga register`` and ``cayuga run``: ``where: line L, column C:
    warning: ...; fix`` and the caret excerpt, the first MAX_WARNINGS of them,
    to standard error unless ``write`` says where."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self.write = write or (lambda text: print(text, file=sys.stderr))
        self.count = 0

    def __call__(self, where, w: dict) -> None:
        from air.errors import render

        self.count += 1
        if self.count <= MAX_WARNINGS:
            head = f"{where}: " if where else ""
            self.write(head + render(f"warning: {w['message']}; {w['fix']}", w.get("line", 0), w.get("column", 0),
                                     w.get("excerpt", "")))

    def summary(self) -> None:
        """How many were not written, if any."""
        if self.count > MAX_WARNINGS:
            self.write(f"cayuga: {plural(self.count - MAX_WARNINGS, 'more warning')} not shown "
                       f"({plural(self.count, 'warning')} in all)")
