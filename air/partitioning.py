"""Partition keys and execution stages for distributed Cayuga (docs/design/semantics.md#distribution, row scaling).

Pure planning over the automaton model: no Spark, no I/O. The Spark jobs
(clients/spark/) and the server's engine workers (server/workers/placement.py:
row scaling, with :func:`key_group` and :func:`restrict_to_group` below) plan with it.

A *partition key* maps every input stream of a set of automata to one of its
attributes such that hash-partitioning the events by it cannot change the
witnesses. That holds when every automaton instance only ever depends on
events of one key value:

- a start edge fires on any event and creates an instance for *that* event's key
  value; schema-map entries copying a key attribute of the event carry the key
  into the new instance (``EV.Name -> Name_1``);
- at every non-start state, each clause of the filter predicate requires
  ``EV.k = NODE.x`` for a key attribute ``k`` of the state's input stream and an
  instance attribute ``x`` known to hold the key (a ``DynamicAtom`` with op
  ``=``, or the same comparison written as a complex atom). An event with any
  other key value fails the filter, so it leaves the instance unaffected, and it
  lives in another partition anyway;
- edges out of such a state carry the key through ``NODE.x -> y`` (``x``
  holding the key) and ``EV.k -> y`` (the filter made ``EV.k`` equal the key).

Streams published by the automata themselves (resubscription) carry the key in
the attributes that hold it at every state that outputs them; a consumer must
use one of those. When the whole set has no key, it is cut into *stages* by the
depth of resubscription (a stage's input is the base streams plus streams
materialised by earlier stages); each stage gets its own key or runs in a
single partition.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from air.expr import Call, Compare, Literal, Ref
from air.formats import LineError, convert_value
from air.model import (
    Automaton,
    Clause,
    ComplexAtom,
    Computed,
    DynamicAtom,
    Edge,
    Predicate,
    Rename,
    StaticAtom,
    StreamSchema,
)

#: Give up enumerating key candidates beyond this many combinations (then: no key).
MAX_CANDIDATES = 4096


@dataclass(frozen=True)
class PartitionKey:
    """Input stream -> the attribute whose value picks the partition of its events."""

    attributes: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return dict(self.attributes)

    def describe(self) -> str:
        return ", ".join(f"{s}.{a}" for s, a in self.attributes)


@dataclass(frozen=True)
class Owned:
    """Automata of one query (``owner``, as in ``cayuga run``: the file's stem)."""

    owner: str
    automata: tuple[Automaton, ...]


@dataclass(frozen=True)
class Stage:
    """Automata run together, one engine per partition.

    ``inputs`` are the streams the stage reads from outside (declared streams
    and streams materialised by earlier stages); ``key`` is None when the stage
    must run in a single partition; ``reason`` says why."""

    queries: tuple[Owned, ...]
    inputs: tuple[str, ...]
    key: PartitionKey | None
    reason: str = ""

    @property
    def automata(self) -> list[Automaton]:
        return [a for q in self.queries for a in q.automata]

    @property
    def outputs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for a in self.automata:
            for _, o in a.outputs:
                seen.setdefault(o.name)
        return tuple(seen)


@dataclass
class Plan:
    stages: list[Stage] = field(default_factory=list)

    def describe(self) -> str:
        lines = []
        for i, st in enumerate(self.stages, 1):
            names = ", ".join(q.owner for q in st.queries)
            how = (f"hash-partitioned by {st.key.describe()}" if st.key
                   else f"single partition ({st.reason})")
            lines.append(f"stage {i}/{len(self.stages)} [{names}] reads {', '.join(st.inputs) or '-'}: {how}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- analysis


def _eq_pairs(clause_atoms) -> list[tuple[str, str]]:
    """(event attribute, node attribute) pairs that a clause requires to be equal."""
    out = []
    for atom in clause_atoms:
        if isinstance(atom, DynamicAtom) and atom.op == "=":
            out.append((atom.event_attr, atom.node_attr))
        elif isinstance(atom, ComplexAtom) and isinstance(atom.expr, Compare) and atom.expr.op == "=":
            left, right = atom.expr.left, atom.expr.right
            if isinstance(left, Ref) and isinstance(right, Ref):
                if left.source == "NODE" and right.source == "EV":
                    left, right = right, left
                if left.source == "EV" and right.source == "NODE":
                    out.append((left.name, right.name))
    return out


def _filter_keyed(pred: Predicate | None, ev_keys: frozenset[str], node_keys: frozenset[str]) -> bool:
    """Every clause forces ``EV.k = NODE.x`` with k a key attribute, x holding the key."""
    if pred is None or not pred.clauses:
        return pred is not None  # FALSE never lets an event in; a missing filter is TRUE
    return all(any(e in ev_keys and n in node_keys for e, n in _eq_pairs(c.atoms)) for c in pred.clauses)


def _carried(edge: Edge, ev_keys: frozenset[str], node_keys: frozenset[str]) -> frozenset[str]:
    out = set()
    for m in edge.schema_map:
        if isinstance(m, Rename):
            if (m.source == "EV" and m.old in ev_keys) or (m.source == "NODE" and m.old in node_keys):
                out.add(m.new)
        elif isinstance(m, Computed) and isinstance(m.expr, Ref):
            src = m.expr.source
            if (src == "EV" and m.expr.name in ev_keys) or (src == "NODE" and m.expr.name in node_keys):
                out.add(m.attr)
    return frozenset(out)


def _analyse(auto: Automaton, stream_keys: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]] | None:
    """Key-holding attributes of each output stream, or None when ``auto`` is not keyed.

    ``stream_keys[s]`` are the attributes of stream ``s`` equal to the partition key."""
    for st in auto.states:
        if st.is_start and not stream_keys.get(st.input_stream or ""):
            return None
    # Greatest fixpoint over the reachable states: the key-holding attributes of a
    # state are the intersection of what its incoming edges carry. Each round
    # can only shrink the sets (more edges reached, smaller sources), so it ends.
    holds: dict[str, frozenset[str]] = {}
    while True:
        incoming: dict[str, frozenset[str]] = {}
        for st in auto.states:
            if not st.is_start and st.id not in holds:
                continue
            ev_keys = stream_keys.get(st.input_stream or "", frozenset())
            node_keys = frozenset() if st.is_start else holds[st.id]
            for e in list(st.forwards) + ([st.rebind] if st.rebind else []):
                c = _carried(e, ev_keys, node_keys)
                incoming[e.destination] = incoming[e.destination] & c if e.destination in incoming else c
        if incoming == holds:
            break
        holds = incoming
    reached = set(holds)
    for st in auto.states:
        if st.is_start or st.id not in reached or st.input_stream is None:
            continue
        ev_keys = stream_keys.get(st.input_stream, frozenset())
        if not _filter_keyed(st.filter, ev_keys, holds[st.id]):
            return None
    out: dict[str, frozenset[str]] = {}
    for st in auto.states:
        for o in st.outputs:
            h = holds.get(st.id, frozenset()) if st.id in reached else frozenset()
            out[o.name] = out[o.name] & h if o.name in out else h
    return out


def check_key(automata: Sequence[Automaton], key: Mapping[str, str]) -> bool:
    """Whether partitioning the input streams by ``key`` preserves the witnesses of ``automata``
    (in the given order: an automaton may read the outputs of earlier ones)."""
    stream_keys: dict[str, frozenset[str]] = {s: frozenset([a]) for s, a in key.items()}
    published: dict[str, frozenset[str]] = {}
    for auto in automata:
        res = _analyse(auto, {**stream_keys, **published})
        if res is None:
            return False
        for name, holds in res.items():
            published[name] = published[name] & holds if name in published else holds
    return True


def _reads(automata: Sequence[Automaton]) -> tuple[set[str], set[str]]:
    """(streams read, streams published) by ``automata``."""
    read = {s.input_stream for a in automata for s in a.states if s.input_stream}
    pub = {o.name for a in automata for _, o in a.outputs}
    return read, pub


def _candidates(automata: Sequence[Automaton], stream: str, schema: StreamSchema) -> list[str]:
    """Attributes of ``stream`` worth trying as its key, best first."""
    eq: dict[str, None] = {}
    for a in automata:
        for s in a.states:
            if s.input_stream == stream and not s.is_start and s.filter is not None:
                for c in s.filter.clauses:
                    for e, _ in _eq_pairs(c.atoms):
                        eq.setdefault(e)
    names = [n for n in eq if schema.has(n)]
    return names + [n for n in schema.names if n not in eq]


def infer_key(automata: Sequence[Automaton], schemas: Mapping[str, StreamSchema],
              external: Iterable[str] | None = None) -> PartitionKey | None:
    """A partition key for ``automata`` over their external input streams, or None.

    ``external`` are the streams read from outside (default: every stream read
    that none of the automata publishes)."""
    read, pub = _reads(automata)
    inputs = sorted(external) if external is not None else sorted(read - pub)
    inputs = [s for s in inputs if s in read]
    options = []
    for s in inputs:
        if s not in schemas:
            return None
        cands = _candidates(automata, s, schemas[s])
        if not cands:
            return None
        options.append(cands)
    n = 1
    for o in options:
        n *= len(o)
    if n > MAX_CANDIDATES:
        options = [o[:1] for o in options]
    for combo in itertools.product(*options):
        key = dict(zip(inputs, combo))
        if check_key(automata, key):
            return PartitionKey(tuple(key.items()))
    return None


def _depths(queries: Sequence[Owned], base: set[str]) -> list[int] | None:
    """Resubscription depth of each query's automata: 0 reads only base streams."""
    autos = [(qi, a) for qi, q in enumerate(queries) for a in q.automata]
    producers: dict[str, list[int]] = {}
    for i, (_, a) in enumerate(autos):
        for _, o in a.outputs:
            producers.setdefault(o.name, []).append(i)
    depth: dict[int, int] = {}
    visiting: set[int] = set()

    def visit(i: int) -> int | None:
        if i in depth:
            return depth[i]
        if i in visiting:
            return None  # a cycle through resubscription
        visiting.add(i)
        d = 0
        for s in autos[i][1].input_streams:
            for p in producers.get(s, []) if s not in base else []:
                pd = visit(p)
                if pd is None:
                    return None
                d = max(d, pd + 1)
        visiting.discard(i)
        depth[i] = d
        return d

    out = []
    for i in range(len(autos)):
        d = visit(i)
        if d is None:
            return None
        out.append(d)
    return out


def plan_stages(queries: Sequence[Owned], schemas: Mapping[str, StreamSchema]) -> Plan:
    """Stages for ``queries`` over the declared streams ``schemas``.

    One keyed stage when a key exists for everything (resubscription chains then
    run inside each partition); otherwise successive stages by resubscription
    depth, adjacent ones merged when the merged set still has a key."""
    all_autos = [a for q in queries for a in q.automata]
    base = set(schemas)
    read, pub = _reads(all_autos)
    key = infer_key(all_autos, schemas, external=read - pub)
    if key is not None or not (pub & read):
        reason = "" if key else _no_key_reason(all_autos)
        return Plan([Stage(tuple(queries), tuple(sorted((read - pub) & read)), key, reason)])
    depths = _depths(queries, base)
    if depths is None:
        return Plan([Stage(tuple(queries), tuple(sorted(read - pub)), None,
                           "the queries read each other's outputs in a cycle")])
    # Group automata by depth, keeping each query's automata in their order.
    flat = [(q.owner, a) for q in queries for a in q.automata]
    layers: list[list[tuple[str, Automaton]]] = [[] for _ in range(max(depths) + 1)]
    for (owner, a), d in zip(flat, depths):
        layers[d].append((owner, a))
    groups: list[list[tuple[str, Automaton]]] = []
    for layer in layers:
        if groups and _group_key(groups[-1] + layer, schemas) is not None:
            groups[-1] = groups[-1] + layer
        else:
            groups.append(list(layer))
    stages = []
    available = dict(schemas)
    for g in groups:
        autos = [a for _, a in g]
        g_read, g_pub = _reads(autos)
        ext = (g_read - g_pub)
        k = infer_key(autos, available, external=ext)
        owned: list[Owned] = []
        for owner, a in g:
            if owned and owned[-1].owner == owner:
                owned[-1] = Owned(owner, owned[-1].automata + (a,))
            else:
                owned.append(Owned(owner, (a,)))
        stages.append(Stage(tuple(owned), tuple(sorted(ext)), k, "" if k else _no_key_reason(autos)))
        for a in autos:
            for st, o in a.outputs:
                available.setdefault(o.name, StreamSchema(o.name, st.schema))
    return Plan(stages)


def _group_key(group, schemas: Mapping[str, StreamSchema]) -> PartitionKey | None:
    autos = [a for _, a in group]
    read, pub = _reads(autos)
    avail = dict(schemas)
    for a in autos:
        for st, o in a.outputs:
            avail.setdefault(o.name, StreamSchema(o.name, st.schema))
    return infer_key(autos, avail, external=read - pub)


def _no_key_reason(automata: Sequence[Automaton]) -> str:
    for a in automata:
        for s in a.states:
            if s.is_start or s.input_stream is None:
                continue
            if s.filter is None or not any(_eq_pairs(c.atoms) for c in s.filter.clauses):
                return (f"{a.name or 'an automaton'}: node {s.id}'s filter has no equality between "
                        "an event attribute and an attribute of the first event")
    return "no attribute is required equal to the first event's value at every state"


# --------------------------------------------------------------------------- constant routes


@dataclass(frozen=True)
class ConstantRoute:
    """Queries that only ever look at events whose ``attributes[stream]`` equals
    ``value`` (``Name = 'IBM'`` at every state): such a query needs only those
    events, so a streaming job routes by the constant (docs: SPARK.md)."""

    attributes: tuple[tuple[str, str], ...]
    value: object

    def as_dict(self) -> dict[str, str]:
        return dict(self.attributes)

    def describe(self) -> str:
        return " and ".join(f"{s}.{a} = {self.value!r}" for s, a in self.attributes)


def _eq_constants(clause_atoms) -> list[tuple[str, object]]:
    """(event attribute, constant as written) pairs a clause requires equal."""
    out = []
    for atom in clause_atoms:
        if isinstance(atom, StaticAtom) and atom.op == "=":
            out.append((atom.event_attr, atom.const))
        elif isinstance(atom, ComplexAtom) and isinstance(atom.expr, Compare) and atom.expr.op == "=":
            left, right = atom.expr.left, atom.expr.right
            if isinstance(right, Ref) and isinstance(left, Literal):
                left, right = right, left
            if isinstance(left, Ref) and left.source in ("EV", None) and isinstance(right, Literal):
                out.append((left.name, right.value))
    return out


def constant_route(automata: Sequence[Automaton], schemas: Mapping[str, StreamSchema]) -> ConstantRoute | None:
    """The one constant every state of ``automata`` requires of the events it
    reads, or None.

    It holds when, for each input stream ``s``, one attribute ``a`` and one
    value ``c`` exist such that every clause of every start edge reading ``s``
    and every clause of every non-start filter reading ``s`` requires
    ``EV.a = c``: an event with another value creates no instance and is
    ignored by every instance (it fails the filter), so it cannot change a
    witness. Streams the automata publish themselves must not be read
    (resubscription is left to keys and column groups)."""
    read, pub = _reads(automata)
    if read & pub or not read:
        return None
    # the predicates that decide whether an event of each stream matters at all
    preds: dict[str, list[Predicate | None]] = {}
    for a in automata:
        for st in a.states:
            if st.input_stream is None:
                continue
            if st.is_start:
                preds.setdefault(st.input_stream, []).extend(
                    e.predicate for e in list(st.forwards) + ([st.rebind] if st.rebind else []))
            else:
                preds.setdefault(st.input_stream, []).append(st.filter)
    attrs: dict[str, str] = {}
    value = _UNSET = object()
    for stream, plist in sorted(preds.items()):
        schema = schemas.get(stream)
        if schema is None:
            return None
        options: set[tuple[str, object]] | None = None
        for pred in plist:
            if pred is None or not pred.clauses:
                if pred is None:
                    return None  # TRUE: every event matters
                continue  # FALSE: no event matters
            for clause in pred.clauses:
                here = set()
                for attr, raw in _eq_constants(clause.atoms):
                    if not schema.has(attr):
                        continue
                    try:
                        here.add((attr, convert_value(raw, schema.type_of(attr), attr)))
                    except (LineError, ValueError, TypeError):
                        continue
                options = here if options is None else options & here
                if not options:
                    return None
        if not options:
            return None
        attr, v = min(options, key=repr)
        if value is not _UNSET and v != value:
            return None
        value = v
        attrs[stream] = attr
    if value is _UNSET:
        return None
    return ConstantRoute(tuple(sorted(attrs.items())), value)


# --------------------------------------------------------------------------- key groups (row scaling)

#: The function a worker's copy of a row-scaled automaton calls on its start edges
#: (:func:`restrict_to_group`); an engine that runs such copies registers it (:func:`key_group`).
KEY_GROUP_FUNCTION = "CAYUGA_KEY_GROUP"


def key_group(value: object, groups: int) -> int:
    """The key group (0 .. ``groups``-1) of a partition key's ``value``: a stable
    hash (CRC-32 of its text), the same in every process and every run, unlike
    Python's salted ``hash()`` of a string."""
    data = value.encode() if isinstance(value, str) else repr(value).encode()
    return zlib.crc32(data) % groups


def is_stateful(automata: Sequence[Automaton]) -> bool:
    """Whether any automaton keeps instances between events (a state that is neither a
    start nor an end one: a NEXT, a FOLD); a filter's cost per event is the same wherever it runs."""
    return any(not s.is_start and s.input_stream is not None for a in automata for s in a.states)


def restrict_to_group(automata: Sequence[Automaton], key: Mapping[str, str], groups: int,
                      group: int) -> tuple[Automaton, ...]:
    """``automata`` as one engine of a row-scaled run holds them: every edge out
    of a start state reading a keyed stream also requires
    ``CAYUGA_KEY_GROUP(EV.k, groups) = group``. Such an engine starts instances
    only for the key values of its group; with ``key`` a partition key
    (:func:`check_key`) every later state's filter requires the instance's own
    key value, so events of other groups it is handed leave its instances
    alone: it makes exactly the witnesses of its group's key values."""
    out = []
    for auto in automata:
        states = []
        for st in auto.states:
            attr = key.get(st.input_stream or "") if st.is_start else None
            if attr is not None:
                atom = ComplexAtom(Compare("=", Call(KEY_GROUP_FUNCTION, (Ref(attr, "EV"), Literal(groups))),
                                           Literal(group)))
                st = replace(st, forwards=tuple(_with_atom(e, atom) for e in st.forwards),
                             rebind=_with_atom(st.rebind, atom) if st.rebind is not None else None)
            states.append(st)
        out.append(replace(auto, states=tuple(states)))
    return tuple(out)


def _with_atom(edge: Edge, atom: ComplexAtom) -> Edge:
    clauses = tuple(Clause(c.atoms + (atom,)) for c in edge.predicate.clauses)  # FALSE stays FALSE
    return replace(edge, predicate=Predicate(clauses))
