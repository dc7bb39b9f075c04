"""The Cayuga automaton model: immutable data, no behaviour beyond lookups.

An :class:`Automaton` is a set of :class:`State` objects. Every non-start state
has a filter predicate, at most one rebind edge and any number of forward edges
(docs/design/semantics.md#automata). Predicates are kept in disjunctive normal form: a :class:`Predicate`
is an OR of :class:`Clause`, each an AND of atoms. Expressions used by complex
atoms and computed schema-map entries are small trees of :mod:`air.expr`
nodes. Nothing here knows how it is executed; the engine compiles it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Union

from air.expr import Expr
from air.names import name_problem

AttrType = Literal["int", "float", "string", "bool"]
ATTR_TYPES: tuple[str, ...] = ("int", "float", "string", "bool")
#: Type names accepted on input and what they mean (the original's
#: ``shortstring`` is a string; a few common spellings are tolerated).
TYPE_ALIASES: dict[str, str] = {
    "int": "int", "integer": "int", "long": "int",
    "float": "float", "double": "float",
    "string": "string", "shortstring": "string", "str": "string",
    "bool": "bool", "boolean": "bool",
}

Op = Literal["=", "!=", "<", "<=", ">", ">="]
OPS: tuple[str, ...] = ("=", "!=", "<", "<=", ">", ">=")


class ModelError(ValueError):
    """An automaton or schema that is not well formed."""


def normalize_type(name: str) -> str:
    try:
        return TYPE_ALIASES[name.strip().lower()]
    except KeyError:
        raise ModelError(
            f"unknown attribute type {name!r}; use one of int, float, string, bool"
        ) from None


@dataclass(frozen=True, slots=True)
class Attribute:
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class StreamSchema:
    """A named stream with ordered, typed attributes."""

    name: str
    attributes: tuple[Attribute, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for a in self.attributes:
            if a.name in seen:
                raise ModelError(f"stream {self.name}: duplicate attribute {a.name!r}")
            seen.add(a.name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def index(self, name: str) -> int:
        for i, a in enumerate(self.attributes):
            if a.name == name:
                return i
        raise KeyError(name)

    def type_of(self, name: str) -> str:
        return self.attributes[self.index(name)].type

    def has(self, name: str) -> bool:
        return any(a.name == name for a in self.attributes)

    def __str__(self) -> str:
        return f"{self.name}(" + ", ".join(f"{a.name} {a.type}" for a in self.attributes) + ")"


_DECL = re.compile(r"^\s*([A-Za-z_][\w]*)\s*\((.*)\)\s*$", re.S)


def parse_stream_decl(text: str) -> StreamSchema:
    """Parse ``Stock(Name string, Price float, Volume int)``."""
    m = _DECL.match(text)
    if not m:
        raise ModelError(
            f"bad stream declaration {text!r}; expected e.g. 'Stock(Name string, Price float)'"
        )
    name, body = m.group(1), m.group(2).strip()
    problem = name_problem(name, what="stream name", identifier=True)
    if problem is not None:
        raise ModelError(problem)
    attrs = []
    if body:
        for part in body.split(","):
            bits = part.split()
            if len(bits) != 2:
                raise ModelError(
                    f"bad attribute {part.strip()!r} in stream {name}; expected 'Name type'"
                )
            problem = name_problem(bits[0], what=f"attribute name in stream {name}", identifier=True)
            if problem is not None:
                raise ModelError(problem)
            attrs.append(Attribute(bits[0], normalize_type(bits[1])))
    return StreamSchema(name, tuple(attrs))


# --------------------------------------------------------------------------- predicates


@dataclass(frozen=True, slots=True)
class StaticAtom:
    """``event.attr OP constant``; the constant is kept as written in AIR and
    converted to the event attribute's type when the automaton is bound."""

    event_attr: str
    op: str
    const: str


@dataclass(frozen=True, slots=True)
class DynamicAtom:
    """``event.attr OP instance.attr``."""

    event_attr: str
    op: str
    node_attr: str


@dataclass(frozen=True, slots=True)
class DurationAtom:
    """``DUR OP constant``: EVENT is ``e.t1 - e.t0``; COMPOSITE is
    ``e.t1 - I.t0``, the duration of the composite event being built."""

    kind: Literal["EVENT", "COMPOSITE"]
    op: str
    const: float


@dataclass(frozen=True, slots=True)
class ComplexAtom:
    """One comparison over arbitrary expressions of event and instance attributes."""

    expr: Expr


Atom = Union[StaticAtom, DynamicAtom, DurationAtom, ComplexAtom]


@dataclass(frozen=True, slots=True)
class Clause:
    atoms: tuple[Atom, ...] = ()


@dataclass(frozen=True, slots=True)
class Predicate:
    """OR of clauses. One empty clause is TRUE; no clause at all is FALSE."""

    clauses: tuple[Clause, ...] = (Clause(),)

    @property
    def is_true(self) -> bool:
        return any(not c.atoms for c in self.clauses)


TRUE = Predicate()


# --------------------------------------------------------------------------- schema maps


@dataclass(frozen=True, slots=True)
class Rename:
    """``OldNewAttrPair``: copy ``source.old`` into ``new``."""

    source: Literal["EV", "NODE"]
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class Computed:
    """``UDF``: evaluate ``expr`` into ``attr``."""

    expr: Expr
    attr: str


MapEntry = Union[Rename, Computed]


@dataclass(frozen=True, slots=True)
class Edge:
    """A forward or rebind edge. ``resets_start`` is AIR's ``Type="DEL"``: the
    new instance's t0 becomes the event's t1 instead of the old instance's t0."""

    destination: str
    predicate: Predicate = TRUE
    schema_map: tuple[MapEntry, ...] = ()
    has_map: bool = True
    resets_start: bool = False


@dataclass(frozen=True, slots=True)
class OutputStream:
    name: str
    type: Literal["OUT", "RESUB"] = "OUT"


@dataclass(frozen=True, slots=True)
class IndexHint:
    """An index hint from AIR (FilterPredIndex, FRPredIndex, DynFilterPredIndex).
    Kept for round-trips; it never changes results."""

    kind: str
    index_type: str
    entries: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class State:
    id: str
    is_start: bool
    input_stream: str | None
    schema: tuple[Attribute, ...] = ()
    filter: Predicate | None = None
    rebind: Edge | None = None
    forwards: tuple[Edge, ...] = ()
    outputs: tuple[OutputStream, ...] = ()
    index_hints: tuple[IndexHint, ...] = ()
    line: int | None = field(default=None, compare=False)

    @property
    def is_end(self) -> bool:
        return self.input_stream is None

    def schema_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.schema)


@dataclass(frozen=True, slots=True)
class Automaton:
    states: tuple[State, ...]
    name: str = ""

    def state(self, state_id: str) -> State:
        for s in self.states:
            if s.id == state_id:
                return s
        raise KeyError(state_id)

    @property
    def start_states(self) -> tuple[State, ...]:
        return tuple(s for s in self.states if s.is_start)

    @property
    def input_streams(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for s in self.states:
            if s.input_stream:
                seen.setdefault(s.input_stream)
        return tuple(seen)

    @property
    def outputs(self) -> tuple[tuple[State, OutputStream], ...]:
        return tuple((s, o) for s in self.states for o in s.outputs)

    def output_schema(self, stream: str) -> StreamSchema:
        for s, o in self.outputs:
            if o.name == stream:
                return StreamSchema(stream, s.schema)
        raise KeyError(stream)
