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

from collections import deque
from functools import partial
from itertools import repeat
from operator import attrgetter, call, itemgetter
from typing import Callable, Mapping

from air.engine import EngineError
from air.partitioning import key_group
from server.delivery.encoding import EncodedBatch
from server.workers.placement import ALL, Placement, route_event


def split(batch: list, placement: Placement, stream: str | None = None
          ) -> tuple[dict[int, list], dict[int, list[int]] | None]:
    """Each worker's events of ``batch`` (in its order), and their places in it where a
    subscription is row-scaled (its witnesses are merged by them; None otherwise).
    ``stream``: the batch's one stream, when the caller has counted them.

    For a batch of one stream, the usual routes (every event to the same workers; by one
    attribute's constant values, as the per-value queries are placed; by one key's group,
    as Rising row-scaled is) give each event's destination as a small int by C-level
    passes, and the events are dealt by ``map`` of ``list.append`` over them: no Python
    loop per event (BENCHMARKS.md, "Engine workers, round 11")."""
    routers: dict[str, _Router] = placement.routers()  # per stream, emptied when the placement changes

    def router(name: str) -> _Router:
        got = routers.get(name)
        if got is None:
            got = routers[name] = _router(*placement.route(name), placement.workers)
        return got

    if stream is not None:
        got = router(stream)
        ks, dests = got.of_batch(batch), got.dests
    else:  # several streams: each event's workers, then numbered (a pass each)
        of = {name: router(name) for name in set(map(_STREAM, batch))}
        index: dict[tuple[int, ...], int] = {}
        ks = [index.setdefault(r.dests[r.of_values(ev.values)], len(index))
              for ev in batch for r in (of[ev.stream],)]
        dests = list(index)
    return _deal(batch, ks, dests, bool(placement.rows))


_STREAM, _VALUES = attrgetter("stream"), attrgetter("values")


def _deal(batch: list, ks: list[int], dests: list[tuple[int, ...]], with_places: bool
          ) -> tuple[dict[int, list], dict[int, list[int]] | None]:
    """``batch`` dealt to the workers of each event's destination (``dests[ks[i]]``)."""
    parts: dict[int, list] = {}
    places: dict[int, list[int]] | None = {} if with_places else None
    if not batch:
        return parts, places
    if ks.count(ks[0]) == len(ks):  # every event to the same workers (a route that goes whole, or one value)
        for w in dests[ks[0]]:
            parts[w] = batch
            if places is not None:
                places[w] = list(range(len(batch)))
        return parts, places
    if all(len(ws) <= 1 for ws in dests):  # (each destination one worker, or none)
        _by_append(batch, ks, dests, parts)
        if places is not None:
            _by_append(range(len(batch)), ks, dests, places)
    else:  # an event for several workers (a value's subscriptions spread, or routes of two kinds)
        add = [_adder(ws, parts) for ws in dests]
        deque(map(call, map(add.__getitem__, ks), batch), 0)
        if places is not None:
            add = [_adder(ws, places) for ws in dests]
            deque(map(call, map(add.__getitem__, ks), range(len(batch))), 0)
    for into in (parts, places):
        for w in [w for w, got in (into or {}).items() if not got]:
            del into[w]
    return parts, places


def _by_append(items, ks: list[int], dests: list[tuple[int, ...]], into: dict[int, list]) -> None:
    """``items`` onto the list of each one's worker (``dests`` of one worker or none: dropped)."""
    lists = [into.setdefault(ws[0], []) if ws else [] for ws in dests]
    deque(map(list.append, map(lists.__getitem__, ks), items), 0)


def _adder(ws: tuple[int, ...], into: dict[int, list]) -> Callable:
    """What puts an item on the lists of workers ``ws`` (made in ``into`` as needed)."""
    if len(ws) == 1:
        return into.setdefault(ws[0], []).append
    if not ws:
        return id  # (a C-level function of one argument that keeps nothing)
    return partial(_append_to_each, [into.setdefault(w, []) for w in ws])


def _append_to_each(lists: list[list], item) -> None:
    for got in lists:
        got.append(item)


class _Router:
    """One stream's route (:meth:`Placement.route`) as destinations: ``dests`` the
    distinct sets of workers its events go to (a route that goes whole has one; one by a
    key has each worker's; one by constants, none first, for values no route names),
    ``of_values`` an event's destination (an index into ``dests``) by its values,
    ``of_batch`` the destination of each event of a batch of the stream, by C-level passes
    where the route allows."""

    __slots__ = ("dests", "of_values", "of_batch")

    def __init__(self, dests: list[tuple[int, ...]], of_values: Callable, of_batch: Callable | None = None) -> None:
        self.dests, self.of_values = dests, of_values
        self.of_batch = of_batch or (lambda events: list(map(of_values, map(_VALUES, events))))


def _router(whole: tuple[int, ...], keyed: tuple[int, ...], consts: tuple, n: int) -> _Router:
    """:func:`route_event` for one stream's route, with the common ones taken short: every event to
    the same workers, by one attribute's value alone (the per-value queries placed whole), or by
    one key's group alone (Rising row-scaled)."""
    if not keyed and not consts:
        return _Router([whole], lambda _values: 0, lambda events: [0] * len(events))
    if not keyed and not whole and len(consts) == 1:
        (at, by_value), = consts
        dests = [()] + list(dict.fromkeys(by_value.values()))
        get, key = {v: dests.index(ws) for v, ws in by_value.items()}.get, itemgetter(at)
        return _Router(dests, lambda values: get(values[at], 0),
                       lambda events: list(map(get, map(key, map(_VALUES, events)), repeat(0, len(events)))))
    if len(keyed) == 1 and not whole and not consts:
        return _by_key(keyed[0], n)
    index: dict[tuple[int, ...], int] = {whole: 0}  # (grows with the combinations met)
    dests = [whole]

    def of_values(values) -> int:
        ws = tuple(route_event(values, whole, keyed, consts, n))
        k = index.get(ws)
        if k is None:
            k = index[ws] = len(dests)
            dests.append(ws)
        return k

    return _Router(dests, of_values)


#: Key values whose group :func:`_by_key` remembers, per stream's router, before it forgets them all.
KEY_MEMO = 1 << 16


def _by_key(at: int, n: int) -> _Router:
    """:func:`route_event` of a route by one key alone: the key's group (its destination, one
    worker), remembered for a string key (names, ids: the usual keys) so that a value seen
    before costs one lookup (a batch's: one C-level pass). Other values take the hash each
    time: ``1`` and ``1.0`` are one dict key but two groups (a dict of strings finds neither)."""
    memo: dict[str, int] = {}
    key = itemgetter(at)

    def of_value(v) -> int:
        if type(v) is str:
            got = memo.get(v)
            if got is None:
                if len(memo) >= KEY_MEMO:
                    memo.clear()
                got = memo[v] = key_group(v, n)
            return got
        return key_group(v, n)

    def of_batch(events: list) -> list[int]:
        keys = list(map(key, map(_VALUES, events)))
        got = list(map(memo.get, keys))
        if None in got:
            got = [of_value(v) if g is None else g for v, g in zip(keys, got)]
        return got

    return _Router([(g,) for g in range(n)], lambda values: of_value(values[at]), of_batch)


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
