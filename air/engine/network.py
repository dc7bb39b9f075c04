"""The engine's query network: merged nodes, edges and the indexes over them.

One :class:`Node` stands for one automaton state, or for several manifestly
equivalent states of different automata when merging is on
(docs/design/semantics.md#indexes-and-state-merging: same input stream, same
filter and rebind, reached by the same edge from the same merged
node; all start states of a stream are one node). Every node and edge knows
its owners; an owner's *generation* (a counter bumped by each
:meth:`Engine.add`) decides which instances it may see: an instance carries the
generation current when its run began (``born``), and an owner added later
never sees it. So a subscription added while events flow starts empty even
where it shares nodes with older ones.

Indexes (docs/design/semantics.md#indexes-and-state-merging), each of which only prunes candidates —
the compiled predicates still decide:

* :class:`EqIndex` hashes the static equality atoms of a single-clause
  predicate (``e.a = c AND e.b = d`` under signature ``(a, b)``, key
  ``(c, d)``); a probe costs one dict lookup per signature in use.
* the **AN index** (per stream) holds the *active* nodes whose filter has
  static equality atoms; active nodes without them are scanned;
* the **AI index** (per node) buckets instances by their value of the
  filter's first dynamic equality atom ``e.a = I.b``;
* the **sorted index** (within AI buckets) keeps instances ordered by the
  instance side of an inequality filter atom (``e.Price >= 1.05 * I.Price``),
  so an event bisects to the instances the atom holds for (:class:`SortedBucket`);
* the **FR index**: start edges of a stream sit in one global index; a
  non-start node with many forward edges (after merging) gets its own.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import attrgetter, itemgetter

from air.bounds import filter_horizon
from air.engine.instance import *  # noqa: F403,F405 - the slot names; C constants when compiled (instance.pxd)
from air.model import State

try:
    import cython

    #: Whether this module runs compiled (air/engine/build.py); Cython makes it a constant.
    COMPILED = cython.compiled
except ImportError:  # plain Python without Cython installed: never compiled then
    COMPILED = False

#: A non-start node gets its own FR index once it has this many forward edges
#: with static equality atoms; below that, probing costs more than it saves.
FR_MIN_EDGES = 6

seq_of = attrgetter("seq")


def new_instance(values: tuple, t0, t1, born: int) -> list:
    """The one way to make an automaton instance: a list with the slots
    :mod:`air.engine.instance` names (the epoch has not affected it yet)."""
    return [values, t0, t1, born, False]


def untrack_instances(insts: list) -> None:
    """Take newly installed instances and their value tuples out of the cyclic
    GC (compiled build only; plain Python has no way to). Neither can be part
    of a reference cycle: an instance holds its value tuple and atomic values,
    and nothing but the engine holds an instance. Left tracked, the instances
    that live across collections dominated the engine's GC time (a collection
    walks every young instance: 15% of `increasing` at K = 1000)."""
    if COMPILED:
        for inst in insts:
            PyObject_GC_UnTrack(inst)
            PyObject_GC_UnTrack(inst[VALUES])


def untrack_events(events) -> None:
    """Take events out of the cyclic GC (compiled build only; the
    plain-Python build has no way to). The compiled ``Event`` is made
    untracked (``no_gc``): this is for events of any other kind. An event holds a stream name, a tuple of atomic values and two
    times: it cannot be part of a cycle. The queue calls it on what it accepts:
    a full collection otherwise walked every event waiting in a full queue
    (with the witness log, a 1M-tick replay spent 0.7 s more in gen-2
    collections; BENCHMARKS.md round 6)."""
    if COMPILED:
        for ev in events:
            if PyObject_IS_GC(ev):  # noqa: F821 - C only (network.pxd)
                PyObject_GC_UnTrack(ev)  # noqa: F821


def live_node_list(plans: list, dirty: list) -> list:
    """Every node holding installed instances (the stream plans' active nodes),
    then those holding only pending ones (made this epoch: ``dirty``, not yet installed)."""
    nodes: list = []
    for plan in plans:
        nodes.extend(plan.active_scan)
        for group in plan.an_index.groups.values():
            for bucket in group[1].values():
                nodes.extend(bucket)
    for node in dirty:
        if node.pending and not node.active and node.stream is not None:
            nodes.append(node)
    return nodes


def tally_nodes(nodes: list, floor: float, bucket_bytes: int) -> tuple:
    """Over ``nodes`` (:func:`live_node_list`): estimated bytes (each node's
    ``inst_bytes`` per instance, ``bucket_bytes`` per AI bucket), instances,
    nodes holding some, and the nodes an event of their stream visits at least
    ``floor`` instances of, as ``(node, instances, visits)``. The state
    budget's pass (air/engine/footprint.py), compiled: ~20 ns a node."""
    total = 0
    insts = 0
    count = 0
    heavy: list = []
    for node in nodes:
        n = node.count + len(node.pending)
        if n == 0:
            continue
        total += n * node.inst_bytes
        insts += n
        count += 1
        if node.ai_ev >= 0:
            total += len(node.buckets) * bucket_bytes
        if n >= floor:
            v = n / max(len(node.buckets), 1) if node.ai_ev >= 0 else float(n)
            if v >= floor:
                heavy.append((node, n, v))
    return total, insts, count, heavy


def _bisect_keys(keys: list, x, right: bool) -> int:
    """``bisect_right(keys, x)`` (``right``) or ``bisect_left(keys, x)``; in the
    compiled build a float ``x`` is compared with float keys as C doubles (an
    exact comparison, as Python's), other keys as Python objects. ``x`` is never
    NaN here and keys never are (the sorted index holds numbers only)."""
    lo = 0
    hi = len(keys)
    if type(x) is float:
        xd = x
        while lo < hi:
            mid = (lo + hi) >> 1
            k = keys[mid]
            if type(k) is float:
                kd = k
                below = xd < kd if right else kd < xd
            else:
                below = x < k if right else k < x
            if below == right:
                hi = mid
            else:
                lo = mid + 1
        return lo
    return bisect_right(keys, x) if right else bisect_left(keys, x)


class SortedBucket:
    """One AI bucket of a node with a sorted index (on a filter atom
    ``ev_side OP key(instance)``). Three parallel lists, ``keys``, ``cids`` and
    ``insts``, are sorted by key and then by ``cid`` (the install order), so the
    instances an event can affect are one slice found by bisecting ``keys``, a
    list of plain numbers (bisecting ``(key, cid, instance)`` tuples cost three
    times as much); ``rest`` holds ``(cid, instance)`` for instances whose key is
    not a number (or NaN, or raised), which every event must check. An
    installed instance carries its key and cid in slots SORT_KEY and SORT_CID."""

    __slots__ = ("keys", "cids", "insts", "rest")

    def __init__(self) -> None:
        self.keys: list = []
        self.cids: list[int] = []
        self.insts: list[list] = []
        self.rest: list[tuple] = []

    def __len__(self) -> int:
        return len(self.keys) + len(self.rest)

    def add(self, key, cid: int, inst: list) -> None:
        """Install ``inst`` under a numeric ``key``; ``cid`` must exceed every
        cid already held (it is the install order), so it goes after equal keys."""
        i = _bisect_keys(self.keys, key, True) if COMPILED else bisect_right(self.keys, key)
        self.keys.insert(i, key)
        self.cids.insert(i, cid)
        self.insts.insert(i, inst)

    def ordered(self) -> list[list]:
        """Every instance, in install order."""
        pairs = list(zip(self.cids, self.insts)) + self.rest
        pairs.sort(key=_first)
        return [i for _c, i in pairs]

    def remove(self, inst: list) -> None:
        key, cid = inst[SORT_KEY], inst[SORT_CID]
        if key is None:
            self.rest.remove((cid, inst))
            return
        i = _bisect_keys(self.keys, key, False) if COMPILED else bisect_left(self.keys, key)
        cids = self.cids
        while cids[i] != cid:  # past equal keys installed earlier
            i += 1
        del self.keys[i], cids[i], self.insts[i]

    def keep_born_since(self, gen: int) -> None:
        """Drop the instances whose run began before generation ``gen``."""
        kept = [j for j, inst in enumerate(self.insts) if inst[BORN] >= gen]
        if len(kept) != len(self.insts):
            self.keys = [self.keys[j] for j in kept]
            self.cids = [self.cids[j] for j in kept]
            self.insts = [self.insts[j] for j in kept]
        self.rest = [(cid, inst) for cid, inst in self.rest if inst[BORN] >= gen]


_first = itemgetter(0)


def affectable(iq, bucket: SortedBucket, e: tuple) -> list:
    """The instances of ``bucket`` whose sorted-index atom ``ev_side(e) OP
    key`` (``Node.iq`` is ``(OP, ev_side, key)``) holds, plus those without a
    key, in install order: those event ``e`` can affect (the event loop in
    runtime.py asks). If the event side is not a number (or raises), every
    instance: the filter decides (and raises) as without the index."""
    op, evf, _keyf = iq
    try:
        x = evf(e)
    except Exception:  # noqa: BLE001
        return bucket.ordered()
    t = type(x)
    if t is float and x != x:
        insts = []  # NaN: no comparison holds
    elif t is float or t is int:
        keys = bucket.keys
        if COMPILED:
            if op == ">=":
                insts = bucket.insts[:_bisect_keys(keys, x, True)]
            elif op == ">":
                insts = bucket.insts[:_bisect_keys(keys, x, False)]
            elif op == "<=":
                insts = bucket.insts[_bisect_keys(keys, x, False):]
            else:
                insts = bucket.insts[_bisect_keys(keys, x, True):]
        elif op == ">=":
            insts = bucket.insts[:bisect_right(keys, x)]
        elif op == ">":
            insts = bucket.insts[:bisect_left(keys, x)]
        elif op == "<=":
            insts = bucket.insts[bisect_left(keys, x):]
        else:
            insts = bucket.insts[bisect_right(keys, x):]
    else:
        return bucket.ordered()
    if bucket.rest:
        insts.extend([pair[1] for pair in bucket.rest])
    if len(insts) > 1:
        # install order: every installed instance carries its install number (SORT_CID);
        # sorting by it as a plain int key costs less than pairing and unpairing (cid, instance)
        insts.sort(key=_cid)
    return insts


_cid = itemgetter(SORT_CID)


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
                 "ai_ev", "ai_node", "iq", "rebind", "forwards", "fr", "fr_scan", "children", "outputs",
                 "instances", "buckets", "pending", "ndead", "dead_keys", "count", "dirty", "active",
                 "owners", "min_gen", "shareable", "merge_key", "alive", "horizon", "inst_bytes")

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
        self.iq = None  # sorted index within AI buckets: (op, ev_fn, key_fn), see SortedBucket
        self.rebind: NEdge | None = None
        self.forwards: list[NEdge] = []
        self.fr: EqIndex | None = None
        # made when needed (most nodes have neither an FR index nor merged children nor outputs)
        self.fr_scan: dict[NEdge, None] | None = None
        self.children: dict[object, NEdge] | None = None  # merge key -> edge, for merged children
        # (stream, kind, owner, owner generation): a plain tuple, not a named one: the event loop
        # unpacks one per witness, and Cython and CPython unpack only an exact tuple fast
        self.outputs: list[tuple[str, str, str, int]] | tuple = ()
        self.instances: list[list] = []  # without an AI index
        self.buckets: dict[object, list[list]] = _NO_BUCKETS  # with one (the loader makes it)
        self.pending: list[list] = []
        self.ndead = 0
        # AI keys of affected instances, possibly repeated (made on demand); with a sorted index, the
        # affected instances themselves
        self.dead_keys: list | None = None
        self.count = 0
        self.dirty = False
        self.active = False
        self.owners: dict[str, int] = {}
        self.min_gen = 0
        self.shareable = shareable
        self.merge_key = None
        self.alive = True
        # when no event can affect an instance any more (air/bounds.py: the filter's DUR bounds), or
        # None; air/engine/footprint.py drops the instances past it (none of them could do anything)
        self.horizon = None if state.is_start or state.input_stream is None else filter_horizon(state.filter)
        self.inst_bytes = 0  # estimated bytes of one of its instances (footprint.py fills it in when first asked)

    def all_instances(self) -> list[list]:
        if self.ai_ev >= 0:
            if self.iq is not None:
                return [i for b in self.buckets.values() for i in b.ordered()]
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
            self.fr_scan = None
            for f in self.forwards:
                f.indexed = False
                f.run = f.pred

    def add_child(self, edge: NEdge) -> None:
        if self.children is None:
            self.children = {}
        self.children[edge.sig] = edge

    def add_forward(self, edge: NEdge, fr_enabled: bool) -> None:
        self.forwards.append(edge)
        if edge.sig is not None:
            self.add_child(edge)
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
        self.pending = [i for i in self.pending if i[BORN] >= gen]
        if self.ai_ev >= 0 and self.iq is not None:
            for key in list(self.buckets):
                b = self.buckets[key]
                b.keep_born_since(gen)
                if not len(b):
                    del self.buckets[key]
            self.count = sum(len(b) for b in self.buckets.values())
        elif self.ai_ev >= 0:
            for key in list(self.buckets):
                kept = [i for i in self.buckets[key] if i[BORN] >= gen]
                if kept:
                    self.buckets[key] = kept
                else:
                    del self.buckets[key]
            self.count = sum(len(b) for b in self.buckets.values())
        else:
            self.instances = [i for i in self.instances if i[BORN] >= gen]
            self.count = len(self.instances)
        self.ndead = sum(1 for i in self.all_instances() if i[DEAD])
        if self.iq is not None and self.dead_keys:  # the affected instances still held
            self.dead_keys = [i for i in self.dead_keys if i[BORN] >= gen] or None


#: Shared by every node without an AI index; never written.
_NO_BUCKETS: dict = {}


class StreamPlan:
    """Everything that reads one stream: start edges and active nodes."""

    __slots__ = ("name", "start_index", "start_scan_list", "an_index", "active_scan", "nodes",
                 "start_edges")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start_index = EqIndex()  # the global FR index of start edges
        self.start_scan_list: list[NEdge] = []  # start edges the index cannot hold, in seq order
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
            self.start_scan_list.append(edge)  # the newest edge has the largest seq: still sorted

    def remove_start_edge(self, edge: NEdge) -> None:
        self.start_edges -= 1
        if edge.indexed:
            self.start_index.remove(edge.eq[0], edge.eq[1], edge)
        else:
            self.start_scan_list.remove(edge)

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
