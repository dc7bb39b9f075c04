"""The main process's engine when engine workers run the automata: the
catalogue (streams, schemas, what each subscription holds in the network)
that registrations are checked and compiled against, and every change to it
sent on to the worker that runs the subscription (server/workers/placement.py;
a stream's declaration to every worker; a row-scaled subscription's automata to
every worker, each copy restricted to that worker's key group), in order, on
that worker's one pipe.

It never sees an event: its nodes hold no instance. What holds instances —
counts, snapshots, shedding — is asked of the workers (server/workers/dispatch.py).
A change a worker refuses where this engine took it would leave the two
apart: it is logged and :attr:`MirroredEngine.diverged` says so (/health is
then degraded); it cannot happen while both run the same code on the same
changes.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Callable, Iterator

from air.engine import Engine, EngineError
from air.model import Automaton, StreamSchema
from air.partitioning import restrict_to_group
from server.workers.link import WorkerGone, WorkerLink
from server.workers.placement import ALL, Placement

log = logging.getLogger("cayuga.daemon")


def _reads_and_publishes(autos) -> tuple[set[str], set[str], int]:
    reads = {s.input_stream for a in autos for s in a.states if s.input_stream}
    publishes = {o.name for a in autos for _s, o in a.outputs}
    return reads, publishes, sum(len(a.states) for a in autos)


class MirroredEngine(Engine):
    """See the module's docstring."""

    def __init__(self, links: list[WorkerLink], placement: Placement | None = None, **kw) -> None:
        super().__init__(**kw)
        self.links = links
        self.placement = placement or Placement(len(links))
        self.diverged: str | None = None
        self._quiet = 0  # inside unmirrored(): a caller mirrors the change itself
        self._shapes: dict[tuple[int, int], tuple[object, int]] = {}  # (id(shape), worker) -> (shape, number there)
        self._numbers = 0
        # what rebuilds a worker that is restarted (server/workers/restart.py): the streams as declared,
        # and per subscription the changes its worker was sent to install it
        self.declared: dict[str, StreamSchema] = {}
        self.recipes: dict[str, list[tuple[str, tuple]]] = {}
        self.reads_of: dict[str, frozenset[str]] = {}  # the streams each subscription reads
        self.stopped: dict[int, str] = {}  # workers no longer started again (restart.py), and why
        # id(shape) -> (shape, key, constant route's attributes, place, type, streams read)
        self._plans: dict[int, tuple] = {}
        self._held: dict[int, list[tuple[str, tuple]]] | None = None  # inside together(): per worker, in order
        #: the workers' answers to what the last :meth:`together` sent (a registration waits for them
        #: before its next slice but one: server/subscriptions/registry.py)
        self.sent: list[Future] = []
        #: where the witness numbering of a subscription stands (its last seq; server/workers/dispatch.py
        #: sets it once its loop runs): one placed whole is told it after its automata, where it is not 0
        #: (a backfill's hand-over: its history was numbered first)
        self.seq_of: Callable[[str], int] | None = None

    @property
    def link(self) -> WorkerLink:
        return self.links[0]

    def declare(self, schema: StreamSchema) -> None:
        super().declare(schema)
        self.declared.pop(schema.name, None)
        self.declared[schema.name] = schema
        for w in range(len(self.links)):
            self._mirror(w, "declare", schema)

    def add(self, automata, owner: str) -> list[str]:
        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        if self._quiet:
            return super().add(autos, owner)
        reads, publishes, cost = _reads_and_publishes(autos)
        worker = self.placement.place(owner, reads, publishes, cost, automata=autos)
        try:
            self._running(owner, worker)
            got = super().add(autos, owner)
        except BaseException:
            self.placement.remove(owner)
            raise
        self._send_add(worker, owner, autos)
        self.reads_of[owner] = frozenset(reads)
        self.recipes[owner] = [("add_rows" if worker == ALL else "add", (owner, autos))]
        return got

    def add_unmerged(self, automata, owner: str) -> list[str]:
        """:meth:`add` with nodes of its own, here and in its worker (air/engine/handover.py);
        placed whole (its automata are not given to the planner: never row-scaled)."""
        from air.engine.handover import unmerged

        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        worker = self.placement.place(owner, *_reads_and_publishes(autos))
        try:
            with unmerged(self):
                got = super().add(autos, owner)
        except BaseException:
            self.placement.remove(owner)
            raise
        self._mirror(worker, "add_unmerged", owner, autos)
        self._seed(worker, owner)
        self.reads_of[owner] = frozenset(_reads_and_publishes(autos)[0])
        self.recipes[owner] = [("add_unmerged", (owner, autos))]
        return got

    def _seed(self, worker: int, owner: str) -> None:
        """After ``owner`` was sent to ``worker`` whole: where its numbering stands, unless at 0."""
        last = self.seq_of(owner) if self.seq_of is not None else 0
        if last:
            self._mirror(worker, "seqs", {owner: last})

    def _send_add(self, worker: int, owner: str, autos) -> None:
        if worker != ALL:
            self._mirror(worker, "add", owner, autos)
            self._seed(worker, owner)
            return
        key, n = self.placement.rows[owner], len(self.links)
        for w in range(n):  # each worker's copy starts instances only for its key group's values
            self._mirror(w, "add", owner, restrict_to_group(autos, key, n, w), True)

    @contextmanager
    def together(self) -> Iterator[None]:
        """The changes made inside reach each worker as one message, as it ends (in their order,
        before anything sent after it), and where each subscription runs is stored once
        (placement.py's ``saving_once``): a registration's slice of a few dozen subscriptions was a
        command and an answer each, the answers read by the link's thread on the main process's lock
        (issue 32, round 25). A change the worker refuses is said as one sent alone is."""
        outer = self._held is None  # (nested: the outer one sends)
        if outer:
            self._held = {}
        try:
            with self.placement.saving_once():
                yield
        finally:
            if outer:
                self._flush()

    def _flush(self) -> None:
        """Send what :meth:`together` held: each worker's changes as one message, in order."""
        held, self._held = self._held, None
        self.sent = [self._send(worker, *changes[0]) if len(changes) == 1 else self._send(worker, "many", changes)
                     for worker, changes in held.items()]

    @contextmanager
    def unmirrored(self) -> Iterator[None]:
        """Changes made inside are not sent on: the caller sends them its own way (:meth:`mirror_bound`)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def mirror_bound(self, owner: str, bq) -> None:
        """A CEL query of a cached shape (air/cel/shapes.py's ``BoundQuery``) was installed as
        ``owner`` (under :meth:`unmirrored`): its worker gets its shape once, then its constants
        and names, and installs it from its own templates (server/subscriptions/prepared.py), as
        this engine did. Raises :class:`EngineError` (the install undone here) when it cannot be placed."""
        autos = bq.shape.compiled.automata
        shape = bq.shape
        known_plan = self._plans.get(id(shape))
        plan = None
        if known_plan is not None and known_plan[0] is shape and known_plan[5] == bq.reads():
            _shape, key, attrs, at, cast, _reads = known_plan
            if attrs is None:
                plan = (key, None)
            else:
                value = bq.values[at[0]]
                if all(type(bq.values[i]) is type(value) and bq.values[i] == value for i in at[1:]):
                    plan = (key, (attrs, cast(value)))
        try:
            worker = self.placement.place(owner, bq.reads(), {name for name, _attrs in bq.published()},
                                          sum(len(a.states) for a in autos), automata=lambda: bq.automata,
                                          plan=plan)
            self._running(owner, worker)
        except EngineError:
            super().remove(owner)
            raise
        if plan is None and self.placement.last_plan is not None:
            self._learn_plan(shape, bq, *self.placement.last_plan)
        if worker == ALL:  # its copies differ per worker: sent built, not as the shape's constants
            autos = tuple(bq.automata)
            self._send_add(worker, owner, autos)
            self.reads_of[owner] = frozenset(bq.reads())
            self.recipes[owner] = [("add_rows", (owner, autos))]
            return
        known = self._shapes.get((id(shape), worker))
        if known is None or known[0] is not shape:
            self._numbers += 1
            self._shapes[(id(shape), worker)] = known = (shape, self._numbers)
            self._mirror(worker, "shape", known[1], shape.dump())
        self._mirror(worker, "add_bound", owner, known[1], bq.values, bq.names, bq.prefix)
        self._seed(worker, owner)
        self.reads_of[owner] = frozenset(bq.reads())
        self.recipes[owner] = [("shape", (known[1], shape)), ("add_bound", (owner, known[1], bq.values, bq.names,
                                                                           bq.prefix))]

    def _learn_plan(self, shape, bq, key, const) -> None:
        """Keep what the planner found for a query of ``shape`` (placement.py: its key, its
        constant route): the automata of the next ones need not be built to plan them. A
        key is the shape's (constants do not make or break one); a constant route's value
        is the query's constant at the places of the shape that hold it (``at``: each
        of its ``Name = 'IBM'`` atoms, one a step of a per-symbol query), used for a
        query whose constants at those places are all one value again (each atom that
        required the route's value then requires that one: the route holds; any other
        query of the shape is planned afresh). Learnt only from one place before, so a
        per-symbol query of ten steps was planned from its built automata each time: 60%
        of the engine thread's time registering 10,000 of them over 2 workers."""
        if const is None:
            self._plans[id(shape)] = (shape, key, None, (), None, bq.reads())
            return
        attrs, value = const
        cast = type(value)
        at = tuple(i for i, v in enumerate(bq.values) if type(v) in (str, int, float) and v == value)
        if cast in (str, int, float) and at:
            self._plans[id(shape)] = (shape, key, attrs, at, cast, bq.reads())

    def remove(self, owner: str) -> None:
        super().remove(owner)
        workers = self.placement.workers_of(owner) if owner in self.placement.worker_of else ()
        self.placement.remove(owner)
        self.recipes.pop(owner, None)
        self.reads_of.pop(owner, None)
        for w in workers:
            self._mirror(w, "remove", owner)

    def _running(self, owner: str, worker: int) -> None:
        """Raise :class:`EngineError` (``owner`` unplaced) when ``worker`` is stopped (restart.py)."""
        why = self.stopped.get(worker) if worker != ALL else next(iter(self.stopped.values()), None)
        if why is not None:
            self.placement.remove(owner)
            raise EngineError(f"{owner} would run on engine worker {worker}, which is stopped ({why}): "
                              "restart the server, then register it")

    def rebuild(self, worker: int, owners) -> None:
        """A restarted ``worker`` (a fresh process, server/workers/restart.py): the streams declared, if
        ``owners`` is None; else those subscriptions installed, as they were sent to it before."""
        if owners is None:
            self._shapes = {k: v for k, v in self._shapes.items() if k[1] != worker}  # it knows no shape yet
            for schema in list(self.declared.values()):
                self._mirror(worker, "declare", schema)
            return
        sent: set[int] = set()
        for owner in owners:
            for name, args in self.recipes.get(owner, ()):
                if name == "shape":
                    number, shape = args
                    if number not in sent:
                        sent.add(number)
                        self._mirror(worker, "shape", number, shape.dump())
                    self._shapes[(id(shape), worker)] = (shape, number)
                elif name == "add_rows":  # a row-scaled one: this worker's key group's copy
                    sid, autos = args
                    key, n = self.placement.rows[sid], len(self.links)
                    self._mirror(worker, "add", sid, restrict_to_group(autos, key, n, worker), True)
                else:
                    self._mirror(worker, name, *args)

    def _mirror(self, worker: int, name: str, *args) -> None:
        if self._held is not None:
            self._held.setdefault(worker, []).append((name, args))
        else:
            self._send(worker, name, args)

    def _send(self, worker: int, name: str, args) -> Future:
        fut = self.links[worker].command(name, *((args,) if name == "many" else args))
        fut.add_done_callback(lambda fut: self._check(fut, name, args))
        return fut

    def _check(self, fut: Future, name: str, args) -> None:
        exc = fut.exception()
        if exc is None or isinstance(exc, WorkerGone):  # a worker that died is rebuilt with it (restart.py)
            return
        what = (f"one of {len(args)} changes sent together" if name == "many"
                else f"{name} {args[0] if args else ''}".strip())
        self.diverged = f"an engine worker refused a change this process made ({what}): {exc}"
        log.error("%s; restart the server", self.diverged)
