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
from dataclasses import dataclass
from typing import Callable, Iterable

from air.model import Automaton, StreamSchema
from server.engine.codegen import BindError
from server.engine.functions import FunctionRegistry
from server.engine.loader import Holding, LoadError, Loader, Options
from server.engine.network import Instance, Node, seq_of


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


@dataclass(frozen=True, slots=True)
class Emission:
    """A witness produced by an automaton reaching a state with an output stream."""

    stream: str
    event: Event
    kind: str  # "OUT" or "RESUB"
    owner: str


@dataclass
class EngineStats:
    events: int = 0
    epochs: int = 0
    witnesses: int = 0
    resubscribed: int = 0
    eval_errors: int = 0
    last_eval_error: str = ""
    late: int = 0



#: A runaway resubscription loop within one epoch stops after this many events.
MAX_EVENTS_PER_EPOCH = 1_000_000


class Engine:
    """Runs many automata at once over time-ordered events.

    ``merge`` shares manifestly equivalent states between automata; ``index``
    switches all indexes, and ``an_index`` (static filter atoms -> active
    nodes), ``instance_index`` (AN + per-node AI index on a dynamic equality
    filter atom; off also turns ``an_index`` off unless it is given) and
    ``fr_index`` (static parts of forward edges) each one on its own. None of
    them changes results, only speed (002 §4.1, Fig. 7)."""

    def __init__(self, functions: FunctionRegistry | None = None,
                 on_emit: Callable[[Emission], None] | None = None, *, merge: bool = True, index: bool = True,
                 an_index: bool | None = None, instance_index: bool | None = None,
                 fr_index: bool | None = None) -> None:
        self.functions = functions or FunctionRegistry.default()
        self.on_emit = on_emit
        self.stats = EngineStats()
        inst = index if instance_index is None else instance_index
        self.options = Options(merge=merge, an_index=inst if an_index is None else an_index,
                               instance_index=inst, fr_index=index if fr_index is None else fr_index)
        self._net = Loader(self.options, self.functions)
        self._declared: dict[str, StreamSchema] = {"DUAL": StreamSchema("DUAL", ())}
        self._published: dict[str, tuple[StreamSchema, set[str]]] = {}  # stream -> (schema, owners)
        self._loaded: dict[str, Holding] = {}
        self._readers: dict[str, int] = {}  # stream -> number of states reading it
        self._gen = 0
        self._epoch = None
        self._closed = False
        self._epoch_events = 0
        self._dirty: list[Node] = []
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
        installed: on error nothing changes. The new automata start empty,
        even where their states are merged with older ones."""
        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        if owner in self._loaded:
            raise EngineError(f"owner {owner!r} already has automata loaded; remove it first")
        new_pub: dict[str, StreamSchema] = {}
        for ai, auto in enumerate(autos):
            for st, out in auto.outputs:
                schema = StreamSchema(out.name, st.schema)
                known = self.schema(out.name) or new_pub.get(out.name)
                if known is not None and known.attributes != schema.attributes:
                    raise EngineError(
                        f"automaton {auto.name or ai} publishes {out.name} as {schema}, but {out.name} "
                        f"is already {known}")
                new_pub[out.name] = schema
        try:
            stage, bound = self._net.stage(autos, owner, lambda s: self.schema(s) or new_pub.get(s))
        except (LoadError, BindError) as exc:
            raise EngineError(str(exc)) from None
        self._gen += 1
        holding = Holding(owner, self._gen, autos)
        self._net.commit(holding, stage, bound)
        self._loaded[owner] = holding
        for stream in holding.readers:
            self._readers[stream] = self._readers.get(stream, 0) + 1
        for name, schema in new_pub.items():
            self._published.setdefault(name, (schema, set()))[1].add(owner)
        return list(new_pub)

    def remove(self, owner: str) -> None:
        """Remove ``owner``'s automata and exactly their instances; merged
        nodes other owners still use keep the instances those owners see."""
        holding = self._loaded.pop(owner, None)
        if holding is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        gone = self._net.release(holding)
        if gone:
            self._dirty = [n for n in self._dirty if n.alive]
        for stream in holding.readers:
            left = self._readers[stream] - 1
            if left:
                self._readers[stream] = left
            else:
                del self._readers[stream]
        for name in list(self._published):
            schema, owners = self._published[name]
            owners.discard(owner)
            if not owners:
                del self._published[name]

    def plan_stats(self) -> dict[str, int]:
        """Size of the query network: nodes and edges after merging, the
        states and edges the loaded automata have, and active nodes."""
        states = sum(len(h.states) for h in self._loaded.values())
        edges = sum(len(h.edges) for h in self._loaded.values())
        active = sum(p.an_index.size + len(p.active_scan) for p in self._net.plans.values())
        return {"nodes": self._net.nodes, "edges": self._net.edges, "states": states,
                "automaton_edges": edges, "active_nodes": active}

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
        for node in self._dirty:
            node.dirty = False
            ai = node.ai_ev >= 0
            if node.ndead:
                if ai:
                    buckets = node.buckets
                    for key in node.dead_keys or ():
                        b = buckets.get(key)
                        if b is not None:
                            kept = [i for i in b if not i.dead]
                            if kept:
                                buckets[key] = kept
                            else:
                                del buckets[key]
                    node.dead_keys = None
                else:
                    node.instances = [i for i in node.instances if not i.dead]
                node.count -= node.ndead
                node.ndead = 0
            pending = node.pending
            if pending:
                if ai:
                    buckets = node.buckets
                    k = node.ai_node
                    for inst in pending:
                        key = inst.values[k]
                        b = buckets.get(key)
                        if b is None:
                            buckets[key] = [inst]
                        else:
                            b.append(inst)
                elif node.instances:
                    node.instances.extend(pending)
                else:
                    node.instances = pending
                node.count += len(pending)
                node.pending = []
            if (node.count > 0) is not node.active and not node.is_start:
                node.plan.set_active(node, node.count > 0)
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
        plan = self._net.plans.get(ev.stream)
        if plan is None:
            return
        e = ev.values
        et0 = ev.t0
        et1 = ev.t1
        create = self._create
        # start edges: the global FR index of the stream, plus the edges it cannot hold
        edges = plan.start_scan_list
        if plan.start_index.size:
            found: list = []
            plan.start_index.probe(e, found)
            if found:
                if edges:
                    found.extend(edges)
                if len(found) > 1:
                    found.sort(key=seq_of)
                edges = found
        if edges:
            gen = self._gen
            for edge in edges:
                try:
                    run = edge.run
                    if run is None or run(e, (), et0, et1, et0):
                        create(edge, edge.smap(e, ()), et1 if edge.resets else et0, et1, gen)
                except Exception as exc:  # noqa: BLE001 - a user expression failed on this event
                    self._eval_error(edge.src.label, exc)
        # active nodes: the AN index, plus active nodes it cannot hold
        nodes: list = []
        if plan.an_index.size:
            plan.an_index.probe(e, nodes)
        if plan.active_scan:
            nodes.extend(plan.active_scan)
        if not nodes:
            return
        if len(nodes) > 1:
            nodes.sort(key=seq_of)
        dirty = self._dirty
        for node in nodes:
            k = node.ai_ev
            if k >= 0:
                insts = node.buckets.get(e[k])
                if not insts:
                    continue
            else:
                insts = node.instances
            filt = node.filter_run
            rebind = node.rebind
            forwards = node.forwards if node.fr is None else node.fr_candidates(e)
            for inst in insts:
                if et0 <= inst.t1:
                    continue  # the event overlaps the instance: not affected
                n = inst.values
                nt0 = inst.t0
                try:
                    if filt is not None and not filt(e, n, et0, et1, nt0):
                        continue
                    if not inst.dead:
                        inst.dead = True
                        node.ndead += 1
                        if k >= 0:
                            if node.dead_keys is None:
                                node.dead_keys = {e[k]}
                            else:
                                node.dead_keys.add(e[k])
                        if not node.dirty:
                            node.dirty = True
                            dirty.append(node)
                    born = inst.born
                    if rebind is not None:
                        run = rebind.pred
                        if run is not None and not run(e, n, et0, et1, nt0):
                            continue
                        create(rebind, rebind.smap(e, n), et1 if rebind.resets else nt0, et1, born)
                    for edge in forwards:
                        run = edge.run
                        if (run is None or run(e, n, et0, et1, nt0)) and born >= edge.min_gen:
                            create(edge, edge.smap(e, n), et1 if edge.resets else nt0, et1, born)
                except Exception as exc:  # noqa: BLE001
                    self._eval_error(node.label, exc)

    def _create(self, edge, values: tuple, t0, t1, born: int) -> None:
        dest = edge.dest
        if dest.stream is not None:
            if not dest.dirty:
                dest.dirty = True
                self._dirty.append(dest)
            dest.pending.append(Instance(values, t0, t1, born))
        if dest.outputs:
            for name, kind, owner, gen in dest.outputs:
                if born < gen:
                    continue  # the run began before this owner subscribed
                wit = Event(name, values, t0, t1)
                self.stats.witnesses += 1
                if self.on_emit is not None:
                    self.on_emit(Emission(name, wit, kind, owner))
                if name in self._readers:
                    self.stats.resubscribed += 1
                    self._resub.append(wit)

    def _eval_error(self, where: str, exc: Exception) -> None:
        self.stats.eval_errors += 1
        self.stats.last_eval_error = f"{where}: {type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ inspection

    def instances(self, owner: str) -> dict[str, list[tuple[tuple, object, object]]]:
        """Live (installed) instances of ``owner`` by state key ``"<automaton>/<state id>"``."""
        holding = self._loaded.get(owner)
        if holding is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        out: dict[str, list] = {}
        for ai, sid, node in holding.states:
            if node.stream is None or node.is_start:
                continue
            out[f"{ai}/{sid}"] = [(i.values, i.t0, i.t1) for i in node.all_instances() if i.born >= holding.gen]
        return out

    def instance_count(self, owner: str | None = None) -> int:
        """Installed and pending instances of ``owner`` (as if nothing were
        merged), or of the whole network."""
        if owner is None:
            return sum(n.count + len(n.pending) for n in {id(n): n for h in self._loaded.values()
                                                          for _a, _s, n in h.states}.values())
        holding = self._loaded.get(owner)
        if holding is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        g = holding.gen
        total = 0
        for _ai, _sid, node in holding.states:
            if node.count or node.pending:
                total += sum(1 for i in node.all_instances() if i.born >= g)
                total += sum(1 for i in node.pending if i.born >= g)
        return total
