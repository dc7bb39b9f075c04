"""Eviction: taking an owner's oldest instances out of the engine
(``Engine.evict_oldest``, the server's ``max_instances_per_subscription``).

Not on the event path: plain Python in both builds. It works on the engine's
nodes (``air.engine.network.Node``) between events, and keeps every structure
the hot loop in ``runtime.py`` relies on (counts, affected marks and keys,
AI buckets, sorted buckets, the active flag) as that loop would have left it.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from air.engine.instance import BORN, DEAD, T0, T1, VALUES
from air.engine.network import Node

if TYPE_CHECKING:
    from air.engine.enginelike import EngineLike


def _evict_key(candidate: tuple) -> tuple:
    """A candidate is ``(t0, t1, state, position, instance)``: its eviction order
    is that of the first four (see :func:`evict_oldest`)."""
    return candidate[:4]


def evict_oldest(eng: "EngineLike", owner: str, keep: int, shared: bool = False,
                 losers: dict[str, int] | None = None) -> int:
    """Remove ``owner``'s oldest instances until it sees at most ``keep``
    (as :meth:`Engine.instance_count` counts: installed and pending); returns how
    many instances were removed. Call it between events (mid-epoch too).

    *Oldest* is the order of the key ``(t0, t1, state, position)``: start
    time first; then ``t1``, the epoch the instance was made in (so the
    order of epochs it was installed in); then the owner's state, in the
    order :meth:`Engine.instances` lists them; then its place in that state's
    list (:meth:`Engine.instances` with ``pending=True``: installed in the
    node's order, then pending in the order they were made). The key
    depends only on the engine's state, never on the clock, so a replay
    that calls this at the same point removes the same instances.

    Merged nodes (network.py) hold instances other owners may see too:
    an instance is *shared* when another live owner of its node sees it
    (that owner's generation is no later than the instance's ``born``).
    Evicting a shared instance changes that owner's results, so the
    oldest instances only ``owner`` sees go first; shared ones are
    evicted only with ``shared`` (oldest first, after every unshared one
    is gone) and only as far as still needed to reach ``keep``: the other
    owners seeing them lose them too (counted in
    ``stats.evicted_shared``, and in ``losers``, owner -> how many it lost,
    when given). Without ``shared``, ``owner`` may still see
    more than ``keep`` afterwards. An instance the current epoch affected
    may go too: the epoch's bookkeeping (``ndead``, ``dead_keys``) follows."""
    holding = eng.holding(owner)
    g = holding.gen
    gens = eng.network.owner_gen
    mult: dict[int, int] = {}  # node -> how many of owner's states it stands for
    nodes: list[Node] = []
    for _ai, _sid, node in holding.states:
        if node.stream is None or node.is_start:
            continue
        if id(node) in mult:
            mult[id(node)] += 1
        else:
            mult[id(node)] = 1
            nodes.append(node)
    seen = 0
    own: list[tuple] = []  # candidates only owner sees
    common: list[tuple] = []  # ... and those another live owner sees too
    for si, node in enumerate(nodes):
        if not (node.count or node.pending):
            continue
        others = min((gens[o] for o in node.owners if o != owner), default=None)
        pos = 0
        for inst in itertools.chain(node.all_instances(), node.pending):
            if inst[BORN] >= g:
                seen += mult[id(node)]
                entry = (inst[T0], inst[T1], si, pos, inst)
                if others is not None and inst[BORN] >= others:
                    common.append(entry)
                else:
                    own.append(entry)
            pos += 1
    if seen <= keep:
        return 0
    victims: dict[int, list] = {}
    n_shared = 0
    for group, is_shared in ((own, False), (common, True)):
        if seen <= keep or (is_shared and not shared):
            break
        group.sort(key=_evict_key)
        for _t0, _t1, si, _pos, inst in group:
            if seen <= keep:
                break
            seen -= mult[id(nodes[si])]
            victims.setdefault(si, []).append(inst)
            n_shared += is_shared
            if is_shared and losers is not None:
                born = inst[BORN]
                for o in nodes[si].owners:
                    if o != owner and gens[o] <= born:
                        losers[o] = losers.get(o, 0) + 1
    removed = 0
    for si, insts in victims.items():
        removed += evict_from(nodes[si], insts)
    eng.stats.evicted += removed
    eng.stats.evicted_shared += n_shared
    return removed


def evict_from(node: Node, insts: list) -> int:
    """Take ``insts`` (installed or pending instances of ``node``) out of
    every structure that holds them; keeps ``count``, ``ndead``,
    ``dead_keys`` and the active flag right."""
    gone = {id(i) for i in insts}
    installed = insts
    if node.pending:
        waiting = {id(i) for i in node.pending}
        installed = [i for i in insts if id(i) not in waiting]
        if len(installed) != len(insts):
            node.pending[:] = [i for i in node.pending if id(i) not in gone]
    n_inst = 0
    n_dead = 0
    if node.ai_ev < 0:
        before = len(node.instances)
        kept = []
        for i in node.instances:
            if id(i) in gone:
                n_dead += i[DEAD]
            else:
                kept.append(i)
        node.instances[:] = kept
        n_inst = before - len(kept)
    else:
        k = node.ai_node
        buckets = node.buckets
        for key in dict.fromkeys(i[VALUES][k] for i in installed):
            b = buckets.get(key)
            if b is None:
                continue
            if node.iq is not None:
                for i in b.ordered():
                    if id(i) in gone:
                        b.remove(i)
                        n_inst += 1
                        n_dead += i[DEAD]
                empty = not len(b)
            else:
                kept = [i for i in b if id(i) not in gone]
                for i in b:
                    if id(i) in gone:
                        n_inst += 1
                        n_dead += i[DEAD]
                if kept:
                    buckets[key] = kept
                empty = not kept
            if empty:
                del buckets[key]
    node.count -= n_inst
    if n_dead:
        node.ndead -= n_dead
        if node.iq is not None:
            node.dead_keys = [i for i in node.dead_keys if id(i) not in gone] or None
        if not node.ndead:
            node.dead_keys = None
    if node.active and node.count == 0 and not node.is_start:
        node.plan.set_active(node, False)
    return len(insts)
