"""Binding automata into the query network, with state merging, and undoing it.

:class:`Loader` turns the states of one :meth:`Engine.add` call into nodes and
edges. It works in two phases so that a failing automaton changes nothing:
:meth:`Loader.stage` compiles everything that is new into detached objects
(and finds what can be shared with the existing network), :meth:`Loader.commit`
then links it in. :meth:`Loader.release` undoes one owner's share.

A state is merged with an existing node when it is *manifestly* equivalent:
same input stream (and schema), same stored schema, same filter, same rebind
edge, and reached by its only incoming edge — with the same predicate, schema
map and ``Type="DEL"`` flag — from a node that was itself merged (or from the
stream's shared start node). States on cycles or with several incoming edges
are never merged, nor is anything downstream of them.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from air.expr import Literal, walk
from air.model import (
    Attribute, Automaton, Clause, ComplexAtom, Computed, DurationAtom, DynamicAtom, Edge, Predicate, Rename, State,
    StaticAtom, StreamSchema,
)
from server.engine.codegen import (
    BindError, Scope, compile_atoms, compile_predicate, compile_schema_map, convert_const, eq_key, split_clause,
    split_inequality,
)
from server.engine.network import NEdge, Node, StreamPlan


class LoadError(ValueError):
    """An automaton that cannot be bound (the engine re-raises it as EngineError)."""


@dataclass
class Options:
    merge: bool = True
    an_index: bool = True
    instance_index: bool = True
    fr_index: bool = True
    sorted_index: bool = True


@dataclass
class Holding:
    """What one owner holds in the network."""

    owner: str
    gen: int
    automata: tuple[Automaton, ...]  # empty: the engine does not keep its callers' automata
    states: list[tuple[int, str, Node]] = field(default_factory=list)  # (automaton, state id, node)
    edges: list[NEdge] = field(default_factory=list)  # one entry per automaton edge held
    readers: list[str] = field(default_factory=list)  # streams read, one entry per state
    published: list[str] = field(default_factory=list)  # output streams of its automata


class _Stage:
    def __init__(self) -> None:
        self.new_nodes: list[Node] = []
        self.new_edges: list[NEdge] = []
        self.start_nodes: dict[str, Node] = {}
        self.children: dict[tuple[int, object], NEdge] = {}
        self.outputs: list[tuple[Node, tuple[str, str]]] = []


def _rebind_sig(s: State, loader: "Loader"):
    r = s.rebind
    if r is None:
        return None
    return (loader._canon_pred(r.predicate), loader._canon_map(r.schema_map), r.resets_start, r.has_map)


class Loader:
    def __init__(self, options: Options, functions) -> None:
        self.opt = options
        self.functions = functions
        self.plans: dict[str, StreamPlan] = {}
        self.start_nodes: dict[str, Node] = {}  # the shared start node per stream (merging on)
        self.owner_gen: dict[str, int] = {}
        self.nodes = 0
        self.edges = 0
        self._seq = 0
        self._interned: dict = {}

    # ------------------------------------------------------------------ merge keys

    def _canon(self, x):
        """A value-equal object (with the same literal types) that the network
        already holds, or ``x``. Merge keys keep parts of the automata alive;
        thousands of subscriptions repeat their schemas, schema maps and atoms,
        so this keeps one copy of each. The table stops growing at
        ``CANON_MAX`` entries."""
        t = type(x)
        # plain tuples of the fields where they are strings: hashing and comparing
        # them runs in C, a dataclass's __hash__ and __eq__ in Python
        if t is StaticAtom:
            key = ("S", x.event_attr, x.op, x.const)
        elif t is Attribute:
            key = ("A", x.name, x.type)
        elif t is Rename:
            key = ("R", x.source, x.old, x.new)
        elif t is DynamicAtom:
            key = ("D", x.event_attr, x.op, x.node_attr)
        elif t is DurationAtom:
            key = (x, type(x.const))
        else:
            key = (x, _literal_types((x,)))  # 1 == 1.0, but x / 2 and x / 2.0 differ
        table = self._interned
        got = table.get(key)
        if got is None:
            if len(table) >= CANON_MAX:
                return x
            table[key] = got = x
        return got

    def _canon_tuple(self, items: tuple) -> tuple:
        """A held tuple of the same canonical items (compared by identity, so
        literal types are kept apart); ``items`` must already be canonical."""
        table = self._interned
        if len(table) >= CANON_MAX:
            return items  # ids of items that are not held could be reused
        key = ("tuple", tuple(map(id, items)))
        got = table.get(key)
        if got is None:
            table[key] = got = items
        return got

    def _canon_pred(self, p: Predicate | None) -> Predicate | None:
        if p is None:
            return None
        c = self._canon
        if sum(len(cl.atoms) for cl in p.clauses) <= 1:
            return c(p)  # TRUE and one-atom predicates repeat a lot
        return Predicate(tuple(Clause(tuple(c(a) for a in cl.atoms)) for cl in p.clauses))

    def _canon_map(self, entries: tuple) -> tuple:
        c = self._canon
        return self._canon_tuple(tuple(c(m) for m in entries))

    def _canon_schema(self, attrs: tuple) -> tuple:
        c = self._canon
        return self._canon_tuple(tuple(c(a) for a in attrs))

    # ------------------------------------------------------------------ staging

    def stage(self, autos: tuple[Automaton, ...], owner: str, schema_of) -> tuple[_Stage, list]:
        """Compile and match ``autos``; returns the stage and, per automaton,
        (state id -> node, edges held). Raises :class:`LoadError`."""
        stage = _Stage()
        bound = []
        for ai, auto in enumerate(autos):
            try:
                bound.append(self._stage_one(auto, ai, owner, schema_of, stage))
            except BindError as exc:
                raise LoadError(str(exc)) from None
        return stage, bound

    def _stage_one(self, auto: Automaton, ai: int, owner: str, schema_of, stage: _Stage):
        label = auto.name or f"automaton {ai}"
        by_id = {s.id: s for s in auto.states}
        incoming: Counter[str] = Counter()
        for s in auto.states:
            for kind, e in [("forward", f) for f in s.forwards] + ([("rebind", s.rebind)] if s.rebind else []):
                if e.destination not in by_id:
                    raise LoadError(f"{label}: node {s.id} has a {kind} edge to unknown node {e.destination!r}")
                if kind == "forward" or e.destination != s.id:
                    incoming[e.destination] += 1
        ev_schema: dict[str, StreamSchema | None] = {}
        for s in auto.states:
            if s.input_stream is None:
                ev_schema[s.id] = None
                continue
            sch = schema_of(s.input_stream)
            if sch is None:
                raise LoadError(f"{label}: node {s.id} reads stream {s.input_stream!r}, which is not declared "
                                "and not published by any loaded automaton; declare it first")
            ev_schema[s.id] = sch

        consts = _constant_attrs(auto, by_id, ev_schema) if self.opt.an_index else {}
        nodes: dict[str, Node] = {}
        reused: dict[tuple[str, int], NEdge] = {}
        new_sig: dict[tuple[str, int], object] = {}
        merge = self.opt.merge
        queue: deque[State] = deque()
        for s in auto.states:
            if not s.is_start:
                continue
            if merge and incoming[s.id] == 0:
                node = self.start_nodes.get(s.input_stream) or stage.start_nodes.get(s.input_stream)
                if node is None:
                    node = self._new_node(s, f"{owner}/{ai}/{s.id}", True, None, ev_schema[s.id], label, stage)
                    stage.start_nodes[s.input_stream] = node
                nodes[s.id] = node
            else:
                nodes[s.id] = self._new_node(s, f"{owner}/{ai}/{s.id}", False, None, ev_schema[s.id], label, stage)
            queue.append(s)
        while queue:  # merge along single-entry paths from the start nodes
            s = queue.popleft()
            parent = nodes[s.id]
            for i, e in enumerate(s.forwards):
                d = by_id[e.destination]
                if d.id in nodes:
                    continue
                if not (merge and parent.shareable and incoming[d.id] == 1 and not d.is_start
                        and (d.rebind is None or d.rebind.destination == d.id)):
                    continue
                sch = ev_schema[d.id]
                sig = (self._canon_pred(e.predicate), self._canon_map(e.schema_map), e.resets_start, d.input_stream,
                       sch.attributes if sch else None, self._canon_schema(d.schema), self._canon_pred(d.filter),
                       _rebind_sig(d, self))
                sig += _literal_types(sig)
                hit = (parent.children or _NONE).get(sig) or stage.children.get((id(parent), sig))
                if hit is not None:
                    nodes[d.id] = hit.dest
                    reused[(s.id, i)] = hit
                else:
                    nodes[d.id] = self._new_node(d, f"{owner}/{ai}/{d.id}", True, sig, sch, label, stage,
                                                 consts.get(d.id))
                    new_sig[(s.id, i)] = sig
                queue.append(d)
        for s in auto.states:  # everything else is this automaton's own
            if s.id not in nodes:
                nodes[s.id] = self._new_node(s, f"{owner}/{ai}/{s.id}", False, None, ev_schema[s.id], label, stage,
                                             consts.get(s.id))

        held: list[NEdge] = []
        for s in auto.states:
            src = nodes[s.id]
            for i, e in enumerate(s.forwards):
                edge = reused.get((s.id, i))
                if edge is None:
                    sig = new_sig.get((s.id, i))
                    edge = self._edge(e, src, nodes[e.destination], s, ev_schema[s.id], label, "forward", sig)
                    stage.new_edges.append(edge)
                    if sig is not None:
                        stage.children[(id(src), sig)] = edge
                held.append(edge)
            if src.rebind is None and s.rebind is not None and src in stage.new_nodes:
                src.rebind = self._edge(s.rebind, src, nodes[s.rebind.destination], s, ev_schema[s.id], label,
                                        "rebind", None)
            for out in s.outputs:
                stage.outputs.append((nodes[s.id], (out.name, out.type)))
        return nodes, held

    def _new_node(self, s: State, label: str, shareable: bool, sig, sch: StreamSchema | None, where: str,
                  stage: _Stage, consts: dict | None = None) -> Node:
        node = Node(s, label, shareable)
        node.schema = self._canon_schema(s.schema)
        node.merge_key = sig
        if s.filter is not None and not s.is_start and s.input_stream is not None:
            scope = Scope(sch.attributes, s.schema, self.functions, f"{where}, node {s.id} filter")
            node.filter_full = compile_predicate(s.filter, scope)
            node.filter_run = node.filter_full
            if len(s.filter.clauses) == 1 and node.filter_full is not None:
                clause = s.filter.clauses[0]
                static_eq, dyn_eq, _rest = split_clause(clause, scope)
                if consts:  # only derived with the AN index on
                    static_eq += _derived_static(clause, consts, scope)
                node.an = eq_key(static_eq) if self.opt.an_index else None
                use_ai = bool(dyn_eq) and self.opt.instance_index
                if use_ai:
                    node.ai_ev, node.ai_node = dyn_eq[0]
                    node.buckets = {}
                used, dropped = [], False
                for a in clause.atoms:  # what the indexes do not guarantee
                    if node.an is not None and _is_static_eq(a):
                        continue
                    if use_ai and not dropped and _is_dyn_eq(a):
                        dropped = True
                        continue
                    used.append(a)
                node.filter_run = compile_atoms(used, scope)
                if use_ai and self.opt.sorted_index:
                    for a in used:  # the sorted index prunes; the filter still decides
                        node.iq = split_inequality(a, scope)
                        if node.iq is not None:
                            break
        stage.new_nodes.append(node)
        return node

    def _edge(self, e: Edge, src: Node, dest: Node, s: State, sch: StreamSchema | None, label: str,
              kind: str, sig) -> NEdge:
        where = f"{label}, node {s.id} {kind} edge to {e.destination}"
        ev_attrs = sch.attributes if sch else ()
        node_attrs = None if s.is_start else s.schema
        scope = Scope(ev_attrs, node_attrs, self.functions, where)
        smap = compile_schema_map(e.schema_map, dest.schema, scope)
        eq = rest = None
        if len(e.predicate.clauses) == 1 and not e.predicate.is_true and kind == "forward":
            static_eq, _dyn, _rest = split_clause(e.predicate.clauses[0], scope)
            eq = eq_key(static_eq)
            if eq is not None:
                rest = compile_atoms([a for a in e.predicate.clauses[0].atoms if not _is_static_eq(a)], scope)
        if eq is not None and s.is_start and self.opt.fr_index:
            pred = None  # never evaluated: the start edge lives in the stream's FR index
        else:
            pred = compile_predicate(e.predicate, scope)
        if eq is None:
            rest = pred
        return NEdge(src, dest, pred, rest, eq, smap, e.resets_start, sig)

    # ------------------------------------------------------------------ commit / release

    def commit(self, holding: Holding, stage: _Stage, bound: list) -> None:
        owner, gen = holding.owner, holding.gen
        self.owner_gen[owner] = gen
        for node in stage.new_nodes:
            self._seq += 1
            node.seq = self._seq
            node.min_gen = gen
            self.nodes += 1
            if node.stream is not None:
                plan = self.plans.get(node.stream)
                if plan is None:
                    plan = self.plans[node.stream] = StreamPlan(node.stream)
                node.plan = plan
                if not node.is_start:
                    plan.nodes += 1
        self.start_nodes.update(stage.start_nodes)
        for edge in stage.new_edges:
            self._seq += 1
            edge.seq = self._seq
            edge.min_gen = gen
            self.edges += 1
            if edge.is_start:  # lives in the stream's start index (not in src.forwards: never scanned)
                if edge.sig is not None:
                    edge.src.add_child(edge)
                edge.src.plan.add_start_edge(edge, self.opt.fr_index)
            else:
                edge.src.add_forward(edge, self.opt.fr_index)
        for ai, (nodes, held) in enumerate(bound):
            for sid, node in nodes.items():
                node.owners[owner] = node.owners.get(owner, 0) + 1
                holding.states.append((ai, sid, node))
                if node.stream is not None:
                    holding.readers.append(node.stream)
            for edge in held:
                edge.owners[owner] = edge.owners.get(owner, 0) + 1
                holding.edges.append(edge)
        for node, (name, kind) in stage.outputs:
            if not node.outputs:
                node.outputs = []
            node.outputs.append((name, kind, owner, gen))

    def release(self, holding: Holding) -> list[Node]:
        """Undo one owner's share; returns the nodes that no longer exist."""
        owner = holding.owner
        gens = self.owner_gen
        for edge in holding.edges:
            left = edge.owners[owner] - 1
            if left:
                edge.owners[owner] = left
                continue
            del edge.owners[owner]
            if edge.owners:
                edge.min_gen = gens[next(iter(edge.owners))]  # owners are held in the order they came
                continue
            self.edges -= 1
            src = edge.src
            if edge.is_start:
                if edge.sig is not None and src.children.get(edge.sig) is edge:
                    del src.children[edge.sig]
                src.plan.remove_start_edge(edge)
            else:
                src.remove_forward(edge, self.opt.fr_index)
        gone: list[Node] = []
        seen: set[int] = set()
        for _ai, _sid, node in holding.states:
            left = node.owners[owner] - 1
            if left:
                node.owners[owner] = left
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            del node.owners[owner]
            node.outputs = [o for o in node.outputs if o[2] != owner] or ()
            if node.owners:
                # owners are held in the order they came, so the first is the oldest: O(1), where
                # min() over the shared start node's owners cost the whole network per removal
                oldest = gens[next(iter(node.owners))]
                if oldest != node.min_gen:
                    node.min_gen = oldest
                    node.purge_older_than(oldest)  # what only the removed owner could see
                if node.plan is not None and not node.is_start and node.active and node.count == 0:
                    node.plan.set_active(node, False)
                continue
            gone.append(node)
            self.nodes -= 1
            node.alive = False
            plan = node.plan
            if plan is not None:
                if node.active:
                    plan.set_active(node, False)
                if not node.is_start:
                    plan.nodes -= 1
                if plan.empty:
                    self.plans.pop(plan.name, None)
            if node.is_start and self.start_nodes.get(node.stream) is node:
                del self.start_nodes[node.stream]
            node.instances, node.pending, node.count = [], [], 0
            if node.ai_ev >= 0:
                node.buckets = {}
        del gens[owner]
        return gone


_NONE: dict = {}
#: Size limit of the table of shared merge-key parts (see Loader._canon).
CANON_MAX = 1_000_000


def _literal_types(parts) -> tuple:
    """Types of the literals in the expressions of ``parts``: model equality
    says ``1 == 1.0 == True``, but ``x / 2`` and ``x / 2.0`` differ. (Dispatch
    on the exact type: this runs for every state loaded.)"""
    out: list[str] = []
    stack = list(parts)
    pop, push = stack.pop, stack.extend
    while stack:
        x = pop()
        t = type(x)
        if t is tuple or t is list:
            push(x)
        elif t in _NO_LITERALS:
            continue
        elif t is Predicate:
            for cl in x.clauses:
                push(cl.atoms)
        elif t is ComplexAtom or t is Computed:
            out.extend(type(n.value).__name__ for n in walk(x.expr) if isinstance(n, Literal))
        elif t is Edge:
            push((x.predicate, x.schema_map))
        elif isinstance(x, (tuple, list)):  # a subclass, e.g. a named tuple
            push(x)
    return tuple(out)


_NO_LITERALS = frozenset({str, bool, type(None), int, float, StaticAtom, DynamicAtom, DurationAtom, Rename,
                          Attribute})


def _constant_attrs(auto: Automaton, by_id: dict[str, State], ev_schema: dict[str, StreamSchema | None]
                    ) -> dict[str, dict[str, tuple[str, str]]]:
    """Stored attributes that hold the same constant in every instance of a
    state: ``{state id: {attribute: (AIR constant, type)}}``.

    ``FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name ...} Stock`` copies
    ``EV.Name`` into ``Name_1`` on an edge that requires ``Name = 'IBM'``, so
    every instance of the NEXT state has ``Name_1 = 'IBM'`` and its filter atom
    ``Name = NODE.Name_1`` can go into the AN index as ``Name = 'IBM'``: the
    state is then visited only for IBM events instead of for every event (one
    subscription per symbol written in CEL would otherwise cost every event a
    visit to every subscription). Sound by induction over the ways an instance
    is made: each incoming forward edge must produce the constant (from a static
    equality atom of the edge or of its source's filter, both of which hold when
    it fires, or by copying a constant attribute of its source), and the rebind
    edge must copy it unchanged. Types must agree exactly; anything unsure
    (OR-predicates, computed values, a rebind from elsewhere) gives no constant.
    States on cycles are seen before all their predecessors and so get fewer
    constants, never wrong ones."""

    types_of: dict[int, dict[str, str]] = {}  # by id of an attribute tuple: name -> type

    def types(attrs: tuple) -> dict[str, str]:
        got = types_of.get(id(attrs))
        if got is None:
            got = types_of[id(attrs)] = {a.name: a.type for a in attrs}
        return got

    def ev_type(state: State, attr: str) -> str | None:
        sch = ev_schema.get(state.id)
        return types(sch.attributes).get(attr) if sch else None

    def attr_type(state: State, attr: str) -> str | None:
        return types(state.schema).get(attr)

    def holding(src: State, src_consts: dict, pred: Predicate) -> dict[str, tuple[str, str]]:
        """Event attributes equal to a constant whenever an edge of ``src`` fires."""
        atoms: list = []
        if not src.is_start and src.filter is not None:
            if len(src.filter.clauses) != 1:
                return {}
            atoms.extend(src.filter.clauses[0].atoms)
        if len(pred.clauses) == 1:
            atoms.extend(pred.clauses[0].atoms)
        out: dict[str, tuple[str, str]] = {}
        for a in atoms:
            t = ev_type(src, a.event_attr) if isinstance(a, (StaticAtom, DynamicAtom)) else None
            if t is None or a.op != "=":
                continue
            if isinstance(a, StaticAtom):
                out[a.event_attr] = (a.const, t)
            elif a.node_attr in src_consts and src_consts[a.node_attr][1] == t:
                out[a.event_attr] = src_consts[a.node_attr]
        return out

    def produced(src: State, src_consts: dict, edge: Edge, dest: State) -> dict[str, tuple[str, str]]:
        ev = holding(src, src_consts, edge.predicate)
        out: dict[str, tuple[str, str]] = {}
        for m in edge.schema_map:  # a later entry for the same attribute wins, as in compile_schema_map
            if isinstance(m, Rename):
                got = ev.get(m.old) if m.source == "EV" else src_consts.get(m.old)
                if got is not None and attr_type(dest, m.new) == got[1]:
                    out[m.new] = got
                    continue
            out.pop(m.new if isinstance(m, Rename) else m.attr, None)
        return out

    incoming: dict[str, list[tuple[State, Edge]]] = {s.id: [] for s in auto.states}
    for s in auto.states:
        for e in s.forwards:
            if e.destination in incoming:
                incoming[e.destination].append((s, e))
        if s.rebind is not None and s.rebind.destination != s.id and s.rebind.destination in incoming:
            incoming[s.rebind.destination].append((s, None))  # a rebind from elsewhere: give up
    result: dict[str, dict[str, tuple[str, str]]] = {}
    order = deque(s for s in auto.states if s.is_start)
    seen = {s.id for s in order}
    while order:
        s = order.popleft()
        if not s.is_start:
            got: dict | None = None
            for src, e in incoming[s.id]:
                part = {} if e is None else produced(src, result.get(src.id, {}), e, s)
                got = part if got is None else {k: v for k, v in got.items() if part.get(k) == v}
                if not got:
                    break
            got = got or {}
            if got and s.rebind is not None:  # a rebind must keep each one
                keeps = produced(s, got, s.rebind, s)
                got = {k: v for k, v in got.items() if keeps.get(k) == v}
            if got:
                result[s.id] = got
        for e in s.forwards:
            d = by_id.get(e.destination)
            if d is not None and d.id not in seen:
                seen.add(d.id)
                order.append(d)
    return result


def _derived_static(clause: Clause, consts: dict[str, tuple[str, str]], scope: Scope) -> list[tuple[int, object]]:
    """``e.a = I.b`` atoms of a filter clause whose ``b`` is a constant of the
    state (see :func:`_constant_attrs`), as ``(event attribute index, value)``
    for the AN index."""
    out = []
    for a in clause.atoms:
        if isinstance(a, DynamicAtom) and a.op == "=" and a.node_attr in consts and a.event_attr in scope.ev:
            text, t = consts[a.node_attr]
            idx, ev_t = scope.ev[a.event_attr]
            if ev_t != t:
                continue
            try:
                out.append((idx, convert_const(text, t)))
            except BindError:
                continue  # the edge with the bad constant reports it
    return out


def _is_static_eq(a) -> bool:
    return isinstance(a, StaticAtom) and a.op == "="


def _is_dyn_eq(a) -> bool:
    return isinstance(a, DynamicAtom) and a.op == "="
