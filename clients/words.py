"""Counted nouns in the commands' messages: "1 witness", "2 witnesses"."""

from __future__ import annotations

#: Plurals that are not the singular plus "s".
_IRREGULAR = {"witness": "witnesses", "query": "queries", "entry": "entries"}


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, singular for exactly one: ``plural(1, "witness")`` is
    "1 witness", ``plural(3, "line")`` "3 lines"."""
    return f"{n} {word if n == 1 else _IRREGULAR.get(word, word + 's')}"


def noun(n: int, word: str) -> str:
    """``word`` alone, in the number ``n`` asks for ("of 1 line", "of 5 lines")."""
    return plural(n, word).split(" ", 1)[1]
