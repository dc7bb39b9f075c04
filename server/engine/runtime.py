"""The epoch-based Cayuga query engine (SPEC §4). No I/O happens here.

Events are fed in order of detection time ``t1``. All events with the same
``t1`` form an epoch: instances created during an epoch wait on per-state
*pending* lists and instances affected during it are deleted only when the
epoch closes, so simultaneous events all see the same instances and the
result does not depend on their order. Witnesses are emitted at once; a
witness on a stream that some automaton reads is processed in the same epoch
(resubscription).

The engine is single-threaded by design: exactly one thread may call
:meth:`Engine.feed`, :meth:`Engine.add` and :meth:`Engine.remove`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from air.model import Automaton, Edge, State, StreamSchema
from server.engine.codegen import BindError, Scope, compile_predicate, compile_schema_map
from server.engine.functions import FunctionRegistry


class EngineError(ValueError):
    """A request the engine cannot honour (unknown stream, clashing schema, ...)."""


class LateEvent(EngineError):
    """An event older than the epoch already being processed."""


class Event:
    """A tuple of attribute values on a stream, with start and detection time."""

    __slots__ = ("stream", "values", "t0", "t1")

    def __init__(self, stream: str, values: tuple, t0, t1) -> None:
        self.stream = stream
        self.values = values
        self.t0 = t0
        self.t1 = t1

    def __repr__(self) -> str:
        return f"Event({self.stream!r}, {self.values!r}, {self.t0!r}, {self.t1!r})"

    def __eq__(self, other) -> bool:
        return (isinstance(other, Event) and self.stream == other.stream and self.values == other.values
                and self.t0 == other.t0 and self.t1 == other.t1)

    def __hash__(self) -> int:
        return hash((self.stream, self.values, self.t0, self.t1))


class Instance:
    """An automaton instance: stored values in the state's schema and an interval."""

    __slots__ = ("values", "t0", "t1", "dead")

    def __init__(self, values: tuple, t0, t1) -> None:
        self.values = values
        self.t0 = t0
        self.t1 = t1
        self.dead = False


@dataclass(frozen=True, slots=True)
class Emission:
    """A witness produced by an automaton reaching a state with an output stream."""

    stream: str
    event: Event
    kind: str  # "OUT" or "RESUB"
    owner: str


class _CEdge:
    __slots__ = ("pred", "smap", "dest", "resets_start")

    def __init__(self, pred, smap, dest: "_CState", resets_start: bool) -> None:
        self.pred = pred
        self.smap = smap
        self.dest = dest
        self.resets_start = resets_start


class _CState:
    """A state bound to stream schemas, with its live and pending instances."""

    __slots__ = ("model", "owner", "key", "is_start", "stream", "filter", "rebind", "forwards",
                 "outputs", "instances", "pending", "has_dead")

    def __init__(self, model: State, owner: str, key: str) -> None:
        self.model = model
        self.owner = owner
        self.key = key
        self.is_start = model.is_start
        self.stream = model.input_stream
        self.filter = None
        self.rebind: _CEdge | None = None
        self.forwards: list[_CEdge] = []
        self.outputs: tuple[tuple[str, str], ...] = tuple((o.name, o.type) for o in model.outputs)
        self.instances: list[Instance] = []
        self.pending: list[Instance] = []
        self.has_dead = False


@dataclass
class EngineStats:
    events: int = 0
    epochs: int = 0
    witnesses: int = 0
    resubscribed: int = 0
    eval_errors: int = 0
    last_eval_error: str = ""
    late: int = 0


@dataclass
class _Loaded:
    owner: str
    automata: tuple[Automaton, ...]
    states: list[_CState] = field(default_factory=list)


#: A runaway resubscription loop within one epoch stops after this many events.
MAX_EVENTS_PER_EPOCH = 1_000_000


class Engine:
    """Runs many automata at once over time-ordered events."""

    def __init__(self, functions: FunctionRegistry | None = None,
                 on_emit: Callable[[Emission], None] | None = None) -> None:
        self.functions = functions or FunctionRegistry.default()
        self.on_emit = on_emit
        self.stats = EngineStats()
        self._declared: dict[str, StreamSchema] = {"DUAL": StreamSchema("DUAL", ())}
        self._published: dict[str, tuple[StreamSchema, set[str]]] = {}  # stream -> (schema, owners)
        self._loaded: dict[str, _Loaded] = {}
        self._start_by_stream: dict[str, list[_CState]] = {}
        self._states_by_stream: dict[str, list[_CState]] = {}
        self._epoch = None
        self._closed = False
        self._epoch_events = 0
        self._dirty: list[_CState] = []
        self._resub: deque[Event] = deque()

    # ------------------------------------------------------------------ catalogue

    def declare(self, schema: StreamSchema) -> None:
        """Declare an input stream. Re-declaring with the same schema is a no-op."""
        old = self._declared.get(schema.name) or (self._published.get(schema.name) or (None,))[0]
        if old is not None and old.attributes != schema.attributes:
            raise EngineError(f"stream {schema.name} is already declared as {old}; cannot redeclare as {schema}")
        self._declared[schema.name] = schema

    def schema(self, stream: str) -> StreamSchema | None:
        if stream in self._declared:
            return self._declared[stream]
        pub = self._published.get(stream)
        return pub[0] if pub else None

    @property
    def streams(self) -> dict[str, StreamSchema]:
        out = {k: v[0] for k, v in self._published.items()}
        out.update(self._declared)
        return out

    @property
    def owners(self) -> list[str]:
        return list(self._loaded)

    # ------------------------------------------------------------------ loading

    def add(self, automata: Automaton | Iterable[Automaton], owner: str) -> list[str]:
        """Bind and install automata under ``owner``; returns their output streams.

        Automata of one call are bound in order, so a later one may read an
        earlier one's output. Everything is checked before anything is
        installed: on error nothing changes."""
        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        if owner in self._loaded:
            raise EngineError(f"owner {owner!r} already has automata loaded; remove it first")
        new_pub: dict[str, StreamSchema] = {}
        bound: list[_CState] = []
        for ai, auto in enumerate(autos):
            for st, out in auto.outputs:
                schema = StreamSchema(out.name, st.schema)
                known = self.schema(out.name) or new_pub.get(out.name)
                if known is not None and known.attributes != schema.attributes:
                    raise EngineError(
                        f"automaton {auto.name or ai} publishes {out.name} as {schema}, but {out.name} "
                        f"is already {known}")
                new_pub[out.name] = schema
            bound.extend(self._bind(auto, owner, ai, new_pub))
        loaded = _Loaded(owner, autos, bound)
        self._loaded[owner] = loaded
        for name, schema in new_pub.items():
            self._published.setdefault(name, (schema, set()))[1].add(owner)
        for cs in bound:
            if cs.stream is None:
                continue
            index = self._start_by_stream if cs.is_start else self._states_by_stream
            index.setdefault(cs.stream, []).append(cs)
        return list(new_pub)

    def _bind(self, auto: Automaton, owner: str, ai: int, new_pub: dict[str, StreamSchema]) -> list[_CState]:
        label = auto.name or f"automaton {ai}"
        cstates = {s.id: _CState(s, owner, f"{owner}/{ai}/{s.id}") for s in auto.states}
        for s in auto.states:
            cs = cstates[s.id]
            ev_schema = None
            if s.input_stream is not None:
                ev_schema = self.schema(s.input_stream) or new_pub.get(s.input_stream)
                if ev_schema is None:
                    raise EngineError(
                        f"{label}: node {s.id} reads stream {s.input_stream!r}, which is not declared "
                        "and not published by any loaded automaton; declare it first")
            ev_attrs = ev_schema.attributes if ev_schema else ()
            node_attrs = None if s.is_start else s.schema
            try:
                if s.filter is not None and not s.is_start:
                    cs.filter = compile_predicate(
                        s.filter, Scope(ev_attrs, node_attrs, self.functions, f"{label}, node {s.id} filter"))
                if s.rebind is not None:
                    cs.rebind = self._edge(s.rebind, cstates, ev_attrs, node_attrs, label, s.id, "rebind")
                cs.forwards = [self._edge(e, cstates, ev_attrs, node_attrs, label, s.id, "forward")
                               for e in s.forwards]
            except BindError as exc:
                raise EngineError(str(exc)) from None
        return list(cstates.values())

    def _edge(self, e: Edge, cstates, ev_attrs, node_attrs, label, sid, kind) -> _CEdge:
        dest = cstates[e.destination]
        where = f"{label}, node {sid} {kind} edge to {e.destination}"
        pred = compile_predicate(e.predicate, Scope(ev_attrs, node_attrs, self.functions, where))
        smap = compile_schema_map(e.schema_map, dest.model.schema,
                                  Scope(ev_attrs, node_attrs, self.functions, where))
        return _CEdge(pred, smap, dest, e.resets_start)

    def remove(self, owner: str) -> None:
        """Remove ``owner``'s automata and exactly their instances."""
        loaded = self._loaded.pop(owner, None)
        if loaded is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        gone = set(map(id, loaded.states))
        for index in (self._start_by_stream, self._states_by_stream):
            for stream in list(index):
                index[stream] = [c for c in index[stream] if id(c) not in gone]
                if not index[stream]:
                    del index[stream]
        self._dirty = [c for c in self._dirty if id(c) not in gone]
        for name in list(self._published):
            schema, owners = self._published[name]
            owners.discard(owner)
            if not owners:
                del self._published[name]

    # ------------------------------------------------------------------ running

    @property
    def epoch(self):
        """Detection time of the epoch being processed (None before the first event)."""
        return self._epoch

    def feed(self, event: Event) -> None:
        """Process one event. Events must come in non-decreasing ``t1``; an event
        with a larger ``t1`` than the current epoch closes that epoch first."""
        t1 = event.t1
        if self._closed and t1 == self._epoch:
            self.stats.late += 1
            raise LateEvent(f"event at t1={t1} arrived after epoch {t1} was closed")
        if self._epoch is None or t1 > self._epoch:
            if self._epoch is not None and not self._closed:
                self.close_epoch()
            self._epoch = t1
            self._epoch_events = 0
            self._closed = False
        elif t1 < self._epoch:
            self.stats.late += 1
            raise LateEvent(f"event at t1={t1} arrived after epoch {self._epoch} began")
        self._process(event)
        resub = self._resub
        while resub:
            self._process(resub.popleft())

    def close_epoch(self) -> None:
        """Install pending instances and delete affected ones (end of epoch).
        Called by :meth:`feed` when time moves on; after an explicit call no
        further event of the same epoch is accepted."""
        if self._closed:
            return
        self._closed = self._epoch is not None
        for cs in self._dirty:
            if cs.has_dead:
                cs.instances = [i for i in cs.instances if not i.dead]
                cs.has_dead = False
            if cs.pending:
                cs.instances.extend(cs.pending)
                cs.pending = []
        self._dirty = []
        if self._epoch is not None:
            self.stats.epochs += 1

    def flush(self) -> None:
        """End of input: close the current epoch."""
        self.close_epoch()
        self._epoch_events = 0

    def run(self, events: Iterable[Event]) -> list[Emission]:
        """Feed ``events`` (in t1 order), flush, and return every emission."""
        out: list[Emission] = []
        prev = self.on_emit
        self.on_emit = out.append if prev is None else (lambda em: (out.append(em), prev(em)))
        try:
            for ev in events:
                self.feed(ev)
            self.flush()
        finally:
            self.on_emit = prev
        return out

    def _process(self, ev: Event) -> None:
        self.stats.events += 1
        self._epoch_events += 1
        if self._epoch_events > MAX_EVENTS_PER_EPOCH:
            raise EngineError(
                f"more than {MAX_EVENTS_PER_EPOCH} events in epoch {self._epoch}: "
                "an automaton is resubscribing to its own output without end")
        stream = ev.stream
        e = ev.values
        et0 = ev.t0
        et1 = ev.t1
        for cs in self._start_by_stream.get(stream, ()):
            for edge in cs.forwards:
                try:
                    if edge.pred is None or edge.pred(e, (), et0, et1, et0):
                        self._create(edge, e, (), et1 if edge.resets_start else et0, et1)
                except Exception as exc:  # noqa: BLE001 - a user expression failed on this event
                    self._eval_error(cs, exc)
        for cs in self._states_by_stream.get(stream, ()):
            insts = cs.instances
            if not insts:
                continue
            filt = cs.filter
            rebind = cs.rebind
            forwards = cs.forwards
            for inst in insts:
                if et0 <= inst.t1:
                    continue  # the event overlaps the instance: not affected
                n = inst.values
                try:
                    if filt is not None and not filt(e, n, et0, et1, inst.t0):
                        continue
                    if not inst.dead:
                        inst.dead = True
                        if not cs.has_dead:
                            cs.has_dead = True
                            self._dirty.append(cs)
                    if rebind is not None:
                        if rebind.pred is not None and not rebind.pred(e, n, et0, et1, inst.t0):
                            continue
                        self._create(rebind, e, n, et1 if rebind.resets_start else inst.t0, et1)
                    for edge in forwards:
                        if edge.pred is None or edge.pred(e, n, et0, et1, inst.t0):
                            self._create(edge, e, n, et1 if edge.resets_start else inst.t0, et1)
                except Exception as exc:  # noqa: BLE001
                    self._eval_error(cs, exc)

    def _create(self, edge: _CEdge, e: tuple, n: tuple, t0, t1) -> None:
        values = edge.smap(e, n)
        dest = edge.dest
        if dest.stream is not None:
            if not dest.pending:
                self._dirty.append(dest)
            dest.pending.append(Instance(values, t0, t1))
        if dest.outputs:
            for name, kind in dest.outputs:
                wit = Event(name, values, t0, t1)
                self.stats.witnesses += 1
                if self.on_emit is not None:
                    self.on_emit(Emission(name, wit, kind, dest.owner))
                if name in self._start_by_stream or name in self._states_by_stream:
                    self.stats.resubscribed += 1
                    self._resub.append(wit)

    def _eval_error(self, cs: _CState, exc: Exception) -> None:
        self.stats.eval_errors += 1
        self.stats.last_eval_error = f"{cs.key}: {type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ inspection

    def instances(self, owner: str) -> dict[str, list[tuple[tuple, object, object]]]:
        """Live (installed) instances of ``owner`` by state key ``"<automaton>/<state id>"``."""
        loaded = self._loaded.get(owner)
        if loaded is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        out: dict[str, list] = {}
        for cs in loaded.states:
            if cs.stream is None or cs.is_start:
                continue
            key = cs.key.split("/", 1)[1]
            out[key] = [(i.values, i.t0, i.t1) for i in cs.instances]
        return out

    def instance_count(self, owner: str | None = None) -> int:
        owners = [self._loaded[owner]] if owner is not None else list(self._loaded.values())
        return sum(len(cs.instances) + len(cs.pending) for lo in owners for cs in lo.states)
