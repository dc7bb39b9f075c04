"""One owner's state moved from the engine that ran it alone into a running
engine (a backfill's hand-over: docs/design/backfill.md).

:func:`unmerged` adds an owner with nodes of its own (no state shared with
the owners already there: their instances are theirs, and the ones imported
below must be seen by this owner only; owners added later may still share
its nodes, and see none of its older instances, as always). :func:`import_owner`
then loads what :func:`air.engine.state.export_state` gave of an engine that
ran only this owner over the same events, at the same epoch, between two
events, leaving every other owner's instances, the epoch and the counters
as they are. Works on any :class:`~air.engine.enginelike.EngineLike`.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from air.engine.errors import EngineError
from air.engine.network import new_instance
from air.engine.state import _saved_nodes, mark_dead

if TYPE_CHECKING:
    from air.engine.enginelike import EngineLike


@contextmanager
def unmerged(eng: "EngineLike") -> Iterator[None]:
    """Owners added inside get nodes of their own (the engine's ``merge`` off for them)."""
    net = eng.network
    opt = net.opt
    net.opt = dataclasses.replace(opt, merge=False)
    try:
        yield
    finally:
        net.opt = opt


def import_owner(eng: "EngineLike", state: dict, owner: str) -> dict[str, int]:
    """Load ``owner``'s instances of ``state`` into ``eng``, where ``owner`` was
    just added :func:`unmerged` and nothing was fed since. The epoch of
    ``state`` must be the engine's (both took the same last event), or
    ``state`` must hold no instance, or the engine has taken no event of the
    state's epoch (it then moves on to it). Returns counts."""
    holdings = eng.holdings()
    if owner not in holdings:
        raise EngineError(f"no automata loaded for owner {owner!r}")
    if state["owners"].get(owner) is None:
        raise EngineError(f"the state has no owner {owner!r}")
    saved_nodes = _saved_nodes(state)
    epoch = state["epoch"]
    if saved_nodes and epoch != eng._epoch:
        if eng._epoch is not None and (epoch is None or eng._epoch > epoch):
            raise EngineError(f"the state is at epoch {epoch!r}, the engine at {eng._epoch!r}: the engine took "
                              "events the state did not")
        # the engine took no event of the state's epoch (an engine worker is fed only the streams its own
        # subscriptions read): every event to come is at least that late, so its epoch would close at the
        # next one anyway; close it now and stand at the state's epoch, as if it had begun with no event
        if eng._epoch is not None and not eng._closed:
            eng.close_epoch()
        eng._epoch, eng._closed, eng._epoch_events = epoch, False, 0
    gen = holdings[owner].gen
    states = {(a, s): n for a, s, n in holdings[owner].states}
    loaded = 0
    nodes = []
    for saved in saved_nodes:
        node = next((states.get((ai, sid)) for o, ai, sid in saved["states"] if o == owner), None)
        if node is None:
            continue
        if node.count or node.pending:
            raise EngineError(f"a node of {owner!r} already holds instances: it was not added afresh, unmerged")
        installed = saved["installed"]
        insts = [new_instance(v, t0, t1, gen) for v, t0, t1, _b, _affected in installed]
        nodes.append((node, insts, [i for i, (*_, affected) in zip(insts, installed) if affected],
                      [new_instance(v, t0, t1, gen) for v, t0, t1, _b in saved["pending"]]))
        loaded += len(installed) + len(saved["pending"])
    if not nodes:
        return {"instances": 0}
    # install as an epoch's close would, for these nodes only: the engine's own epoch goes on untouched
    kept_dirty, kept_closed, kept_t1, kept_epochs = eng._dirty, eng._closed, eng._installed_t1, eng.stats.epochs
    eng._dirty = []
    for node, insts, _dead, _pending in nodes:
        node.pending.extend(insts)
        node.dirty = True
        eng._dirty.append(node)
    eng._closed = False
    try:
        eng.close_epoch()
    finally:
        eng._closed, eng.stats.epochs = kept_closed, kept_epochs
        eng._dirty = kept_dirty
        saved_t1 = state["installed_t1"]
        if kept_t1 is None or (saved_t1 is not None and saved_t1 > kept_t1):
            eng._installed_t1 = saved_t1 if saved_t1 is not None else kept_t1
        else:
            eng._installed_t1 = kept_t1
    # then what the epoch in progress had: its affected marks and its pending instances
    for node, _insts, dead, pending in nodes:
        for inst in dead:
            mark_dead(node, inst)
        if pending:
            node.pending.extend(pending)
        if (dead or pending) and not node.dirty:
            node.dirty = True
            eng._dirty.append(node)
    return {"instances": loaded}
