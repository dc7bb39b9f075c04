"""The daemon: wires the receivers, the priority queue, the engine thread, the
subscriptions, the witness delivery, recovery and snapshots together, and
starts and shuts them down in order.

Who does what (each in its own module, holding its own state):
- TCP receiver threads (server/ingest/tcp.py; a connection's reader server/ingest/connection.py,
  asking the rest through server/ingest/intake.py) decode lines and put events on
  the bounded queue (server/ingest/queue.py);
- the single engine thread (server/processing.py) is the only one that touches
  the engine once the server is ready: it pops batches, runs them, and between
  batches runs commands submitted by the API, checks the state budget and
  recounts instances (server/budget.py), and forks snapshots
  (server/durability/checkpoints.py);
- the registrar (server/subscriptions/registry.py) compiles, installs, stores
  and removes subscriptions;
- witnesses are numbered, logged and handed to WebSocket clients by
  server/delivery/witnesses.py;
- a start recovers in the background (server/durability/recovery.py): the
  snapshot, the journal after it, the stored subscriptions, then the engine
  thread starts;
- server/observability/health.py is what /health, /stats and /metrics read.
"""

from __future__ import annotations

import gc
import logging
import sqlite3
import threading
import time
from concurrent.futures import Future
from typing import Callable

from air.engine import Engine, EngineError
from air.model import Attribute, StreamSchema
from server.backfill.manager import Backfills
from server.backfill.preview import preview
from server.budget import Cap, StateBudget
from server.config import Settings
from server.delivery.hub import ClientChannel, NotifierHub
from server.delivery.witnesses import Witnesses
from server.durability.checkpoints import Checkpoints
from server.durability.datadir import DataDirLock, DataDirUnusable
from server.durability.diskfull import DiskFull, DiskState, storing
from server.durability.journal import SUFFIX as JOURNAL_SUFFIX, Journal
from server.durability.recovery import Recovery, ServerStarting
from server.durability.store import Store
from server.durability.witlog import WitnessLog
from server.ingest.connection import Limits
from server.ingest.intake import Intake
from server.ingest.queue import DelayQueue
from server.ingest.readers import ReaderConfig, ReaderProcess
from server.ingest.tcp import TcpReceiver, bind_port
from server.observability.counters import Counters
from server.observability.health import Health
from server.observability.metrics import make_registry
from server.processing import EngineThread
from server.workers.dispatch import WorkerEngineThread
from server.workers.link import WorkerLink, worker_settings
from server.workers.mirror import MirroredEngine
from server.workers.placement import Placement
from server.security import Security
from server.security.tls import TlsCollector
from server.subscriptions import schemacheck
from server.subscriptions.registry import (LimitReached, Registered, Registrar, Subscription, SubscriptionError,
                                           SubscriptionInUse, Validation, compile_subscription)

__all__ = ["Daemon", "LimitReached", "Registered", "ServerStarting", "Subscription", "SubscriptionError",
           "SubscriptionInUse", "Validation", "compile_subscription"]

log = logging.getLogger("cayuga.daemon")

#: Seconds a stop waits for the engine thread to end once the workers it waited for are ended.
STUCK_WORKER_SECONDS = 5.0


class Daemon:
    """The parts of one server and how they are connected.

    The api (server/api/) calls the public methods below; the parts are
    reachable as ``processing``, ``budget``, ``registrar``, ``witnesses``,
    ``recovery``, ``checkpoints`` and ``health``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.disk = DiskState()  # what of the data dir cannot be written now (/health, metrics)
        self.queue = DelayQueue(settings.queue_capacity, settings.delay, settings.time_unit_ms,
                                event_time=settings.time == "event")
        self.hub = NotifierHub()
        # one server per data directory (server/durability/datadir.py): before anything opens a file there
        self.lock = DataDirLock(settings.data_dir)
        self.lock.acquire(settings.host)
        try:
            self.store = Store(settings.data_dir / "cayuga.sqlite3")
        except BaseException as exc:
            self.lock.release()
            if isinstance(exc, sqlite3.Error):
                raise DataDirUnusable(f"the store {settings.data_dir / 'cayuga.sqlite3'} cannot be opened "
                                            f"({exc}); check that file, or give another data directory "
                                            "(--data-dir or CAYUGA_DATA_DIR)") from None
            raise
        try:  # what the configured streams' changes do to the stored subscriptions: a refusal ends the start here
            self.schema_check = schemacheck.check(
                self.store.subscriptions(), self.store.config_streams(), settings.stream_schemas(),
                self.store.streams(), self.store.broken(), settings.function_registry().return_types(),
                settings.time_unit_ms, settings.accept_schema_changes)
        except BaseException:
            self.store.close()
            self.lock.release()
            raise
        try:  # tokens, scopes, the audit log, TLS (server/security); TLS files that cannot be used: TlsError
            self.security = Security(settings, self.store, self.counters)
        except BaseException:
            self.store.close()
            self.lock.release()
            raise
        # engine_workers: 1 runs the automata in a worker process (server/workers/); this engine is then the
        # catalogue that registrations are checked against, every change sent on to the worker
        self.links: list[WorkerLink] = []
        if settings.engine_workers:
            n = settings.engine_workers
            self.links = [WorkerLink(worker_settings(settings), name=f"cayuga-engine-worker-{w}") for w in range(n)]
            # where each subscription runs (server/workers/placement.py): stored, so a restart places each
            # where its snapshot's instances are (one worker: always there)
            placement = Placement(n, self.store.placements(n) if n > 1 else None,
                                  (lambda placed: self.store.save_placements(placed, n)) if n > 1 else None,
                                  rows=settings.row_scaling)
            self.engine: Engine = MirroredEngine(self.links, placement, functions=settings.function_registry())
            placement.schema = self.engine.schema  # the catalogue's streams, for the planner (row scaling)
        else:
            self.engine = Engine(functions=settings.function_registry())
        self.receiver: TcpReceiver | None = None
        self._tcp_sock = None  # the event port, when bind_tcp() bound it before start()
        self.journal: Journal | None = None  # opened by start() unless durability is off
        self.declared: set[str] = set()  # input streams (config, API), as opposed to published outputs
        self._stop = threading.Event()
        self._final_written = False  # the shutdown snapshot (drain)
        self._drain_deadline: float | None = None  # (monotonic) the shutdown's one deadline, set by the first drain
        self.started = False
        if self.links:
            self.processing: EngineThread = WorkerEngineThread(self.engine, self.queue, settings, self.counters,
                                                               latency=None, stopping=self._stop, links=self.links)
            self.processing.hub = self.hub
        else:
            self.processing = EngineThread(self.engine, self.queue, settings, self.counters, latency=None,
                                           stopping=self._stop)
        self.registrar = Registrar(settings, self.engine, self.store, self.counters, self.processing,
                                   submit=self.submit, storing=self._storing, require_ready=self._require_ready,
                                   on_removed=self._removed, invalidate_routes=self.hub.invalidate,
                                   close_owner=self.hub.close_owner)
        self.subscriptions = self.registrar.subscriptions  # the same dict: registration order
        self.broken = self.registrar.broken  # stored subscriptions that do not compile (the same dict)
        self.witnesses = Witnesses(self.engine.schema, self.hub, self.counters, self.subscriptions, self._stop,
                                   queued=lambda: len(self.queue))
        self.engine.on_emit = self.witnesses.on_emit
        self.budget = StateBudget(self.engine, settings, self.store, self.counters, self.processing,
                                  self.subscriptions, storing=self._storing, seqs=lambda: self.witnesses.seq,
                                  local=not self.links)
        self.budget.notify = self._notify
        self.checkpoints = Checkpoints(settings, self.engine, self.queue, self.store, self.disk, self.counters,
                                       self.processing, self.budget, self.witnesses)
        self.snapshots, self.snapshotter = self.checkpoints.snapshots, self.checkpoints.snapshotter
        self.recovery = Recovery(self.store, self.queue, self.engine, self.snapshots, self.registrar,
                                 self.processing, self.witnesses, self.budget, self.checkpoints,
                                 start_engine=self.processing.start, stopping=self._stop)
        self.budget.recovery = self.recovery
        # subscriptions registered with "from": history first, then live (server/backfill/)
        self.backfills = Backfills(settings, self.registrar, self.store, self.queue, self.witnesses, self.recovery,
                                   self.checkpoints, self.processing, submit=self.submit,
                                   quiesce=self.processing.quiesce if self.links else None,
                                   inputs=lambda: {n: self.engine.schema(n) for n in sorted(self.declared)},
                                   stopping=self._stop)
        self.recovery.on_backfill_redo = self.backfills.resume
        if self.links:  # what reads or writes the instances asks the workers
            self.budget.remote = self.checkpoints.remote = self.processing
            self.recovery.import_engine = self.processing.import_snapshot
            for link in self.links:
                link.on_snapshot = self.snapshotter.remote_done
        self.processing.recovery, self.processing.budget = self.recovery, self.budget
        self.processing.witnesses, self.processing.checkpoints = self.witnesses, self.checkpoints
        self.health = Health(settings, self.queue, self.disk, self.store, self.counters, self.engine,
                             self.hub, self.snapshotter, self.processing, self.budget, self.recovery,
                             self.witnesses, self.subscriptions)
        self.health.broken = self.broken
        self.registry, self.latency = make_registry(self.health)
        self.disk.retry_with("store", self._retry_store)
        if self.security.tls is not None:
            self.registry.register(TlsCollector(self.security.tls))
        self.processing.latency = self.latency
        # the parts' public state the api reads (the same objects)
        self.ready = self.recovery.ready  # stored subscriptions restored, engine thread running
        # set once recovery has put back what the queue held: new events (TCP, POST /events) wait for it
        self.accepting = self.recovery.accepting
        self.recovered = self.recovery.recovered  # what the last start recovered (logged; /health)
        self.shapes, self.preparer = self.registrar.shapes, self.registrar.preparer

    # ------------------------------------------------------------------ wiring helpers

    def _storing(self, what: str):
        """A write to the SQLite store: a full disk raises :class:`DiskFull` saying ``what``."""
        return storing(self.store, self.disk, what)

    def _retry_store(self) -> bool:
        """The store could not be written: whether a small write works again (then the episode ends)."""
        if not self.store.probe():
            return False
        self.disk.recovered("store")
        return True

    def _removed(self, sid: str) -> None:
        """On the engine thread: a subscription left the engine; drop what the parts kept of it."""
        self.budget.forget(sid)
        self.witnesses.forget(sid)
        self.backfills.forget(sid)

    def _notify(self, sid: str, message: dict) -> None:
        """Tell a subscription's watchers (and those of the streams it publishes) a control message."""
        sub = self.subscriptions.get(sid)
        self.hub.notify(sid, sub.outputs if sub is not None else (), message)

    def _require_ready(self) -> None:
        held = self.witnesses.held
        if held is not None:  # the engine thread takes no command until the witness log takes its batch
            raise DiskFull(held.part, f"{held.what}, and the engine waits until it can", held.path, held.reason,
                           held.kind)
        self.recovery.require_ready()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Declare streams, open the witness log, the journal and the TCP
        receiver, and recover in the background (server/durability/recovery.py):
        the snapshot's queued events and the journal after it go back on the
        queue first, then new events are accepted (:attr:`accepting`), then the
        stored subscriptions and the snapshot's instances come back and the
        engine thread starts (:attr:`ready`). 100K subscriptions take about 7 s;
        meanwhile /health answers (status "starting"), events queue up
        (bounded: senders are slowed, nothing is lost), and changes to
        subscriptions or streams are refused with 503 (:class:`ServerStarting`)."""
        if self.started:
            return
        st = self.settings
        for link in self.links:
            link.start()  # first: every stream and subscription below is sent on to them
        witlog = WitnessLog(st.data_dir / "witnesses", max_bytes=st.witness_log_bytes,
                            max_seconds=st.witness_log_seconds, disk=self.disk)
        self.witnesses.open(witlog)
        if st.slow_client_policy is not None:
            log.warning("slow_client_policy (%s) is retired and ignored: a slow WebSocket client lags on the "
                        "witness log instead of being cut or losing witnesses", st.slow_client_policy)
        for s in st.stream_schemas():
            self.engine.declare(s)
            self.declared.add(s.name)
        for name, attrs in self.store.streams():
            self.engine.declare(StreamSchema(name, tuple(Attribute(a, t) for a, t in attrs)))
            self.declared.add(name)
        self._record_schemas()
        stored = self.store.subscriptions()
        # a backfill not yet live runs again once the engine thread runs; live ones are restored as any other
        backfilling = [st for st in stored if st.backfill is not None and st.backfill.get("state") != "live"]
        self.backfills.restored_live([st for st in stored if st.backfill is not None and st not in backfilling])
        stored = [st for st in stored if st not in backfilling]
        for sid, (max_instances, max_state_bytes, since) in self.store.caps().items():
            self.budget.set_cap(sid, Cap(max_instances, max_state_bytes, since))
        if st.durability != "off":
            journal_dir = st.data_dir / "journal"
            begins = not any(journal_dir.glob("*" + JOURNAL_SUFFIX)) if journal_dir.exists() else True
            self.journal = Journal(journal_dir, st.durability, st.journal_segment_bytes, disk=self.disk,
                                   retain_time=st.retain_units, retain_bytes=st.retain_bytes,
                                   sync_interval=st.journal_sync_ms / 1000)
            self.queue.journal = self.recovery.journal = self.checkpoints.journal = self.journal
            self.backfills.journal = self.journal
            self.budget.journal = self.health.journal = self.journal
            self.disk.retry_with("journal", self.journal.probe)  # a freed disk ends the episode by itself
            if begins:
                # the journal begins now (a new data directory, or one whose journal was off or removed):
                # a replay from its first record numbers witnesses on from where the log stands now. Not
                # when a journal lost its every record (a torn tail): its senders send them again, and
                # their witnesses must come back with the numbers they had
                self.store.set_witness_base(self.witnesses.seq)
        if self.links:  # (started first thing above: their interpreters came up meanwhile)
            self.processing.await_workers()  # before events or requests come: the first would wait for them
        intake = Intake(self.queue, self.engine.schema, self.health.now, self.counters, time_unit_ms=st.time_unit_ms,
                        streams=lambda: list(self.declared), security=self.security, horizon=self.horizon,
                        stamp=st.time == "clock")
        limits = Limits(max_line_bytes=st.max_line_bytes, max_value_bytes=st.max_value_bytes,
                        idle_timeout=st.idle_timeout)
        self.receiver = self.health.receiver = TcpReceiver(
            st.host, st.tcp_port, intake, max_connections=st.max_connections, limits=limits,
            max_per_address=st.max_connections_per_address, security=self.security, gate=self.accepting,
            sock=self._tcp_sock, readers=self._readers(st, limits))
        try:
            self.receiver.start()
        except BaseException:
            if self.journal is not None:
                self.journal.close()
            witlog.close()
            for link in self.links:
                link.stop()
            raise
        self.started = True
        self.backfills.resume(backfilling)  # listed now, run once the engine thread runs
        self.recovery.start(stored)

    def _readers(self, st: Settings, limits: Limits) -> ReaderProcess | None:
        """The TCP reader process (``receivers: 1``), or None: a reader thread a connection."""
        if not st.receivers:
            return None
        config = ReaderConfig(limits, time_unit_ms=st.time_unit_ms, stamp=st.time == "clock",
                              horizon_ahead=self.health.horizon_ahead(), tls_certfile=_path(st.tls_certfile),
                              tls_keyfile=_path(st.tls_keyfile), tls_client_ca=_path(st.tls_client_ca),
                              log_level=st.log_level)
        return ReaderProcess(config, auth=self.security.enabled, journaled=self.journal is not None)

    def _record_schemas(self) -> None:
        """Record this start's configured streams, what it installs afresh and what
        it finds broken (server/subscriptions/schemacheck.py: the restore logs each), and
        log what it accepted."""
        check = self.schema_check
        self.store.started_with(check.streams, check.fresh, check.broken)
        for o in check.affected:
            log.warning("accepted a change of the schemas of subscription %s (accept_schema_changes): %s; it is "
                        "recompiled against the new schemas and starts afresh once the recovery's replay is over",
                        o.sid, "; ".join(o.changes))
        if check.fresh:
            log.warning("installed afresh after the replay (their partial matches are not carried over, their "
                        "witnesses are numbered on): %s", ", ".join(check.fresh))

    def bind_tcp(self) -> None:
        """Bind the TCP event port now, before the HTTP server starts (start() listens on it):
        a port in use is an OSError here, not a failure inside the HTTP server's start-up."""
        self._tcp_sock = bind_port(self.settings.host, self.settings.tcp_port)

    def drain(self, timeout: float) -> None:
        """Graceful stop, first half: no new events, run what is queued, and
        give WebSocket clients time to receive what is buffered for them (and
        lagging ones to catch up from the witness log); then every client is
        closed with 1001. No one is cut: a client still behind at the deadline
        resumes from the witness log after the restart (``?from=``). One shutdown has one
        deadline: stop() drains again after a SIGTERM's drain, within what is left of the first."""
        deadline = time.monotonic() + timeout
        if self._drain_deadline is not None:
            deadline = min(deadline, self._drain_deadline)
        self._drain_deadline = deadline
        self.backfills.stop(timeout=max(timeout / 4, 0.5))  # they use the engine thread: before it stops
        if self.receiver:
            self.receiver.stop(timeout=max(deadline - time.monotonic(), 0.1))
        self.queue.close(drain=True)
        if self.recovery.cancel(deadline) and len(self.queue):
            log.warning("stopped while restoring subscriptions: %d queued events were not processed",
                        len(self.queue))
        while len(self.queue) and time.monotonic() < deadline and self.processing.alive:
            time.sleep(0.01)
        self._stop.set()
        self.queue.wake()
        self.processing.join(max(deadline - time.monotonic(), 0.1))
        self.snapshotter.stop(timeout=0.0)  # a periodic one being written is superseded by the final one
        if (self.processing.thread is not None and not self.processing.alive and not self.witnesses.unlogged
                and not self._final_written):
            # not when witnesses were abandoned: the journal replay makes them again; and once: stop() drains
            # again after a SIGTERM's drain, and a second, identical snapshot pushed the older one out
            self._final_written = True
            self.checkpoints.final()
        while self.hub.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        for ch in self.hub.channels():  # tell each client we are going away (close code 1001)
            ch.close()
        while self.hub.client_count and time.monotonic() < deadline:
            time.sleep(0.01)

    def _end_stuck_workers(self) -> None:
        """The drain is over and the engine thread still waits for a worker's results: one that
        does not answer (stopped by a signal or a debugger, stuck), or slower than shutdown_timeout;
        or one started again after it died and still catching up (the engine thread feeds it the
        journal: as long as the replay takes, and a stopped one never ends it).
        No shutdown snapshot was written, so the next start replays from the journal whatever the
        workers had not done; waiting for such a worker to answer ``stop`` (it never does, when
        stopped) held a SIGTERM for 30 s more. Each one that owes a batch, or catches up, is ended
        with SIGKILL, saying so, and none is started again."""
        restarter = self.processing.restarter
        restarter.ending = True
        catching_up = dict(restarter.catching_up)  # (the engine thread's: a copy)
        for w, link in enumerate(self.links):
            owed = restarter.owed(w)
            if w in catching_up and link.alive:
                progress = catching_up[w]
                log.warning("engine worker %d (pid %d) was started again and is catching up (%d of %d events "
                            "replayed): ended with SIGKILL at shutdown; the next start replays the journal",
                            w, link.process.pid, progress["events_done"], progress["events_total"])
                link.kill()
            elif owed is not None and link.alive:
                log.warning("engine worker %d (pid %d) has not answered a batch sent %.1f s ago: ended with "
                            "SIGKILL at shutdown; the next start replays its events from the journal",
                            w, link.process.pid, owed)
                link.kill()
        self.processing.join(STUCK_WORKER_SECONDS)

    def stop(self, timeout: float | None = None) -> None:
        """Stop everything (idempotent); returns when threads have ended. The
        data directory's lock is released last, once nothing writes there."""
        if not self.started:
            if self._tcp_sock is not None:
                self._tcp_sock.close()
            self.lock.release()
            return
        timeout = timeout if timeout is not None else self.settings.shutdown_timeout
        self.drain(timeout)
        if self.links and self.processing.alive:
            self._end_stuck_workers()
        for ch in self.hub.channels():
            ch.close()
        self.disk.close()  # no more retries of what could not be written
        if self.journal is not None:
            self.journal.close()  # after drain: the receivers and the engine thread have stopped
        for link in self.links:
            link.stop()  # after the shutdown snapshot, which the workers wrote
        if self.links:
            self.processing.restarter.close()  # the thread that started restarted ones (server/workers/restart.py)
        self.store.close()
        self.security.close()
        if self.witlog is not None and not self.processing.alive:
            self.witlog.close()  # synced; readers still open read what they have
        self.started = False
        if self.processing.alive:  # it may still write: the data directory stays locked until the process exits
            log.error("the engine thread did not stop; %s stays locked until this process exits", self.lock.directory)
        else:
            self.lock.release()
        gc.unfreeze()  # what large batches froze (see Registrar.install) may be collected again, this daemon included

    # ------------------------------------------------------------------ the engine thread

    def submit(self, fn: Callable[[Engine], object]) -> Future:
        """Run ``fn(engine)`` on the engine thread between batches."""
        return self.processing.submit(fn)

    @property
    def engine_error(self) -> str | None:
        """The last error the engine raised on an event (the thread survived it), or why an
        engine worker is gone (server/workers/link.py)."""
        if self.links:  # a worker that died is started again (server/workers/restart.py) unless it died too often
            gone = self.processing.gone()
            if gone is not None:
                return f"{gone}: its subscriptions get no events; restart the server"
        return self.processing.error

    def state_counts(self, sid: str, timeout: float = 5.0) -> dict[str, int]:
        """Live instances of one subscription per state, counted on the engine
        thread between batches (KeyError when it does not exist)."""
        if sid not in self.subscriptions:
            raise KeyError(sid)
        try:
            if self.links:
                return self.processing.state_counts(sid, timeout)
            return self.submit(lambda eng: eng.state_counts(sid)).result(timeout=timeout)
        except EngineError:
            raise KeyError(sid) from None

    # ------------------------------------------------------------------ streams

    def declare_stream(self, schema: StreamSchema) -> bool:
        """Declare (and persist) a stream; False when it already existed identically."""
        with self.registrar.lock:
            self._require_ready()
            existing = self.engine.schema(schema.name)
            if existing is not None:
                if existing.attributes != schema.attributes:
                    raise EngineError(f"stream {schema.name} already exists as {existing}")
                return False
            with self._storing(f"stream {schema.name} could not be stored; it was not declared"):
                self.store.save_stream(schema.name, [(a.name, a.type) for a in schema.attributes])
            self.submit(lambda eng: eng.declare(schema)).result(timeout=10)  # after: nothing half declared
            self.declared.add(schema.name)
            return True

    # ------------------------------------------------------------------ subscriptions (server/subscriptions)

    def functions(self) -> dict[str, str]:
        return self.registrar.functions()

    def add_subscription(self, kind: str, text: str, name: str | None = None) -> Subscription:
        return self.registrar.add_subscription(kind, text, name)

    def add_subscriptions(self, items: list[tuple[str, str, str | None]]) -> list[Subscription]:
        return self.registrar.add_subscriptions(items)

    def register_subscription(self, kind: str, text: str, name: str | None = None) -> Registered:
        """:meth:`add_subscription`, with what its registration warns of."""
        return self.registrar.register_one(kind, text, name)

    def register_subscriptions(self, items: list[tuple[str, str, str | None]]) -> list[Registered]:
        """:meth:`add_subscriptions`, each with what its registration warns of."""
        return self.registrar.register(items)

    def register_from(self, kind: str, text: str, name: str | None, start) -> Registered:
        """Register a subscription that runs over history from ``start`` first (server/backfill/)."""
        return self.backfills.register(kind, text, name, start)

    def backfill(self, sid: str) -> dict | None:
        """A subscription's backfill as GET /subscriptions/{id} shows it (None: registered without from)."""
        return self.backfills.public(sid)

    def preview(self, kind: str, text: str, start, limit: int) -> dict:
        """The witnesses a query would have made over history from ``start`` (nothing installed)."""
        return preview(self.backfills, kind, text, start, limit)

    def subscription_warnings(self, sub: Subscription) -> list[dict]:
        """What registering ``sub``'s query again would warn of."""
        return self.registrar.warnings_of(sub)

    def set_cap(self, sid: str, cap: Cap) -> None:
        """A subscription's own limits on its state (its registration body): in force from the
        budget's next check (server/budget.py), stored with the point they came into force at
        (so that a replay applies them from the same point)."""
        def apply(_eng) -> None:
            fixed = cap._replace(since=self.processing.fed)
            with self._storing(f"the limits of subscription {sid} could not be stored; they are not in force"):
                self.store.save_cap(sid, fixed.max_instances, fixed.max_state_bytes, fixed.since)
            self.budget.set_cap(sid, fixed)

        self.submit(apply).result(timeout=10)

    def remove_subscription(self, sid: str, cascade: bool = False) -> list[str]:
        return self.registrar.remove_subscription(sid, cascade)

    def readers_of(self, sid: str) -> list[str]:
        return self.registrar.readers_of(sid)

    def validate_subscription(self, kind: str, text: str) -> Validation:
        return self.registrar.validate_subscription(kind, text)

    # ------------------------------------------------------------------ witnesses (server/delivery)

    @property
    def witlog(self) -> WitnessLog | None:
        return self.witnesses.witlog

    def on_client_drop(self, ch: ClientChannel, policy: str, n: int = 1) -> None:
        self.witnesses.on_client_drop(ch, policy, n)

    # ------------------------------------------------------------------ recovery (server/durability)

    @property
    def restored(self) -> int:
        return self.recovery.restored

    @property
    def restore_total(self) -> int:
        return self.recovery.restore_total

    @property
    def caught_up(self) -> bool:
        return self.recovery.caught_up

    # ------------------------------------------------------------------ health (server/observability)

    def now(self) -> float:
        return self.health.now()

    def horizon(self) -> float | None:
        return self.health.horizon()

    def queue_stalled(self) -> str | None:
        return self.health.queue_stalled()

    def disk_status(self) -> dict[str, dict]:
        return self.health.disk_status()

    def epoch(self) -> float | None:
        """The engine's current epoch (stream time units), None before the first event."""
        return self.processing.epoch

    def epoch_lag(self) -> float:
        return self.health.epoch_lag()

    @property
    def engine_alive(self) -> bool:
        return self.health.engine_alive

    @property
    def events_taken(self) -> int:
        return self.health.events_taken

    @property
    def replay_remaining(self) -> int:
        return self.health.replay_remaining

    @property
    def heaviest(self) -> tuple[str, int] | None:
        return self.health.heaviest

    @property
    def counted_at(self) -> float:
        return self.health.counted_at

    def instance_counts(self) -> dict[str, int]:
        return self.health.instance_counts()

    def inexact(self) -> dict[str, dict]:
        return self.health.inexact()

    def witness_gaps(self) -> dict[str, list[dict]]:
        return self.health.witness_gaps()

    def broken_subscriptions(self) -> dict[str, dict]:
        return self.health.broken_subscriptions()

    def workers(self) -> list[dict]:
        return self.health.workers()

    def worker_trouble(self) -> list[str]:
        """What /health says of engine workers restarted, catching up, stopped or not answering
        (server/workers/restart.py), or of the in-process engine on one batch that long."""
        return self.processing.restarter.trouble() if self.links else self.processing.trouble()

    def retained(self) -> dict | None:
        return self.health.retained()

    def runaways(self) -> dict[str, dict]:
        return self.health.runaways()

    def state(self) -> dict:
        return self.health.state()

    def instance_count(self, sid: str) -> int:
        return self.health.instance_count(sid)

    def activity(self) -> tuple[dict[str, int], dict[str, int]]:
        return self.health.activity()


def _path(p) -> str | None:
    return None if p is None else str(p)
