"""Subscriptions registered with ``from``: run over history on an engine of their
own, then joined to the live engine at the exact queue position
(docs/design/backfill.md).

A registration with ``from`` stores the subscription with its backfill's record
and lists it (watchable, deletable) without installing it. A thread of its own
(``cayuga-backfill-<sid>``) has a backfill engine process (engine.py) read the
retained journal from ``from`` on, in the live engine's order
(server/durability/history.py, in that process) and feed it, and hands each
batch's witnesses, marked ``"replay": true``, to the engine thread to be
numbered (from 1), logged and offered like live ones. It follows the journal
past the registration while the live queue releases events; once it has fed
all the queue has certainly released, it asks
the engine thread, between two batches, for the hand-over: the rest of what
the live engine has taken is fed, the state is exported, the subscription is
added to the live engine (or its worker) with nodes of its own and the state
imported (air/engine/handover.py); from the next batch it is live. The record
says ``handing_over`` until a snapshot taken after that is durable, then
``live``. A start finds a backfill that is not ``live`` and runs it again from
``from``: its witnesses come out with the same numbers, and those the witness
log holds already are neither logged nor offered again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from server.backfill.engine import BackfillEngine
from server.config import Settings
from server.delivery.encoding import Columns, pack_columns
from server.durability.history import resolve_from
from server.durability.store import StoredSubscription
from server.observability.threadcpu import thread_ended
from server.subscriptions.registry import (Pending, Registered, Registrar, Subscription, SubscriptionError,
                                           add_unmerged)

log = logging.getLogger("cayuga.backfill")

#: Events a backfill feeds its engine at a time: the live engine's batch. Each batch's witnesses
#: are taken in and delivered on the engine thread between live batches: at 8,192 (a megabyte
#: of Rising's witnesses each) the live path's p99 while a backfill ran was 4.4-5.6 ms against
#: 0.8-1.2 without; at 1,024, 1.0-1.4 ms, and the backfill no slower (BENCHMARKS.md).
BATCH = 1024
#: Seconds a backfill waits for the engine thread (a delivery, the hand-over).
ENGINE_TIMEOUT = 120.0
#: Backfills that run at once (each an engine process); later ones wait their turn, shown running at 0 events.
MAX_RUNNING = 2
#: Previews that run at once (each an engine process); later requests wait their turn.
MAX_PREVIEWS = 2

@dataclass
class Backfill:
    """One subscription's backfill: what GET /subscriptions/{id} shows, and what is stored."""

    sid: str
    start: object  # the event time history is run from
    state: str = "running"  # running, handing_over, live, failed
    to: object = None  # the cut's event time, once known
    events_done: int = 0
    events_total: int | None = None
    witnesses: int = 0
    error: str | None = None
    changes: int | None = None  # progress.changes once handed over: live once a snapshot covers it

    def public(self) -> dict:
        return {"from": self.start, "to": self.to, "events_done": self.events_done,
                "events_total": self.events_total, "witnesses": self.witnesses, "state": self.state,
                "error": self.error}

    @classmethod
    def of(cls, sid: str, record: dict) -> "Backfill":
        return cls(sid, record["from"], record.get("state", "running"), record.get("to"),
                   record.get("events_done", 0), record.get("events_total"), record.get("witnesses", 0),
                   record.get("error"))


class Backfills:
    """Every backfill of this server (see the module's docstring). The daemon wires
    the parts: ``submit`` runs a function on the engine thread, ``quiesce``
    takes back what engine workers have in flight (None: no workers), ``inputs``
    gives the input streams' schemas, ``newest`` the newest accepted event's time."""

    def __init__(self, settings: Settings, registrar: Registrar, store, queue, witnesses, recovery, checkpoints,
                 progress, submit: Callable, quiesce: Callable[[], bool] | None, inputs: Callable[[], dict],
                 stopping: threading.Event) -> None:
        self.settings = settings
        self.registrar = registrar
        self.store = store
        self.queue = queue
        self.witnesses = witnesses
        self.recovery = recovery
        self.checkpoints = checkpoints
        self.progress = progress
        self.submit = submit
        self.quiesce = quiesce
        self.inputs = inputs
        self.stopping = stopping
        self.journal = None  # set by the daemon's start() unless durability is off
        self.items: dict[str, Backfill] = {}
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._engines: dict[str, BackfillEngine] = {}  # the running ones' engines (stop() ends them)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_RUNNING)
        self.previews = threading.BoundedSemaphore(MAX_PREVIEWS)  # taken by preview.py
        checkpoints.on_published = self._published

    # ------------------------------------------------------------------ registration

    def resolve(self, value):
        """The event time ``value`` (a registration's or a preview's ``from``) means; FromError."""
        return resolve_from(value, self.journal, self.queue.newest, self.settings.time_unit_ms)

    def compile(self, sid: str, kind: str, text: str, name: str | None) -> Pending:
        """Compile a query that is to run over history (SubscriptionError: its errors, or that it
        reads a stream no history holds: another subscription's output)."""
        p = Pending(sid, kind, text, name, time.time())
        errors = self.registrar.compile_batch([p], strict=True)
        if errors:
            detail = errors[0].pop("detail")
            for e in errors:
                e.pop("index", None)
            raise SubscriptionError(detail, errors)
        inputs = self.inputs()
        derived = sorted({s.input_stream for a in p.automata for s in a.states if s.input_stream}
                         - set(inputs) - {o.name for a in p.automata for _, o in a.outputs})
        if derived:
            raise SubscriptionError(f"from: the query reads {', '.join(derived)}, published by other subscriptions; "
                                    "history holds only input streams: register it without from, or over input "
                                    "streams only")
        return p

    def register(self, kind: str, text: str, name: str | None, start_value) -> Registered:
        """Register with ``from`` (see the module's docstring); FromError, SubscriptionError, LimitReached."""
        reg = self.registrar
        with reg.lock:
            reg.require_ready()
            reg.check_room(1)
            sid = self.store.peek_ids(1)[0]
            start = self.resolve(start_value)
            p = self.compile(sid, kind, text, name)
            internal = list(dict.fromkeys(o.name for a in p.automata for _, o in a.outputs
                                          if o.name not in p.outputs))
            sub = Subscription(sid, kind, text, p.automata, p.outputs, internal, name, p.created)
            bf = Backfill(sid, start)
            with reg.storing("the subscription could not be stored; none was registered"):
                self.store.save_backfilled(StoredSubscription(sid, kind, text, name, p.created), bf.public())
            with self._lock:
                self.items[sid] = bf
            reg.hold(sub)
        self._start(bf, sub)
        return Registered(sub, p.warnings)

    def resume(self, stored: list[StoredSubscription]) -> None:
        """At a start, before recovery: the backfills that were not live yet are listed and
        run again from their ``from`` (each thread waits for the engine thread)."""
        for st in stored:
            bf = Backfill.of(st.id, st.backfill)
            bf.state, bf.error, bf.to, bf.events_done, bf.witnesses = "running", None, None, 0, 0
            with self._lock:
                self.items[st.id] = bf
            if st.backfill.get("state") == "live":  # (run again by recovery): not live until its new hand-over
                try:
                    self.store.save_backfill(st.id, bf.public())
                except Exception as exc:  # noqa: BLE001 - a failed write keeps "live": the next start checks again
                    log.warning("could not store that the backfill of %s runs again: %s", st.id, exc)
            try:
                sub = self._restore(bf, st)
            except SubscriptionError as exc:  # listed as broken (server/subscriptions/broken.py), as any other
                self._fail(bf, f"it no longer compiles: {exc}")
                self.registrar.mark_broken(Pending(st.id, st.kind, st.text, st.name, st.created), str(exc))
                continue
            self._start(bf, sub)

    def _restore(self, bf: Backfill, st: StoredSubscription) -> Subscription:
        p = self.compile(st.id, st.kind, st.text, st.name)
        internal = list(dict.fromkeys(o.name for a in p.automata for _, o in a.outputs if o.name not in p.outputs))
        sub = Subscription(st.id, st.kind, st.text, p.automata, p.outputs, internal, st.name, st.created)
        with self.registrar.lock:
            self.registrar.hold(sub)
        return sub

    def restored_live(self, stored: list[StoredSubscription]) -> None:
        """Backfills a start found live: shown as they were."""
        with self._lock:
            for st in stored:
                self.items[st.id] = Backfill.of(st.id, st.backfill)

    def public(self, sid: str) -> dict | None:
        bf = self.items.get(sid)
        return bf.public() if bf is not None else None

    def forget(self, sid: str) -> None:
        """``sid`` was deleted: its backfill stops (no hand-over)."""
        with self._lock:
            self.items.pop(sid, None)
            got = self._threads.pop(sid, None)
        if got is not None:
            got[1].set()

    def stop(self, timeout: float) -> None:
        with self._lock:
            threads = list(self._threads.values())
            self._threads.clear()
        for _t, cancel in threads:
            cancel.set()
        deadline = time.monotonic() + timeout
        for t, _c in threads:
            t.join(max(deadline - time.monotonic(), 0.1))
        with self._lock:
            engines = list(self._engines.values())
        for eng in engines:  # a thread still waiting on its engine: the engine ends, the wait with it
            eng.stop()
        for t, _c in threads:
            t.join(5.0)

    # ------------------------------------------------------------------ the backfill thread

    def _start(self, bf: Backfill, sub: Subscription) -> None:
        cancel = threading.Event()
        t = threading.Thread(target=self._run, args=(bf, sub, cancel), name=f"cayuga-backfill-{bf.sid}",
                             daemon=True)
        with self._lock:
            self._threads[bf.sid] = (t, cancel)
        t.start()

    def _stopped(self, cancel: threading.Event) -> bool:
        return cancel.is_set() or self.stopping.is_set()

    def _run(self, bf: Backfill, sub: Subscription, cancel: threading.Event) -> None:
        eng = None
        slot = False
        try:
            while not self.recovery.ready.is_set() or not (slot := self._slots.acquire(timeout=0.05)):
                if cancel.wait(0.05) or self.stopping.is_set():  # a restart: the engine thread first; a turn
                    return
            if self.journal is None:
                raise RuntimeError("the server keeps no journal (durability off)")
            eng = BackfillEngine(self.settings, f"cayuga-backfill-{bf.sid}", replay=True)
            with self._lock:
                self._engines[bf.sid] = eng
            eng.start(list(self.inputs().values()), bf.sid, sub.automata)
            eng.open_history(self.journal, bf.start)  # read in its process (engine.py), pinned here
            # numbered from 1 again: what the witness log holds already (a restart) is neither logged nor offered
            self.submit(lambda _e: self.witnesses.set_seq(bf.sid, 0)).result(ENGINE_TIMEOUT)
            delivering = None
            while not self._stopped(cancel):
                while eng.room:  # IN_FLIGHT requests out: the engine process reads and feeds while this one delivers
                    eng.ask(self.queue, BATCH)
                fed, cols = eng.answer()
                delivering = self._handed(bf, cols, delivering)
                bf.events_done, bf.events_total = eng.given, eng.scanned
                if fed:
                    continue
                # it has fed all the queue had released: what is asked still, then the hand-over
                while eng.asked:
                    delivering = self._handed(bf, eng.answer()[1], delivering)
                if delivering is not None:
                    delivering.result(ENGINE_TIMEOUT)
                    delivering = None
                bf.events_done, bf.events_total = eng.given, eng.scanned
                if self.recovery.settled():
                    joined = self.submit(lambda e: self._hand_over(e, bf, sub, eng)).result(ENGINE_TIMEOUT)
                    if joined:
                        return
                cancel.wait(0.02)
        except Exception as exc:  # noqa: BLE001 - the backfill fails, the server goes on
            if not self._stopped(cancel):
                log.exception("backfill of %s failed", bf.sid)
                self._fail(bf, f"{type(exc).__name__}: {exc}")
        finally:
            if eng is not None:
                with self._lock:
                    self._engines.pop(bf.sid, None)
                eng.stop()
            if slot:
                self._slots.release()
            with self._lock:
                if self._threads.get(bf.sid, (None,))[0] is threading.current_thread():
                    del self._threads[bf.sid]
            thread_ended()  # (its CPU kept by role: server/observability/threadcpu.py)

    def _handed(self, bf: Backfill, cols: Columns, delivering):
        """Hand a batch's witnesses to the engine thread once the last delivery is done (one in
        flight), as one command (the live batches go between): packed as the witness log holds
        them, they are numbered per subscription and written without a loop per witness."""
        if delivering is not None:
            delivering.result(ENGINE_TIMEOUT)
        if not cols.owners:
            return None
        return self.submit(lambda _e: self._deliver(bf, cols))

    def _deliver(self, bf: Backfill, cols: Columns) -> None:
        """On the engine thread: number, log and offer a batch of historical witnesses."""
        if bf.sid not in self.registrar.subscriptions or not cols.owners:  # (one deleted meanwhile)
            return
        if set(cols.owners) != {bf.sid}:  # (its engine runs it alone: never so, but never logged under another)
            cols = pack_columns([g for g in cols.groups() if g[0] == bf.sid])
        self.witnesses.deliver_columns(cols)
        bf.witnesses += cols.count()

    def _hand_over(self, live, bf: Backfill, sub: Subscription, eng: BackfillEngine) -> bool:
        """On the engine thread, between two batches: join the live engine exactly here."""
        if bf.sid not in self.registrar.subscriptions:
            return True  # deleted meanwhile
        if self.quiesce is not None and not self.quiesce():
            return False
        began = time.perf_counter()
        rest, cols = eng.cut(self.queue, bf.start)
        self._deliver(bf, cols)
        bf.events_done, bf.events_total = eng.given, eng.scanned
        fed = time.perf_counter()
        links = getattr(live, "links", None)
        state = eng.export_state(pickled=links is not None)  # an engine worker reads it: passed on unread
        exported = time.perf_counter()
        add_unmerged(live, sub.automata, bf.sid)
        try:
            if links is not None:  # the engine worker that runs it takes the state (after the add, on one pipe)
                links[live.placement.of(bf.sid)].call("import_owner", bf.sid, state, timeout=ENGINE_TIMEOUT)
            else:
                from air.engine.handover import import_owner

                import_owner(live, state, bf.sid)
        except BaseException:
            live.remove(bf.sid)
            raise
        bf.to = eng.epoch if eng.epoch is not None else self.queue.last_released
        bf.state = "handing_over"
        self.progress.changes += 1
        bf.changes = self.progress.changes
        self.store.save_backfill(bf.sid, bf.public(), installed_at=self.progress.fed)
        self.checkpoints.wanted = True  # live once a snapshot holding its state is durable
        log.info("backfill of %s handed over at event %d (event time %s): %d events, %d witnesses; the engine "
                 "thread stood still %.1f ms (%d events fed at the cut: %.1f ms, the state exported: %.1f ms)",
                 bf.sid, self.progress.fed, bf.to, bf.events_done, bf.witnesses,
                 (time.perf_counter() - began) * 1000, rest, (fed - began) * 1000, (exported - fed) * 1000)
        return True

    def _published(self, changes: int) -> None:
        """A snapshot taken at ``changes`` is durable: the hand-overs it covers are done."""
        with self._lock:
            done = [bf for bf in self.items.values()
                    if bf.state == "handing_over" and bf.changes is not None and bf.changes <= changes]
        for bf in done:
            bf.state = "live"
            try:
                self.store.save_backfill(bf.sid, bf.public())
            except Exception as exc:  # noqa: BLE001 - a restart runs it again: same witnesses, same numbers
                log.warning("could not store that the backfill of %s is live: %s", bf.sid, exc)

    def _fail(self, bf: Backfill, error: str) -> None:
        bf.state, bf.error = "failed", error
        try:
            self.store.save_backfill(bf.sid, bf.public())
        except Exception as exc:  # noqa: BLE001
            log.warning("could not store that the backfill of %s failed: %s", bf.sid, exc)
