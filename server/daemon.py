"""The daemon: wires the receivers, the priority queue, the engine thread, the
notifiers and the store together, and shuts them down in order.

Threads and who owns what:
- TCP receiver threads decode lines and put events on the bounded queue;
- the single engine thread is the only one that touches the engine: it pops
  batches, runs them, and between batches applies control commands (add or
  remove a subscription) submitted by the API as futures;
- the engine thread numbers each witness, appends a batch's witnesses to the
  witness log (witlog.py) and hands them, already serialised, to the channels
  of the WebSocket clients listening for them (see notifiers.py);
- between batches it also forks snapshots (snapshot.py); a restart loads the
  newest, puts back its queued events and the journal after it (journal.py),
  and reinstalls subscriptions registered since where the replay reaches the
  point they were installed at (``installed_at``, ``_due``), so the engine
  takes exactly the events, in the order, it took before the crash.
"""

from __future__ import annotations

import gc
import logging
import queue as stdqueue
import sqlite3
import threading
import time
from collections import ChainMap, Counter, deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Mapping

from air.airxml import dump_air, load_air_many
from air.cel.shapes import BoundQuery, ShapeCache
from air.engine.memory import paused_gc
from air.engine import Emission, Engine, EngineError, Event, LateEvent
from air.errors import CayugaError
from air.formats import witness_bytes
from air.model import Automaton, StreamSchema
from server.config import Settings
from server.delivery.hub import ClientChannel, NotifierHub
from server.durability.diskfull import DiskFull, DiskState, store_error
from server.durability.journal import SUFFIX as JOURNAL_SUFFIX, Journal
from server.durability.snapshot import SnapshotFile, SnapshotStore, Snapshotter
from server.durability.store import Store, StoredSubscription
from server.durability.witlog import WitnessLog
from server.ingest.limits import automaton_size_errors
from server.ingest.queue import DelayQueue
from server.ingest.tcp import TcpReceiver
from server.observability.metrics import Counters, make_registry
from server.subscriptions.prepared import Preparer

log = logging.getLogger("cayuga.daemon")

_STREAM_OF = attrgetter("stream")

#: Instance counts per subscription (API, /metrics): a full pass at most this often ...
COUNT_PASS_SECONDS = 1.0
#: ... taking at most this much engine-thread time per loop iteration ...
COUNT_BUDGET_SECONDS = 0.002
#: ... and at most this share of the engine thread's time overall (with 100K
#: subscriptions a pass costs ~0.2 s, so passes then come every ~4 s).
COUNT_SHARE = 0.05


#: A subscription the count pass finds above this share of max_instances_per_subscription
#: is watched: recounted after every batch, not only once a pass (a FOLD whose rebind is
#: always true grows by an instance per event, and slows every event in proportion) ...
WATCH_SHARE = 0.5
#: ... and brought back to the limit as soon as it holds this share more than the limit
#: (so a runaway is evicted once per tenth of the limit in events, not once per batch).
WATCH_SLACK = 0.1
#: While one is watched, the engine takes batches of at most a tenth of the limit (not
#: less than this), so that a watched subscription never outgrows the limit by much more.
MIN_WATCHED_BATCH = 64


#: Evictions of one subscription are logged at most once per this many seconds.
EVICTION_LOG_SECONDS = 10.0


#: /health calls a full queue that released nothing for this long stalled.
STALL_SECONDS = 5.0
#: The engine thread tries a witness-log append that failed again after this
#: long, doubling up to WITLOG_RETRY_MAX (seconds).
WITLOG_RETRY_FIRST = 0.1
WITLOG_RETRY_MAX = 1.0
#: A snapshot that could not be written (a full disk) is tried again this often (seconds).
SNAPSHOT_RETRY_SECONDS = 5.0
#: /health tries a small write to a store that could not be written at most this often (seconds).
STORE_PROBE_SECONDS = 1.0


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
        super().__init__(f"subscription {sid} publishes {streams}, which {', '.join(readers)} read"
                         f"{'s' if len(readers) == 1 else ''}; delete {'it' if len(readers) == 1 else 'them'} "
                         f"first, or delete with ?cascade=true to remove {sid} and every subscription reading "
                         "its outputs")
        self.readers = readers


class ServerStarting(RuntimeError):
    """A change asked for while stored subscriptions are still being restored."""


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


def compile_subscription(kind: str, text: str, streams: Mapping[str, StreamSchema], sid: str,
                         functions: dict[str, str], time_unit_ms: float,
                         shapes: ShapeCache | None = None) -> tuple[tuple[Automaton, ...], list[str]]:
    """Automata and user-visible output streams of a CEL or AIR text (CEL
    through ``shapes`` when given: one compile per query shape)."""
    if kind == "cel":
        from air.cel import compile_cel

        compile_ = shapes.compile if shapes is not None else compile_cel
        compiled = compile_(text, streams, functions=functions, time_unit_ms=time_unit_ms, name_prefix=sid)
        return tuple(compiled.automata), list(compiled.outputs)
    autos = tuple(load_air_many(text, name=sid))
    outs = list(dict.fromkeys(o.name for a in autos for _, o in a.outputs if o.type == "OUT"))
    return autos, outs


#: Registrations and restores install subscriptions on the engine thread this
#: many at a time (≈0.2 s each), so that events keep flowing during a large batch.
INSTALL_CHUNK = 500
#: A batch reports at most this many errors.
MAX_BATCH_ERRORS = 100


@dataclass
class _Pending:
    """A subscription compiled, not yet installed."""

    id: str
    kind: str
    text: str
    name: str | None
    created: float
    automata: tuple[Automaton, ...] = ()  # or a BoundQuery (restored from its binding: built when read)
    outputs: list[str] = field(default_factory=list)
    installed_at: int | None = None  # Daemon._fed when the engine thread installed it
    binding: tuple[str, str] | None = None  # CEL of a cached shape: (shape id, constants), stored beside the text
    stored: tuple[str | None, str | None] = (None, None)  # the binding a restored row had

    @classmethod
    def restored(cls, st: StoredSubscription) -> "_Pending":
        return cls(st.id, st.kind, st.text, st.name, st.created, installed_at=st.installed_at,
                   binding=(st.shape, st.constants) if st.shape and st.constants else None,
                   stored=(st.shape, st.constants))


@dataclass
class _Eviction:
    """A recorded max_instances_per_subscription eviction a replay applies again (see Daemon._evict)."""

    seq: int
    sid: str
    keep: int


def _bind_error(index: int, exc: EngineError) -> dict:
    return {"index": index, "kind": "bind", "message": str(exc), "detail": str(exc)}


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.disk = DiskState()  # what of the data dir cannot be written now (/health, metrics)
        self._witlog_held: DiskFull | None = None  # the engine thread holds a batch the witness log refused
        self._unlogged = 0  # witnesses a stop abandoned because the witness log could not take them
        self._store_probed = 0.0
        self.engine = Engine(functions=settings.function_registry())
        self.engine.on_emit = self._on_emit
        self.queue = DelayQueue(settings.queue_capacity, settings.delay, settings.time_unit_ms,
                                event_time=settings.time == "event")
        self.hub = NotifierHub()
        self.store = Store(settings.data_dir / "cayuga.sqlite3")
        self.registry, self.latency = make_registry(self)
        self.subscriptions: dict[str, Subscription] = {}
        self.shapes = ShapeCache()  # compiled CEL query shapes (registrations and restores)
        self.preparer = Preparer()  # installs restored CEL queries without building their automata
        self.receiver: TcpReceiver | None = None
        self.journal: Journal | None = None  # opened by start() unless durability is off
        self._commands: stdqueue.Queue = stdqueue.Queue(maxsize=1000)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards subscriptions and stream declarations
        # the current batch's witnesses, as columns (no object per witness for the garbage collector):
        self._outbox: dict[ClientChannel, tuple[list, list, list]] = {}  # per client: sids, seqs, payloads
        self._logged: tuple[list, list, list, list] = ([], [], [], [])  # sids, seqs, streams, payloads: the log's
        self._log_add = tuple(c.append for c in self._logged)  # their append methods
        self._box_add: dict[ClientChannel, tuple] = {}  # the append methods of each client's columns
        #: The last seq given per subscription (engine thread only; from the witness log at start-up).
        self.witness_seq: dict[str, int] = {}
        self.witlog: WitnessLog | None = None  # opened by start()
        self._instances: dict[str, int] = {}  # per subscription, refreshed by the engine thread
        self._count_queue: list[str] = []  # subscriptions still to count in the current pass
        self._count_next_pass = 0.0  # monotonic time
        self._count_pass_cost = 0.0  # engine-thread seconds spent on the current pass
        self.counted_at = time.monotonic()  # when the last full pass of instance counts ended
        self._watched: set[str] = set()  # near max_instances_per_subscription: recounted every batch
        self._pass_heaviest: tuple[str, int] = ("", 0)  # the most instances the current pass found
        self.heaviest: tuple[str, int] | None = None  # ... and the last full pass (or a watched recount)
        self._eviction_log: dict[str, tuple[float, int]] = {}  # sid -> (last logged, evictions not logged since)
        self._epoch = None
        self.started = False
        self.ready = threading.Event()  # stored subscriptions restored, engine thread running
        self.restore_total = 0
        self.restored = 0
        self._restore_thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # the engine thread starts, or the stop wins
        self.engine_error: str | None = None
        self.declared: set[str] = set()  # input streams (config, API), as opposed to published outputs
        self._readers: dict[str, set[str]] = {}  # stream -> subscriptions whose automata read it
        # for the console's rates; written by the engine thread only, read as copies (see activity())
        self._stream_events: dict[str, int] = {}  # input stream -> events taken from the queue
        self._owner_witnesses: dict[str, int] = {}  # subscription -> witnesses on its outputs
        # crash safety (see server/durability/snapshot.py and _restore_then_run); the engine thread writes these
        self._fed = 0  # events the engine thread has taken from the queue, over every life of the data dir
        # a replay installs these subscriptions and applies these evictions at these _fed points
        self._due: deque[tuple[int, list[_Pending | _Eviction]]] = deque()
        self._replay_until = 0  # _fed at the end of a replay: no new eviction is decided before it
        self._replaying = False  # a recovery's exact replay is under way (until _fed reaches _replay_until)
        self._evict_seq = 0  # the last eviction applied (Store.evictions); a snapshot includes those up to it
        self._fork_mark = 0  # _evict_seq of the snapshot being written
        self._marks: deque[int] = deque()  # _evict_seq of the snapshots published by this process, oldest first
        self._changes = 0  # subscriptions installed or removed (a snapshot is due after a change too)
        self.snapshots = SnapshotStore(settings.data_dir / "snapshots")
        self.snapshotter = Snapshotter(self.snapshots, before_publish=self._before_publish,
                                       after_publish=self._after_publish, disk=self.disk)
        self._snap_fed = 0
        self._snap_changes = 0
        self._snap_at = time.monotonic()
        self.recovered: dict = {}  # what the last start recovered (logged; /health)
        # set once recovery has put back what the queue held: new events (TCP, POST /events) wait for it
        self.accepting = threading.Event()

    # ------------------------------------------------------------------ clock

    def now(self) -> float:
        """The server clock in stream time units."""
        return time.time() * 1000.0 / self.settings.time_unit_ms

    def horizon(self) -> float | None:
        """The latest t1 an event may have now (time: clock and max_future > 0), else None."""
        s = self.settings
        if s.time != "clock" or not s.max_future:
            return None
        return self.now() + s.max_future * 1000.0 / s.time_unit_ms

    def queue_stalled(self) -> str | None:
        """Why the queue is stuck (full, and nothing left it for STALL_SECONDS), or None."""
        q = self.queue
        idle = time.monotonic() - q.released_at
        if len(q) < q.capacity or idle < STALL_SECONDS:
            return None
        wait = q.head_wait()
        due = "" if wait is None else f"; the next event is due in {wait * self.settings.time_unit_ms / 1000:.0f} s"
        return (f"the event queue is full ({len(q)} events) and none has left for {idle:.0f} s{due}: "
                "senders are blocked")

    def disk_status(self) -> dict[str, dict]:
        """The parts of the data dir that cannot be written now (for /health):
        a store failure ends once a small write works again (tried at most
        every STORE_PROBE_SECONDS), the others with their next write."""
        if self.disk.failing("store") is not None and time.monotonic() - self._store_probed >= STORE_PROBE_SECONDS:
            self._store_probed = time.monotonic()
            if self.store.probe():
                self.disk.recovered("store")
        return self.disk.current()

    @contextmanager
    def _storing(self, what: str):
        """A write to the SQLite store: one that fails for a full disk (or an
        I/O error) raises :class:`DiskFull` saying ``what`` could not be done."""
        try:
            yield
        except sqlite3.Error as exc:
            failure = store_error(exc, self.store.path, what)
            if failure is None:
                raise
            self.disk.failed(failure)
            raise failure from None
        self.disk.recovered("store")

    def epoch(self) -> float | None:
        """The engine's current epoch (stream time units), None before the first event."""
        return self._epoch

    def epoch_lag(self) -> float:
        return 0.0 if self._epoch is None else max(self.now() - self._epoch, 0.0)

    @property
    def engine_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def instance_counts(self) -> dict[str, int]:
        """A copy of every subscription's last instance count (for /metrics)."""
        return dict(self._instances)

    def instance_count(self, sid: str) -> int:
        """One subscription's last instance count, without copying them all."""
        return self._instances.get(sid, 0)

    def activity(self) -> tuple[dict[str, int], dict[str, int]]:
        """Copies of the running totals of events per input stream and of
        witnesses per subscription (the console turns them into rates). The
        engine thread is their only writer; a dict copy is atomic under the GIL."""
        return dict(self._stream_events), dict(self._owner_witnesses)

    def state_counts(self, sid: str, timeout: float = 5.0) -> dict[str, int]:
        """Live instances of one subscription per state, counted on the engine
        thread between batches (KeyError when it does not exist)."""
        if sid not in self.subscriptions:
            raise KeyError(sid)
        try:
            return self.submit(lambda eng: eng.state_counts(sid)).result(timeout=timeout)
        except EngineError:
            raise KeyError(sid) from None

    def _count_batch(self, batch: list) -> None:
        """Add a batch's events per stream to the console's totals (engine thread)."""
        totals = self._stream_events
        for name, n in Counter(map(_STREAM_OF, batch)).items():
            totals[name] = totals.get(name, 0) + n

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Declare streams, open the witness log, the journal and the TCP
        receiver, and recover in the background (:meth:`_restore_then_run`):
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
        self.witlog = WitnessLog(st.data_dir / "witnesses", max_bytes=st.witness_log_bytes,
                                 max_seconds=st.witness_log_seconds, disk=self.disk)
        self.witness_seq = self.witlog.last_seqs()
        if st.slow_client_policy is not None:
            log.warning("slow_client_policy (%s) is retired and ignored: a slow WebSocket client lags on the "
                        "witness log instead of being cut or losing witnesses", st.slow_client_policy)
        for s in self.settings.stream_schemas():
            self.engine.declare(s)
            self.declared.add(s.name)
        for name, attrs in self.store.streams():
            self._declare_restored(name, attrs)
        stored = self.store.subscriptions()
        self.restore_total = len(stored)
        if self.settings.durability != "off":
            journal_dir = self.settings.data_dir / "journal"
            begins = not any(journal_dir.glob("*" + JOURNAL_SUFFIX)) if journal_dir.exists() else True
            self.journal = Journal(journal_dir, self.settings.durability, self.settings.journal_segment_bytes,
                                   disk=self.disk)
            self.queue.journal = self.journal
            if begins:
                # the journal begins now (a new data directory, or one whose journal was off or removed):
                # a replay from its first record numbers witnesses on from where the log stands now. Not
                # when a journal lost its every record (a torn tail): its senders send them again, and
                # their witnesses must come back with the numbers they had
                self.store.set_witness_base(self.witness_seq)
        self.receiver = TcpReceiver(
            self.settings.host, self.settings.tcp_port, self.queue, self.engine.schema, self.now, self.counters,
            max_connections=self.settings.max_connections, max_line_bytes=self.settings.max_line_bytes,
            time_unit_ms=self.settings.time_unit_ms, streams=lambda: list(self.declared),
            max_per_address=self.settings.max_connections_per_address, idle_timeout=self.settings.idle_timeout,
            tokens=self.settings.auth_tokens, horizon=self.horizon, max_value_bytes=self.settings.max_value_bytes,
            stamp=self.settings.time == "clock", gate=self.accepting)
        try:
            self.receiver.start()
        except BaseException:
            if self.journal is not None:
                self.journal.close()
            self.witlog.close()
            raise
        self.started = True
        self._restore_thread = threading.Thread(target=self._restore_then_run, args=(stored,), name="cayuga-restore",
                                                daemon=True)
        self._restore_thread.start()

    def _restore_then_run(self, stored: list) -> None:
        """The engine's only writer until it hands over to the engine thread.
        Stored CEL is not compiled again: each query is bound from its
        shape's compiled form, stored when the shape was first compiled (keyed
        by the compiler's version, so a new compiler compiles each shape once
        again); subscriptions are installed in chunks."""
        if stored:
            log.info("restoring %d subscriptions", len(stored))
        clock = time.perf_counter
        began = clock()
        rows = self.store.shapes()
        if rows:
            self.shapes.load(rows)
            self.store.keep_shapes(self.shapes.keys())
        with paused_gc():  # a snapshot is a million small tuples, which live on
            found = self.snapshots.load_latest()
        snap, snap_file = found if found is not None else (None, None)
        seconds = self.recovered["seconds"] = {"snapshot_read": round(clock() - began, 2)}
        exact = self._replayable(snap_file)
        # the queue first: what waited in it, then the journal after the snapshot, all before any new
        # event (the receivers and POST /events wait for `accepting`), so arrival order stays journal order
        if snap is not None:
            queued = [Event(*t) for t in snap["queue"]["events"]]
            self.queue.restore(queued, snap["queue"])
            self.recovered.update(snapshot=snap_file.path.name, queued=len(queued))
        fed = snap["fed"] if snap is not None else 0
        if exact:
            # the replay gives every witness since the snapshot (without one: since the journal's first
            # record) again, in the order and so with the numbers it had: numbering goes on from the
            # snapshot's (_load_snapshot), or from where it stood when the journal began (Store.witness_base:
            # nothing for a new data directory); what the log holds already is not logged again
            self._replaying = True
            if snap is None:
                self.witness_seq = self.store.witness_base()
        if exact:
            self._replay(snap_file.journal if snap_file else 0)
            self._replay_until = fed + len(self.queue)  # what the journal gives back, before any new event
        self.accepting.set()
        seconds["events_back"] = round(clock() - began, 2)  # new events are accepted from here on
        mark = snap.get("evictions", 0) if snap is not None else 0
        evictions = self.store.evictions(after=mark) if exact else []
        self._evict_seq = mark if exact else self.store.last_eviction()
        early = [st for st in stored if not exact or st.installed_at is None or st.installed_at <= fed]
        later = [st for st in stored if exact and st.installed_at is not None and st.installed_at > fed]
        for k in range(0, len(early), INSTALL_CHUNK):
            if self._stop.is_set():
                return
            chunk = early[k:k + INSTALL_CHUNK]
            self._install([_Pending.restored(st) for st in chunk], persist=False)
            self.restored += len(chunk)
        if later or evictions:
            self._defer(later, evictions)
        seconds["subscriptions"] = round(clock() - began, 2)
        self._fed = fed if exact else max([fed] + [st.installed_at or 0 for st in stored])
        if snap is not None:
            with paused_gc(freeze=True):  # the instances live on: no collection should walk them (see _install)
                self._load_snapshot(snap, snap_file, exact)
            del snap, found
        seconds["ready"] = round(clock() - began, 2)
        with self._start_lock:
            if self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._engine_loop, name="cayuga-engine", daemon=True)
            self._thread.start()
            self.ready.set()
        if stored:
            log.info("ready: %d subscriptions restored", len(self.subscriptions))

    def _require_ready(self) -> None:
        held = self._witlog_held
        if held is not None:  # the engine thread takes no command until the witness log takes its batch
            raise DiskFull(held.part, f"{held.what}, and the engine waits until it can", held.path, held.reason,
                           held.kind)
        if not self.ready.is_set():
            raise ServerStarting(f"the server is starting: {self.restored} of {self.restore_total} stored "
                                 "subscriptions restored so far; retry shortly")
        if self._due:
            subs = sum(isinstance(x, _Pending) for _f, items in self._due for x in items)
            raise ServerStarting(f"the server is replaying its journal: {subs} subscriptions registered after "
                                 "its last snapshot are still to come back, and evictions to apply again; "
                                 "retry shortly")

    @property
    def caught_up(self) -> bool:
        """Every stored subscription is installed (a recovery's replay has
        passed the points where the later ones were registered)."""
        return self.ready.is_set() and not self._due

    # ------------------------------------------------------------------ crash recovery

    def _replayable(self, snap_file: SnapshotFile | None) -> bool:
        """Whether the journal holds every event since ``snap_file`` (or since
        the beginning): only then is a replay exact, and subscriptions
        registered since are installed again where they were."""
        if self.journal is None:
            return False
        expected = (snap_file.journal if snap_file else 0) + 1
        oldest = self.journal.oldest()  # from what the journal knows of its segments: nothing read twice
        if oldest is None or self.journal.appended < expected or oldest <= expected:
            return True
        log.error("the journal starts at record %d but recovery needs it from %d (%s): queued events and "
                  "partial matches of before cannot be recovered exactly; subscriptions start afresh",
                  oldest, expected, "no snapshot" if snap_file is None else snap_file.path.name)
        return False

    def _defer(self, stored: list[StoredSubscription], evictions: list[tuple[int, int, str, int]] = ()) -> None:
        """Compile subscriptions registered after the snapshot; the engine
        thread installs each when the replay reaches the point it was
        registered at, and applies each eviction recorded after the snapshot
        at the point it was applied at (:attr:`_due`). At one point,
        subscriptions come first: one installed there sees no instance older
        than itself, so the order changes nothing."""
        pending = [_Pending.restored(st) for st in stored]
        for e in self._compile_batch(pending, strict=False):
            log.error("could not restore subscription %s: %s", pending[e["index"]].id, e.get("message"))
        items = [(p.installed_at, 0, i, p) for i, p in enumerate(pending) if p.automata]
        items += [(fed, 1, seq, _Eviction(seq, sid, keep)) for seq, fed, sid, keep in evictions]
        items.sort(key=lambda x: x[:3])
        for at, _k, _i, item in items:
            if self._due and self._due[-1][0] == at:
                self._due[-1][1].append(item)
            else:
                self._due.append((at, [item]))
        self.restored += len(stored)
        if evictions:
            log.info("the replay applies %d recorded evictions again", len(evictions))

    def _install_due(self) -> None:
        """On the engine thread: install (and evict) what the replay has reached."""
        while self._due and self._due[0][0] <= self._fed:
            _at, items = self._due.popleft()
            pending = [x for x in items if isinstance(x, _Pending)]
            if pending:
                self._adopt(self._add_chunk(self.engine, list(enumerate(pending)), strict=False), [], pending,
                            False)
            for x in items:
                if isinstance(x, _Eviction):
                    self._apply_eviction(x.sid, x.keep, replayed=True)
                    self._evict_seq = x.seq

    def _load_snapshot(self, snap: dict, snap_file: SnapshotFile, exact: bool) -> None:
        """Put a snapshot's state into the engine (before the engine thread
        starts; its queued events are back already). Without an exact replay
        the witness numbers go on from the witness log's where that is
        further (fresh numbers for fresh witnesses)."""
        try:
            counts = self.engine.import_state(snap["engine"])
        except EngineError as exc:
            log.error("snapshot %s does not fit the stored subscriptions (%s): they start without instances",
                      snap_file.path.name, exc)
            counts = {"instances": 0, "skipped": 0, "clashes": 0}
        seqs = dict(snap["witness_seq"])
        if not exact:
            for sid, n in self.witness_seq.items():
                seqs[sid] = max(n, seqs.get(sid, 0))
        self.witness_seq = seqs
        self._snap_fed, self._snap_changes = snap["fed"], self._changes
        self.recovered.update(instances=counts["instances"])
        if counts["clashes"]:
            log.warning("snapshot %s: %d nodes of the saved network are merged now; their instances were joined",
                        snap_file.path.name, counts["clashes"])
        log.info("loaded snapshot %s: %d instances, %d queued events, %d events taken before it",
                 snap_file.path.name, counts["instances"], len(snap["queue"]["events"]), snap["fed"])

    def _replay(self, after: int) -> None:
        """Put the journal's records after position ``after`` back on the
        queue, in journal order (the arrival order they had: the engine then
        takes them in the order it took them before)."""
        records = events = 0
        for _pos, evs, _sender, _lines in self.journal.replay(after):
            if evs:
                self.queue.restore(evs)
                events += len(evs)
            records += 1
        self.recovered.update(replayed_records=records, replayed_events=events)
        if records:
            log.info("replaying %d journaled events (%d records after position %d)", events, records, after)

    def _snapshot_state(self) -> dict:
        """Everything a snapshot holds (called in the forked child, or on the
        engine thread once it has stopped)."""
        return {"version": 1, "created": time.time(), "fed": self._fed, "evictions": self._evict_seq,
                "journal": self.journal.appended if self.journal is not None else 0,
                "engine": self.engine.export_state(), "queue": self.queue.export_state(),
                "witness_seq": dict(self.witness_seq)}

    def _snapshot_due(self, now: float) -> bool:
        s = self.settings
        if self.snapshotter.running:
            return False
        if self.disk.failing("snapshot") is not None and now - self._snap_at >= SNAPSHOT_RETRY_SECONDS:
            return True  # the last one could not be written: try again even if nothing changed since
        if self._fed == self._snap_fed and self._changes == self._snap_changes:
            return False
        return (self._fed - self._snap_fed >= s.snapshot_events
                or (s.snapshot_seconds > 0 and now - self._snap_at >= s.snapshot_seconds))

    def _take_snapshot(self, now: float) -> None:
        """On the engine thread, between batches: fork the snapshot writer."""
        journal = self.journal
        if self.snapshotter.running:
            return
        self._fork_mark = self._evict_seq  # before the fork: its watcher publishes it
        if self.snapshotter.fork(self.queue.lock, lambda: journal.appended if journal is not None else 0,
                                 self._snapshot_state):
            self._snap_fed, self._snap_changes, self._snap_at = self._fed, self._changes, now
            self.counters.add("snapshot_forks")

    def _before_publish(self) -> None:
        if self.witlog is not None:
            self.witlog.sync()  # every witness the snapshot counts is on disk before the snapshot is

    def _after_publish(self, kept: list[SnapshotFile]) -> None:
        """Journal segments before the oldest snapshot kept are no longer
        needed, nor the evictions every kept snapshot includes (known once
        each kept snapshot was written by this process)."""
        if self.journal is not None and kept:
            self.journal.truncate_before(kept[-1].journal + 1)
        self._marks.append(self._fork_mark)
        while len(self._marks) > max(len(kept), 1):
            self._marks.popleft()
        if kept and len(self._marks) >= len(kept):
            try:
                self.store.prune_evictions(min(self._marks))
            except sqlite3.Error as exc:  # they stay: a later snapshot prunes them
                log.warning("could not prune recorded evictions from the store: %s", exc)

    def _final_snapshot(self) -> None:
        """At a graceful stop, once the engine thread has ended: the state
        it ended in, so a restart replays nothing."""
        try:
            position = self.journal.appended if self.journal is not None else 0
            self._fork_mark = self._evict_seq
            self._before_publish()
            with paused_gc():  # a million instances become a million tuples
                state = self._snapshot_state()
            self._after_publish(self.snapshots.write(state, position))
        except Exception:  # noqa: BLE001 - the journal still covers everything
            log.exception("the shutdown snapshot failed; the next start replays the journal instead")

    def _declare_restored(self, name: str, attrs) -> None:
        from air.model import Attribute

        self.engine.declare(StreamSchema(name, tuple(Attribute(a, t) for a, t in attrs)))
        self.declared.add(name)

    def drain(self, timeout: float) -> None:
        """Graceful stop, first half: no new events, run what is queued, and
        give WebSocket clients time to receive what is buffered for them (and
        lagging ones to catch up from the witness log); then every client is
        closed with 1001. No one is cut: a client still behind at the deadline
        resumes from the witness log after the restart (``?from=``)."""
        deadline = time.monotonic() + timeout
        if self.receiver:
            self.receiver.stop(timeout=max(deadline - time.monotonic(), 0.1))
        self.queue.close(drain=True)
        with self._start_lock:
            restoring = not self.ready.is_set()
            if restoring:
                self._stop.set()  # the restore thread stops and never starts the engine thread
        if restoring:
            if self._restore_thread:
                self._restore_thread.join(max(deadline - time.monotonic(), 0.1))
            if len(self.queue):
                log.warning("stopped while restoring subscriptions: %d queued events were not processed",
                            len(self.queue))
        while len(self.queue) and time.monotonic() < deadline and self._thread and self._thread.is_alive():
            time.sleep(0.01)
        self._stop.set()
        self.queue.wake()
        if self._thread:
            self._thread.join(max(deadline - time.monotonic(), 0.1))
        self.snapshotter.stop(timeout=0.0)  # a periodic one being written is superseded by the final one
        if self._thread is not None and not self._thread.is_alive() and not self._unlogged:
            self._final_snapshot()  # not when witnesses were abandoned: the journal replay makes them again
        while self.hub.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        for ch in self.hub.channels():  # tell each client we are going away (close code 1001)
            ch.close()
        while self.hub.client_count and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout: float | None = None) -> None:
        """Stop everything (idempotent); returns when threads have ended."""
        if not self.started:
            return
        timeout = timeout if timeout is not None else self.settings.shutdown_timeout
        self.drain(timeout)
        for ch in self.hub.channels():
            ch.close()
        if self.journal is not None:
            self.journal.close()  # after drain: the receivers and the engine thread have stopped
        self.store.close()
        if self.witlog is not None and (self._thread is None or not self._thread.is_alive()):
            self.witlog.close()  # synced; readers still open read what they have
        self.started = False
        gc.unfreeze()  # what large batches froze (see _install) may be collected again, this daemon included

    # ------------------------------------------------------------------ the engine thread

    def submit(self, fn: Callable[[Engine], object]) -> Future:
        """Run ``fn(engine)`` on the engine thread between batches."""
        fut: Future = Future()
        if not self._thread or not self._thread.is_alive():
            try:
                fut.set_result(fn(self.engine))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)
            return fut
        self._commands.put((fn, fut), timeout=5)
        self.queue.wake()  # do not leave it waiting for events (a registration took up to 50 ms)
        return fut

    def _apply_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except stdqueue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # noqa: BLE001
                    fut.set_exception(exc)

    def _refresh_counts(self, now: float) -> None:
        """Recount instances per subscription for the API and /metrics, a few
        subscriptions per loop iteration: at most COUNT_BUDGET_SECONDS of
        engine-thread time per call, and the next full pass no sooner than
        COUNT_PASS_SECONDS after the last began nor before the engine has had
        (1 - COUNT_SHARE) / COUNT_SHARE times the last pass's cost to itself,
        so that counting 100K subscriptions never stalls the events (nor spins
        while the server is idle)."""
        eng = self.engine
        limit = self.settings.max_instances_per_subscription
        # a replay applies the evictions recorded then (_due), and decides none of its own before it has
        # given back every event the journal had: a count at another moment would evict elsewhere
        evicting = not self._due and self._fed >= self._replay_until
        if self._watched:
            self._recount_watched(limit, evicting)
        todo = self._count_queue
        if not todo:
            if now < self._count_next_pass:
                return
            self._count_next_pass = now + COUNT_PASS_SECONDS
            self._count_pass_cost = 0.0
            self._pass_heaviest = ("", 0)
            todo.extend(reversed(list(self.subscriptions)))
        perf = time.perf_counter
        start = perf()
        deadline = start + COUNT_BUDGET_SECONDS
        counts = self._instances
        watch = limit * WATCH_SHARE
        over = []
        while todo:
            sid = todo.pop()
            if eng.has_owner(sid):
                counts[sid] = n = eng.instance_count(sid)
                if n > watch:
                    self._watched.add(sid)
                    if n > limit and evicting:
                        over.append(sid)
                if n > self._pass_heaviest[1]:
                    self._pass_heaviest = (sid, n)
            if perf() > deadline:
                break
        if over:
            self._evict(over)
        self._count_pass_cost += perf() - start
        if not todo:  # pass done: keep the counting's share of the engine thread small
            self.counted_at = time.monotonic()
            self.heaviest = self._pass_heaviest if self._pass_heaviest[1] else None
            self._count_next_pass = max(self._count_next_pass,
                                        now + self._count_pass_cost * (1 - COUNT_SHARE) / COUNT_SHARE)

    def _recount_watched(self, limit: int, evicting: bool) -> None:
        """Recount the subscriptions near the limit (after every batch): one
        above it by WATCH_SLACK is evicted now, not at the next pass — in a
        second a runaway could grow by as many instances as events came, and
        slow every event by as much. One back under WATCH_SHARE is let go."""
        eng, counts, over = self.engine, self._instances, []
        high = limit + max(1, int(limit * WATCH_SLACK))
        for sid in list(self._watched):
            if not eng.has_owner(sid):
                self._watched.discard(sid)
                continue
            counts[sid] = n = eng.instance_count(sid)
            if n > high and evicting:
                over.append(sid)
            elif n <= limit * WATCH_SHARE:
                self._watched.discard(sid)
            if self.heaviest is None or n > self.heaviest[1] or sid == self.heaviest[0]:
                self.heaviest = (sid, n)
        if over:
            self._evict(over)

    def _evict(self, sids: list[str]) -> None:
        """Bring subscriptions found above max_instances_per_subscription
        back to it, oldest instances first (engine thread, between batches).
        Each eviction is recorded — ``(_fed, sid, keep)``, durably, before it
        is applied — so that a recovery replaying the journal applies it
        again at the same point (:meth:`_defer`); without a journal there is
        no exact replay, and nothing to record."""
        keep = self.settings.max_instances_per_subscription
        seqs = [0] * len(sids)
        if self.journal is not None:
            try:
                with self._storing("an eviction could not be recorded; it is tried again at the next count"):
                    seqs = self.store.save_evictions([(self._fed, sid, keep) for sid in sids])
            except DiskFull:  # not applied unrecorded: a replay could not apply it again
                return
        for sid, seq in zip(sids, seqs):
            self._apply_eviction(sid, keep)
            if seq:
                self._evict_seq = seq

    def _apply_eviction(self, sid: str, keep: int, replayed: bool = False) -> int:
        """``Engine.evict_oldest(sid, keep, shared=True)``, counted and logged:
        the instances only ``sid`` sees go first, oldest first; then, if it
        still sees more than ``keep``, the oldest it shares with other
        subscriptions (merged states), which lose them too — otherwise
        subscriptions sharing everything could together hold memory without
        bound."""
        eng = self.engine
        if not eng.has_owner(sid):
            return 0
        before, shared0 = eng.instance_count(sid), eng.stats.evicted_shared
        removed = eng.evict_oldest(sid, keep, shared=True)
        shared = eng.stats.evicted_shared - shared0
        self._instances[sid] = eng.instance_count(sid) if removed else before
        if removed:
            self._changes += 1
            self.counters.add("instances_evicted", removed)
            self.counters.add("instance_evictions")
            if shared:
                self.counters.add("instances_evicted_shared", shared)
            # a runaway is evicted every tenth of the limit in events (_recount_watched): one line per
            # subscription per EVICTION_LOG_SECONDS, saying how many evictions it stands for
            now, (logged, quiet) = time.monotonic(), self._eviction_log.get(sid, (-EVICTION_LOG_SECONDS, 0))
            if now - logged < EVICTION_LOG_SECONDS:
                self._eviction_log[sid] = (logged, quiet + 1)
                return removed
            self._eviction_log[sid] = (now, 0)
            log.warning("subscription %s had %d instances, more than max_instances_per_subscription (%d): "
                        "evicted its %d oldest%s%s%s", sid, before, keep, removed,
                        f" ({shared} of them seen by other subscriptions too, which lost them)" if shared else "",
                        " (again, replaying the journal)" if replayed else "",
                        f"; {quiet} more evictions of it since the last such line ({now - logged:.0f} s ago) not logged"
                        if quiet else "")
        return removed

    def _engine_loop(self) -> None:
        """Batches from the queue through the engine; between batches, control
        commands and instance counting. The thread sleeps in the queue until
        events, a command or the next counting pass are due."""
        eng = self.engine
        perf = time.perf_counter
        queue = self.queue
        size = self.settings.batch_size
        while True:
            self._apply_commands()
            now = time.monotonic()
            idle = 0.0 if self._count_queue else min(max(self._count_next_pass - now, 0.001), COUNT_PASS_SECONDS)
            limit = size
            if self._watched:  # smaller batches: a runaway is recounted (and evicted) every tenth of the limit
                tenth = int(self.settings.max_instances_per_subscription * WATCH_SLACK)
                limit = min(size, max(MIN_WATCHED_BATCH, tenth))
            if self._due:  # a replay: install the later subscriptions exactly where they were installed
                self._install_due()
                if self._due:
                    limit = min(limit, self._due[0][0] - self._fed)
            if self._replaying and not self._due and self._fed >= self._replay_until:
                self._replaying = False
                log.info("recovery done: %d journaled events replayed", self.recovered.get("replayed_events", 0))
            batch = queue.get_batch(limit, timeout=idle)
            if batch:
                self._fed += len(batch)
                self._count_batch(batch)
                start = perf()
                self._feed(batch)
                self._epoch = eng.epoch
                self.latency.observe((perf() - start) / len(batch))
                if not self._deliver():  # stopped while the witness log could not take the batch
                    return
            now = time.monotonic()
            self._refresh_counts(now)
            if self._snapshot_due(now):
                self._take_snapshot(now)
            if self._stop.is_set() and not batch and not len(queue):
                self._apply_commands()
                return

    @property
    def events_taken(self) -> int:
        """Events the engine thread has taken from the queue, over every life
        of the data directory (a replay takes the journaled ones again)."""
        return self._fed

    @property
    def replay_remaining(self) -> int:
        """Events of a recovery's replay the engine has still to take (0 once it is over)."""
        return max(self._replay_until - self._fed, 0) if self._replaying else 0

    def _feed(self, batch: list) -> None:
        feed = self.engine.feed
        i, n = 0, len(batch)
        while i < n:
            try:
                for ev in (batch if i == 0 else batch[i:]):
                    feed(ev)
                    i += 1
            except LateEvent:
                i += 1  # counted by the engine
            except Exception as exc:  # noqa: BLE001 - the engine thread must survive a bad event
                self.engine_error = f"{type(exc).__name__}: {exc}"
                self.counters.add("engine_errors")
                log.exception("engine failed on %r", batch[i])
                i += 1

    def _is_output(self, owner: str, stream: str) -> bool:
        sub = self.subscriptions.get(owner)
        return sub is not None and stream in sub.outputs

    def _on_emit(self, em: Emission) -> None:
        """Number a witness of a subscription's outputs (``witness_seq``) and
        encode it once, for the witness log and every client it goes to; they
        get it when the batch ends (:meth:`_deliver`). Count it for the console.
        Witnesses of internal (RESUB) streams are not numbered nor logged: they
        go only to clients watching that stream, encoded only if there are any."""
        owner = em.owner
        stream = em.stream
        if em.kind == "OUT":  # the subscription's own outputs; RESUB streams link its automata
            self._owner_witnesses[owner] = self._owner_witnesses.get(owner, 0) + 1
            seqs = self.witness_seq
            seq = seqs[owner] = seqs.get(owner, 0) + 1
            payload = witness_bytes(stream, em.event, self.engine.schema(stream))
            add = self._log_add
            add[0](owner)
            add[1](seq)
            add[2](stream)
            add[3](payload)
            chans = self.hub.route(owner, stream, self._is_output)
            if not chans:
                return
        else:
            chans = self.hub.route(owner, stream, self._is_output)
            if not chans:
                return
            seq = 0
            payload = witness_bytes(stream, em.event, self.engine.schema(stream))
        outbox = self._outbox
        for ch in chans:
            box = outbox.get(ch)
            if box is None:
                sids, nums, payloads = box = ([], [], [])
                outbox[ch] = box
                self._box_add[ch] = add = (sids.append, nums.append, payloads.append)
            else:
                add = self._box_add[ch]
            add[0](owner)
            add[1](seq)
            add[2](payload)

    def _deliver(self) -> bool:
        """The batch's witnesses into the witness log (one write), then to the
        clients, under the hub's delivery lock (a lagging client checks it has
        caught up under it). Witnesses the log already held (re-produced after a
        restart: their seq is not above the log's) are neither logged again
        nor offered: clients get them from the log.

        Nothing reaches a client that is not in the log: when the log cannot
        be written (a full disk) the engine thread holds the batch's witnesses,
        delivers none, and tries again (WITLOG_RETRY_FIRST, doubling up to
        WITLOG_RETRY_MAX) until it can; meanwhile it takes no new batch, so the
        queue fills and the receivers stop reading (back-pressure), and
        changes to subscriptions are refused (:meth:`_require_ready`). A stop
        meanwhile abandons the batch (returns False, logged): the journal still
        holds its events, so the next start produces these witnesses again."""
        logged, outbox = self._logged, self._outbox
        if not logged[0] and not outbox:
            return True
        self._logged, self._outbox, self._box_add = ([], [], [], []), {}, {}
        self._log_add = tuple(c.append for c in self._logged)
        wait = WITLOG_RETRY_FIRST
        while True:
            with self.hub.delivery_lock:
                try:
                    dropped = self.witlog.append_columns(*logged) if logged[0] else []
                except DiskFull as exc:
                    failure = exc
                else:
                    self._witlog_held = None
                    self._offer(logged, outbox, dropped)
                    return True
            if self._witlog_held is None:
                self.counters.add("witness_log_holds")
            self._witlog_held = failure
            self.counters.add("witness_log_errors")
            if self._stop.wait(wait):
                self._unlogged = len(logged[0])
                log.error("stopping while the witness log cannot be written (%s): the last batch's %d witnesses "
                          "were neither logged nor delivered, and %d queued events were not processed; the "
                          "journal holds their events, so the next start produces them again (no shutdown "
                          "snapshot is written)", failure, len(logged[0]), len(self.queue))
                return False
            wait = min(wait * 2, WITLOG_RETRY_MAX)

    def _offer(self, logged: tuple, outbox: dict, dropped: list[int]) -> None:
        """Hand a logged batch to the clients (under the delivery lock), but
        the witnesses the log already held (``dropped``)."""
        if dropped:
            dup = {(logged[0][i], logged[1][i]) for i in dropped}
            for ch, (sids, seqs, payloads) in list(outbox.items()):
                keep = [i for i, k in enumerate(zip(sids, seqs)) if k not in dup]
                outbox[ch] = ([sids[i] for i in keep], [seqs[i] for i in keep], [payloads[i] for i in keep])
        for ch, (sids, seqs, payloads) in outbox.items():
            if payloads:
                ch.offer_many(sids, seqs, payloads)

    def on_client_drop(self, ch: ClientChannel, policy: str, n: int = 1) -> None:
        """A client's buffer overflowed: it lags (``policy`` "lag": served from
        the witness log) or, on an internal stream that is not logged, it is
        disconnected ("disconnect")."""
        if policy == "lag":
            self.counters.add("client_lags", n)
            log.info("WebSocket client %s (%s) fell %d witnesses behind: served from the witness log until it "
                     "catches up", ch.id, ch.label, ch.capacity)
            return
        self.counters.add(f"drop_{policy}", n)
        if policy == "disconnect":
            log.warning("disconnecting slow WebSocket client %s (%s): buffer of %d full (an internal stream, "
                        "not in the witness log)", ch.id, ch.label, ch.capacity)

    # ------------------------------------------------------------------ streams

    def declare_stream(self, schema: StreamSchema) -> bool:
        """Declare (and persist) a stream; False when it already existed identically."""
        with self._lock:
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

    # ------------------------------------------------------------------ subscriptions

    def functions(self) -> dict[str, str]:
        return self.engine.functions.return_types()

    def _compile_batch(self, batch: list[_Pending], strict: bool) -> list[dict]:
        """Compile every subscription of ``batch`` (CEL through the shape
        cache); returns the errors, each with its ``index`` in the batch."""
        published: dict[str, StreamSchema] = {}  # by earlier queries of the batch, which later ones may read
        streams = ChainMap(published, self.engine.stream_view)
        functions, unit = self.functions(), self.settings.time_unit_ms
        errors: list[dict] = []
        for i, p in enumerate(batch):
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
                else:
                    p.automata, p.outputs = compile_subscription(p.kind, p.text, streams, p.id, functions, unit)
            except CayugaError as exc:
                detail = exc.to_dict() if hasattr(exc, "to_dict") else {"message": str(exc)}
                errors.append({"index": i, **detail, "detail": str(exc)})
                if strict and len(errors) >= MAX_BATCH_ERRORS:
                    break
                continue
            too_large = self._size_errors(p.automata) if strict else []
            if too_large:
                self.counters.add("subscriptions_refused")
                p.automata = ()
                errors.append({"index": i, "kind": "limit", "message": "; ".join(too_large), "line": 0,
                               "column": 0, "excerpt": "", "detail": "; ".join(too_large)})
                continue
            for a in p.automata:
                for st, out in a.outputs:
                    published.setdefault(out.name, StreamSchema(out.name, st.schema))
        return errors

    def _add_chunk(self, eng: Engine, chunk: list[tuple[int, _Pending]], strict: bool) -> list:
        """On the engine thread: add each of ``chunk``; returns (index, pending,
        published streams or the EngineError). Strict: the first error
        removes what this chunk added and is raised with its index."""
        done = []
        for i, p in chunk:
            try:
                done.append((i, p, self.preparer.add(eng, p.automata, p.id)))
                p.installed_at = self._fed  # a replay reaches the point of a deferred one exactly
                self._changes += 1
            except EngineError as exc:
                if strict:
                    self._forget(eng, [q.id for _, q, _ in done])
                    raise SubscriptionError(str(exc), [_bind_error(i, exc)]) from None
                done.append((i, p, exc))
        return done

    def _forget(self, eng: Engine, ids: list[str]) -> None:
        """On the engine thread: remove subscriptions of a batch that failed
        (their ids are not taken: nothing of them may stay behind)."""
        for sid in ids:
            eng.remove(sid)
            self._owner_witnesses.pop(sid, None)

    def _install(self, batch: list[_Pending], persist: bool = True) -> list[Subscription]:
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
            errors = self._compile_batch(batch, strict=persist)
            if errors and persist:
                raise SubscriptionError(f"{len(errors)} of {len(batch)} subscriptions have errors", errors)
            todo = [(i, p) for i, p in enumerate(batch) if p.automata]
            added: list = []
            try:
                for k in range(0, len(todo), INSTALL_CHUNK):
                    chunk = todo[k:k + INSTALL_CHUNK]
                    added += self.submit(lambda eng, c=chunk: self._add_chunk(eng, c, persist)).result(timeout=60)
            except SubscriptionError:
                for k in range(0, len(added), INSTALL_CHUNK):
                    ids = [p.id for _, p, _ in added[k:k + INSTALL_CHUNK]]
                    self.submit(lambda eng, ids=ids: self._forget(eng, ids)).result(timeout=60)
                raise
        subs = self._adopt(added, errors, batch, persist)
        try:
            self.store.save_shapes(self.shapes.export())
        except sqlite3.Error as exc:  # a cache: a restart compiles those shapes again
            log.warning("could not store compiled query shapes: %s", exc)
        return subs

    def _adopt(self, added: list, errors: list[dict], batch: list[_Pending], persist: bool) -> list[Subscription]:
        """Make Subscriptions of what ``_add_chunk`` installed (and store them
        when ``persist``); a restore logs those that failed."""
        subs, installed_at = [], {}
        for i, p, published in added:
            if isinstance(published, EngineError):
                errors.append(_bind_error(i, published))
                continue
            internal = [s for s in published if s not in p.outputs]
            subs.append(Subscription(p.id, p.kind, p.text, p.automata, p.outputs, internal, p.name, p.created))
            installed_at[p.id] = p.installed_at
        for e in errors:  # only a restore gets here with errors
            log.error("could not restore subscription %s: %s", batch[e["index"]].id, e.get("message"))
        if persist:  # stored before they are known: what could not be stored is taken out of the engine again
            bindings = {p.id: p.binding for p in batch if p.binding is not None}
            try:
                with self._storing(f"{len(subs)} subscription(s) could not be stored; none was registered"):
                    self.store.save_subscriptions([StoredSubscription(s.id, s.kind, s.text, s.name, s.created,
                                                                      *(bindings.get(s.id) or (None, None)),
                                                                      installed_at=installed_at[s.id])
                                                   for s in subs])
            except DiskFull:
                for k in range(0, len(subs), INSTALL_CHUNK):
                    ids = [s.id for s in subs[k:k + INSTALL_CHUNK]]
                    self.submit(lambda eng, ids=ids: self._forget(eng, ids)).result(timeout=60)
                raise
        for sub in subs:
            self.subscriptions[sub.id] = sub
            self._index_readers(sub)
        if subs:
            self.hub.invalidate()  # routes of witnesses to clients depend on the subscriptions' outputs
        if not persist:  # rows stored before bindings were, or with a binding no longer valid
            try:
                self.store.save_bindings([(p.binding or (None, None), p.id) for p in batch
                                          if (p.binding or (None, None)) != p.stored and p.id in self.subscriptions])
            except sqlite3.Error as exc:  # a cache: the next start binds them from their text again
                log.warning("could not store the bindings of restored subscriptions: %s", exc)
        return subs

    def _size_errors(self, autos) -> list[str]:
        return automaton_size_errors(autos, self.settings.max_states, self.settings.max_predicate_atoms)

    def add_subscription(self, kind: str, text: str, name: str | None = None) -> Subscription:
        try:
            return self.add_subscriptions([(kind, text, name)])[0]
        except SubscriptionError as exc:
            detail = exc.errors[0].pop("detail")
            for e in exc.errors:
                e.pop("index", None)
            raise SubscriptionError(detail, exc.errors) from None

    def add_subscriptions(self, items: list[tuple[str, str, str | None]]) -> list[Subscription]:
        """Register many subscriptions (kind, text, name) at once, all or
        nothing: on any error none is registered, no id is taken, and the
        :class:`SubscriptionError` lists each error with its index. Ids are
        consecutive, in the order given; a query may read the output of an
        earlier one in the same batch. CEL queries of one shape are compiled
        once (:class:`~air.cel.shapes.ShapeCache`). The engine thread installs
        a large batch INSTALL_CHUNK at a time and runs events in between: a
        subscription of the batch starts empty when its chunk is installed,
        as if registered alone at that moment."""
        with self._lock:
            self._require_ready()
            if len(self.subscriptions) + len(items) > self.settings.max_subscriptions:
                self.counters.add("subscriptions_refused", len(items))
                raise LimitReached(f"the server holds {len(self.subscriptions)} subscriptions and its limit is "
                                   f"{self.settings.max_subscriptions} (the max_subscriptions setting): "
                                   f"{len(items)} more do not fit; delete some first")
            now = time.time()
            ids = self.store.peek_ids(len(items))
            return self._install([_Pending(sid, kind, text, name, now)
                                  for sid, (kind, text, name) in zip(ids, items)])

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
        """The other subscriptions that read a stream ``sid`` publishes, in registration order."""
        sub = self.subscriptions[sid]
        found = {r for s in sub.outputs + sub.internal for r in self._readers.get(s, ()) if r != sid}
        return [r for r in self.subscriptions if r in found]

    def remove_subscription(self, sid: str, cascade: bool = False) -> list[str]:
        """Remove ``sid``; returns the ids removed. A subscription whose outputs
        others read is refused (:class:`SubscriptionInUse`, naming them: they
        would lose their input, and could not be restored), unless ``cascade``,
        which removes those readers too (and theirs), newest first."""
        with self._lock:
            self._require_ready()
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
                self._instances.pop(s, None)
                self.submit(lambda eng, s=s: self._owner_witnesses.pop(s, None))  # its only writer's thread
            self.hub.invalidate()
        for s in order:
            self.hub.close_owner(s)
        if len(order) > 1:
            log.info("removed subscription %s and the subscriptions reading its outputs: %s", sid,
                     ", ".join(order[:-1]))
        return order

    def _remove_owner(self, eng: Engine, sid: str) -> None:
        eng.remove(sid)
        self._watched.discard(sid)
        self._eviction_log.pop(sid, None)
        self._changes += 1

    def validate_subscription(self, kind: str, text: str) -> tuple[list[dict], list[str], str | None]:
        """Every error (with positions) a registration would meet; registers nothing."""
        streams = self.engine.stream_view
        if kind == "cel":
            from air.cel import validate

            errors = validate(text, streams, functions=self.functions(), time_unit_ms=self.settings.time_unit_ms)
            if errors:
                return [e.to_dict() for e in errors], [], None
        try:
            autos, outs = compile_subscription(kind, text, streams, "validate", self.functions(),
                                               self.settings.time_unit_ms)
        except CayugaError as exc:
            return [exc.to_dict() if hasattr(exc, "to_dict") else {"message": str(exc)}], [], None
        too_large = self._size_errors(autos)
        if too_large:
            return [{"kind": "limit", "message": m, "line": 0, "column": 0, "excerpt": ""} for m in too_large], [], None
        probe = Engine(self.engine.functions)
        for name in {s.input_stream for a in autos for s in a.states if s.input_stream}:
            schema = streams.get(name)  # the others are published within the query, or unknown (reported)
            if schema is not None:
                probe.declare(schema)
        try:
            probe.add(autos, owner="validate")
        except EngineError as exc:
            return [{"kind": "bind", "message": str(exc), "line": 0, "column": 0, "excerpt": ""}], [], None
        sub = Subscription("validate", kind, text, autos, outs, [])
        return [], outs, sub.air
