"""Row scaling's share of the engine thread's work (server/workers/placement.py
says which subscriptions are split, and how): the events of a batch dealt to
the workers by their key values, and a row-scaled subscription's witnesses,
made by several workers, merged into one order before they are numbered.

The order: by the place in the queue's order of the event that made each
witness, then by worker, then in the order that worker's engine made them. A
witness is made while one event is fed (air/engine/runtime.py: an end state
is reached during ``feed``), and the events of one key value all go to one
worker, so the order depends neither on how the queue was cut into batches
nor on the workers' timing: two runs of the same input, and a recovery's
replay, number the witnesses alike. (Within one event the witnesses of one
key come from one engine, in its order, as one engine's would.)

Limits, as built: one key group per worker (a snapshot's row-scaled instances
restore into the same worker count only: another count marks them inexact,
server/workers/dispatch.py's ``import_snapshot``); a subscription's own cap
(``max_instances``, ``max_state_bytes``) is split: each of N workers holds 1/N of it
(rounded up) for its key group (server/budgetcheck.py's ``shares``); a recovery applies a
recorded shedding of a row-scaled subscription on every worker (which worker
shed is not recorded: the subscription was marked inexact by it already); the
witnesses of its internal streams a client watches (not numbered) come worker
by worker, not merged.
"""

from __future__ import annotations

from typing import Callable, Mapping

from air.engine import EngineError
from air.partitioning import key_group
from server.delivery.encoding import EncodedBatch
from server.workers.placement import ALL, Placement, route_event


def split(batch: list, placement: Placement) -> tuple[dict[int, list], dict[int, list[int]]]:
    """Each worker's events of ``batch`` and their places in it."""
    n, route = placement.workers, placement.route
    parts: dict[int, list] = {}
    places: dict[int, list[int]] = {}
    routers: dict[str, Callable] = placement.routers()  # per stream, an event's values -> its workers
    for i, ev in enumerate(batch):
        to = routers.get(ev.stream)
        if to is None:
            to = routers[ev.stream] = _router(*route(ev.stream), n)
        for w in to(ev.values):
            got = parts.get(w)
            if got is None:
                got = parts[w] = []
                places[w] = []
            got.append(ev)
            places[w].append(i)
    return parts, places


def _router(whole: tuple[int, ...], keyed: tuple[int, ...], consts: tuple, n: int) -> Callable:
    """:func:`route_event` for one stream's route, with the common ones taken short: every event to
    the same workers, or (the per-value queries placed whole) by one attribute's value alone."""
    if not keyed and not consts:
        return lambda _values: whole
    if not keyed and not whole and len(consts) == 1:
        (at, by_value), = consts
        get = by_value.get
        return lambda values: get(values[at], ())
    if len(keyed) == 1 and not whole and not consts:  # the row-scaled ones' (Rising's): by one key's group
        return _by_key(keyed[0], n)
    return lambda values: route_event(values, whole, keyed, consts, n)


#: Key values whose group :func:`_by_key` remembers, per stream's router, before it forgets them all.
KEY_MEMO = 1 << 16


def _by_key(at: int, n: int) -> Callable:
    """:func:`route_event` of a route by one key alone: the key's group, remembered for a
    string key (names, ids: the usual keys) so that a value seen before costs one lookup.
    Other values take the hash each time: ``1`` and ``1.0`` are one dict key but two groups."""
    memo: dict[str, tuple[int]] = {}

    def to(values) -> tuple[int, ...]:
        v = values[at]
        if type(v) is str:
            got = memo.get(v)
            if got is None:
                if len(memo) >= KEY_MEMO:
                    memo.clear()
                got = memo[v] = (key_group(v, n),)
            return got
        return (key_group(v, n),)

    return to


class Merge:
    """A batch's witnesses of the row-scaled subscriptions, from each worker, in one order."""

    def __init__(self) -> None:
        self.groups: dict[str, tuple[list, list, list]] = {}  # sid -> (places in the batch, streams, payloads)

    def take(self, w: int, groups: list, places: list, where: list[int]) -> list:
        """Keep worker ``w``'s witnesses of the subscriptions ``places`` names (each
        with the place in the batch of the event that made it: ``where`` maps the
        worker's places to the batch's); the other groups are returned. Workers
        come in order, each one's witnesses in the order its engine made them."""
        mine = {sid: ps for sid, ps in places}
        rest = []
        for group in groups:
            sid, streams, payloads = group
            ps = mine.get(sid)
            if ps is None:
                rest.append(group)
                continue
            got = self.groups.get(sid)
            if got is None:
                got = self.groups[sid] = ([], [], [])
            got[0].extend(map(where.__getitem__, ps))
            got[1].extend(streams)
            got[2].extend(payloads)
        return rest

    def batch(self) -> EncodedBatch:
        """The witnesses by (place, worker, engine order): a stable sort on the place alone."""
        out = []
        for sid, (keys, streams, payloads) in self.groups.items():
            order = sorted(range(len(keys)), key=keys.__getitem__)
            out.append((sid, list(map(streams.__getitem__, order)), list(map(payloads.__getitem__, order))))
        return EncodedBatch(out, [])


def runs_on(placement: Placement, sid: str) -> str:
    """Where ``sid`` runs, as GET /subscriptions/{id} says it."""
    if placement.worker_of.get(sid) != ALL:
        return f"worker {placement.of(sid)}"
    n = placement.workers
    return (f"workers {', '.join(map(str, range(n)))}: row-scaled by {placement.describe_key(sid)}, "
            f"{n} key groups (one per worker)")


def recorded(placement: Placement) -> dict[str, dict[str, str]]:
    """What a snapshot records of the row scaling: each row-scaled subscription's key."""
    return {sid: dict(key) for sid, key in sorted(placement.rows.items())}


def check_snapshot(name: str, snap: Mapping, placement: Placement) -> None:
    """Raise :class:`EngineError` when the snapshot's instances cannot be given to the
    workers as they are: a row-scaled subscription's instances are split by the key
    groups of the worker count they were taken with (moving instances between key
    groups is not built), and one placed whole holds all of them in one engine."""
    saved, now = snap.get("rows", {}), recorded(placement)
    workers = snap.get("workers", 1)
    then = snap.get("placement")  # the subscriptions placed when it was taken (None: not recorded)
    if then is not None:  # one deleted since, or registered since, has no partial matches in both: it cannot differ
        saved = {sid: key for sid, key in saved.items() if sid in placement.worker_of}
        now = {sid: key for sid, key in now.items() if sid in then}
    if not saved and not now:
        return
    if workers != placement.workers:
        raise EngineError(f"the snapshot {name} was taken with engine_workers {workers}, and this server runs "
                          f"{placement.workers} with row-scaled subscriptions ({', '.join(sorted(saved or now))}): "
                          "their partial matches are split by key groups that differ")
    if saved != now:
        differ = sorted(set(saved) ^ set(now) | {s for s in saved if s in now and saved[s] != now[s]})
        raise EngineError(f"the snapshot {name} was taken with other row-scaled subscriptions ({', '.join(differ)} "
                          "split otherwise: the row_scaling setting changed): their partial matches are not "
                          "where the workers hold them now")
