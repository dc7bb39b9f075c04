"""Compile a CEL query once per shape, then bind its constants.

Queries that differ only in their literal constants (one query per symbol,
per sensor, per user) have one *shape*: the text with each string and number
literal replaced by a placeholder of its kind. :class:`ShapeCache` compiles a
shape once and makes each further query of that shape by copying the shape's
automata with the query's own constants put in, prepared-statement style, at a
small fraction of the cost of parsing, checking and compiling it again.

How it stays exactly equivalent to :func:`~air.cel.compile_cel` on each query
alone:

* A query not in the cache is compiled on its own first, so that its errors
  carry its own line, column and excerpt; nothing that fails is cached.
* The shape is then compiled with *marker* constants (a distinct large prime
  per int literal, a distinct prime + 0.5 per float, a distinct unprintable
  string per string) and a marker name prefix. Every place a marker reached
  in the automata is a *site*: a ``Literal`` (possibly negated by a leading
  ``-``), a ``StaticAtom`` constant (its text), a ``DurationAtom`` constant
  (converted from a time unit), or a stream or automaton name built from the
  prefix. A site matching no marker or several makes the shape uncacheable.
* The shape's binding of the first query's own constants must equal the
  compiler's output for it (automata, outputs, schemas); otherwise the shape
  is marked uncacheable and every query of it is compiled on its own.
* Value-dependent behaviour is kept out of shapes: the int literal ``0``
  stays part of the shape (``2 ^ -0`` is an int, ``2 ^ -1`` a float); atoms
  that become equal once bound are dropped from their clause, as
  :func:`~air.cel.compiler.make_predicate` drops them; the streams a shape
  read while it compiled are checked on every hit (a stream redeclared with
  another schema means a recompile).

The cache key holds the shape's text, the user functions' signatures, the
time unit, whether a name prefix was given and :data:`COMPILER_VERSION`.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from typing import Iterable, Mapping

from air.cel.compiler import CompiledQuery, _const_text, _schemas, compile_cel
from air.cel.semantics import UNIT_MS, dur_constant
from air.expr import Literal
from air.model import Automaton, Clause, DurationAtom, OutputStream, State, StaticAtom, StreamSchema

#: Bump whenever the compiler's output for some text changes: stored compiled
#: forms and cached shapes of another version are never used.
COMPILER_VERSION = "cel-1"

#: One pass finds comments (kept), string and number literals, and the words
#: and ``$n`` decorators whose digits are not numbers, in the order the
#: tokenizer tries them (air/expr.py), so it splits literals where it does.
_SCAN = re.compile(
    r"(--[^\n]*|//[^\n]*|/\*.*?\*/)"
    r"|('(?:[^']|'')*')"
    r"|((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)"
    r"|\$\d*|[A-Za-z_][A-Za-z_0-9]*",
    re.S)

_MARK = "\x00"  # never valid in CEL outside a string literal: texts holding it are not shaped
_PREFIX = "\x00P"
_UNITS = (None, *UNIT_MS)


def split_shape(text: str) -> tuple[str, tuple, tuple] | None:
    """``(shape, constants, names)`` of a CEL text, or None when it is not shaped.
    ``names`` are the PUBLISH names that appear nowhere else in the text.

    >>> shape, values, names = split_shape("FILTER{Name = 'IBM' AND Price > 1.5}(Stock) PUBLISH Up")
    >>> shape.replace("\\x00", "?"), values, names
    ('FILTER{Name = ?s AND Price > ?f}(Stock) PUBLISH ?n', ('IBM', 1.5), ('Up',))
    """
    if _MARK in text:
        return None
    cuts: list[tuple[int, int, str]] = []
    values: list = []
    names: list[tuple[int, int, str]] = []
    words: dict[str, int] = {}
    after_publish = -1
    for m in _SCAN.finditer(text):
        s, n = m.group(2), m.group(3)
        if s is not None:
            values.append(s[1:-1].replace("''", "'"))
            cuts.append((m.start(), m.end(), "\x00s"))
        elif n is not None:
            if any(c in n for c in ".eE"):
                values.append(float(n))
                cuts.append((m.start(), m.end(), "\x00f"))
            elif int(n):
                values.append(int(n))
                cuts.append((m.start(), m.end(), "\x00i"))
        elif m.group(1) is None:
            word = m.group()
            upper = word.upper()
            words[upper] = words.get(upper, 0) + 1
            if after_publish >= 0 and not text[after_publish:m.start()].strip():
                names.append((m.start(), m.end(), word))
            after_publish = m.end() if upper == "PUBLISH" else -1
            continue
        after_publish = -1
    own = [nm for nm in names if words[nm[2].upper()] == sum(1 for x in names if x[2].upper() == nm[2].upper())]
    cuts.extend((a, b, "\x00n") for a, b, _ in own)
    if not cuts:
        return text, (), ()
    cuts.sort()
    parts: list[str] = []
    last = 0
    for a, b, tag in cuts:
        parts.append(text[last:a])
        parts.append(tag)
        last = b
    parts.append(text[last:])
    return "".join(parts), tuple(values), tuple(w for _, _, w in own)


def _primes(n: int, start: int = 1_000_003) -> list[int]:
    out: list[int] = []
    k = start
    while len(out) < n:
        if all(k % d for d in range(3, int(k ** 0.5) + 1, 2)):
            out.append(k)
        k += 2
    return out


def _markers(values: tuple) -> tuple:
    primes = iter(_primes(sum(1 for v in values if not isinstance(v, str))))
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            out.append(f"{_MARK}{i}{_MARK}")
        elif isinstance(v, int):
            out.append(next(primes))
        else:
            out.append(next(primes) + 0.5)
    return tuple(out)


def _literal_text(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def _join(shape: str, values: tuple, names: tuple) -> str:
    """The CEL text of ``shape`` with ``values`` and ``names`` put back."""
    pieces = re.split("\x00([sifn])", shape)
    out = [pieces[0]]
    vals, nams = iter(values), iter(names)
    for tag, piece in zip(pieces[1::2], pieces[2::2]):
        out.append(next(nams) if tag == "n" else _literal_text(next(vals)))
        out.append(piece)
    return "".join(out)


class _Recorder(Mapping):
    """The streams a compile looked up, and what it found."""

    def __init__(self, streams: Mapping[str, StreamSchema]) -> None:
        self.streams = streams
        self.seen: dict[str, StreamSchema | None] = {}
        self.listed = False

    def __getitem__(self, name: str) -> StreamSchema:
        found = self.streams.get(name)
        self.seen[name] = found
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self):
        self.listed = True  # only error messages list every stream
        return iter(self.streams)

    def __len__(self) -> int:
        self.listed = True
        return len(self.streams)


# --------------------------------------------------------------------------- binding

_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _name_markers(names: tuple) -> tuple[str, ...]:
    return tuple(f"_shapeN{i}_" for i in range(len(names)))


class _Renamer:
    """Stream names built from a marker (the name prefix, a PUBLISH name):
    the marker itself, or the marker then ``__<n>`` (internal streams)."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers

    def index(self, name: str) -> int | None:
        for i, m in enumerate(self.markers):
            if name.startswith(m) and (len(name) == len(m) or name.startswith("__", len(m))):
                return i
        return None

    def rename(self, name: str, real: tuple) -> str:
        i = self.index(name)
        return name if i is None else real[i] + name[len(self.markers[i]):]


class _Sites:
    """Where the markers of one shape landed in its compiled automata.

    A rule is (constant index, how, sign): ``how`` is "lit" (a Literal),
    "static" (a StaticAtom's text) or a DUR unit (None: no unit); ``sign`` is
    -1 where the parser folded a leading minus into the literal."""

    def __init__(self, markers: tuple, names: _Renamer, time_unit_ms: float) -> None:
        self.time_unit_ms = time_unit_ms
        self.names = names
        self.rules: dict[int, tuple] = {}  # id(template node) -> rule
        self.dirty: set[int] = set()  # ids of template nodes with a site at or below them
        self.ok = True
        self._lit: dict[object, list] = {}
        self._static: dict[str, list] = {}
        self._dur: dict[float, list] = {}
        for i, m in enumerate(markers):
            if isinstance(m, str):
                self._lit.setdefault(m, []).append((i, "lit", 1))
                self._static.setdefault(m, []).append((i, "static", 1))
                continue
            for sign in (1, -1):
                self._lit.setdefault(sign * m, []).append((i, "lit", sign))
                self._static.setdefault(_const_text(sign * m), []).append((i, "static", sign))
                for unit in _UNITS:
                    if unit == "MS" and time_unit_ms == 1.0:
                        continue  # the same value as no unit, for every constant
                    self._dur.setdefault(float(self._dur_value(sign * m, unit)), []).append((i, unit, sign))

    def _dur_value(self, v, unit):
        return v if unit is None else dur_constant(v, unit, self.time_unit_ms)

    def _rule(self, table: dict, key):
        found = table.get(key)
        if not found:
            return None
        if len(found) > 1:
            self.ok = False  # two markers (or units) would explain this value: do not guess
        return found[0]

    def scan(self, node) -> bool:
        """Record the sites at or below ``node``; True when there is one."""
        hit = False
        if isinstance(node, tuple):
            for x in node:
                hit = self.scan(x) or hit
        elif isinstance(node, str):
            hit = self.names.index(node) is not None
            if not hit and (_MARK in node or "_shapeN" in node):
                self.ok = False  # a marker where no rule reaches it
            return hit
        elif isinstance(node, (Literal, StaticAtom, DurationAtom)):
            if isinstance(node, Literal):
                rule = None if isinstance(node.value, bool) else self._rule(self._lit, node.value)
            elif isinstance(node, StaticAtom):
                rule = self._rule(self._static, node.const)
            else:
                rule = self._rule(self._dur, node.const)
            if rule is not None:
                self.rules[id(node)] = rule
                hit = True
            elif isinstance(node, Literal) and isinstance(node.value, str) and _MARK in node.value:
                self.ok = False
        elif dataclasses.is_dataclass(node):
            for f in _fields(type(node)):
                hit = self.scan(getattr(node, f)) or hit
        if hit:
            self.dirty.add(id(node))
        return hit

    def bind(self, node, values: tuple, names: tuple):
        if isinstance(node, str):
            return self.names.rename(node, names)
        if id(node) not in self.dirty:
            return node
        if isinstance(node, tuple):
            return tuple(self.bind(x, values, names) for x in node)
        rule = self.rules.get(id(node))
        if rule is not None:
            i, how, sign = rule
            v = values[i] if sign > 0 else -values[i]
            if how == "lit":
                return Literal(v, node.line, node.column)
            if how == "static":
                return StaticAtom(node.event_attr, node.op, _const_text(v))
            return DurationAtom(node.kind, node.op, float(self._dur_value(v, how)))
        args = [self.bind(getattr(node, f), values, names) for f in _fields(type(node))]
        if isinstance(node, Clause):
            atoms: list = []
            for a in args[0]:
                if a not in atoms:  # as make_predicate: constants bound equal make one atom
                    atoms.append(a)
            args[0] = tuple(atoms)
        return type(node)(*args)


class _Shape:
    __slots__ = ("compiled", "sites", "streams")

    def __init__(self, compiled: CompiledQuery, sites: _Sites, streams: dict) -> None:
        self.compiled = compiled
        self.sites = sites
        self.streams = streams

    def valid_for(self, streams: Mapping[str, StreamSchema]) -> bool:
        return all(streams.get(n) == s for n, s in self.streams.items())

    def bind(self, values: tuple, names: tuple, prefix: str | None) -> CompiledQuery:
        """``names``: the PUBLISH names; ``prefix``: the name prefix (if the shape has one)."""
        c, sites = self.compiled, self.sites
        real = names if prefix is None else names + (prefix,)
        automata = sites.bind(c.automata, values, real)
        rename = sites.names.rename
        outputs = tuple(rename(o, real) for o in c.outputs)
        schemas = {}
        for n, sch in c.schemas.items():
            new = rename(n, real)
            schemas[new] = sch if new == n else StreamSchema(new, sch.attributes)
        return CompiledQuery(automata, outputs, schemas)


class ShapeCache:
    """Compiled CEL shapes, the most recently used ``max_shapes`` kept; thread-safe.

    :meth:`compile` has :func:`~air.cel.compile_cel`'s signature and result."""

    def __init__(self, max_shapes: int = 4096) -> None:
        self.max_shapes = max_shapes
        self._shapes: OrderedDict[tuple, _Shape | None] = OrderedDict()  # None: not cacheable
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.uncacheable = 0

    def __len__(self) -> int:
        return len(self._shapes)

    def stats(self) -> dict[str, int]:
        return {"shapes": len(self._shapes), "hits": self.hits, "misses": self.misses,
                "uncacheable": self.uncacheable}

    def compile(self, text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
                functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
                name_prefix: str | None = None) -> CompiledQuery:
        """The automata :func:`~air.cel.compile_cel` makes of ``text``; raises
        the same :class:`~air.cel.CelError` it raises."""
        streams = _schemas(streams)
        split = split_shape(text)
        if split is None:
            return compile_cel(text, streams, functions=functions, time_unit_ms=time_unit_ms,
                               name_prefix=name_prefix)
        shape, values, names = split
        key = (shape, tuple(names.index(n) for n in names),
               None if functions is None else tuple(sorted(functions.items())), float(time_unit_ms),
               name_prefix is not None, COMPILER_VERSION)
        with self._lock:
            entry = self._shapes.get(key, False)
            if entry is not False:
                self._shapes.move_to_end(key)
        if entry is None:
            self.uncacheable += 1
        elif entry is not False and entry.valid_for(streams):
            self.hits += 1
            return entry.bind(values, names, name_prefix)
        rec = _Recorder(streams)
        own = compile_cel(text, rec, functions=functions, time_unit_ms=time_unit_ms, name_prefix=name_prefix)
        if entry is None:
            return own
        self.misses += 1
        made = self._make(text, shape, values, names, rec, own, functions, time_unit_ms, name_prefix)
        with self._lock:
            self._shapes[key] = made
            while len(self._shapes) > self.max_shapes:
                self._shapes.popitem(last=False)
        return own

    def _make(self, text: str, shape: str, values: tuple, names: tuple, rec: _Recorder, own: CompiledQuery,
              functions, time_unit_ms: float, name_prefix: str | None) -> _Shape | None:
        if rec.listed:
            return None
        markers = _markers(values)
        name_marks = _name_markers(names)
        if any(m in text for m in name_marks):
            return None
        renamer = _Renamer(name_marks + ((_PREFIX,) if name_prefix is not None else ()))
        try:
            template = compile_cel(_join(shape, markers, name_marks), rec.streams, functions=functions,
                                   time_unit_ms=time_unit_ms, name_prefix=_PREFIX if name_prefix is not None else None)
        except Exception:  # noqa: BLE001 - a shape its markers break is simply not cached
            return None
        sites = _Sites(markers, renamer, time_unit_ms)
        sites.scan(template.automata)
        made = _Shape(template, sites, dict(rec.seen))
        if not sites.ok or made.bind(values, names, name_prefix) != own:
            return None
        return made


__all__ = ["ShapeCache", "split_shape", "COMPILER_VERSION"]
