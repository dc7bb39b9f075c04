"""The registered subscriptions: compiling, installing, storing and removing them.

:class:`Registrar` holds every :class:`Subscription` (registration order) and
the index of which subscriptions read which stream; it compiles CEL through
the shape cache, installs on the engine thread in chunks (:meth:`Registrar.install`),
stores what it installed, and removes a subscription with (``cascade``) the
ones reading its outputs. A restore (server/durability/recovery.py) uses the
same steps without storing.
"""

from __future__ import annotations

import gc
import logging
import sqlite3
import threading
import time
from collections import ChainMap
from concurrent.futures import wait as futures_wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Mapping, NamedTuple, Protocol

from air.airxml import dump_air, load_air_many
from air.boundwarn import air_warnings, cel_warnings
from air.cel.shapes import BoundQuery, ShapeCache
from air.engine import Engine, EngineError
from air.engine.handover import unmerged
from air.engine.memory import paused_gc
from air.errors import CayugaError
from air.model import Automaton, StreamSchema
from server.config import Settings
from server.courtesy import Courtesy
from server.durability.diskfull import DiskFull
from server.durability.store import BrokenRow, Store, StoredSubscription
from server.ingest.limits import automaton_size_errors
from server.subscriptions.broken import FIX, Broken, reason_from
from server.subscriptions.prepared import Preparer
from server.observability.counters import Count

log = logging.getLogger("cayuga.daemon")

#: Registrations and restores install subscriptions on the engine thread at most
#: this many at a time ...
INSTALL_CHUNK = 500
#: ... and for at most this long (seconds; the one it is installing then is finished),
#: so that events keep flowing during a large batch: a chunk of 500 per-symbol queries
#: held them 0.2-0.3 s, and 10,000 registered while 10,000 events/s flowed held the
#: live events up to 2.5 s (BENCHMARKS.md, "Engine workers, round 25").
INSTALL_SLICE_S = 0.01
#: ... and, while events flow, leaves the engine thread this long to them before the next slice:
#: slices back to back took two cores' worth with the worker installing them too, and the live
#: events waited 40-150 ms (BENCHMARKS.md, "Engine workers, round 26") ...
INSTALL_GAP_S = 0.01
#: ... and waits before its next slice but one until the engine workers have installed the one
#: before (so that events queue behind at most two slices in a worker's pipe), at most this long
#: once (a worker stopped in a debugger: the rest goes on without waiting).
WORKER_SLICE_WAIT_S = 1.0
#: A batch reports at most this many errors.
MAX_BATCH_ERRORS = 100


class SubscriptionError(ValueError):
    """A subscription that cannot be registered; ``errors`` holds positioned details."""

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or [{"message": message}]


class LimitReached(RuntimeError):
    """A registration refused by a server limit (max_subscriptions)."""


class SubscriptionInUse(RuntimeError):
    """A subscription whose outputs other subscriptions read cannot be removed alone."""

    def __init__(self, sid: str, readers: list[str], sub: "Subscription") -> None:
        streams = ", ".join(sub.outputs + sub.internal)
        what = (f"subscription {sid} publishes {streams}, which" if streams else
                f"subscription {sid} is broken, and")  # (a broken one's readers are broken too)
        super().__init__(f"{what} {', '.join(readers)} read{'s' if len(readers) == 1 else ''}"
                         f"{'' if streams else ' its outputs'}; delete {'it' if len(readers) == 1 else 'them'} "
                         f"first, or delete with ?cascade=true to remove {sid} and every subscription reading "
                         "its outputs")
        self.readers = readers


@dataclass
class Subscription:
    id: str
    kind: str
    text: str
    automata: tuple[Automaton, ...]
    outputs: list[str]
    internal: list[str]
    name: str | None = None
    created: float = field(default_factory=time.time)

    def reads(self) -> set[str]:
        """The streams its automata read (without building them, for a restored query)."""
        if isinstance(self.automata, BoundQuery):
            return self.automata.reads()
        return {s.input_stream for a in self.automata for s in a.states if s.input_stream}

    @property
    def air(self) -> str:
        if len(self.automata) == 1:
            return dump_air(self.automata[0])
        return "<NFAs>\n" + "".join(dump_air(a) for a in self.automata) + "</NFAs>\n"


class Registered(NamedTuple):
    """A subscription just registered, with what its registration warns of
    (air/boundwarn.py: instances kept without a time bound), as the API shows it."""

    subscription: Subscription
    warnings: list[dict]


class Validation(NamedTuple):
    """What a registration of a query would meet (nothing is registered)."""

    errors: list[dict]
    outputs: list[str]
    air: str | None
    warnings: list[dict]


def compile_subscription(kind: str, text: str, streams: Mapping[str, StreamSchema], sid: str,
                         functions: dict[str, str], time_unit_ms: float,
                         shapes: ShapeCache | None = None) -> tuple[tuple[Automaton, ...], list[str]]:
    """Automata and user-visible output streams of a CEL, SASE or AIR text (CEL
    through ``shapes`` when given: one compile per query shape)."""
    if kind == "sase":
        from air.sase import compile_sase

        sase = compile_sase(text, streams, functions=functions, time_unit_ms=time_unit_ms, name_prefix=sid)
        return sase.automata, list(sase.outputs)
    if kind == "cel":
        from air.cel import compile_cel

        compile_ = shapes.compile if shapes is not None else compile_cel
        compiled = compile_(text, streams, functions=functions, time_unit_ms=time_unit_ms, name_prefix=sid)
        return tuple(compiled.automata), list(compiled.outputs)
    autos = tuple(load_air_many(text, name=sid))
    outs = list(dict.fromkeys(o.name for a in autos for _, o in a.outputs if o.type == "OUT"))
    return autos, outs


@dataclass
class Pending:
    """A subscription compiled, not yet installed."""

    id: str
    kind: str
    text: str
    name: str | None
    created: float
    automata: tuple[Automaton, ...] = ()  # or a BoundQuery (restored from its binding: built when read)
    outputs: list[str] = field(default_factory=list)
    installed_at: int | None = None  # Progress.fed when the engine thread installed it
    binding: tuple[str, str] | None = None  # CEL of a cached shape: (shape id, constants), stored beside the text
    stored: tuple[str | None, str | None] = (None, None)  # the binding a restored row had
    warnings: list[dict] = field(default_factory=list)  # a registration's (air/boundwarn.py); a restore has none
    mirror: object = None  # with an engine worker: the BoundQuery it installs instead of these automata
    fresh: bool = False  # a restore installs it afresh (recovery.py), numbered on after what the log holds
    seq_base: int | None = None  # a restore numbers its witnesses on from here (Store: seq_base)
    unmerged: bool = False  # a backfilled one (server/backfill/): nodes of its own, as at its hand-over

    @classmethod
    def restored(cls, st: StoredSubscription) -> "Pending":
        unmerged = st.backfill is not None
        return cls(st.id, st.kind, st.text, st.name, st.created, installed_at=st.installed_at,
                   binding=(st.shape, st.constants) if st.shape and st.constants and not unmerged else None,
                   stored=(st.shape, st.constants), seq_base=st.seq_base, unmerged=unmerged)


def add_unmerged(eng: Engine, automata, sid: str) -> list[str]:
    """Add ``sid``'s automata with nodes of their own (air/engine/handover.py): a backfilled
    subscription, whose imported instances no other subscription may see."""
    own = getattr(eng, "add_unmerged", None)  # an engine worker's catalogue (server/workers/mirror.py)
    if own is not None:
        return own(automata, sid)
    with unmerged(eng):
        return eng.add(automata, sid)


class Progress(Protocol):
    """How far the engine thread is (server/processing.py): events taken, and
    subscriptions installed or removed (a snapshot is due after a change)."""

    fed: int
    changes: int


def _bind_error(index: int, exc: EngineError) -> dict:
    return {"index": index, "kind": "bind", "message": str(exc), "detail": str(exc)}


class Registrar:
    """Every registered subscription, and how one is added or taken away.

    ``submit`` runs a function on the engine thread; ``storing(what)`` wraps
    a store write (a full disk becomes :class:`DiskFull` saying ``what``);
    ``require_ready`` raises when changes are refused (starting, replaying,
    witness log held); ``on_removed(sid)`` is called on the engine thread once
    a subscription has left the engine, for the state others keep per
    subscription; ``invalidate_routes`` and ``close_owner`` tell the WebSocket
    hub its routes changed and a subscription's clients must go."""

    def __init__(self, settings: Settings, engine: Engine, store: Store, counters, progress: Progress,
                 submit: Callable, storing: Callable[[str], ContextManager], require_ready: Callable[[], None],
                 on_removed: Callable[[str], None], invalidate_routes: Callable[[], None],
                 close_owner: Callable[[str], None]) -> None:
        self.settings = settings
        self.engine = engine
        self.store = store
        self.counters = counters
        self.progress = progress
        self.submit = submit
        self._storing = storing
        self._require_ready = require_ready
        self._on_removed = on_removed
        self._invalidate_routes = invalidate_routes
        self._close_owner = close_owner
        self.subscriptions: dict[str, Subscription] = {}
        #: stored subscriptions that do not compile against this configuration (server/subscriptions/broken.py)
        self.broken: dict[str, Broken] = {}
        self.broken_rows: dict[str, BrokenRow] = {}  # the store's, as a restore found them
        self.shapes = ShapeCache()  # compiled CEL query shapes (registrations and restores)
        self.preparer = Preparer()  # installs restored CEL queries without building their automata
        self.slice_sent: list = []  # the engine workers' answers to the last slice installed (add_chunk)
        self.lock = threading.Lock()  # guards subscriptions and stream declarations
        self._readers: dict[str, set[str]] = {}  # stream -> subscriptions whose automata read it

    def functions(self) -> dict[str, str]:
        return self.engine.functions.return_types()

    def compile_batch(self, batch: list[Pending], strict: bool) -> list[dict]:
        """Compile every subscription of ``batch`` (CEL through the shape
        cache); returns the errors, each with its ``index`` in the batch."""
        published: dict[str, StreamSchema] = {}  # by earlier queries of the batch, which later ones may read
        streams = ChainMap(published, self.engine.stream_view)
        functions, unit = self.functions(), self.settings.time_unit_ms
        errors: list[dict] = []
        courtesy = Courtesy()
        for i, p in enumerate(batch):
            courtesy()
            if p.binding is not None:
                bq = self.shapes.bound(p.binding, streams, functions=functions, time_unit_ms=unit, name_prefix=p.id)
                if bq is not None:  # a restore: the automata are built only if something reads them
                    p.automata, p.outputs = bq, list(bq.outputs)
                    for name, attrs in bq.published():
                        if name not in published:
                            published[name] = StreamSchema(name, attrs)
                    continue
                p.binding = None
            try:
                if p.kind == "cel":
                    compiled, p.binding = self.shapes.compile_keyed(p.text, streams, functions=functions,
                                                                    time_unit_ms=unit, name_prefix=p.id)
                    p.automata, p.outputs = tuple(compiled.automata), list(compiled.outputs)
                    if p.binding is not None and hasattr(self.engine, "mirror_bound"):
                        # an engine worker gets the query as its shape and constants, not as pickled automata
                        # (server/workers/mirror.py): the same automata
                        p.mirror = self.shapes.bound(p.binding, streams, functions=functions, time_unit_ms=unit,
                                                     name_prefix=p.id, count=False)
                    if strict:
                        p.warnings = [w.to_dict() for w in cel_warnings(p.text, compiled)]
                elif p.kind == "sase":
                    from air.sase import compile_sase

                    sase = compile_sase(p.text, streams, functions=functions, time_unit_ms=unit, name_prefix=p.id)
                    p.automata, p.outputs = sase.automata, list(sase.outputs)
                    p.warnings = [w.to_dict() for w in sase.warnings] if strict else []
                else:
                    p.automata, p.outputs = compile_subscription(p.kind, p.text, streams, p.id, functions, unit)
                    if strict:
                        p.warnings = [w.to_dict() for w in air_warnings(p.automata, p.text, unit)]
            except CayugaError as exc:
                detail = exc.to_dict() if hasattr(exc, "to_dict") else {"message": str(exc)}
                errors.append({"index": i, **detail, "detail": str(exc)})
                if strict and len(errors) >= MAX_BATCH_ERRORS:
                    break
                continue
            too_large = self.size_errors(p.automata) if strict else []
            if too_large:
                self.counters.add(Count.SUBSCRIPTIONS_REFUSED)
                p.automata = ()
                errors.append({"index": i, "kind": "limit", "message": "; ".join(too_large), "line": 0,
                               "column": 0, "excerpt": "", "detail": "; ".join(too_large)})
                continue
            for a in p.automata:
                for st, out in a.outputs:
                    published.setdefault(out.name, StreamSchema(out.name, st.schema))
        return errors

    def add_chunk(self, eng: Engine, chunk: list[tuple[int, Pending]], strict: bool,
                  seconds: float | None = None) -> list:
        """On the engine thread: add each of ``chunk`` (``seconds``: only those begun
        within that long, at least one); returns (index, pending, published
        streams or the EngineError) of each added, in order. Strict: the first
        error removes what this call added and is raised with its index."""
        done = []
        mirror = getattr(eng, "mirror_bound", None)
        until = None if seconds is None else time.perf_counter() + seconds
        with getattr(eng, "together", nullcontext)():  # (engine workers: one message each, placements stored once)
            self._add_each(eng, chunk, strict, mirror, done, until)
        self.slice_sent = getattr(eng, "sent", [])  # (read by the request's thread once this call's answer came)
        return done

    def _add_each(self, eng: Engine, chunk: list[tuple[int, Pending]], strict: bool, mirror, done: list,
                  until: float | None) -> None:
        for i, p in chunk:
            if until is not None and done and time.perf_counter() > until:
                return
            try:
                if p.unmerged:
                    done.append((i, p, add_unmerged(eng, p.automata, p.id)))
                elif mirror is not None and p.mirror is not None:  # the engine worker gets it by its shape
                    with eng.unmirrored():
                        got = self.preparer.add(eng, p.automata, p.id)
                    mirror(p.id, p.mirror)
                    done.append((i, p, got))
                else:
                    done.append((i, p, self.preparer.add(eng, p.automata, p.id)))
                p.installed_at = self.progress.fed  # a replay reaches the point of a deferred one exactly
                self.progress.changes += 1
            except EngineError as exc:
                if strict:
                    self.forget(eng, [q.id for _, q, _ in done])
                    raise SubscriptionError(str(exc), [_bind_error(i, exc)]) from None
                done.append((i, p, exc))

    def _undo(self, ran: list[str], persist: bool) -> None:
        """Take out of the engine the subscriptions ``ran`` of a batch that fails after they were
        installed (in earlier slices: events may have reached them, and their witnesses be in the
        log under their ids), and retire those ids (a registration's: ``persist``), so that a later
        subscription is not given one and its witnesses (issue 32, round 25)."""
        for k in range(0, len(ran), INSTALL_CHUNK):
            ids = ran[k:k + INSTALL_CHUNK]
            self.submit(lambda eng, ids=ids: self.forget(eng, ids)).result(timeout=60)
        if ran and persist:
            try:
                self.store.retire_ids(ran)
            except sqlite3.Error as exc:  # (a full disk: the refusal's own cause)
                log.error("the ids %s..%s of a refused batch that had run could not be retired (%s): the next "
                          "registration may be given one, with the witnesses it logged", ran[0], ran[-1], exc)

    def forget(self, eng: Engine, ids: list[str]) -> None:
        """On the engine thread: remove subscriptions of a batch that failed
        (nothing of them may stay behind in the engine: see :meth:`_undo` for their ids)."""
        for sid in ids:
            eng.remove(sid)
            self._on_removed(sid)

    def install(self, batch: list[Pending], persist: bool = True) -> list[Subscription]:
        """Compile, install and (``persist``) store ``batch``.

        A registration (``persist``) is all or nothing: any error raises a
        :class:`SubscriptionError` listing every compile error (or the first
        engine error) with its index, and leaves the engine and the store as
        they were. A restore skips (and logs) the subscriptions that fail.

        The cyclic garbage collector waits meanwhile; a batch of at least
        INSTALL_CHUNK then leaves the collector's reach (``gc.freeze``), so
        neither the collection that would follow nor later full collections
        walk the network it built (removing a subscription leaves no cyclic
        garbage: reference counting frees it). What else is alive and cyclic
        garbage at that moment is frozen too; the young generations are
        collected first to keep that small."""
        large = len(batch) >= INSTALL_CHUNK
        if large:
            gc.collect(1)
        with paused_gc(freeze=large):
            errors = self.compile_batch(batch, strict=persist)
            if errors and persist:
                raise SubscriptionError(f"{len(errors)} of {len(batch)} subscriptions have errors", errors)
            todo = [(i, p) for i, p in enumerate(batch) if p.automata]
            added: list = []
            try:
                k, before, fed = 0, [], [-1, -1]  # (events taken when the last two slices were sent)
                while k < len(todo):  # a slice of the engine thread's time at a time, events between
                    if self.progress.fed != fed[0] >= 0:  # events flow: the engine thread is theirs a while
                        time.sleep(INSTALL_GAP_S)
                    fed, chunk = [fed[1], self.progress.fed], todo[k:k + INSTALL_CHUNK]
                    fut = self.submit(lambda eng, c=chunk: self.add_chunk(eng, c, persist, INSTALL_SLICE_S))
                    got = self._installed(fut, 60) if persist else fut.result(timeout=60)
                    added += got
                    k += len(got)
                    if before is not None and futures_wait(before, WORKER_SLICE_WAIT_S).not_done:
                        before = None  # (a worker that does not answer: not waited for again)
                    elif before is not None:
                        before = self.slice_sent
            except (SubscriptionError, DiskFull):
                self._undo([p.id for _, p, _ in added], persist)
                raise
        subs = self.adopt(added, errors, batch, persist)
        try:
            self.store.save_shapes(self.shapes.export())
        except sqlite3.Error as exc:  # a cache: a restart compiles those shapes again
            log.warning("could not store compiled query shapes: %s", exc)
        return subs

    def adopt(self, added: list, errors: list[dict], batch: list[Pending], persist: bool) -> list[Subscription]:
        """Make Subscriptions of what :meth:`add_chunk` installed (and store them
        when ``persist``); a restore logs those that failed."""
        subs, installed_at = [], {}
        courtesy = Courtesy()  # (10,000 of them: 0.4 s, the live events between)
        for i, p, published in added:
            courtesy()
            if isinstance(published, EngineError):
                errors.append(_bind_error(i, published))
                continue
            internal = [s for s in published if s not in p.outputs]
            subs.append(Subscription(p.id, p.kind, p.text, p.automata, p.outputs, internal, p.name, p.created))
            installed_at[p.id] = p.installed_at
        for e in errors:  # only a restore gets here with errors
            self.mark_broken(batch[e["index"]], e.get("message"))
        if persist:  # stored before they are known: what could not be stored is taken out of the engine again
            bindings = {p.id: p.binding for p in batch if p.binding is not None}
            try:
                stored = []
                for s in subs:
                    stored.append(StoredSubscription(s.id, s.kind, s.text, s.name, s.created,
                                                     *(bindings.get(s.id) or (None, None)),
                                                     installed_at=installed_at[s.id]))
                    courtesy()
                with self._storing(f"{len(subs)} subscription(s) could not be stored; none was registered"):
                    self.store.save_subscriptions(stored)
            except DiskFull:
                self._undo([s.id for s in subs], persist)
                raise
        for sub in subs:
            self.subscriptions[sub.id] = sub
            self._index_readers(sub)
            courtesy()
        if subs:
            self._invalidate_routes()  # routes of witnesses to clients depend on the subscriptions' outputs
        if not persist:  # rows stored before bindings were, or with a binding no longer valid
            try:
                self.store.save_bindings([(p.binding or (None, None), p.id) for p in batch
                                          if (p.binding or (None, None)) != p.stored and p.id in self.subscriptions])
            except sqlite3.Error as exc:  # a cache: the next start binds them from their text again
                log.warning("could not store the bindings of restored subscriptions: %s", exc)
        return subs

    def check_room(self, n: int) -> None:
        """Raise :class:`LimitReached` when ``n`` more subscriptions do not fit (max_subscriptions)."""
        if len(self.subscriptions) + n > self.settings.max_subscriptions:
            self.counters.add(Count.SUBSCRIPTIONS_REFUSED, n)
            raise LimitReached(f"the server holds {len(self.subscriptions)} subscriptions and its limit is "
                               f"{self.settings.max_subscriptions} (the max_subscriptions setting): "
                               f"{n} more do not fit; delete some first")

    def storing(self, what: str) -> ContextManager:
        """A store write; a full disk raises DiskFull saying ``what``."""
        return self._storing(what)

    def _installed(self, fut, timeout: float):
        """The engine thread's answer to a registration's install. One it has not begun is
        taken back, and :class:`DiskFull` raised, once the engine holds a batch the witness log
        cannot take (a full disk: it takes no command until it can): the caller gets its 507 at
        once, not after the disk has room again or a timeout (``require_ready`` had passed just
        before the hold began: the whole suite at 2 workers met it, BENCHMARKS.md, "Engine
        workers, round 11")."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=0.05)
            except TimeoutError:
                if fut.done() or time.monotonic() > deadline:  # (done: the install's own error)
                    raise
            try:
                self._require_ready()
            except DiskFull:
                if fut.cancel():  # (not begun: nothing of it was installed)
                    raise

    def require_ready(self) -> None:
        """Raise while changes are refused (starting, replaying, witness log held)."""
        self._require_ready()

    def hold(self, sub: Subscription) -> None:
        """List ``sub`` (watchable, deletable) without installing it: a subscription registered
        with ``from`` joins the engine at its backfill's hand-over (server/backfill/manager.py)."""
        self.subscriptions[sub.id] = sub
        self._index_readers(sub)
        self._invalidate_routes()

    def mark_broken(self, p: Pending, message: str | None) -> None:
        """A restore found that ``p`` does not compile (or bind): keep it as broken,
        with the reason a start's schema check recorded (server/subscriptions/schemacheck.py)
        or else the compiler's, since when it first broke."""
        row = self.broken_rows.get(p.id)
        if row is None:
            row = BrokenRow(p.id, reason_from(message), time.time())
            try:
                self.store.save_broken([row])
            except sqlite3.Error as exc:  # listed all the same; the next start finds it again
                log.warning("could not store that subscription %s is broken: %s", p.id, exc)
            self.broken_rows[p.id] = row
        self.broken[p.id] = Broken(p.id, p.kind, p.text, p.name, p.created, row.reason, row.since, row.upstream)
        log.error("subscription %s is broken: %s. It is kept (GET /subscriptions/%s) but does not run; %s",
                  p.id, row.reason, p.id, FIX)

    def size_errors(self, autos) -> list[str]:
        return automaton_size_errors(autos, self.settings.max_states, self.settings.max_predicate_atoms)

    def add_subscription(self, kind: str, text: str, name: str | None = None) -> Subscription:
        return self.register_one(kind, text, name).subscription

    def register_one(self, kind: str, text: str, name: str | None = None) -> Registered:
        """:meth:`register` of one subscription; its errors without an index."""
        try:
            return self.register([(kind, text, name)])[0]
        except SubscriptionError as exc:
            detail = exc.errors[0].pop("detail")
            for e in exc.errors:
                e.pop("index", None)
            raise SubscriptionError(detail, exc.errors) from None

    def add_subscriptions(self, items: list[tuple[str, str, str | None]]) -> list[Subscription]:
        return [r.subscription for r in self.register(items)]

    def register(self, items: list[tuple[str, str, str | None]]) -> list[Registered]:
        """Register many subscriptions (kind, text, name) at once, all or
        nothing: on any error none is registered, no id is taken (but those of
        a batch's subscriptions installed in slices before one refused at
        install: events may have reached them, and their ids are retired), and the
        :class:`SubscriptionError` lists each error with its index. Ids are
        consecutive, in the order given; a query may read the output of an
        earlier one in the same batch. CEL queries of one shape are compiled
        once (:class:`~air.cel.shapes.ShapeCache`). The engine thread installs
        a large batch INSTALL_SLICE_S of its time at a time and runs events in
        between: a subscription of the batch starts empty when its slice is
        installed, as if registered alone at that moment. Each comes back with its
        warnings (air/boundwarn.py), which are not kept."""
        with self.lock:
            self._require_ready()
            self.check_room(len(items))
            now = time.time()
            ids = self.store.peek_ids(len(items))
            batch, courtesy = [], Courtesy()
            for sid, (kind, text, name) in zip(ids, items):
                batch.append(Pending(sid, kind, text, name, now))
                courtesy()
            subs = self.install(batch)
        warnings = {p.id: p.warnings for p in batch}
        return [Registered(s, warnings[s.id]) for s in subs]

    def warnings_of(self, sub: Subscription) -> list[dict]:
        """What registering ``sub``'s query again would warn of (for a repeated
        named registration that returns it); [] when it no longer compiles."""
        streams, unit = self.engine.stream_view, self.settings.time_unit_ms
        try:
            if sub.kind == "cel":
                compiled = self.shapes.compile(sub.text, streams, functions=self.functions(), time_unit_ms=unit,
                                               name_prefix=sub.id)
                return [w.to_dict() for w in cel_warnings(sub.text, compiled)]
            if sub.kind == "sase":
                from air.sase import compile_sase

                return [w.to_dict() for w in compile_sase(sub.text, streams, functions=self.functions(),
                                                          time_unit_ms=unit, name_prefix=sub.id).warnings]
            return [w.to_dict() for w in air_warnings(load_air_many(sub.text, name=sub.id), sub.text, unit)]
        except CayugaError:
            return []

    def _index_readers(self, sub: Subscription, remove: bool = False) -> None:
        for stream in sub.reads():
            readers = self._readers.setdefault(stream, set())
            if remove:
                readers.discard(sub.id)
                if not readers:
                    del self._readers[stream]
            else:
                readers.add(sub.id)

    def readers_of(self, sid: str) -> list[str]:
        """The other subscriptions that read a stream ``sid`` publishes, in registration order
        (of a broken one: the broken ones that read its outputs)."""
        if sid in self.broken:
            return [b.id for b in self.broken.values() if b.upstream == sid]
        sub = self.subscriptions[sid]
        found = {r for s in sub.outputs + sub.internal for r in self._readers.get(s, ()) if r != sid}
        return [r for r in self.subscriptions if r in found]

    def remove_subscription(self, sid: str, cascade: bool = False) -> list[str]:
        """Remove ``sid``; returns the ids removed. A subscription whose outputs
        others read is refused (:class:`SubscriptionInUse`, naming them: they
        would lose their input, and could not be restored), unless ``cascade``,
        which removes those readers too (and theirs), newest first."""
        with self.lock:
            self._require_ready()
            if sid in self.broken:
                return self._remove_broken(sid, cascade)
            if sid not in self.subscriptions:
                raise KeyError(sid)
            doomed, todo = {sid}, [sid]
            while todo:
                readers = self.readers_of(todo.pop())
                if readers and not cascade:
                    raise SubscriptionInUse(sid, readers, self.subscriptions[sid])
                todo += [r for r in readers if r not in doomed]
                doomed.update(readers)
            order = [s for s in reversed(self.subscriptions) if s in doomed]  # readers before what they read
            with self._storing(f"the deletion of {', '.join(order)} could not be stored; nothing was deleted"):
                self.store.delete_subscriptions(order)  # first: a restart must not bring back what is gone
            for s in order:
                self.submit(lambda eng, s=s: self._remove_owner(eng, s)).result(timeout=30)
                self._index_readers(self.subscriptions.pop(s), remove=True)
            self._invalidate_routes()
        for s in order:
            self._close_owner(s)
        if len(order) > 1:
            log.info("removed subscription %s and the subscriptions reading its outputs: %s", sid,
                     ", ".join(order[:-1]))
        return order

    def _remove_broken(self, sid: str, cascade: bool) -> list[str]:
        """Forget a broken subscription (it runs nothing), and (``cascade``) the broken
        ones reading its outputs; without ``cascade`` those refuse it (:class:`SubscriptionInUse`)."""
        doomed, todo = [sid], [sid]
        while todo:
            upstream = todo.pop()
            readers = [b for b in self.broken.values() if b.upstream == upstream and b.id not in doomed]
            if readers and not cascade:
                raise SubscriptionInUse(sid, [b.id for b in readers], self.broken[sid])
            doomed += [b.id for b in readers]
            todo += [b.id for b in readers]
        order = [s for s in reversed(list(self.broken)) if s in doomed]
        with self._storing(f"the deletion of {', '.join(order)} could not be stored; nothing was deleted"):
            self.store.delete_subscriptions(order)
        for s in order:
            del self.broken[s]
            self.broken_rows.pop(s, None)
        return order

    def _remove_owner(self, eng: Engine, sid: str) -> None:
        if eng.has_owner(sid):  # (not one whose backfill is still under way: server/backfill/)
            eng.remove(sid)
        self._on_removed(sid)
        self.progress.changes += 1

    def validate_subscription(self, kind: str, text: str) -> Validation:
        """Every error (with positions) a registration would meet, and its
        warnings (those of a query that compiles); registers nothing."""
        streams, unit = self.engine.stream_view, self.settings.time_unit_ms
        try:
            if kind == "cel":
                from air.cel import compile_cel, validate

                errors = validate(text, streams, functions=self.functions(), time_unit_ms=unit)
                if errors:
                    return Validation([e.to_dict() for e in errors], [], None, [])
                compiled = compile_cel(text, streams, functions=self.functions(), time_unit_ms=unit,
                                       name_prefix="validate")
                autos, outs = tuple(compiled.automata), list(compiled.outputs)
                warnings = [w.to_dict() for w in cel_warnings(text, compiled)]
            elif kind == "sase":
                from air.sase import compile_sase

                sase = compile_sase(text, streams, functions=self.functions(), time_unit_ms=unit,
                                    name_prefix="validate")
                autos, outs, warnings = sase.automata, list(sase.outputs), [w.to_dict() for w in sase.warnings]
            else:
                autos, outs = compile_subscription(kind, text, streams, "validate", self.functions(), unit)
                warnings = [w.to_dict() for w in air_warnings(autos, text, unit)]
        except CayugaError as exc:
            return Validation([exc.to_dict() if hasattr(exc, "to_dict") else {"message": str(exc)}], [], None, [])
        too_large = self.size_errors(autos)
        if too_large:
            return Validation([{"kind": "limit", "message": m, "line": 0, "column": 0, "excerpt": ""}
                               for m in too_large], [], None, warnings)
        probe = Engine(self.engine.functions)
        for name in {s.input_stream for a in autos for s in a.states if s.input_stream}:
            schema = streams.get(name)  # the others are published within the query, or unknown (reported)
            if schema is not None:
                probe.declare(schema)
        try:
            probe.add(autos, owner="validate")
        except EngineError as exc:
            return Validation([{"kind": "bind", "message": str(exc), "line": 0, "column": 0, "excerpt": ""}], [], None,
                              warnings)
        sub = Subscription("validate", kind, text, autos, outs, [])
        return Validation([], outs, sub.air, warnings)
