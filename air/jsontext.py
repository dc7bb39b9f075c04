"""JSON text read without decoding it into events: what the JSON lines decoder
(air/formats.py) needs to know of a line or a body beyond what msgspec tells it.

- Duplicate keys: msgspec (like the standard library) keeps the last value of
  a key given twice; a JSON event must name each key once. :func:`at_most_keys`
  and :func:`keys_as_decoded` prove cheaply that a text holds no more keys
  than were decoded (the usual case); :func:`first_duplicate` and
  :func:`duplicates_per_item` find the repeated key otherwise.
- Items: :func:`item_spans` splits a list (or ``{"events": [...]}``) into its
  items from its brackets, braces, commas and strings alone, so that each
  item can be decoded, and refused, on its own.
- Errors: :func:`json_reason` turns msgspec's byte offsets into columns and
  names NaN and Infinity.

Pure functions of the text: no schema, no event.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Mapping

import msgspec

from air.engine.convert import times_given

if TYPE_CHECKING:
    from air.engine.convert import Layout


def at_most_keys(data: str | bytes, n: int) -> bool:
    """Whether JSON text ``data`` holds at most ``n`` object keys. Every key is
    followed by a colon, so a text with no more colons than ``n`` holds no
    more keys; else the keys are counted as an unescaped ``"`` followed by
    ``:`` (that always ends a key; inside a string a ``"`` is escaped, and
    ``\\":`` is counted too: the answer errs towards "more", never "fewer"),
    with the whitespace JSON allows between a key and its colon taken out first."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    return data.count(b":") <= n or data.translate(None, b" \t\r\n").count(b'":') <= n


def keys_as_decoded(data: bytes, records: list, layouts: Mapping[type, Layout]) -> bool:
    """Whether the text of well-typed ``records`` names only the keys they
    hold (stream, each attribute, t0 and t1 when not null), so that none was
    given twice. The text holds at least those keys (each field a record has
    came from one), so at most as many proves that no key came twice; more
    (a duplicate, a colon in a string, a ``null`` time) sends the block to
    the precise path, which tells them apart. Costs a colon count and one
    pass over the records (about 65 ns an event)."""
    width = {t: layout.n + 1 for t, layout in layouts.items()}  # stream + attributes (ta, tb: below)
    expected = (len(records) * next(iter(width.values())) if len(width) == 1
                else sum(map(width.__getitem__, map(type, records))))
    expected += times_given(records)
    return at_most_keys(data, expected)


class _Keyed(dict):
    """A JSON object as the standard library reads it, with its first repeated key (or None)."""

    __slots__ = ("duplicate",)


def _keyed(pairs: list) -> _Keyed:
    obj = _Keyed(pairs)
    obj.duplicate = None
    if len(obj) != len(pairs):
        seen: set = set()
        obj.duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
    return obj


def _parse_keyed(data: str | bytes):
    """``data`` read by the standard library, each object a :class:`_Keyed`
    (None where it does not read: msgspec has read it, its error stands)."""
    try:
        return json.loads(data, object_pairs_hook=_keyed)
    except (ValueError, RecursionError):
        return None


def first_duplicate(line: str | bytes) -> str | None:
    """The first key a JSON line's object gives twice, or None."""
    obj = _parse_keyed(line)
    return obj.duplicate if isinstance(obj, _Keyed) else None


def duplicates_per_item(body: bytes, wrapped: bool, n: int) -> list[str | None]:
    """Per item of a document (``[...]``, one object, ``{"events": [...]}``):
    the first key that item gives twice, or None."""
    doc = _parse_keyed(body)
    if wrapped and isinstance(doc, dict):
        doc = doc.get("events")
    items = doc if isinstance(doc, list) else [doc]
    if len(items) != n:
        return [None] * n
    return [o.duplicate if isinstance(o, _Keyed) else None for o in items]


#: What splits a list into items: strings (whose brackets and commas do not count) and structure.
_ITEM_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|["\[\]{},]')
_WRAPPED = re.compile(rb'\A\s*\{\s*"events"\s*:\s*(?=\[)')
_WRAPPED_END = re.compile(rb'\}\s*\Z')


def item_spans(body: bytes) -> list[tuple[int, int]] | None:
    """Where each item of a top-level JSON list (or of ``{"events": [...]}``)
    starts and ends, found from its brackets, braces, commas and strings alone
    (so an item need not be JSON to be found); None when they do not make such
    a list."""
    start, stop = 0, len(body)
    wrapped = _WRAPPED.match(body)
    if wrapped:
        end = _WRAPPED_END.search(body)
        if end is None:
            return None
        start, stop = wrapped.end(), end.start()
    head = body[start:stop].lstrip()
    if not head.startswith(b"["):
        return None
    start = stop - len(head)  # the list's opening bracket
    spans: list[tuple[int, int]] = []
    depth, item_at, closed_at = 0, start + 1, None
    for m in _ITEM_TOKENS.finditer(body, start, stop):
        tok = m.group()
        if closed_at is not None:
            return None  # something after the list's closing bracket
        if tok == b'"':
            return None  # a string never closed
        if tok in (b"[", b"{"):
            depth += 1
        elif tok in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                if tok != b"]":
                    return None
                spans.append((item_at, m.start()))
                closed_at = m.end()
            elif depth < 0:
                return None
        elif tok == b"," and depth == 1:
            spans.append((item_at, m.start()))
            item_at = m.end()
    if closed_at is None or body[closed_at:stop].strip():
        return None
    if len(spans) == 1 and not body[spans[0][0]:spans[0][1]].strip():
        return []  # []
    if any(not body[a:b].strip() for a, b in spans):
        return None  # an empty item: [1,,2] or a trailing comma
    return spans


def duplicate_reason(key: str) -> str:
    shown = repr(key) if len(key) <= 40 else f"{key[:40]!r}... ({len(key)} characters)"
    return (f"duplicate key {shown}: a JSON event names each key once (the stream, t0, t1 and each attribute); "
            "send it with one value")


def json_reason(exc: msgspec.DecodeError, line: str | bytes) -> str:
    """msgspec's 'JSON is malformed: invalid character (byte 4)' as
    'invalid character at column 5', naming NaN and Infinity when they are the cause."""
    text = str(exc).removeprefix("JSON is malformed: ")
    m = re.match(r"^(.*) \(byte (\d+)\)$", text)
    start = len(line) - len(line.lstrip())
    if line[start:start + 1] not in ("{", "[", b"{", b"["):
        return f"expected a JSON object at column {start + 1}"
    if not m:
        return text
    at = int(m.group(2))
    rest = line[at:at + 9] if isinstance(line, str) else line[at:at + 9].decode("utf-8", "replace")
    for word in ("NaN", "Infinity"):
        if rest.startswith(word):
            if word == "Infinity" and at and line[at - 1:at] in ("-", b"-"):
                word, at = "-Infinity", at - 1
            return f"{word} at column {at + 1} (non-finite numbers are not JSON and not accepted)"
    return f"{m.group(1)} at column {at + 1}"
