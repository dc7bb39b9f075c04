"""Compile a CEL query once per shape, then bind its constants.

Queries that differ only in their literal constants (one query per symbol,
per sensor, per user) have one *shape*: the text with each string and number
literal, and each PUBLISH name that occurs nowhere else in the text, replaced
by a placeholder of its kind. :class:`ShapeCache` compiles a
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
  prefix or a PUBLISH name. A site matching several markers, or a marker left
  where no rule reaches it, makes the shape uncacheable.
* The shape's binding of the first query's own constants must equal the
  compiler's output for it (automata, outputs, schemas); otherwise the shape
  is marked uncacheable and every query of it is compiled on its own.
* Value-dependent behaviour is kept out of shapes: the int literal ``0``
  stays part of the shape (``2 ^ -0`` is an int, ``2 ^ -1`` a float); atoms
  that become equal once bound are dropped from their clause, as
  :func:`~air.cel.compiler.make_predicate` drops them; the streams a shape
  read while it compiled are checked on every hit (a stream redeclared with
  another schema means a recompile).

The cache key holds the shape's text, which of its PUBLISH names are the
same name, the user functions' signatures, the time unit, whether a name
prefix was given and :data:`COMPILER_VERSION`. :meth:`ShapeCache.export` and
:meth:`ShapeCache.load` keep compiled shapes across restarts as JSON that can
only build the model's own classes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Callable, Iterable, Mapping

from air.cel.compiler import CompiledQuery, Origin, _const_text, _schemas, compile_cel
from air.cel.shapetext import MARK, PREFIX, join_shape, name_markers, split_shape, value_markers
from air.cel.semantics import UNIT_MS, Duration, dur_constant
from air.expr import Literal
from air.model import Clause, DurationAtom, StaticAtom, StreamSchema
from air import expr as _expr
from air import model as _model

#: Bump whenever the compiler's output for some text changes: stored compiled
#: forms and cached shapes of another version are never used.
COMPILER_VERSION = "cel-2"

_UNITS = (None, *UNIT_MS)


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


class _Renamer:
    """Stream names built from a marker (the name prefix, a PUBLISH name):
    the marker itself, or the marker then ``__<n>`` (internal streams)."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers
        self._parts: dict[str, tuple[int, str] | None] = {}  # name -> (marker, what follows it)

    def index(self, name: str) -> int | None:
        for i, m in enumerate(self.markers):
            if name.startswith(m) and (len(name) == len(m) or name.startswith("__", len(m))):
                return i
        return None

    def rename(self, name: str, real: tuple) -> str:
        try:
            part = self._parts[name]
        except KeyError:
            i = self.index(name)
            part = self._parts[name] = None if i is None else (i, name[len(self.markers[i]):])
        return name if part is None else real[part[0]] + part[1]


class _Sites:
    """Where the markers of one shape landed in its compiled automata.

    A rule is (constant index, how, sign): ``how`` is "lit" (a Literal),
    "static" (a StaticAtom's text) or a DUR unit (None: no unit); ``sign`` is
    -1 where the parser folded a leading minus into the literal."""

    def __init__(self, markers: tuple, names: _Renamer, time_unit_ms: float) -> None:
        self.time_unit_ms = time_unit_ms
        self.names = names
        self.ok = True
        self.used: set[tuple[int, object]] = set()  # (constant index, how) of the sites found
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

    def plan(self, node) -> Callable | None:
        """A function of (constants, names) that builds ``node`` with them,
        or None where nothing at or below ``node`` depends on them (the
        template's own object is then shared)."""
        if isinstance(node, str):
            i = self.names.index(node)
            if i is None:
                if MARK in node or "_shapeN" in node:
                    self.ok = False  # a marker where no rule reaches it
                return None
            suffix = node[len(self.names.markers[i]):]
            return lambda v, n: n[i] + suffix
        if isinstance(node, (Literal, StaticAtom, DurationAtom)):
            return self._site(node)
        if isinstance(node, tuple):
            parts = list(node)
            cls = tuple
        elif dataclasses.is_dataclass(node):
            parts = [getattr(node, f) for f in _fields(type(node))]
            cls = type(node)
        else:
            return None
        subs = [(k, f) for k, f in ((k, self.plan(x)) for k, x in enumerate(parts)) if f is not None]
        if not subs:
            return None
        if cls is tuple:
            def build(v, n):
                out = parts.copy()
                for k, f in subs:
                    out[k] = f(v, n)
                return tuple(out)
        elif cls is Clause:
            def build(v, n):
                atoms: list = []
                for a in subs[0][1](v, n):
                    if a not in atoms:  # as make_predicate: constants bound equal make one atom
                        atoms.append(a)
                return Clause(tuple(atoms))
        else:
            def build(v, n):
                out = parts.copy()
                for k, f in subs:
                    out[k] = f(v, n)
                return cls(*out)
        return build

    def _site(self, node) -> Callable | None:
        if isinstance(node, Literal):
            if isinstance(node.value, bool):
                return None
            rule = self._rule(self._lit, node.value)
            if rule is None and isinstance(node.value, str) and MARK in node.value:
                self.ok = False
        elif isinstance(node, StaticAtom):
            rule = self._rule(self._static, node.const)
        else:
            rule = self._rule(self._dur, node.const)
        if rule is None:
            return None
        i, how, sign = rule
        self.used.add((i, how))

        def value(v):
            return v[i] if sign > 0 else -v[i]

        if how == "lit":
            line, column = node.line, node.column
            return lambda v, n: Literal(value(v), line, column)
        if how == "static":
            attr, op = node.event_attr, node.op
            return lambda v, n: StaticAtom(attr, op, _const_text(value(v)))
        kind, op = node.kind, node.op
        return lambda v, n: DurationAtom(kind, op, float(self._dur_value(value(v), how)))


class _Shape:
    __slots__ = ("compiled", "names", "build", "streams", "markers", "time_unit_ms", "saved", "static_rules",
                 "used", "kinds", "fast", "_reads")

    def __init__(self, compiled: CompiledQuery, sites: _Sites, streams: dict, markers: tuple) -> None:
        self.compiled = compiled
        self.names = sites.names
        self.build = sites.plan(compiled.automata)
        self.streams = streams
        self.markers = markers
        self.time_unit_ms = sites.time_unit_ms
        self.saved = False
        #: StaticAtom text -> [(constant index, "static", sign)]: where a StaticAtom's constant comes from
        self.static_rules = sites._static
        #: (constant index, how) of every site in the automata
        self.used = frozenset(sites.used)
        #: the type of each constant (a stored binding must have them)
        self.kinds = tuple(str if isinstance(m, str) else type(m) for m in markers)
        self.fast = None  # what an engine keeps of this shape (server/subscriptions/prepared.py)
        self._reads = None

    def dump(self) -> str:
        """The shape as JSON (see :meth:`ShapeCache.export`)."""
        c = self.compiled
        return json.dumps({
            "markers": list(self.markers), "names": list(self.names.markers), "unit": self.time_unit_ms,
            "streams": {n: None if s is None else _encode(s) for n, s in self.streams.items()},
            "automata": _encode(c.automata), "outputs": list(c.outputs),
            "schemas": {n: _encode(sch) for n, sch in c.schemas.items()},
            "origins": [list(o) for o in c.origins]})

    @classmethod
    def load(cls, text: str) -> "_Shape | None":
        d = json.loads(text)
        # a form written before origins were kept has none (KeyError): not loaded, its first query compiles it again
        origins = tuple(Origin(int(a), str(sid), str(op), int(k), bool(p)) for a, sid, op, k, p in d["origins"])
        compiled = CompiledQuery(_decode(d["automata"]), tuple(d["outputs"]),
                                 {n: _decode(x) for n, x in d["schemas"].items()}, origins)
        markers = tuple(d["markers"])
        sites = _Sites(markers, _Renamer(tuple(d["names"])), d["unit"])
        made = cls(compiled, sites, {n: None if x is None else _decode(x) for n, x in d["streams"].items()}, markers)
        return made if sites.ok else None

    def valid_for(self, streams: Mapping[str, StreamSchema]) -> bool:
        return all(streams.get(n) == s for n, s in self.streams.items())

    def bind(self, values: tuple, names: tuple, prefix: str | None) -> CompiledQuery:
        """``names``: the PUBLISH names; ``prefix``: the name prefix (if the shape has one)."""
        c = self.compiled
        real = names if prefix is None else names + (prefix,)
        automata = c.automata if self.build is None else self.build(values, real)
        rename = self.names.rename
        outputs = tuple(rename(o, real) for o in c.outputs)
        schemas = {}
        for n, sch in c.schemas.items():
            new = rename(n, real)
            schemas[new] = sch if new == n else StreamSchema(new, sch.attributes)
        return CompiledQuery(automata, outputs, schemas, c.origins)

    def reads(self) -> frozenset[str]:
        """The input streams of the shape's automata (names with markers as they are)."""
        if self._reads is None:
            self._reads = frozenset(s.input_stream for a in self.compiled.automata for s in a.states
                                    if s.input_stream)
        return self._reads


class BoundQuery(Sequence):
    """The automata of one query of a cached shape, bound only when they are
    first read (a restore installs them into an engine without building them:
    server/subscriptions/prepared.py). A read-only sequence of automata; equal to a tuple of
    the same automata."""

    __slots__ = ("shape", "values", "names", "prefix", "_automata", "_compiled")

    def __init__(self, shape: "_Shape", values: tuple, names: tuple, prefix: str | None) -> None:
        self.shape = shape
        self.values = values
        self.names = names
        self.prefix = prefix
        self._compiled: CompiledQuery | None = None

    @property
    def real(self) -> tuple:
        """The real names the shape's name markers stand for."""
        return self.names if self.prefix is None else self.names + (self.prefix,)

    def compiled(self) -> CompiledQuery:
        if self._compiled is None:
            self._compiled = self.shape.bind(self.values, self.names, self.prefix)
        return self._compiled

    @property
    def automata(self) -> tuple:
        return self.compiled().automata

    @property
    def outputs(self) -> tuple[str, ...]:
        real = self.real
        return tuple(self.shape.names.rename(o, real) for o in self.shape.compiled.outputs)

    def published(self) -> list[tuple[str, tuple]]:
        """(name, attributes) of each output of the automata, as ``Automaton.outputs`` lists them."""
        rename, real = self.shape.names.rename, self.real
        return [(rename(o.name, real), s.schema) for a in self.shape.compiled.automata for s, o in a.outputs]

    def reads(self) -> set[str]:
        rename, real = self.shape.names.rename, self.real
        return {rename(n, real) for n in self.shape.reads()}

    def __len__(self) -> int:
        return len(self.shape.compiled.automata)

    def __getitem__(self, i):
        return self.automata[i]

    def __iter__(self):
        return iter(self.automata)

    def __eq__(self, other) -> bool:
        if isinstance(other, BoundQuery):
            other = other.automata
        return isinstance(other, tuple) and self.automata == other

    def __hash__(self) -> int:
        return hash(self.automata)

    def __repr__(self) -> str:
        return repr(self.automata)


class ShapeCache:
    """Compiled CEL shapes, the most recently used ``max_shapes`` kept; thread-safe.

    :meth:`compile` has :func:`~air.cel.compile_cel`'s signature and result."""

    def __init__(self, max_shapes: int = 4096) -> None:
        self.max_shapes = max_shapes
        self._shapes: OrderedDict[tuple, _Shape | None] = OrderedDict()  # None: not cacheable
        self._lock = threading.Lock()
        self._unsaved: list[tuple] = []  # keys of shapes made since the last export
        self._ids: dict[str, tuple] = {}  # shape id (shape_id) -> key
        self._id_of: dict[tuple, str] = {}  # and back
        self.hits = 0
        self.misses = 0
        self.uncacheable = 0

    def __len__(self) -> int:
        return len(self._shapes)

    def stats(self) -> dict[str, int]:
        return {"shapes": len(self._shapes), "hits": self.hits, "misses": self.misses,
                "uncacheable": self.uncacheable}

    def export(self, only_unsaved: bool = True) -> list[tuple[str, str]]:
        """``(key, compiled form)`` of the cached shapes as JSON texts (those
        not exported before, by default), for a store to keep across restarts."""
        out = []
        with self._lock:
            if only_unsaved:
                items = [(k, self._shapes.get(k)) for k in self._unsaved]
                self._unsaved = []
            else:
                items = list(self._shapes.items())
        for key, shape in items:
            if shape is None or (only_unsaved and shape.saved):
                continue
            out.append((json.dumps(key), shape.dump()))
            shape.saved = True
        return out

    def keys(self) -> set[str]:
        """The keys (as :meth:`export` writes them) of the shapes held."""
        with self._lock:
            return {json.dumps(k) for k, v in self._shapes.items() if v is not None}

    def load(self, rows: Iterable[tuple[str, str]]) -> int:
        """Add shapes that :meth:`export` wrote; those of another compiler
        version (or unreadable) are skipped. Returns how many were added."""
        added = 0
        for key_text, form in rows:
            try:
                key = _tuples(json.loads(key_text))
                if key[-1] != COMPILER_VERSION:
                    continue
                shape = _Shape.load(form)
            except (ValueError, KeyError, TypeError, IndexError):
                continue
            if shape is None:
                continue
            shape.saved = True
            with self._lock:
                self._shapes[key] = shape
                self._ids[shape_id(key)] = key
                while len(self._shapes) > self.max_shapes:
                    self._shapes.popitem(last=False)
            added += 1
        return added

    def compile(self, text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
                functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
                name_prefix: str | None = None) -> CompiledQuery:
        """The automata :func:`~air.cel.compile_cel` makes of ``text``; raises
        the same :class:`~air.cel.CelError` it raises."""
        return self.compile_keyed(text, streams, functions=functions, time_unit_ms=time_unit_ms,
                                  name_prefix=name_prefix)[0]

    def compile_keyed(self, text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
                      functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
                      name_prefix: str | None = None) -> tuple[CompiledQuery, tuple[str, str] | None]:
        """:meth:`compile`, and the query's *binding* when its shape is cached:
        ``(shape id, constants)`` (texts), which :meth:`bound` turns back into
        the same automata without reading ``text`` again (a store keeps it
        beside the text), else None."""
        streams = _schemas(streams)
        split = split_shape(text)
        if split is None:
            return compile_cel(text, streams, functions=functions, time_unit_ms=time_unit_ms,
                               name_prefix=name_prefix), None
        shape, values, names = split
        key = (shape, tuple(names.index(n) for n in names), self._fn_key(functions), float(time_unit_ms),
               name_prefix is not None, COMPILER_VERSION)
        with self._lock:
            entry = self._shapes.get(key, False)
            if entry is not False:
                self._shapes.move_to_end(key)
        if entry is None:
            self.uncacheable += 1
        elif entry is not False and entry.valid_for(streams):
            self.hits += 1
            return entry.bind(values, names, name_prefix), self._binding(key, values, names)
        rec = _Recorder(streams)
        own = compile_cel(text, rec, functions=functions, time_unit_ms=time_unit_ms, name_prefix=name_prefix)
        if entry is None:
            return own, None
        self.misses += 1
        made = self._make(text, shape, values, names, rec, own, functions, time_unit_ms, name_prefix)
        with self._lock:
            self._shapes[key] = made
            if made is not None:
                self._unsaved.append(key)
                self._ids[shape_id(key)] = key
            while len(self._shapes) > self.max_shapes:
                self._shapes.popitem(last=False)
        return own, (None if made is None else self._binding(key, values, names))

    @staticmethod
    def _fn_key(functions: Mapping[str, str] | None) -> tuple | None:
        return None if functions is None else tuple(sorted(functions.items()))

    def _binding(self, key: tuple, values: tuple, names: tuple) -> tuple[str, str]:
        sid = self._id_of.get(key)
        if sid is None:
            if len(self._id_of) >= self.max_shapes:
                self._id_of.clear()
            sid = self._id_of[key] = shape_id(key)
        return sid, json.dumps([list(values), list(names)], separators=(",", ":"))

    def bound(self, binding: tuple[str, str], streams: Mapping[str, StreamSchema], *,
              functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
              name_prefix: str | None = None, count: bool = True) -> BoundQuery | None:
        """The automata of a query from its binding (:meth:`compile_keyed`),
        as :meth:`compile` would make them of its text, bound when first read;
        None when that cannot be vouched for (the shape is not held, e.g. one
        of another compiler version; functions, time unit or a stream read
        changed since; constants that do not fit the shape): then compile the
        text."""
        sid, constants = binding
        key = self._ids.get(sid)
        if key is None:
            return None
        if (key[2] != self._fn_key(functions) or key[3] != float(time_unit_ms)
                or key[4] != (name_prefix is not None) or key[5] != COMPILER_VERSION):
            return None
        with self._lock:
            entry = self._shapes.get(key)
        if entry is None or not entry.valid_for(streams):
            return None
        try:
            values, names = json.loads(constants)
        except (ValueError, TypeError):
            return None
        if (type(values) is not list or type(names) is not list or tuple(map(type, values)) != entry.kinds
                or not all(type(n) is str for n in names)
                or tuple([names.index(n) for n in names]) != key[1]):
            return None
        self.hits += count  # (not when the query was just compiled from its text: that was its hit)
        return BoundQuery(entry, tuple(values), tuple(names), name_prefix)

    def _make(self, text: str, shape: str, values: tuple, names: tuple, rec: _Recorder, own: CompiledQuery,
              functions, time_unit_ms: float, name_prefix: str | None) -> _Shape | None:
        if rec.listed:
            return None
        markers = value_markers(values)
        name_marks = name_markers(names)
        if any(m in text for m in name_marks):
            return None
        renamer = _Renamer(name_marks + ((PREFIX,) if name_prefix is not None else ()))
        try:
            template = compile_cel(join_shape(shape, markers, name_marks), rec.streams, functions=functions,
                                   time_unit_ms=time_unit_ms, name_prefix=PREFIX if name_prefix is not None else None)
        except Exception:  # noqa: BLE001 - a shape its markers break is simply not cached
            return None
        sites = _Sites(markers, renamer, time_unit_ms)
        made = _Shape(template, sites, dict(rec.seen), markers)
        if not sites.ok or not same_compiled(made.bind(values, names, name_prefix), own):
            return None
        return made


# --------------------------------------------------------------------------- JSON form

#: The only classes a stored shape may hold (nothing else is ever constructed).
_CLASSES: dict[str, type] = {c.__name__: c for c in (
    _model.Attribute, _model.StreamSchema, _model.StaticAtom, _model.DynamicAtom, _model.DurationAtom,
    _model.ComplexAtom, _model.Clause, _model.Predicate, _model.Rename, _model.Computed, _model.Edge,
    _model.OutputStream, _model.IndexHint, _model.State, _model.Automaton, _expr.Literal, _expr.Ref, _expr.Dur,
    _expr.Unary, _expr.Binary, _expr.Call, _expr.Compare, _expr.And, _expr.Or, Duration)}


def _encode(x):
    if isinstance(x, tuple):
        return [_encode(i) for i in x]
    if type(x).__name__ in _CLASSES and dataclasses.is_dataclass(x):
        return {"@": type(x).__name__, "f": [_encode(getattr(x, f)) for f in _fields(type(x))]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot store {type(x).__name__}")


def _decode(x):
    if isinstance(x, list):
        return tuple(_decode(i) for i in x)
    if isinstance(x, dict):
        return _CLASSES[x["@"]](*(_decode(i) for i in x["f"]))
    return x


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


def shape_id(key: tuple) -> str:
    """A short stable name of a shape's key (as stored beside a query)."""
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def same_compiled(a: CompiledQuery, b: CompiledQuery) -> bool:
    """Equal, literal types included (``Literal(1) == Literal(1.0)``, but
    ``x / 1`` truncates where ``x / 1.0`` does not): the reprs of the
    automata show every value with its type, and no source position; and
    the same operators made the same states (``origins``)."""
    return a == b and repr(a) == repr(b) and a.origins == b.origins


__all__ = ["ShapeCache", "BoundQuery", "split_shape", "same_compiled", "shape_id", "COMPILER_VERSION"]
