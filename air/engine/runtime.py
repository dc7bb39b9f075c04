"""The epoch-based Cayuga query engine (docs/design/semantics.md#automata). No I/O happens here.

Events are fed in order of detection time ``t1``. All events with the same ``t1`` form an
epoch: instances created during an epoch wait on per-state *pending* lists and instances
affected during it are deleted only when the epoch closes, so simultaneous events all see the
same instances and the result does not depend on their order. Witnesses are emitted at once; a
witness on a stream that some automaton reads is processed in the same epoch (resubscription).

The engine is single-threaded by design: exactly one thread may call
:meth:`Engine.feed`, :meth:`Engine.add` and :meth:`Engine.remove`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import Callable, Iterable, NamedTuple

from air.engine import eviction, introspect, state as engine_state
from air.engine.codegen import BindError
from air.engine.errors import EngineError, LateEvent
from air.engine.functions import FunctionRegistry
from air.engine.instance import *  # noqa: F403,F405 - the slot names; C constants when compiled (instance.pxd)
from air.engine.introspect import LiveInstance, StreamView
from air.engine.loader import Holding, LoadError, Loader, Options
from air.engine.network import COMPILED, Node, SortedBucket, affectable, new_instance, seq_of, untrack_instances
from air.engine.stats import EngineStats
from air.model import Automaton, StreamSchema

try:
    import cython
except ImportError:  # plain Python without Cython installed: the class decorators below do nothing
    from air.engine import _plain as cython


@cython.no_gc
@cython.freelist(4096)
@cython.cclass
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


class Emission(NamedTuple):
    """A witness produced by an automaton reaching a state with an output stream.

    (A named tuple: one is made per witness, and a frozen dataclass took four
    ``object.__setattr__`` calls to build; the engine makes it with ``tuple.__new__``
    directly, skipping the named tuple's Python-level ``__new__``: 0.16 µs a witness
    instead of 0.34; compiled, allocated and filled: 90 ns less again, runtime.pxd.)"""

    stream: str
    event: Event
    kind: str  # "OUT" or "RESUB"
    owner: str


_make_emission = tuple.__new__


#: A runaway resubscription loop within one epoch stops after this many events.
MAX_EVENTS_PER_EPOCH = 1_000_000


def _sort_nodes(nodes: list) -> None:
    """Sort candidate nodes by ``seq`` (the order results must not depend on).
    The compiled build sorts the few it usually gets by insertion, reading
    ``seq`` as a C field (``list.sort`` with a key called the field's Python
    getter once per node and allocated a key array per event)."""
    n = len(nodes)
    if not COMPILED or n > 32:
        nodes.sort(key=seq_of)
        return
    for i in range(1, n):
        node = nodes[i]
        s = node.seq
        j = i - 1
        while j >= 0:
            other = nodes[j]
            if other.seq <= s:
                break
            nodes[j + 1] = other
            j -= 1
        nodes[j + 1] = node


def _sort_edges(edges: list) -> None:
    """:func:`_sort_nodes` for start edges (a second body, not a shared one: the
    compiled build reads ``seq`` at a fixed offset of each class's own struct,
    and ``Node`` and ``NEdge`` share no base class)."""
    n = len(edges)
    if not COMPILED or n > 32:
        edges.sort(key=seq_of)
        return
    for i in range(1, n):
        edge = edges[i]
        s = edge.seq
        j = i - 1
        while j >= 0:
            other = edges[j]
            if other.seq <= s:
                break
            edges[j + 1] = other
            j -= 1
        edges[j + 1] = edge



class Engine:
    """Runs many automata at once over time-ordered events.

    ``merge`` shares manifestly equivalent states between automata; ``index``
    switches all indexes, and ``an_index`` (static filter atoms -> active
    nodes), ``instance_index`` (AN + per-node AI index on a dynamic equality
    filter atom; off also turns ``an_index`` off unless it is given) and
    ``fr_index`` (static parts of forward edges) each one on its own, and
    ``sorted_index`` (within AI buckets, instances sorted by the instance side
    of an inequality filter atom such as ``e.Price >= 1.05 * I.Price``, so that
    only the instances it holds for are visited; on with ``instance_index``
    unless given). None of
    them changes results, only speed (docs/design/workloads.md#index-ablation)."""

    def __init__(self, functions: FunctionRegistry | None = None,
                 on_emit: Callable[[Emission], None] | None = None, *, merge: bool = True, index: bool = True,
                 an_index: bool | None = None, instance_index: bool | None = None,
                 fr_index: bool | None = None, sorted_index: bool | None = None) -> None:
        self.functions = functions or FunctionRegistry.default()
        self.on_emit = on_emit
        self._stats = EngineStats()
        self._events_n = self._epochs_n = self._witnesses_n = 0
        inst = index if instance_index is None else instance_index
        self.options = Options(merge=merge, an_index=inst if an_index is None else an_index,
                               instance_index=inst, fr_index=index if fr_index is None else fr_index,
                               sorted_index=inst if sorted_index is None else sorted_index)
        self._net = Loader(self.options, self.functions)
        self._declared: dict[str, StreamSchema] = {"DUAL": StreamSchema("DUAL", ())}
        self._published: dict[str, tuple[StreamSchema, set[str]]] = {}  # stream -> (schema, owners)
        self._loaded: dict[str, Holding] = {}
        self._readers: dict[str, int] = {}  # stream -> number of states reading it
        self._gen = 0
        self._epoch = None
        self._closed = False
        # every installed instance ends at or before this time (the last epoch closed); an event
        # starting later overlaps none of them, so the inner loop skips the per-instance check
        self._installed_t1 = None
        self._epoch_events = 0
        self._dirty: list[Node] = []
        self._resub: deque[Event] = deque()
        self._cids = itertools.count()  # install order of instances in sorted indexes

    @property
    def stats(self) -> EngineStats:
        """The running totals. The event loop counts its events, epochs and witnesses in
        fields of its own (compiled: C integers; an attribute of a Python object read and set
        three times an event cost 12% of the loop: BENCHMARKS.md, round 30) and they are
        added to the totals here, whenever they are read: read the totals through this, not
        by keeping the object they are in."""
        st = self._stats
        if self._events_n or self._epochs_n or self._witnesses_n:
            st.events += self._events_n
            st.epochs += self._epochs_n
            st.witnesses += self._witnesses_n
            self._events_n = self._epochs_n = self._witnesses_n = 0
        return st

    @stats.setter
    def stats(self, value: EngineStats) -> None:
        self._stats = value
        self._events_n = self._epochs_n = self._witnesses_n = 0

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
        """A snapshot of every stream: declared and published (costs the
        number of streams; see :attr:`stream_view` for lookups)."""
        out = {k: v[0] for k, v in self._published.items()}
        out.update(self._declared)
        return out

    @property
    def stream_view(self) -> Mapping[str, StreamSchema]:
        """A live read-only mapping of every stream: a lookup costs one dict
        probe however many subscriptions publish streams (compiling a query
        against a snapshot of 100K published streams cost 1 ms a query)."""
        return StreamView(self)

    @property
    def owners(self) -> list[str]:
        return list(self._loaded)

    def has_owner(self, owner: str) -> bool:
        return owner in self._loaded

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
        return self._commit(owner, stage, bound, new_pub)

    def add_prepared(self, owner: str, items: list, published: dict[str, StreamSchema]) -> list[str] | None:
        """:meth:`add` of automata given by the templates staging already
        holds: ``items`` has one ``(template, constants, outputs)`` per
        automaton (:meth:`template_of`; outputs: state number -> [(name,
        type)]), ``published`` their output streams in :meth:`add`'s order.
        Returns None, changing nothing, where :meth:`add` of the automata
        themselves is needed (a template no longer holds, a constant does not
        convert, a published stream clashes: it gives the error)."""
        if owner in self._loaded:
            raise EngineError(f"owner {owner!r} already has automata loaded; remove it first")
        for name, schema in published.items():
            known = self.schema(name)
            if known is not None and known.attributes != schema.attributes:
                return None
        got = self._net.stage_prepared(items, owner, lambda s: self.schema(s) or published.get(s))
        if got is None:
            return None
        return self._commit(owner, got[0], got[1], published)

    def template_of(self, auto: Automaton) -> tuple:
        """(template, constants) staging ``auto`` would use now (template None: none held)."""
        return self._net.template_of(auto)

    def static_sites(self, auto: Automaton) -> list:
        """The StaticAtoms of ``auto`` whose constants :meth:`template_of` returns, in order."""
        return self._net.static_sites(auto)

    def _commit(self, owner: str, stage, bound: list, new_pub: dict[str, StreamSchema]) -> list[str]:
        self._gen += 1
        holding = Holding(owner, self._gen, ())  # the automata are the caller's: not kept
        self._net.commit(holding, stage, bound)
        self._loaded[owner] = holding
        for stream in holding.readers:
            self._readers[stream] = self._readers.get(stream, 0) + 1
        for name, schema in new_pub.items():
            self._published.setdefault(name, (schema, set()))[1].add(owner)
        holding.published = list(new_pub)
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
        for name in holding.published:  # only its own: removal costs its size, not the network's
            owners = self._published[name][1]
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
        if event is None:  # (compiled, the argument is typed: its fields would be read from nothing)
            raise TypeError("Engine.feed takes an Event, not None")
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
        if self._dirty:
            self._installed_t1 = self._epoch
        for node in self._dirty:
            node.dirty = False
            pending = node.pending
            if pending and COMPILED:
                untrack_instances(pending)
            if node.ai_ev < 0:
                ndead = node.ndead
                if ndead:
                    if ndead == node.count:  # every installed instance was affected
                        node.ndead = 0
                        # swap and clear rather than allocate: fresh lists per node and epoch
                        # would pile up in the cyclic GC's young generation (see BENCHMARKS.md)
                        gone = node.instances
                        if pending:
                            node.instances = pending
                            node.count = len(pending)
                            node.pending = gone
                        else:
                            node.count = 0
                        gone.clear()
                        if not pending:
                            if node.active:
                                node.plan.set_active(node, False)
                        continue
                    node.instances = [i for i in node.instances if not i[DEAD]]
                    node.count -= ndead
                    node.ndead = 0
                if pending:
                    node.instances.extend(pending)
                    node.count += len(pending)
                    pending.clear()
            elif node.iq is not None:
                self._close_sorted(node)
            else:
                if node.ndead:
                    buckets = node.buckets
                    keys = node.dead_keys or ()
                    if len(keys) > 1:
                        keys = dict.fromkeys(keys)  # one pass per bucket
                    for key in keys:
                        b = buckets.get(key)
                        if b is None:
                            continue
                        if len(b) == 1 and b[0][DEAD]:
                            del buckets[key]
                        else:
                            kept = [i for i in b if not i[DEAD]]
                            if kept:
                                buckets[key] = kept
                            else:
                                del buckets[key]
                    node.dead_keys = None
                    node.count -= node.ndead
                    node.ndead = 0
                if pending:
                    buckets = node.buckets
                    k = node.ai_node
                    for inst in pending:
                        key = inst[VALUES][k]
                        b = buckets.get(key)
                        if b is None:
                            buckets[key] = [inst]
                        else:
                            b.append(inst)
                    node.count += len(pending)
                    pending.clear()
            if (node.count > 0) is not node.active and not node.is_start:
                node.plan.set_active(node, node.count > 0)
        self._dirty = []
        if self._epoch is not None:
            self._epochs_n += 1

    def _close_sorted(self, node: Node) -> None:
        """End of epoch for a node with a sorted index (see SortedBucket)."""
        buckets = node.buckets
        k = node.ai_node
        if node.ndead:
            for inst in node.dead_keys:
                key = inst[VALUES][k]
                b = buckets[key]
                b.remove(inst)
                if not b.keys and not b.rest:
                    del buckets[key]
            node.dead_keys = None
            node.count -= node.ndead
            node.ndead = 0
        pending = node.pending
        if pending:
            keyf = node.iq[2]
            cids = self._cids
            for inst in pending:
                key = inst[VALUES][k]
                b = buckets.get(key)
                if b is None:
                    b = buckets[key] = SortedBucket()
                cid = next(cids)
                try:
                    v = keyf(inst[VALUES])
                    t = type(v)
                    ok = (t is float and v == v) or t is int
                except Exception:  # noqa: BLE001 - the filter will raise again for each event
                    ok = False
                # the instance's SORT_KEY and SORT_CID slots
                if ok:
                    inst.append(v)
                    inst.append(cid)
                    b.add(v, cid, inst)
                else:
                    inst.append(None)
                    inst.append(cid)
                    b.rest.append((cid, inst))
            node.count += len(pending)
            pending.clear()

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
        self._events_n += 1
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
        # active nodes: the AN index, plus active nodes it cannot hold. Found first, though used
        # last: the start edges below only add pending instances, which no node sees before the
        # epoch closes, and in the compiled build the prefetch is on its way meanwhile
        nodes: list = []
        if plan.an_index.size:
            plan.an_index.probe(e, nodes)
        if plan.active_scan:
            nodes.extend(plan.active_scan)
        if len(nodes) > 1:
            _sort_nodes(nodes)
            if COMPILED:
                _prefetch(nodes)  # noqa: F821 - C only (runtime.pxd); plain Python has nothing like it
        # start edges: the global FR index of the stream, plus the edges it cannot hold
        edges = plan.start_scan_list
        if plan.start_index.size:
            found: list = []
            plan.start_index.probe(e, found)
            if found:
                if edges:
                    found.extend(edges)
                if len(found) > 1:
                    _sort_edges(found)
                edges = found
        dirty = self._dirty
        if edges:
            gen = self._gen
            for edge in edges:
                try:
                    run = edge.run
                    if run is None or run(e, (), et0, et1, et0):
                        dest = edge.dest
                        new = new_instance(edge.smap(e, ()), et1 if edge.resets else et0, et1, gen)
                        if dest.stream is not None:
                            if not dest.dirty:
                                dest.dirty = True
                                dirty.append(dest)
                            dest.pending.append(new)
                        if dest.outputs:
                            self._emit(dest, new)
                except Exception as exc:  # noqa: BLE001 - a user expression failed on this event
                    self._eval_error(edge.src.label, exc)
        if not nodes:
            return
        installed_t1 = self._installed_t1
        overlap = installed_t1 is not None and et0 <= installed_t1
        for node in nodes:
            k = node.ai_ev
            if k >= 0:
                insts = node.buckets.get(e[k])
                if not insts:
                    continue
                if node.iq is not None:
                    insts = affectable(node.iq, insts, e)
                    if not insts:
                        continue
            else:
                insts = node.instances
            filt = node.filter_run
            rebind = node.rebind
            forwards = node.forwards if node.fr is None else node.fr_candidates(e)
            for inst in insts:
                if overlap and et0 <= inst[T1]:
                    continue  # the event overlaps the instance: not affected
                n = inst[VALUES]
                nt0 = inst[T0]
                try:
                    if filt is not None and not filt(e, n, et0, et1, nt0):
                        continue
                    if not inst[DEAD]:
                        inst[DEAD] = True
                        node.ndead += 1
                        if node.iq is not None:
                            if node.dead_keys is None:
                                node.dead_keys = [inst]
                            else:
                                node.dead_keys.append(inst)
                        elif k >= 0:
                            if node.dead_keys is None:
                                node.dead_keys = [e[k]]
                            else:
                                node.dead_keys.append(e[k])  # repeats are harmless
                        if not node.dirty:
                            node.dirty = True
                            dirty.append(node)
                except Exception as exc:  # noqa: BLE001 - the filter failed: the instance is not affected
                    self._eval_error(node.label, exc)
                    continue
                born = inst[BORN]
                # A failing expression costs only its own edge (its predicate counts as false), never
                # the instance's other edges; a rebind edge that fails, like a false rebind predicate,
                # lets no forward edge fire.
                if rebind is not None:
                    try:
                        run = rebind.pred
                        if run is not None and not run(e, n, et0, et1, nt0):
                            continue
                        new = new_instance(rebind.smap(e, n), et1 if rebind.resets else nt0, et1, born)
                    except Exception as exc:  # noqa: BLE001
                        self._eval_error(node.label, exc)
                        continue
                    dest = rebind.dest
                    if dest.stream is not None:
                        if not dest.dirty:
                            dest.dirty = True
                            dirty.append(dest)
                        dest.pending.append(new)
                    if dest.outputs:
                        self._emit(dest, new)
                for edge in forwards:
                    try:
                        run = edge.run
                        if not ((run is None or run(e, n, et0, et1, nt0)) and born >= edge.min_gen):
                            continue
                        new = new_instance(edge.smap(e, n), et1 if edge.resets else nt0, et1, born)
                    except Exception as exc:  # noqa: BLE001
                        self._eval_error(node.label, exc)
                        continue
                    dest = edge.dest
                    if dest.stream is not None:
                        if not dest.dirty:
                            dest.dirty = True
                            dirty.append(dest)
                        dest.pending.append(new)
                    if dest.outputs:
                        self._emit(dest, new)

    def _emit(self, dest: Node, inst: list) -> None:
        """Witnesses of an instance that reached ``dest``, one per output stream (compiled, each
        one's emission allocated and filled, not made by a call of ``tuple.__new__``: runtime.pxd)."""
        values, t0, t1, born = inst[VALUES], inst[T0], inst[T1], inst[BORN]
        for name, kind, owner, gen in dest.outputs:
            if born < gen:
                continue  # the run began before this owner subscribed
            wit = Event(name, values, t0, t1)
            self._witnesses_n += 1
            if self.on_emit is not None:
                self.on_emit(_new_emission(Emission, name, wit, kind, owner) if COMPILED  # noqa: F821
                             else _make_emission(Emission, (name, wit, kind, owner)))
            if name in self._readers:
                self.stats.resubscribed += 1
                self._resub.append(wit)

    def _eval_error(self, where: str, exc: Exception) -> None:
        self.stats.eval_errors += 1
        self.stats.last_eval_error = f"{where}: {type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ beside the loop
    # (not on the event path: plain Python in both builds, in the modules named; they take
    # the engine as an EngineLike, air/engine/enginelike.py, and never import this module)

    def holding(self, owner: str) -> Holding:
        """What ``owner`` holds in the network (its generation, and its states as
        ``(automaton, state id, node)``); :class:`EngineError` if it has nothing loaded."""
        holding = self._loaded.get(owner)
        if holding is None:
            raise EngineError(f"no automata loaded for owner {owner!r}")
        return holding

    def holdings(self) -> dict[str, Holding]:
        """Every owner's :class:`Holding`, in the order they were added (the engine's own: read only)."""
        return self._loaded

    @property
    def network(self) -> Loader:
        """The query network: nodes, edges, stream plans and the templates staging keeps."""
        return self._net

    def evict_oldest(self, owner: str, keep: int, shared: bool = False,
                     losers: dict[str, int] | None = None) -> int:
        """Remove ``owner``'s oldest instances until it sees at most ``keep``;
        returns how many went. See :func:`air.engine.eviction.evict_oldest`."""
        return eviction.evict_oldest(self, owner, keep, shared, losers)

    def export_state(self) -> dict:
        """The processing state as plain data, for a snapshot: see :mod:`air.engine.state`."""
        return engine_state.export_state(self)

    def import_state(self, state: dict) -> dict[str, int]:
        """Load what :meth:`export_state` gave (any version) into this engine,
        whose owners were added afresh in their original order; returns counts.
        See :func:`air.engine.state.import_state`."""
        return engine_state.import_state(self, state)

    def instances(self, owner: str, pending: bool = False) -> dict[str, list[LiveInstance]]:
        """Live instances of ``owner`` by state key ``"<automaton>/<state id>"``
        (with ``pending``, those the current epoch made too): see
        :func:`air.engine.introspect.instances`."""
        return introspect.instances(self, owner, pending)

    def instance_count(self, owner: str | None = None) -> int:
        """Installed and pending instances of ``owner`` (as if nothing were
        merged), or of the whole network."""
        return introspect.instance_count(self, owner)

    def state_counts(self, owner: str) -> dict[str, int]:
        """Installed and pending instances of ``owner`` per state key
        ``"<automaton>/<state id>"``. Read-only; call it on the thread that feeds events."""
        return introspect.state_counts(self, owner)

    def plan_stats(self) -> dict[str, int]:
        """Size of the query network: see :func:`air.engine.introspect.plan_stats`."""
        return introspect.plan_stats(self)
