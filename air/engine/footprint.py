"""What the engine's state costs, and dropping what can no longer matter.

Not on the event path: plain Python in both builds, called between events by
whoever feeds the engine (the server's state budget, server/budget.py), never
imported by the event loop (runtime.py).

- :func:`expire` drops the instances no event can affect any more: a state
  whose filter bounds ``DUR`` in every clause (air/bounds.py) has instances
  that are dead weight once the current epoch is past their horizon. Dropping
  them changes no witness (nothing they could do is left), only memory.
- :func:`measure` estimates the bytes of every live instance (installed and
  pending) from the engine's own instance layout: each node's instances cost
  :func:`instance_bytes` of its schema, plus what its index keeps per bucket.
  The estimate depends only on the engine's state (never on the allocator or
  the clock), so the same events give the same figure on every run and after
  a recovery: a budget decided on it is deterministic in the input.
- :func:`owner_footprint` is one owner's share, as it sees it (merged nodes
  count for every owner that sees their instances, as ``instance_count`` does).
- :func:`node_costs` says how much of the engine's work each active node
  causes: how many of its instances an event of its stream visits.

The per-instance sizes are air/engine/sizes.py's (calibrated against
tracemalloc on CPython 3.11: BENCHMARKS.md, "Memory of automaton state").
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Mapping, NamedTuple

from air.engine.eviction import evict_from
from air.engine.instance import T0
from air.engine.introspect import _unordered, owned_count
from air.engine.network import Node, live_node_list, tally_nodes
from air.engine.sizes import (  # noqa: F401 - the size model, importable from here as before
    BUCKET_BYTES, INSTANCE_BASE, SORTED_EXTRA, VALUE_BYTES, instance_bytes, per_instance_bytes)

if TYPE_CHECKING:
    from air.engine.enginelike import EngineLike


class Footprint(NamedTuple):
    """What :func:`measure` found: estimated bytes, instances, and the nodes holding them."""

    bytes: int
    instances: int
    nodes: int


def live_nodes(eng: "EngineLike") -> list[Node]:
    """Every node holding installed instances (the stream plans' active nodes),
    then those holding only pending ones (made this epoch, not yet installed)."""
    return live_node_list(list(eng.network.plans.values()), eng._dirty)  # noqa: SLF001 - read only


def node_bytes(node: Node, instances: int | None = None) -> int:
    """Estimated bytes of ``node``'s instances (``instances`` of them: all, and its buckets, by default)."""
    if instances is not None:
        return instances * node.inst_bytes
    b = (node.count + len(node.pending)) * node.inst_bytes
    if node.ai_ev >= 0:
        b += len(node.buckets) * BUCKET_BYTES
    return b


def measure(eng: "EngineLike") -> Footprint:
    """Estimated bytes of every live instance in the engine (see the module's docstring)."""
    total, insts, count, _heavy = tally_nodes(live_nodes(eng), float("inf"), BUCKET_BYTES)
    return Footprint(total, insts, count)


def owner_footprint(eng: "EngineLike", owner: str, exclusive: bool = False) -> tuple[int, int]:
    """``(instances, bytes)`` of what ``owner`` sees (installed and pending);
    with ``exclusive``, only of the instances no other live owner sees (those
    a merged node holds for identical queries registered since are shared)."""
    holding = eng.holding(owner)
    g = holding.gen
    gens = eng.network.owner_gen
    insts = size = 0
    for _ai, _sid, node in holding.states:
        if node.stream is None or node.is_start or not (node.count or node.pending):
            continue
        n = owned_count(node, g)
        if exclusive and n:
            others = min((gens[o] for o in node.owners if o != owner), default=None)
            if others is not None:
                n -= owned_count(node, others)  # born since another owner came: it sees them too
        insts += n
        size += node_bytes(node, n)
    return insts, size


def _expire_node(node: Node, now) -> int:
    h = node.horizon
    expired = h.expired
    gone = [i for i in chain(_unordered(node), node.pending) if expired(i[T0], now)]
    return evict_from(node, gone) if gone else 0


def expire(eng: "EngineLike") -> int:
    """Drop every instance that no event at the current epoch or later can
    affect (its state's filter is past its ``DUR`` bound, air/bounds.py);
    returns how many went. Call it between events (mid-epoch too)."""
    return survey(eng, expire=True).expired


class NodeCost(NamedTuple):
    """How much an active node costs each event of its stream."""

    node: Node
    instances: int
    visits: float  # instances an event of its stream visits, on average (its whole list without an AI index)


class Survey(NamedTuple):
    """One pass over the nodes holding instances (:func:`survey`)."""

    footprint: Footprint
    expired: int  # instances dropped as expired
    heavy: list[NodeCost]  # the nodes an event of their stream visits at least ``heavy`` instances of
    work: float  # sum over nodes of visits x the weight of their stream (with ``weights``)


def visits(node: Node, n: int) -> float:
    """How many of ``node``'s ``n`` instances an event of its stream visits:
    all of them without an AI index; with one, a bucket's worth on average
    (a sorted index visits fewer still)."""
    if node.ai_ev >= 0:
        return n / max(len(node.buckets), 1)
    return float(n)


def survey(eng: "EngineLike", *, expire: bool = False, heavy: float | None = None,
           weights: Mapping[str, float] | None = None) -> Survey:
    """One pass over the nodes holding instances: with ``expire``, drop the
    expired ones first (see :func:`expire`); then the footprint (as
    :func:`measure`), the nodes whose events visit at least ``heavy``
    instances, and, with ``weights`` (stream -> events of it, say), the
    engine's work as visits weighted by their stream's events."""
    now = eng.epoch if expire else None
    gone = 0
    nodes = live_nodes(eng)
    if now is not None:
        for node in nodes:
            if node.horizon is not None:
                gone += _expire_node(node, now)
        if gone:
            eng.stats.expired += gone
    total, insts, count, found = tally_nodes(nodes, float("inf") if heavy is None else heavy, BUCKET_BYTES)
    work = 0.0
    if weights is not None:
        for node in nodes:
            n = node.count + len(node.pending)
            if n:
                work += visits(node, n) * weights.get(node.stream, 0)
    return Survey(Footprint(total, insts, count), gone, [NodeCost(*h) for h in found], work)
