"""The engine's processing state as plain data, and back (``Engine.export_state``,
``Engine.import_state``): what a snapshot holds of the engine
(server/durability/snapshot.py pickles it).

Layout, version 2 (:data:`VERSION`): a dict with

* ``version``: 2;
* ``epoch``, ``closed``, ``installed_t1``, ``epoch_events``: where the epoch in
  progress stands;
* ``owners``: owner -> its generation; ``stats``: ``EngineStats`` as a dict;
* ``instance_fields``: the names of an installed instance's fields,
  :data:`INSTANCE_FIELDS`; a pending instance has the first four;
* ``nodes``: one dict per node holding instances: ``states``, the
  ``(owner, automaton, state id)`` of every owner state the node stands for;
  ``installed``, its installed instances (with whether the current epoch
  affected them) in the order the node keeps them; ``pending``, those the
  current epoch made, in the order made.

Nothing in it refers to nodes, edges or compiled code, so it loads into an
engine built afresh from the same subscriptions. Version 1 (before the
redesign of issue 24) is the same with each node as a positional
``(states, installed, pending)`` triple; it still loads.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from typing import TYPE_CHECKING

from air.engine.errors import EngineError
from air.engine.instance import BORN, DEAD, T0, T1, VALUES
from air.engine.network import Node, new_instance

if TYPE_CHECKING:
    from air.engine.enginelike import EngineLike

#: The layout :func:`export_state` writes.
VERSION = 2
#: The fields of a saved installed instance, in order (a pending one has the first four).
INSTANCE_FIELDS = ["values", "t0", "t1", "born", "affected"]


def mark_dead(node: Node, inst: list) -> None:
    """Mark ``inst`` of ``node`` affected in the epoch in progress, as the engine's own
    loop does (its indexes told which key to drop when the epoch closes)."""
    inst[DEAD] = True
    node.ndead += 1
    if node.iq is not None or node.ai_ev >= 0:
        if node.dead_keys is None:
            node.dead_keys = []
        node.dead_keys.append(inst if node.iq is not None else inst[VALUES][node.ai_node])

def export_state(eng: "EngineLike") -> dict:
    """The processing state of ``eng`` in the layout above. Call it on the
    engine thread between events, or on a forked copy of it."""
    named: dict[int, list] = {}
    nodes: dict[int, Node] = {}
    owners: dict[str, int] = {}
    for owner, holding in eng.holdings().items():
        owners[owner] = holding.gen
        for ai, sid, node in holding.states:
            if node.stream is None or node.is_start:
                continue  # hold no instances
            key = id(node)
            if key not in nodes:
                nodes[key] = node
                named[key] = []
            named[key].append((owner, ai, sid))
    held = []
    for key, node in nodes.items():
        if node.count or node.pending:
            held.append({
                "states": named[key],
                "installed": [(i[VALUES], i[T0], i[T1], i[BORN], i[DEAD]) for i in node.all_instances()],
                "pending": [(i[VALUES], i[T0], i[T1], i[BORN]) for i in node.pending]})
    return {"version": VERSION, "epoch": eng._epoch, "closed": eng._closed, "installed_t1": eng._installed_t1,
            "epoch_events": eng._epoch_events, "owners": owners, "stats": dataclasses.asdict(eng.stats),
            "instance_fields": list(INSTANCE_FIELDS), "nodes": held}


def _saved_nodes(state: dict) -> list[dict]:
    """The ``nodes`` of ``state`` in the current layout, whatever its version."""
    version = state.get("version")
    if version == VERSION:
        return state["nodes"]
    if version == 1:
        return [{"states": names, "installed": installed, "pending": pending}
                for names, installed, pending in state["nodes"]]
    raise EngineError(f"unknown engine state version {version!r}: this build reads versions 1 to {VERSION}; "
                      "was the snapshot written by a newer cayuga?")


def import_state(eng: "EngineLike", state: dict) -> dict[str, int]:
    """Load what :func:`export_state` gave (any version) into ``eng``, whose
    owners must have been added afresh in their original order (with no event
    fed since). Owners that are gone are skipped (their instances with them);
    generations are mapped onto the new ones, so each owner sees exactly the
    instances it saw. Returns counts: instances loaded, nodes skipped,
    clashes (two saved nodes that are one node now: a merge the saved network
    did not have) and instances dropped (at a node whose owners that saw them
    are all gone)."""
    saved_nodes = _saved_nodes(state)
    holdings = eng.holdings()
    live = sorted((g, o) for o, g in state["owners"].items() if o in holdings)
    old_gens = [g for g, _o in live]
    new_gens = [holdings[o].gen for _g, o in live]
    if new_gens != sorted(new_gens):
        raise EngineError("owners were added again in another order than they were saved in")

    def born(b: int) -> int:  # the generation of the newest live owner added no later than b
        i = bisect_right(old_gens, b)
        return new_gens[i - 1] if i else 0

    where: dict[str, dict] = {}
    filled: dict[int, Node] = {}
    dead: list[tuple[Node, list]] = []
    pend: list[tuple[Node, list]] = []
    loaded = skipped = clashes = dropped = 0
    for saved in saved_nodes:
        installed, pending = saved["installed"], saved["pending"]
        node = None
        for owner, ai, sid in saved["states"]:
            if owner not in holdings:
                continue
            states = where.get(owner)
            if states is None:
                states = where[owner] = {(a, s): n for a, s, n in holdings[owner].states}
            node = states.get((ai, sid))
            if node is not None:
                break
        if node is None:
            skipped += 1
            continue
        if id(node) in filled:
            clashes += 1
        filled[id(node)] = node
        # an instance whose run began before the node's oldest live owner came belongs to none of
        # them (an owner that is gone saw it): no edge takes it, no output names it, so it is not
        # kept, and every instance at a node is its oldest owner's (introspect.owned_count)
        oldest = node.min_gen
        insts = [(new_instance(v, t0, t1, nb), affected) for v, t0, t1, b, affected in installed
                 if (nb := born(b)) >= oldest]
        node.pending.extend(inst for inst, _affected in insts)
        dead += [(node, inst) for inst, affected in insts if affected]
        kept = [new_instance(v, t0, t1, nb) for v, t0, t1, b in pending if (nb := born(b)) >= oldest]
        pend.append((node, kept))
        loaded += len(insts) + len(kept)
        dropped += len(installed) + len(pending) - len(insts) - len(kept)
    # install the saved instances as an epoch's close would, then put back what the epoch in
    # progress had: its affected marks and its pending instances
    eng._dirty = list(filled.values())
    for node in eng._dirty:
        node.dirty = True
    eng._closed = False
    eng.close_epoch()
    for node, inst in dead:
        mark_dead(node, inst)
        if not node.dirty:
            node.dirty = True
            eng._dirty.append(node)
    for node, insts in pend:
        if insts:
            node.pending.extend(insts)
            if not node.dirty:
                node.dirty = True
                eng._dirty.append(node)
    eng._epoch = state["epoch"]
    eng._closed = state["closed"]
    eng._installed_t1 = state["installed_t1"]
    eng._epoch_events = state["epoch_events"]
    for k, v in state["stats"].items():
        setattr(eng.stats, k, v)
    return {"instances": loaded, "skipped": skipped, "clashes": clashes, "dropped": dropped}


def clear_state(eng: "EngineLike") -> None:
    """Take every instance out of ``eng`` (installed, pending, affected marks)
    and forget the epoch and the counters, so that it stands as if its owners
    had just been added: :func:`import_state` may follow. This lets one engine
    (its compiled network) serve many independent states in turn, e.g. one per
    key group of a streaming job (clients/spark/stream.py), instead of being
    built again for each. Call it between events."""
    for holding in eng.holdings().values():
        for _ai, _sid, node in holding.states:
            if node.stream is None or node.is_start:
                continue
            node.instances.clear()
            if node.ai_ev >= 0:
                node.buckets.clear()
            node.pending.clear()
            node.ndead = 0
            node.dead_keys = None
            node.count = 0
            node.dirty = False
            if node.active:
                node.plan.set_active(node, False)
    eng._dirty = []
    eng._resub.clear()
    eng._epoch = None
    eng._closed = False
    eng._installed_t1 = None
    eng._epoch_events = 0
    for f in dataclasses.fields(eng.stats):
        setattr(eng.stats, f.name, f.default)
