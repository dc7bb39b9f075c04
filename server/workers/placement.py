"""Which engine worker runs each subscription (issue 32, stage 2: column
scaling, the "column" partitioning of distributed Cayuga, seed 001).

Subscriptions linked by resubscription — one reads a stream another publishes
— must run on one worker: resubscription happens within an epoch, inside one
engine. Every other subscription goes to the worker with the least estimated
cost (its automata's states; ties to the lowest number), so the workers share
the work. A subscription that would link subscriptions already on two
different workers is refused with the reason (moving a subscription's state
between workers is not built). The choice is stored (``save``) so that a
restart places every subscription where its snapshot's instances are.

Events go only to the workers whose subscriptions read their stream
(:meth:`Placement.readers`): a worker that gets no events of a stream is not
sent them.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from air.engine import EngineError

log = logging.getLogger("cayuga.daemon")


class Placement:
    """See the module's docstring. ``saved``: sid -> worker of a previous run
    (used when it is still a valid choice)."""

    def __init__(self, workers: int, saved: dict[str, int] | None = None,
                 save: Callable[[str, int], None] | None = None) -> None:
        self.workers = max(workers, 1)
        self.worker_of: dict[str, int] = {}
        self.cost = [0] * self.workers
        self._reads: dict[str, frozenset[str]] = {}
        self._publishes: dict[str, frozenset[str]] = {}
        self._costs: dict[str, int] = {}
        self._saved = dict(saved or {})
        self._save = save
        self.version = 0  # bumped by every change (the routes are made again)
        self._routes: dict[str, tuple[int, ...]] = {}
        self._routes_version = -1

    def place(self, sid: str, reads: Iterable[str], publishes: Iterable[str], cost: int = 1) -> int:
        """The worker ``sid`` runs on (raises :class:`EngineError` when it cannot run on one)."""
        reads, publishes = frozenset(reads), frozenset(publishes)
        if sid in self.worker_of:
            return self.worker_of[sid]
        linked: dict[int, list[str]] = {}
        for other, pubs in self._publishes.items():
            if pubs & reads or self._reads[other] & publishes:
                linked.setdefault(self.worker_of[other], []).append(other)
        if len(linked) > 1:
            where = "; ".join(f"worker {w}: {', '.join(sorted(subs))}" for w, subs in sorted(linked.items()))
            raise EngineError(f"{sid} would link subscriptions that run on different engine workers ({where}): "
                              "a subscription reading another's output runs on that one's worker, and these are "
                              "on two. Register it with engine_workers: 1, or delete and register the linked "
                              "subscriptions again after it")
        saved = self._saved.pop(sid, None)
        if saved is not None and 0 <= saved < self.workers and (not linked or saved in linked):
            worker = saved
        elif linked:
            worker = next(iter(linked))
        else:
            worker = min(range(self.workers), key=lambda w: (self.cost[w], w))
        self.worker_of[sid] = worker
        self._reads[sid], self._publishes[sid], self._costs[sid] = reads, publishes, max(cost, 1)
        self.cost[worker] += max(cost, 1)
        self.version += 1
        if self._save is not None:
            try:
                self._save(sid, worker)
            except Exception as exc:  # noqa: BLE001 - a full disk: the registration's own write says so
                log.warning("where subscription %s runs (worker %d) could not be stored (%s): a restart places "
                            "it afresh", sid, worker, exc)
        return worker

    def remove(self, sid: str) -> int | None:
        worker = self.worker_of.pop(sid, None)
        if worker is not None:
            self.cost[worker] -= self._costs.pop(sid)
            del self._reads[sid], self._publishes[sid]
            self.version += 1
        return worker

    def readers(self, stream: str) -> tuple[int, ...]:
        """The workers whose subscriptions read ``stream`` (in order)."""
        if self._routes_version != self.version:
            routes: dict[str, set[int]] = {}
            for sid, reads in self._reads.items():
                for s in reads:
                    routes.setdefault(s, set()).add(self.worker_of[sid])
            self._routes = {s: tuple(sorted(ws)) for s, ws in routes.items()}
            self._routes_version = self.version
        return self._routes.get(stream, ())

    def count_on(self, worker: int) -> int:
        """How many subscriptions run on ``worker``."""
        return sum(1 for w in self.worker_of.values() if w == worker)

    def of(self, sid: str) -> int:
        """The worker of a subscription placed here (0 when it is not: it has no automata there)."""
        return self.worker_of.get(sid, 0)
