"""Which engine worker runs each subscription (issue 32, stage 2: the
"column" and "row" partitioning of distributed Cayuga, seed 001).

Column scaling: subscriptions linked by resubscription — one reads a stream
another publishes — must run on one worker: resubscription happens within an
epoch, inside one engine. Every other subscription goes to the worker with the
least estimated cost (its automata's states; ties to the lowest number), so
the workers share the work; but one with a constant route (below) goes where
others of the same value run, while that worker is no more than
:data:`AFFINITY_SLACK` of the mean cost (or its own cost) ahead of the least
loaded one: the events of one value then go to one worker, not to each worker
that drew one of its subscriptions (10,000 per-symbol queries of 999 symbols
registered in turn over 8 workers: each event went to all 8). A subscription
that would link subscriptions already on two different workers is refused with
the reason (moving a subscription's state between workers is not built). The
choice is stored (``save``) so that a restart places every subscription where
its snapshot's instances are.

Row scaling (``row_scaling``, server/config.py): a subscription whose
automata have a partition key (air/partitioning.py: every instance depends on
the events of one value of, say, ``Stock.Name``) runs on *every* worker, each
on one key group: worker ``w`` owns the values whose :func:`key_group` is
``w`` (one group per worker), its copy of the automata starts instances only
for those (:func:`air.partitioning.restrict_to_group`), and each event of the
key's stream goes to the worker of its key value. The rule (``auto``): split
a subscription that keeps instances (a NEXT, a FOLD: its cost grows with the
events of every key, and one worker would carry it all), has a key, has no
constant route (it reads one value: splitting it buys nothing), and is linked
to no subscription placed whole. A subscription that reads or publishes a
row-scaled one's streams is row-scaled with it when the planner finds one key
for them all (the same on the streams they share), and refused otherwise.
``on`` splits every subscription with a key; ``off`` none. A row-scaled
subscription counts a worker's share of its cost on each worker.

Events go only to the workers that need them (:meth:`Placement.route`): those
whose subscriptions read the stream whole, for each key of a row-scaled
subscription on it the worker of the event's key value, and the workers of
subscriptions placed whole that have a constant route (air/partitioning.py:
``Name = 'IBM'`` at every step: the events of other values cannot change their
witnesses) when the event has that value (``row_scaling: off`` turns this off too).
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence

from air.engine import EngineError
from air.model import Automaton, StreamSchema
from air.partitioning import constant_route, infer_key, is_stateful, key_group

log = logging.getLogger("cayuga.daemon")

#: ``worker_of`` of a row-scaled subscription: every worker runs it, each on its key group.
ALL = -1
#: How far ahead of the least loaded worker, as a share of the workers' mean cost, the worker of
#: a constant route's value may be and still be given another subscription of that value.
AFFINITY_SLACK = 1 / 16


class Placement:
    """See the module's docstring. ``saved``: sid -> worker of a previous run
    (used when it is still a valid choice); ``save``: stores ``[(sid, worker), ...]``
    (each placement at once, or those of a :meth:`saving_once` as it ends); ``schema``: a stream's schema (the
    catalogue's), for the planner; ``rows``: the ``row_scaling`` setting."""

    def __init__(self, workers: int, saved: dict[str, int] | None = None,
                 save: Callable[[list[tuple[str, int]]], None] | None = None,
                 schema: Callable[[str], StreamSchema | None] | None = None, rows: str = "auto") -> None:
        self.workers = max(workers, 1)
        self.worker_of: dict[str, int] = {}
        self.cost = [0] * self.workers
        self.row_mode = rows if self.workers > 1 else "off"
        self.schema = schema
        self.rows: dict[str, dict[str, str]] = {}  # row-scaled sid -> its key (input stream -> attribute)
        self.consts: dict[str, tuple[dict[str, str], object]] = {}  # sid placed whole -> its constant route
        self._mates: dict[tuple, Counter] = {}  # a constant route -> its subscriptions on each worker
        self._automata: dict[str, tuple[Automaton, ...]] = {}  # of the row-scaled ones (a joint key is checked)
        self._reads: dict[str, frozenset[str]] = {}
        self._publishes: dict[str, frozenset[str]] = {}
        self._costs: dict[str, int] = {}
        self._readers: dict[str, set[str]] = {}  # stream -> the subscriptions that read it
        self._publishers: dict[str, set[str]] = {}  # stream -> those that publish it
        self._order: dict[str, int] = {}  # sid -> when it was placed
        self._placed = 0
        self._saved = dict(saved or {})
        self._save = save
        self._unsaved: dict[str, int] = {}  # placed, not stored yet (inside :meth:`saving_once`)
        self._holding = 0
        self.version = 0  # bumped by every change (the routes are made again)
        self._routes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._routes_version = -1
        self._counts: list[int] = []
        self._counts_version = -1
        self._routers: dict[str, object] = {}  # rows.py's per-stream routers, kept while the placement holds
        self._routers_version = -1
        self.last_plan: tuple | None = None

    def place(self, sid: str, reads: Iterable[str], publishes: Iterable[str], cost: int = 1,
              automata: Sequence[Automaton] | Callable[[], Sequence[Automaton]] = (),
              plan: tuple | None = None) -> int:
        """The worker ``sid`` runs on, or :data:`ALL` when it is row-scaled (then
        :attr:`rows` has its key); raises :class:`EngineError` when it cannot be placed.
        ``automata`` (or a function that builds them, called only when the planner needs
        them) are its automata. ``plan``: (key, constant route) a query of the same shape
        was given (server/workers/mirror.py), used when it is linked to no other;
        :attr:`last_plan` is what this call planned for such a one (else None)."""
        reads, publishes = frozenset(reads), frozenset(publishes)
        build = automata if callable(automata) else None
        built = None if build is not None else tuple(automata)

        def autos() -> tuple:
            nonlocal built
            if built is None:
                built = tuple(build()) if self.row_mode != "off" else ()
            return built

        self.last_plan = None
        if sid in self.worker_of:
            return self.worker_of[sid]
        linked: dict[int, list[str]] = {}
        others = set().union(*(self._publishers.get(s, ()) for s in reads),
                             *(self._readers.get(s, ()) for s in publishes))
        for other in sorted(others, key=self._order.__getitem__):  # (in registration order, as before)
            linked.setdefault(self.worker_of[other], []).append(other)
        key = const = None
        if ALL in linked:
            key = self._joint_key(sid, linked, autos(), reads, publishes)
        elif len(linked) > 1:
            where = "; ".join(f"worker {w}: {', '.join(sorted(subs))}" for w, subs in sorted(linked.items()))
            raise EngineError(f"{sid} would link subscriptions that run on different engine workers ({where}): "
                              "a subscription reading another's output runs on that one's worker, and these are "
                              "on two. Register it with engine_workers: 1, or delete and register the linked "
                              "subscriptions again after it")
        elif not linked and self.row_mode != "off":
            if plan is not None:
                key, const = plan
            else:
                key = self._own_key(autos(), reads, publishes)
                if key is None and autos():
                    schemas = self._schemas(reads)
                    route = constant_route(autos(), schemas) if len(schemas) == len(reads) else None
                    if route is not None:
                        const = (route.as_dict(), route.value)
            self.last_plan = (key, const)
        if const is not None:  # it reads one value's events: its worker is sent only those
            self.consts[sid] = const
        cost = max(cost, 1)
        if key is not None:
            worker = ALL
            self.rows[sid], self._automata[sid] = key, autos()
            for w in range(self.workers):
                self.cost[w] += -(-cost // self.workers)
        else:
            saved = self._saved.pop(sid, None)
            if saved is not None and 0 <= saved < self.workers and (not linked or saved in linked):
                worker = saved
            elif linked:
                worker = next(iter(linked))
            else:
                worker = self._least(cost, const)
            self.cost[worker] += cost
            if const is not None:
                self._mates.setdefault(_route_of(const), Counter())[worker] += 1
        self.worker_of[sid] = worker
        self._reads[sid], self._publishes[sid], self._costs[sid] = reads, publishes, cost
        for s in reads:
            self._readers.setdefault(s, set()).add(sid)
        for s in publishes:
            self._publishers.setdefault(s, set()).add(sid)
        self._order[sid] = self._placed = self._placed + 1
        self.version += 1
        if self._save is not None:
            self._unsaved[sid] = worker
            if not self._holding:
                self._store()
        return worker

    @contextmanager
    def saving_once(self) -> Iterator[None]:
        """What is placed inside is stored once, as it ends (one transaction of the store's):
        a registration's chunk of thousands of subscriptions placed one by one, each in a
        transaction of its own, held the engine thread (and so every worker's events) 0.47 ms a
        subscription (BENCHMARKS.md, "Engine workers, round 25")."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding:
                self._store()

    def _store(self) -> None:
        unsaved, self._unsaved = self._unsaved, {}
        if not unsaved or self._save is None:
            return
        try:
            self._save(list(unsaved.items()))
        except Exception as exc:  # noqa: BLE001 - a full disk: the registration's own write says so
            named = ", ".join(f"{sid} (worker {w})" for sid, w in list(unsaved.items())[:5])
            log.warning("where %d subscriptions run could not be stored (%s): a restart places them afresh: %s%s",
                        len(unsaved), exc, named, ", ..." if len(unsaved) > 5 else "")

    def _least(self, cost: int, const: tuple | None) -> int:
        """The worker for a subscription placed whole and linked to none: the least loaded
        (ties to the lowest number), or, for a constant route, the least loaded of those that
        run its value's subscriptions while it is within the slack (see the module's docstring)."""
        least = min(range(self.workers), key=lambda w: (self.cost[w], w))
        mates = self._mates.get(_route_of(const)) if const is not None else None
        if mates:
            mate = min(mates, key=lambda w: (self.cost[w], w))
            if self.cost[mate] - self.cost[least] <= max(cost, sum(self.cost) / self.workers * AFFINITY_SLACK):
                return mate
        return least

    def _schemas(self, streams: Iterable[str]) -> dict[str, StreamSchema]:
        out = {}
        for s in streams:
            schema = self.schema(s) if self.schema is not None else None
            if schema is not None:
                out[s] = schema
        return out

    def _own_key(self, automata: Sequence[Automaton], reads: frozenset[str],
                 publishes: frozenset[str]) -> dict[str, str] | None:
        """The key to split a subscription linked to no other by (the module's rule), or None."""
        if self.row_mode == "off" or not automata:
            return None
        external = reads - publishes
        schemas = self._schemas(external)
        if len(schemas) < len(external):
            return None  # it reads a stream nobody declared or publishes yet
        if self.row_mode == "auto" and (not is_stateful(automata) or constant_route(automata, schemas) is not None):
            return None
        key = infer_key(automata, schemas, external=external)
        return key.as_dict() if key is not None else None

    def _joint_key(self, sid: str, linked: dict[int, list[str]], automata: Sequence[Automaton],
                   reads: frozenset[str], publishes: frozenset[str]) -> dict[str, str]:
        """The key of ``sid`` linked to row-scaled subscriptions: one key for them all, or refused."""
        rowed = sorted(linked[ALL])
        names = ", ".join(rowed)
        if len(linked) > 1:
            whole = "; ".join(f"worker {w}: {', '.join(sorted(s))}" for w, s in sorted(linked.items()) if w != ALL)
            raise EngineError(f"{sid} would link subscriptions that run on different engine workers (row-scaled "
                              f"over all of them: {names}; {whole}): a subscription reading another's output runs "
                              "where that one runs. Register it with engine_workers: 1 or row_scaling: off, or "
                              "delete and register the linked subscriptions again after it")
        group = list(dict.fromkeys(o for o in self.rows if o in rowed))
        autos = [a for o in group for a in self._automata[o]] + list(automata)
        read = set(reads).union(*(self._reads[o] for o in group))
        pub = set(publishes).union(*(self._publishes[o] for o in group))
        external = read - pub
        schemas = self._schemas(external)
        key = infer_key(autos, schemas, external=external) if len(schemas) == len(external) else None
        if key is not None:
            key_d = key.as_dict()
            if all(self.rows[o].get(s, a) == a and key_d.get(s, a) == a
                   for o in group for s, a in self.rows[o].items()):
                return key_d
        raise EngineError(f"{sid} reads or publishes streams of row-scaled subscriptions ({names}: split over "
                          f"the engine workers by {self.describe_key(rowed[0])}) and has no partition key with "
                          "them: it would need the events of every key group. Make it compare the key at every "
                          "step (e.g. $1.Name = $2.Name), or run with engine_workers: 1 or row_scaling: off")

    def remove(self, sid: str) -> int | None:
        self._unsaved.pop(sid, None)  # (placed and removed inside :meth:`saving_once`: nothing to store)
        worker = self.worker_of.pop(sid, None)
        if worker is not None:
            cost = self._costs.pop(sid)
            if worker == ALL:
                del self.rows[sid], self._automata[sid]
                for w in range(self.workers):
                    self.cost[w] -= -(-cost // self.workers)
            else:
                self.cost[worker] -= cost
            const = self.consts.pop(sid, None)
            if const is not None:
                mates = self._mates[_route_of(const)]
                mates[worker] -= 1
                if mates[worker] <= 0:
                    del mates[worker]
                    if not mates:
                        del self._mates[_route_of(const)]
            for s in self._reads[sid]:
                self._readers[s].discard(sid)
            for s in self._publishes[sid]:
                self._publishers[s].discard(sid)
            del self._reads[sid], self._publishes[sid], self._order[sid]
            self.version += 1
        return worker

    def routers(self) -> dict:
        """A dict for rows.py to keep each stream's router in (a function of an event's
        values), emptied whenever the placement changes: made once per change, not per batch."""
        if self._routers_version != self.version:
            self._routers, self._routers_version = {}, self.version
        return self._routers

    def route(self, stream: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple]:
        """Where the events of ``stream`` go: (the workers that take all of them, in
        order; the indexes in the events' values of the keys row-scaled subscriptions
        split it by: each event also goes to :func:`key_group` of each such value;
        ``(index, {value: workers})`` of the constant routes of the subscriptions
        placed whole that read only one value's events: an event with that value
        also goes to those workers)."""
        if self._routes_version != self.version:
            whole: dict[str, set[int]] = {}
            keyed: dict[str, set[str]] = {}
            consts: dict[str, dict[str, dict[object, set[int]]]] = {}
            for sid, reads in self._reads.items():
                w = self.worker_of[sid]
                key = self.rows.get(sid)
                const = self.consts.get(sid)
                for s in reads:
                    if w == ALL:
                        if s in key:
                            keyed.setdefault(s, set()).add(key[s])
                        # (else an internal stream of its own group: no event comes from outside)
                    elif const is not None and s in const[0]:
                        consts.setdefault(s, {}).setdefault(const[0][s], {}).setdefault(const[1], set()).add(w)
                    else:
                        whole.setdefault(s, set()).add(w)
            routes = {}
            for s in set(whole) | set(keyed) | set(consts):
                ws = tuple(sorted(whole.get(s, ())))
                schema = self.schema(s) if self.schema is not None else None
                if len(ws) == self.workers or schema is None:
                    routes[s] = (tuple(range(self.workers)) if schema is None and (keyed.get(s) or consts.get(s))
                                 else ws, (), ())
                    continue
                idx = tuple(sorted(schema.names.index(a) for a in keyed.get(s, ())))
                by_value = tuple((schema.names.index(a), {v: tuple(sorted(x)) for v, x in values.items()})
                                 for a, values in sorted(consts.get(s, {}).items()))
                routes[s] = (ws, idx, by_value)
            self._routes = routes
            self._routes_version = self.version
        return self._routes.get(stream, ((), (), ()))

    def readers(self, stream: str) -> tuple[int, ...]:
        """The workers that may be sent events of ``stream`` (in order)."""
        whole, keyed, consts = self.route(stream)
        return tuple(range(self.workers)) if keyed or consts else whole

    @property
    def split(self) -> bool:
        """Whether some events go to some workers by their values (row scaling, constant routes)."""
        return bool(self.rows or self.consts)

    def count_on(self, worker: int) -> int:
        """How many subscriptions run on ``worker`` (a row-scaled one runs on each): counted once per
        change of the placement, not per call (/health asks for every worker, and with thousands of
        subscriptions a pass per worker per call cost more than the rest of /health)."""
        version = self.version  # (read first: a change meanwhile leaves the counts marked older, so made again)
        if self._counts_version != version:
            placed = Counter(list(self.worker_of.values()))  # (a copy: the engine thread places and removes)
            everywhere = placed.pop(ALL, 0)
            self._counts, self._counts_version = [placed.get(w, 0) + everywhere for w in range(self.workers)], version
        return self._counts[worker]

    def of(self, sid: str) -> int:
        """The worker of a subscription placed whole here (0 when it is not: it has no automata there,
        or it is row-scaled: see :meth:`workers_of`)."""
        return max(self.worker_of.get(sid, 0), 0)

    def workers_of(self, sid: str) -> tuple[int, ...]:
        """Every worker that holds some of ``sid``'s instances."""
        w = self.worker_of.get(sid, 0)
        return tuple(range(self.workers)) if w == ALL else (w,)

    def describe_key(self, sid: str) -> str:
        return ", ".join(f"{s}.{a}" for s, a in sorted(self.rows.get(sid, {}).items()))


def _route_of(const: tuple) -> tuple:
    """A constant route ``({stream: attribute}, value)`` as a dict key."""
    return tuple(sorted(const[0].items())), const[1]


def route_event(values: Sequence, whole: tuple[int, ...], keyed: tuple[int, ...], consts: tuple,
                workers: int) -> tuple[int, ...] | list[int]:
    """The workers an event with ``values`` goes to, in order, by its stream's :meth:`Placement.route`
    (rows.py takes the routes of neither keys nor values short)."""
    out = set(whole)
    for i in keyed:
        out.add(key_group(values[i], workers))
    for i, by_value in consts:
        ws = by_value.get(values[i])
        if ws:
            out.update(ws)
    return sorted(out)

