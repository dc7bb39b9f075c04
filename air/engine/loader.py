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

Staging goes through a :class:`_Template` per automaton *shape* (the automaton
without the constants of its StaticAtoms and its names, with which of those
constants are equal): per-symbol subscriptions — thousands of automata that
differ only in a symbol — are checked, analysed and compiled once, and each
then costs converting its constants and making its nodes, edges and functions
(0.35 ms -> about 0.08 ms for an 11-state automaton). A merge key is
``(shape token, constants)``: equal exactly when the parts it stands for are
equal, literal types included (the keys are air/engine/shapekeys.py's; which
stored attributes hold constants, for the AN index, air/engine/constant_attrs.py's).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from operator import itemgetter

from air.model import Automaton, DynamicAtom, Edge, State, StaticAtom, StreamSchema
from air.engine.codegen import (
    BindError, FnTemplate, Scope, compile_atoms, compile_predicate, compile_schema_map, convert_const, eq_key,
    split_clause, split_inequality,
)
from air.engine.constant_attrs import constant_attrs, derived_sites
from air.engine.network import NEdge, Node, StreamPlan
from air.engine.shapekeys import automaton_key, map_key, pred_key, schema_key
from air.engine.sizes import per_instance_bytes


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
        self.new_ids: set[int] = set()


class _NodeSpec:
    """What a template knows of one state's node (see :class:`_Template`)."""

    __slots__ = ("state", "schema", "full", "single", "static", "derived", "ai", "run_an", "run_plain", "iq")

    def __init__(self, state: State, schema: tuple) -> None:
        self.state = state
        self.schema = schema
        self.full: FnTemplate | None = None  # the filter, when the node evaluates one
        self.single = False  # a one-clause filter: indexed
        self.static: list[tuple[int, int]] = []  # e.a = c atoms: (event attribute index, converted constant)
        self.derived: list[tuple[int, int]] = []  # e.a = I.b with b constant: (index, derived constant)
        self.ai = None  # (event attribute, instance attribute) of the AI index
        self.run_an = self.run_plain = None  # what the filter leaves to check with and without an AN key
        self.iq = None


class _EdgeSpec:
    __slots__ = ("pred", "rest", "static", "smap", "resets", "is_start")

    def __init__(self, resets: bool, is_start: bool) -> None:
        self.pred: FnTemplate | None = None
        self.rest: FnTemplate | None = None  # without the static equality atoms (indexed)
        self.static: list[tuple[int, int]] | None = None  # as in _NodeSpec
        self.smap = None  # no StaticAtoms in schema maps: one function for every automaton of the shape
        self.resets = resets
        self.is_start = is_start


class _Template:
    """Staging of one automaton *shape*: everything of an automaton but the
    constants of its StaticAtoms and its names, with which of those constants
    are equal (that decides which attributes hold constants), and the loader's
    options. Checks, constant attributes, which states merge, the merge keys'
    shapes and the generated code are worked out once per shape; staging
    another automaton of the shape (:meth:`Loader._bind`) converts its
    constants and makes nodes, edges and functions from them. A template
    holds while the streams it reads keep their schemas and the functions its
    code calls stay registered (checked on every use)."""

    __slots__ = ("streams", "calls", "convs", "dconvs", "starts", "steps", "own", "edges")

    def __init__(self) -> None:
        self.streams: tuple = ()  # (stream, attributes) read
        self.calls: tuple = ()  # (name, Function) called
        self.convs: list[tuple[int, str]] = []  # (constant, type) converted for every bind: BindError
        self.dconvs: list[tuple[int, str]] = []  # ... for derived AN keys: skipped when they fail
        self.starts: list[tuple] = []  # (state id, stream, merged into the stream's start node, spec)
        self.steps: list[tuple] = []  # (source id, edge number, state id, merge token, getter, spec)
        self.own: list[tuple[str, _NodeSpec]] = []  # states never merged
        self.edges: list[tuple] = []  # (state id, [(number, spec, destination)], rebind, outputs' state)


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
        self._interned: dict = {}  # canonical schemas
        self._tokens: dict = {}  # merge-key shape -> token
        self._templates: dict[tuple, _Template] = {}
        #: Stage through templates kept per shape (off: a template per automaton, the reference).
        self.cache_templates = True

    @property
    def template_count(self) -> int:
        """How many templates staging keeps (one per shape of automaton, up to TEMPLATES_MAX)."""
        return len(self._templates)

    # ------------------------------------------------------------------ shapes

    def _canon_schema(self, attrs: tuple) -> tuple:
        """A held tuple value-equal to ``attrs`` (thousands of subscriptions
        repeat their schemas: one copy each). The table stops growing at
        ``CANON_MAX`` entries."""
        table = self._interned
        key = tuple([(a.name, a.type) for a in attrs])
        got = table.get(key)
        if got is None:
            if len(table) >= CANON_MAX:
                return attrs
            table[key] = got = attrs
        return got

    def _token(self, key) -> object:
        """A small stand-in for a merge-key shape: equal keys get the same
        token (an int), so a merge key is ``(token, constants)``, hashed and
        compared in C. Past ``CANON_MAX`` shapes the key itself stands in."""
        got = self._tokens.get(key)
        if got is None:
            if len(self._tokens) >= CANON_MAX:
                return key
            got = self._tokens[key] = len(self._tokens)
        return got

    # ------------------------------------------------------------------ staging

    def stage(self, autos: tuple[Automaton, ...], owner: str, schema_of) -> tuple[_Stage, list]:
        """Compile and match ``autos``; returns the stage and, per automaton,
        (state id -> node, edges held). Raises :class:`LoadError`."""
        stage = _Stage()
        bound = []
        opt = self.opt
        opts = (opt.merge, opt.an_index, opt.instance_index, opt.fr_index, opt.sorted_index)
        for ai, auto in enumerate(autos):
            try:
                bound.append(self._stage_one(auto, ai, owner, schema_of, stage, opts))
            except BindError as exc:
                raise LoadError(str(exc)) from None
        return stage, bound

    def _stage_one(self, auto: Automaton, ai: int, owner: str, schema_of, stage: _Stage, opts: tuple):
        """Stage one automaton through the template of its shape (made on
        first sight; see :class:`_Template`)."""
        sites: list[StaticAtom] = []
        key = automaton_key(auto, sites)
        texts = [a.const for a in sites]
        rep: dict = {}
        # which constants are equal decides which attributes hold constants (constant_attrs)
        part = tuple([rep.setdefault(t, i) for i, t in enumerate(texts)])
        tkey = (key, part, opts)
        cache = self.cache_templates
        tpl = self._templates.get(tkey) if cache else None
        if tpl is not None and not self._still_valid(tpl, schema_of):
            tpl = None
        fresh = tpl is None
        if fresh:
            tpl = self._template(auto, ai, sites, rep, schema_of)
            if cache and len(self._templates) < TEMPLATES_MAX:
                self._templates[tkey] = tpl
        try:
            return self._bind(tpl, auto, texts, ai, owner, stage)
        except BindError:
            if fresh:
                raise
            # a constant of this automaton does not convert: compile it alone, for its own message
            return self._bind(self._template(auto, ai, sites, rep, schema_of), auto, texts, ai, owner, stage)

    def template_of(self, auto: Automaton) -> tuple["_Template | None", list[str]]:
        """The template staging ``auto`` would use now (None: none is held,
        or it no longer holds) and the constants it would be bound with."""
        sites: list[StaticAtom] = []
        key = automaton_key(auto, sites)
        texts = [a.const for a in sites]
        rep: dict = {}
        part = tuple([rep.setdefault(t, i) for i, t in enumerate(texts)])
        opt = self.opt
        tpl = self._templates.get((key, part, (opt.merge, opt.an_index, opt.instance_index, opt.fr_index,
                                               opt.sorted_index)))
        return tpl, texts

    def static_sites(self, auto: Automaton) -> list[StaticAtom]:
        """The StaticAtoms of ``auto`` whose constants a template binds, in its order."""
        sites: list[StaticAtom] = []
        automaton_key(auto, sites)
        return sites

    def stage_prepared(self, items: list, owner: str, schema_of) -> tuple[_Stage, list] | None:
        """Stage automata given as ``(template, constants, outputs)`` (see
        :meth:`template_of`; outputs: state number -> [(name, type)]) exactly
        as :meth:`stage` stages the automata they stand for; None (nothing
        changed) when a template no longer holds or a constant does not
        convert: then stage the automata themselves."""
        stage = _Stage()
        bound = []
        for ai, (tpl, texts, outs) in enumerate(items):
            if not self._still_valid(tpl, schema_of):
                return None
            try:
                bound.append(self._bind(tpl, None, texts, ai, owner, stage, outs))
            except BindError:
                return None
        return stage, bound

    def _still_valid(self, tpl: "_Template", schema_of) -> bool:
        for name, attrs in tpl.streams:
            sch = schema_of(name)
            if sch is None or (sch.attributes is not attrs and sch.attributes != attrs):
                return False
        get = self.functions.get
        return all(get(name) is fn for name, fn in tpl.calls)

    def _template(self, auto: Automaton, ai: int, sites: list, rep: dict, schema_of) -> "_Template":
        """Compile ``auto`` into a :class:`_Template`: everything staging does
        that its constants do not change (checks, constant attributes, which
        states may merge, code) is done here, once per shape."""
        label = auto.name or f"automaton {ai}"
        by_id = {s.id: s for s in auto.states}
        incoming: Counter[str] = Counter()
        for s in auto.states:
            for kind, e in [("forward", f) for f in s.forwards] + ([("rebind", s.rebind)] if s.rebind else []):
                if e.destination not in by_id:
                    raise LoadError(f"{label}: node {s.id} has a {kind} edge to unknown node {e.destination!r}")
                if kind == "forward" or e.destination != s.id:
                    incoming[e.destination] += 1
        tpl = _Template()
        ev_schema: dict[str, StreamSchema | None] = {}
        streams: dict[str, tuple] = {}
        for s in auto.states:
            if s.input_stream is None:
                ev_schema[s.id] = None
                continue
            sch = schema_of(s.input_stream)
            if sch is None:
                raise LoadError(f"{label}: node {s.id} reads stream {s.input_stream!r}, which is not declared "
                                "and not published by any loaded automaton; declare it first")
            ev_schema[s.id] = sch
            streams[s.input_stream] = sch.attributes
        tpl.streams = tuple(streams.items())

        site_rep = {id(a): rep[a.const] for a in sites}
        conv_ix: dict[tuple, int] = {}

        def slot_of(atom: StaticAtom, type_: str) -> int:
            """Index of the converted constant of ``atom`` (as ``type_``) among those a bind converts."""
            k = (site_rep[id(atom)], type_)
            i = conv_ix.get(k)
            if i is None:
                i = conv_ix[k] = len(tpl.convs)
                tpl.convs.append(k)
            return i

        consts: dict[str, dict[str, tuple[int, str]]] = {}
        if self.opt.an_index:
            for sid, attrs in constant_attrs(auto, by_id, ev_schema).items():
                consts[sid] = {k: (rep[text], t) for k, (text, t) in attrs.items()}
        calls: dict[str, object] = {}

        def node_spec(s: State, prefix: str) -> _NodeSpec:
            spec = _NodeSpec(s, self._canon_schema(s.schema))
            if s.filter is None or s.is_start or s.input_stream is None:
                return spec
            sch = ev_schema[s.id]
            scope = Scope(sch.attributes, s.schema, self.functions, f"{prefix}, node {s.id} filter")
            spec.full = FnTemplate(compile_predicate(s.filter, scope), scope, slot_of)
            if len(s.filter.clauses) == 1 and spec.full.fn is not None:
                clause = s.filter.clauses[0]
                _static, dyn_eq, _rest = split_clause(clause, scope)
                spec.single = True
                spec.static = [(scope.ev[a.event_attr][0], slot_of(a, scope.ev[a.event_attr][1]))
                               for a in clause.atoms if _is_static_eq(a)]
                for idx, r, t in derived_sites(clause, consts.get(s.id), scope):
                    spec.derived.append((idx, len(tpl.dconvs)))
                    tpl.dconvs.append((r, t))
                use_ai = bool(dyn_eq) and self.opt.instance_index
                if use_ai:
                    spec.ai = dyn_eq[0]

                def run(an: bool) -> tuple[list, FnTemplate]:
                    used, dropped = [], False
                    for a in clause.atoms:  # what the indexes do not guarantee
                        if an and _is_static_eq(a):
                            continue
                        if use_ai and not dropped and _is_dyn_eq(a):
                            dropped = True
                            continue
                        used.append(a)
                    return used, FnTemplate(compile_atoms(used, scope), scope, slot_of)

                used, spec.run_plain = run(False)
                spec.run_an = run(True)[1] if self.opt.an_index else spec.run_plain
                if use_ai and self.opt.sorted_index:
                    for a in used:  # the sorted index prunes; the filter still decides (never a StaticAtom)
                        spec.iq = split_inequality(a, scope)
                        if spec.iq is not None:
                            break
            calls.update(scope.calls)
            return spec

        def edge_spec(e: Edge, s: State, kind: str) -> _EdgeSpec:
            sch = ev_schema[s.id]
            scope = Scope(sch.attributes if sch else (), None if s.is_start else s.schema, self.functions,
                          f"{label}, node {s.id} {kind} edge to {e.destination}")
            spec = _EdgeSpec(e.resets_start, s.is_start)
            spec.smap = compile_schema_map(e.schema_map, self._canon_schema(by_id[e.destination].schema), scope)
            if len(e.predicate.clauses) == 1 and not e.predicate.is_true and kind == "forward":
                clause = e.predicate.clauses[0]
                split_clause(clause, scope)
                static = [(scope.ev[a.event_attr][0], slot_of(a, scope.ev[a.event_attr][1]))
                          for a in clause.atoms if _is_static_eq(a)]
                if static:
                    spec.static = static
                    spec.rest = FnTemplate(compile_atoms([a for a in clause.atoms if not _is_static_eq(a)], scope),
                                           scope, slot_of)
            spec.pred = FnTemplate(compile_predicate(e.predicate, scope), scope, slot_of)
            calls.update(scope.calls)
            return spec

        # which states merge: along single-entry paths from the stream's shared start node
        merge = self.opt.merge
        shareable: dict[str, bool] = {}
        queue: deque[State] = deque()
        for s in auto.states:
            if s.is_start:
                shareable[s.id] = merge and incoming[s.id] == 0
                tpl.starts.append((s.id, s.input_stream, shareable[s.id], node_spec(s, label)))
                queue.append(s)
        while queue:
            s = queue.popleft()
            for i, e in enumerate(s.forwards):
                d = by_id[e.destination]
                if d.id in shareable:
                    continue
                if not (merge and shareable[s.id] and incoming[d.id] == 1 and not d.is_start
                        and (d.rebind is None or d.rebind.destination == d.id)):
                    continue
                shareable[d.id] = True
                tpl.steps.append((s.id, i, d.id, *self._merge_key(e, d, ev_schema[d.id], site_rep),
                                  node_spec(d, label)))
                queue.append(d)
        tpl.own = [(s.id, node_spec(s, label)) for s in auto.states if s.id not in shareable]
        for k, s in enumerate(auto.states):
            fwd = [(i, edge_spec(e, s, "forward"), e.destination) for i, e in enumerate(s.forwards)]
            rb = None if s.rebind is None else (edge_spec(s.rebind, s, "rebind"), s.rebind.destination)
            tpl.edges.append((s.id, fwd, rb, k if s.outputs else -1))
        tpl.calls = tuple(calls.items())
        return tpl

    def _merge_key(self, e: Edge, d: State, sch: StreamSchema | None, site_rep: dict) -> tuple:
        """(token, getter) of the merge key of ``d`` reached by ``e``: same
        predicate, schema map and DEL flag of the edge, same input stream and
        schema, stored schema, filter and rebind edge of ``d`` — with literal
        types, as ``1 == 1.0`` but ``x / 2`` and ``x / 2.0`` differ. Constants
        of StaticAtoms are the getter's part (of the automaton's constants)."""
        sl: list[StaticAtom] = []
        r = d.rebind
        shape = (pred_key(e.predicate, sl), map_key(e.schema_map), e.resets_start, d.input_stream,
                 sch.attributes if sch else None, schema_key(d.schema), pred_key(d.filter, sl),
                 None if r is None else (pred_key(r.predicate, sl), map_key(r.schema_map), r.resets_start,
                                         r.has_map))
        return self._token(shape), (itemgetter(*[site_rep[id(a)] for a in sl]) if sl else None)

    def _bind(self, tpl: "_Template", auto: Automaton | None, texts: list, ai: int, owner: str, stage: _Stage,
              outs: dict | None = None):
        """Stage ``auto`` (of ``tpl``'s shape, with constants ``texts``): nodes
        and edges of its own, or shared ones where merge keys match. Without
        ``auto``, ``outs`` gives its outputs: state number -> [(name, type)]."""
        convert = convert_const
        vals = [convert(texts[r], t) for r, t in tpl.convs]  # the only BindError here: before any change
        dvals = []
        for r, t in tpl.dconvs:
            try:
                dvals.append(convert(texts[r], t))
            except BindError:
                dvals.append(_FAIL)  # the edge with the bad constant reports it
        prefix = f"{owner}/{ai}/"
        make_node = self._make_node
        nodes: dict[str, Node] = {}
        for sid, stream, merged, spec in tpl.starts:
            if merged:
                node = self.start_nodes.get(stream) or stage.start_nodes.get(stream)
                if node is None:
                    node = make_node(spec, prefix + sid, True, None, vals, dvals, stage)
                    stage.start_nodes[stream] = node
            else:
                node = make_node(spec, prefix + sid, False, None, vals, dvals, stage)
            nodes[sid] = node
        reused: dict[tuple[str, int], NEdge] = {}
        new_sig: dict[tuple[str, int], object] = {}
        children = stage.children
        for sid, i, did, token, getter, spec in tpl.steps:
            parent = nodes[sid]
            sig = token if getter is None else (token, getter(texts))
            hit = (parent.children or _NONE).get(sig) or children.get((id(parent), sig))
            if hit is not None:
                nodes[did] = hit.dest
                reused[(sid, i)] = hit
            else:
                nodes[did] = make_node(spec, prefix + did, True, sig, vals, dvals, stage)
                new_sig[(sid, i)] = sig
        for sid, spec in tpl.own:  # everything else is this automaton's own
            nodes[sid] = make_node(spec, prefix + sid, False, None, vals, dvals, stage)

        held: list[NEdge] = []
        make_edge = self._make_edge
        new_edges = stage.new_edges
        for sid, fwd, rb, k in tpl.edges:
            src = nodes[sid]
            for i, spec, did in fwd:
                edge = reused.get((sid, i)) if reused else None
                if edge is None:
                    sig = new_sig.get((sid, i)) if new_sig else None
                    edge = make_edge(spec, src, nodes[did], vals, sig)
                    new_edges.append(edge)
                    if sig is not None:
                        children[(id(src), sig)] = edge
                held.append(edge)
            if rb is not None and src.rebind is None and id(src) in stage.new_ids:
                src.rebind = make_edge(rb[0], src, nodes[rb[1]], vals, None)
            if k >= 0:
                for out in (auto.states[k].outputs if outs is None else outs[k]):
                    if outs is None:
                        out = (out.name, out.type)
                    stage.outputs.append((src, out))
        return nodes, held

    def _make_node(self, spec: "_NodeSpec", label: str, shareable: bool, sig, vals: list, dvals: list,
                   stage: _Stage) -> Node:
        node = Node(spec.state, label, shareable)
        node.schema = spec.schema
        node.merge_key = sig
        if spec.full is not None:
            node.filter_full = node.filter_run = spec.full.make(vals)
            if spec.single:
                static_eq = [(idx, vals[v]) for idx, v in spec.static]
                for idx, d in spec.derived:
                    if dvals[d] is not _FAIL:
                        static_eq.append((idx, dvals[d]))
                node.an = eq_key(static_eq) if self.opt.an_index else None
                if spec.ai is not None:
                    node.ai_ev, node.ai_node = spec.ai
                    node.buckets = {}
                node.filter_run = (spec.run_an if node.an is not None else spec.run_plain).make(vals)
                if spec.iq is not None:
                    node.iq = spec.iq
        node.inst_bytes = per_instance_bytes(spec.schema, node.iq is not None)
        stage.new_nodes.append(node)
        stage.new_ids.add(id(node))
        return node

    def _make_edge(self, spec: "_EdgeSpec", src: Node, dest: Node, vals: list, sig) -> NEdge:
        eq = rest = None
        if spec.static is not None:
            eq = eq_key([(idx, vals[v]) for idx, v in spec.static])
            if eq is not None:
                rest = spec.rest.make(vals)
        if eq is not None and spec.is_start and self.opt.fr_index:
            pred = None  # never evaluated: the start edge lives in the stream's FR index
        else:
            pred = spec.pred.make(vals)
        if eq is None:
            rest = pred
        return NEdge(src, dest, pred, rest, eq, spec.smap, spec.resets, sig)

    # ------------------------------------------------------------------ commit / release

    def commit(self, holding: Holding, stage: _Stage, bound: list) -> None:
        owner, gen = holding.owner, holding.gen
        self.owner_gen[owner] = gen
        seq = self._seq
        plans = self.plans
        for node in stage.new_nodes:
            seq += 1
            node.seq = seq
            node.min_gen = gen
            stream = node.stream
            if stream is not None:
                plan = plans.get(stream)
                if plan is None:
                    plan = plans[stream] = StreamPlan(stream)
                node.plan = plan
                if not node.is_start:
                    plan.nodes += 1
        self.nodes += len(stage.new_nodes)
        self.start_nodes.update(stage.start_nodes)
        fr_index = self.opt.fr_index
        for edge in stage.new_edges:
            seq += 1
            edge.seq = seq
            edge.min_gen = gen
            if edge.is_start:  # lives in the stream's start index (not in src.forwards: never scanned)
                if edge.sig is not None:
                    edge.src.add_child(edge)
                edge.src.plan.add_start_edge(edge, fr_index)
            else:
                edge.src.add_forward(edge, fr_index)
        self._seq = seq
        self.edges += len(stage.new_edges)
        states, readers, edges = holding.states, holding.readers, holding.edges
        for ai, (nodes, held) in enumerate(bound):
            for sid, node in nodes.items():
                owners = node.owners
                owners[owner] = owners.get(owner, 0) + 1
                states.append((ai, sid, node))
                if node.stream is not None:
                    readers.append(node.stream)
            for edge in held:
                owners = edge.owners
                owners[owner] = owners.get(owner, 0) + 1
                edges.append(edge)
        for node, (name, kind) in stage.outputs:
            if not node.outputs:
                node.outputs = []
            node.outputs.append((name, kind, owner, gen))  # see Node.outputs

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
            node.outputs = [o for o in node.outputs if o[2] != owner] or ()  # (stream, kind, owner, gen)
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


#: Marks a derived constant that did not convert.
_FAIL = object()
#: Most templates kept per loader (more shapes are staged uncached).
TEMPLATES_MAX = 10_000


def _is_static_eq(a) -> bool:
    return isinstance(a, StaticAtom) and a.op == "="


def _is_dyn_eq(a) -> bool:
    return isinstance(a, DynamicAtom) and a.op == "="
