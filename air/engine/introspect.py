"""Looking into a running engine without changing it: an owner's instances and
their counts (``Engine.instances``, ``instance_count``, ``state_counts``: the
API's and metrics' numbers), the size of the query network
(``Engine.plan_stats``) and the live mapping of its streams
(``Engine.stream_view``). Not on the event path: plain Python in both builds;
counts are made of C-level passes (:func:`owned_count`).
Read-only; call it on the thread that feeds events."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, repeat
from operator import attrgetter, itemgetter, le
from typing import TYPE_CHECKING, Iterable, NamedTuple

from air.engine.instance import BORN, T0, T1, VALUES
from air.engine.network import Node

if TYPE_CHECKING:
    from air.engine.enginelike import EngineLike
    from air.model import StreamSchema


class LiveInstance(NamedTuple):
    """What :func:`instances` shows of an instance."""

    values: tuple  # stored values, in the state's schema order
    t0: object
    t1: object


def instances(eng: "EngineLike", owner: str, pending: bool = False) -> dict[str, list[LiveInstance]]:
    """Live (installed) instances of ``owner`` by state key ``"<automaton>/<state id>"``,
    in the order the node keeps them; with ``pending``, followed by those
    the current epoch made (installed when it closes), in the order made."""
    holding = eng.holding(owner)
    out: dict[str, list] = {}
    for ai, sid, node in holding.states:
        if node.stream is None or node.is_start:
            continue
        insts = node.all_instances() + node.pending if pending else node.all_instances()
        out[f"{ai}/{sid}"] = [LiveInstance(i[VALUES], i[T0], i[T1]) for i in insts if i[BORN] >= holding.gen]
    return out


def instance_count(eng: "EngineLike", owner: str | None = None) -> int:
    """Installed and pending instances of ``owner`` (as if nothing were
    merged), or of the whole network."""
    if owner is None:
        return sum(n.count + len(n.pending) for n in {id(n): n for h in eng.holdings().values()
                                                      for _a, _s, n in h.states}.values())
    holding = eng.holding(owner)
    g = holding.gen
    return sum(owned_count(node, g) for _ai, _sid, node in holding.states)


def state_counts(eng: "EngineLike", owner: str) -> dict[str, int]:
    """Installed and pending instances of ``owner`` per state key
    ``"<automaton>/<state id>"`` (as :func:`instances` names them; start
    states hold none)."""
    holding = eng.holding(owner)
    g = holding.gen
    return {f"{ai}/{sid}": owned_count(node, g) for ai, sid, node in holding.states}


def owned_count(node: Node, gen: int) -> int:
    """Instances at ``node`` (installed and pending) born in generation ``gen`` or later.

    Counted in C-level passes (``map``/``sum`` over the instances' BORN
    slots, in no particular order): no sorting of a sorted index's buckets
    back into install order, no Python frame per instance (a pass over a
    subscription's 20K instances, once a second on the engine thread, took
    17 ms before: BENCHMARKS.md, "Round 8 (2026-11-27): the server's own overhead").
    The node's oldest owner (``gen`` its ``min_gen``) owns all of them, counted
    without a pass: each began in that owner's generation or later (edges carry
    only those, loader.release drops the rest when the oldest owner goes,
    state.import_state does not load them)."""
    if not (node.count or node.pending):
        return 0
    if gen <= node.min_gen:
        return node.count + len(node.pending)
    return sum(map(le, repeat(gen), map(_BORN_OF, chain(_unordered(node), node.pending))))


_BORN_OF = itemgetter(BORN)
_INSTS, _REST = attrgetter("insts"), attrgetter("rest")
_SECOND = itemgetter(1)


def _unordered(node: Node) -> Iterable[list]:
    """The installed instances of ``node`` (those of ``Node.all_instances``), in no particular order."""
    if node.ai_ev < 0:
        return node.instances
    buckets = node.buckets.values()
    if node.iq is None:
        return chain.from_iterable(buckets)
    # a sorted index's buckets (network.SortedBucket): numeric keys' instances, then (cid, instance) pairs
    return chain(chain.from_iterable(map(_INSTS, buckets)), map(_SECOND, chain.from_iterable(map(_REST, buckets))))


def plan_stats(eng: "EngineLike") -> dict[str, int]:
    """Size of the query network: nodes and edges after merging, the
    states and edges the loaded automata have, and active nodes."""
    holdings = eng.holdings().values()
    net = eng.network
    states = sum(len(h.states) for h in holdings)
    edges = sum(len(h.edges) for h in holdings)
    active = sum(p.an_index.size + len(p.active_scan) for p in net.plans.values())
    return {"nodes": net.nodes, "edges": net.edges, "states": states,
            "automaton_edges": edges, "active_nodes": active}


class StreamView(Mapping):
    """See ``Engine.stream_view``: every stream, declared and published, looked
    up one dict probe at a time however many there are."""

    __slots__ = ("_eng",)

    def __init__(self, eng: "EngineLike") -> None:
        self._eng = eng

    def __getitem__(self, name: str) -> StreamSchema:
        schema = self._eng.schema(name)
        if schema is None:
            raise KeyError(name)
        return schema

    def __contains__(self, name) -> bool:
        return self._eng.schema(name) is not None

    def __iter__(self):
        eng = self._eng
        declared = list(eng._declared)
        return iter(declared + [n for n in list(eng._published) if n not in eng._declared])

    def __len__(self) -> int:
        return sum(1 for _ in self)
