"""The engine's query network: merged nodes, edges and the indexes over them.

One :class:`Node` stands for one automaton state, or for several manifestly
equivalent states of different automata when merging is on (002 §3: same input
stream, same filter and rebind, reached by the same edge from the same merged
node; all start states of a stream are one node). Every node and edge knows
its owners; an owner's *generation* (a counter bumped by each
:meth:`Engine.add`) decides which instances it may see: an instance carries the
generation current when its run began (``born``), and an owner added later
never sees it. So a subscription added while events flow starts empty even
where it shares nodes with older ones.

Indexes (002 §3.3–3.4, 000 §4.3.3), each of which only prunes candidates —
the compiled predicates still decide:

* :class:`EqIndex` hashes the static equality atoms of a single-clause
  predicate (``e.a = c AND e.b = d`` under signature ``(a, b)``, key
  ``(c, d)``); a probe costs one dict lookup per signature in use.
* the **AN index** (per stream) holds the *active* nodes whose filter has
  static equality atoms; active nodes without them are scanned;
* the **AI index** (per node) buckets instances by their value of the
  filter's first dynamic equality atom ``e.a = I.b``;
* the **FR index**: start edges of a stream sit in one global index; a
  non-start node with many forward edges (after merging) gets its own.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

from air.model import State

#: A non-start node gets its own FR index once it has this many forward edges
#: with static equality atoms; below that, probing costs more than it saves.
FR_MIN_EDGES = 6

seq_of = attrgetter("seq")


class Instance:
    """An automaton instance: stored values in the node's schema, its
    interval, whether the current epoch affected it, and the generation its
    run began in."""

    __slots__ = ("values", "t0", "t1", "dead", "born")

    def __init__(self, values: tuple, t0, t1, born: int = 0) -> None:
        self.values = values
        self.t0 = t0
        self.t1 = t1
        self.dead = False
        self.born = born


class EqIndex:
    """Hash index on conjunctions of ``event.attr = constant`` atoms.

    Entries are grouped by signature (the tuple of attribute indexes); within a
    group a dict maps the key to an insertion-ordered dict of entries."""

    __slots__ = ("groups", "size")

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...], tuple[itemgetter, dict]] = {}
        self.size = 0

    def add(self, sig: tuple[int, ...], key, entry) -> None:
        group = self.groups.get(sig)
        if group is None:
            group = self.groups[sig] = (itemgetter(*sig), {})
        group[1].setdefault(key, {})[entry] = None
        self.size += 1

    def remove(self, sig: tuple[int, ...], key, entry) -> None:
        getter, table = self.groups[sig]
        bucket = table[key]
        del bucket[entry]
        self.size -= 1
        if not bucket:
            del table[key]
            if not table:
                del self.groups[sig]

    def probe(self, e: tuple, out: list) -> None:
        """Append every entry whose key the event's values match."""
        for getter, table in self.groups.values():
            bucket = table.get(getter(e))
            if bucket:
                out.extend(bucket)


class NEdge:
    """A forward or rebind edge. ``run`` is the compiled predicate the inner
    loop evaluates: the full predicate, or only what an index hit leaves."""

    __slots__ = ("seq", "src", "dest", "pred", "rest", "eq", "run", "smap", "resets", "owners", "min_gen",
                 "sig", "indexed", "is_start")

    def __init__(self, src: "Node", dest: "Node", pred, rest, eq, smap, resets: bool, sig) -> None:
        self.seq = 0
        self.src = src
        self.dest = dest
        self.pred = pred
        self.rest = rest
        self.eq = eq  # (signature, key) of its static equality atoms, or None
        self.run = pred
        self.smap = smap
        self.resets = resets
        self.owners: dict[str, int] = {}
        self.min_gen = 0
        self.sig = sig  # merge key among the source's children, or None
        self.indexed = False
        self.is_start = src.is_start


class Node:
    """A (possibly merged) state with its live, pending and affected instances."""

    __slots__ = ("seq", "label", "is_start", "stream", "plan", "schema", "filter_full", "filter_run", "an",
                 "ai_ev", "ai_node", "rebind", "forwards", "fr", "fr_scan", "children", "outputs",
                 "instances", "buckets", "pending", "ndead", "dead_keys", "count", "dirty", "active",
                 "owners", "min_gen", "shareable", "merge_key", "alive")

    def __init__(self, state: State, label: str, shareable: bool) -> None:
        self.seq = 0
        self.label = label
        self.is_start = state.is_start
        self.stream = state.input_stream
        self.plan: StreamPlan | None = None
        self.schema = state.schema
        self.filter_full = None
        self.filter_run = None
        self.an = None  # (signature, key) in the AN index, or None: scanned when active
        self.ai_ev = -1  # AI index: event attribute index, -1 when off
        self.ai_node = -1  # ... and the instance attribute it is compared with
        self.rebind: NEdge | None = None
        self.forwards: list[NEdge] = []
        self.fr: EqIndex | None = None
        self.fr_scan: dict[NEdge, None] = {}
        self.children: dict[object, NEdge] = {}  # merge key -> edge, for merged children
        self.outputs: list[tuple[str, str, str, int]] = []  # (stream, kind, owner, owner generation)
        self.instances: list[Instance] = []  # without an AI index
        self.buckets: dict[object, list[Instance]] = {}  # with one
        self.pending: list[Instance] = []
        self.ndead = 0
        self.dead_keys: set | None = None  # AI keys of affected instances (made on demand)
        self.count = 0
        self.dirty = False
        self.active = False
        self.owners: dict[str, int] = {}
        self.min_gen = 0
        self.shareable = shareable
        self.merge_key = None
        self.alive = True

    def all_instances(self) -> list[Instance]:
        if self.ai_ev >= 0:
            return [i for b in self.buckets.values() for i in b]
        return list(self.instances)

    # ---------------------------------------------------------------- FR index

    def fr_candidates(self, e: tuple) -> list[NEdge]:
        """Forward edges whose indexed static part the event satisfies, plus
        the unindexed ones, in edge order."""
        out: list[NEdge] = []
        self.fr.probe(e, out)
        if self.fr_scan:
            out.extend(self.fr_scan)
        if len(out) > 1:
            out.sort(key=seq_of)
        return out

    def refresh_fr(self, enabled: bool) -> None:
        """Build or drop this node's FR index after its edges changed."""
        indexable = sum(1 for f in self.forwards if f.eq is not None)
        want = enabled and indexable >= FR_MIN_EDGES
        if want and self.fr is None:
            self.fr = EqIndex()
            self.fr_scan = {}
            for f in self.forwards:
                self._fr_add(f)
        elif not want and self.fr is not None:
            self.fr = None
            self.fr_scan = {}
            for f in self.forwards:
                f.indexed = False
                f.run = f.pred

    def add_forward(self, edge: NEdge, fr_enabled: bool) -> None:
        self.forwards.append(edge)
        if edge.sig is not None:
            self.children[edge.sig] = edge
        if self.fr is not None:
            self._fr_add(edge)
        else:
            self.refresh_fr(fr_enabled)

    def remove_forward(self, edge: NEdge, fr_enabled: bool) -> None:
        self.forwards.remove(edge)
        if edge.sig is not None and self.children.get(edge.sig) is edge:
            del self.children[edge.sig]
        if self.fr is not None:
            if edge.indexed:
                self.fr.remove(edge.eq[0], edge.eq[1], edge)
            else:
                self.fr_scan.pop(edge, None)
            self.refresh_fr(fr_enabled)

    def _fr_add(self, f: NEdge) -> None:
        if f.eq is not None:
            f.indexed = True
            f.run = f.rest
            self.fr.add(f.eq[0], f.eq[1], f)
        else:
            f.run = f.pred
            self.fr_scan[f] = None

    # ---------------------------------------------------------------- instances

    def purge_older_than(self, gen: int) -> None:
        """Drop instances no remaining owner may see (their run began before
        every remaining owner was added)."""
        self.pending = [i for i in self.pending if i.born >= gen]
        if self.ai_ev >= 0:
            for key in list(self.buckets):
                kept = [i for i in self.buckets[key] if i.born >= gen]
                if kept:
                    self.buckets[key] = kept
                else:
                    del self.buckets[key]
            self.count = sum(len(b) for b in self.buckets.values())
        else:
            self.instances = [i for i in self.instances if i.born >= gen]
            self.count = len(self.instances)
        self.ndead = sum(1 for i in self.all_instances() if i.dead)


class StreamPlan:
    """Everything that reads one stream: start edges and active nodes."""

    __slots__ = ("name", "start_index", "start_scan", "start_scan_list", "an_index", "active_scan", "nodes",
                 "start_edges")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start_index = EqIndex()  # the global FR index of start edges
        self.start_scan: dict[NEdge, None] = {}  # start edges the index cannot hold
        self.start_scan_list: list[NEdge] = []
        self.an_index = EqIndex()  # active nodes by their filter's static equality atoms
        self.active_scan: dict[Node, None] = {}  # active nodes the AN index cannot hold
        self.nodes = 0  # non-start nodes reading this stream
        self.start_edges = 0

    def add_start_edge(self, edge: NEdge, indexed: bool) -> None:
        self.start_edges += 1
        if indexed and edge.eq is not None:
            edge.indexed = True
            edge.run = edge.rest
            self.start_index.add(edge.eq[0], edge.eq[1], edge)
        else:
            edge.run = edge.pred
            self.start_scan[edge] = None
            self.start_scan_list = sorted(self.start_scan, key=seq_of)

    def remove_start_edge(self, edge: NEdge) -> None:
        self.start_edges -= 1
        if edge.indexed:
            self.start_index.remove(edge.eq[0], edge.eq[1], edge)
        else:
            del self.start_scan[edge]
            self.start_scan_list = sorted(self.start_scan, key=seq_of)

    def set_active(self, node: Node, active: bool) -> None:
        node.active = active
        if node.an is not None:
            if active:
                self.an_index.add(node.an[0], node.an[1], node)
            else:
                self.an_index.remove(node.an[0], node.an[1], node)
        elif active:
            self.active_scan[node] = None
        else:
            del self.active_scan[node]

    @property
    def empty(self) -> bool:
        return self.nodes == 0 and self.start_edges == 0
