"""The shape of a CEL text: the text with its literal constants (and the
PUBLISH names used nowhere else) cut out, and the marker constants put in
their place when the shape compiles (air/cel/shapes.py explains how the
shape cache uses them).

:func:`split_shape` takes a text apart, :func:`join_shape` puts one together
again; :func:`value_markers` and :func:`name_markers` are the markers. Text
only: nothing here compiles.
"""

from __future__ import annotations

import math
import re

from air.expr import INT_MAX

#: One pass splits a text into runs of tokens that cannot hold a literal
#: (words whole, so no digit inside a name is taken for a number; ``$n``
#: decorators; operators and white space, but no character that starts a
#: comment or a literal), comments, string literals and number literals, by the
#: tokenizer's own patterns (air/expr.py) and in its order, so that literals
#: begin and end where the tokenizer's do.
_SCAN = re.compile(
    r"((?:[A-Za-z_][A-Za-z_0-9]*|\$\d*|[^'0-9.A-Za-z_$/\-]|-(?!-)|/(?![/*])|\.(?!\d))+)"
    r"|(--[^\n]*|//[^\n]*|/\*.*?\*/)"
    r"|('(?:[^']|'')*')"
    r"|((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)",
    re.S)
#: ``PUBLISH name`` inside one run.
_PUBLISH = re.compile(r"(?<![A-Za-z_0-9$])PUBLISH[ \t\r\n]+([A-Za-z_][A-Za-z_0-9]*)", re.I)

MARK = "\x00"  # never valid in CEL outside a string literal: texts holding it are not shaped
PREFIX = "\x00P"  # the marker name prefix a shape compiles with, when its query has one


def split_shape(text: str) -> tuple[str, tuple, tuple] | None:
    """``(shape, constants, names)`` of a CEL text, or None when it is not shaped.
    ``names`` are the PUBLISH names that appear nowhere else in the text.

    >>> shape, values, names = split_shape("FILTER{Name = 'IBM' AND Price > 1.5}(Stock) PUBLISH Up")
    >>> shape.replace("\\x00", "?"), values, names
    ('FILTER{Name = ?s AND Price > ?f}(Stock) PUBLISH ?n', ('IBM', 1.5), ('Up',))
    """
    if MARK in text:
        return None
    cuts: list[tuple[int, int, str]] = []
    values: list = []
    names: list[tuple[int, int, str]] = []
    for m in _SCAN.finditer(text):
        kind = m.lastindex
        if kind == 1:
            if "PUBLISH" in m.group().upper():
                names.extend((p.start(1), p.end(1), p.group(1)) for p in _PUBLISH.finditer(text, m.start(), m.end()))
        elif kind == 3:
            values.append(m.group()[1:-1].replace("''", "'"))
            cuts.append((m.start(), m.end(), "\x00s"))
        elif kind == 4:
            n = m.group()
            if "." in n or "e" in n or "E" in n:
                if not math.isfinite(float(n)):
                    return None  # out of range: compile_cel refuses it, with its position
                values.append(float(n))
                cuts.append((m.start(), m.end(), "\x00f"))
            elif int(n) > INT_MAX:
                return None  # out of range (but -9223372036854775808 is not): compile_cel decides
            elif int(n):  # 0 stays in the shape: 2 ^ -0 is an int, 2 ^ -1 a float
                values.append(int(n))
                cuts.append((m.start(), m.end(), "\x00i"))
    publish: list[str] = []
    if names:
        upper = text.upper()
        for a, b, w in names:  # a name that occurs anywhere else (even in a string) stays in the shape
            if upper.count(w.upper()) == sum(1 for x in names if x[2].upper() == w.upper()):
                cuts.append((a, b, "\x00n"))
                publish.append(w)
        cuts.sort()
    if not cuts:
        return text, (), ()
    parts: list[str] = []
    last = 0
    for a, b, tag in cuts:
        parts.append(text[last:a])
        parts.append(tag)
        last = b
    parts.append(text[last:])
    return "".join(parts), tuple(values), tuple(publish)


def _primes(n: int, start: int = 1_000_003) -> list[int]:
    out: list[int] = []
    k = start
    while len(out) < n:
        if all(k % d for d in range(3, int(k ** 0.5) + 1, 2)):
            out.append(k)
        k += 2
    return out


def value_markers(values: tuple) -> tuple:
    """Marker constants standing for ``values`` while a shape compiles: a
    distinct large prime per int, a distinct prime + 0.5 per float, a distinct
    unprintable string per string."""
    primes = iter(_primes(sum(1 for v in values if not isinstance(v, str))))
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            out.append(f"{MARK}{i}{MARK}")
        elif isinstance(v, int):
            out.append(next(primes))
        else:
            out.append(next(primes) + 0.5)
    return tuple(out)


def _literal_text(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def join_shape(shape: str, values: tuple, names: tuple) -> str:
    """The CEL text of ``shape`` with ``values`` and ``names`` put back."""
    pieces = re.split("\x00([sifn])", shape)
    out = [pieces[0]]
    vals, nams = iter(values), iter(names)
    for tag, piece in zip(pieces[1::2], pieces[2::2]):
        out.append(next(nams) if tag == "n" else _literal_text(next(vals)))
        out.append(piece)
    return "".join(out)


def name_markers(names: tuple) -> tuple[str, ...]:
    """Marker names standing for a shape's PUBLISH names while it compiles."""
    return tuple(f"_shapeN{i}_" for i in range(len(names)))
