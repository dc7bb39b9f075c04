"""The health view: what /health, /stats and /metrics read of a running server.

:class:`Health` answers from counters and copies the other parts keep (the
queue, the engine thread's progress, the instance counts, the recovery's
replay, the data directory's write failures), never waiting for the engine
thread. It is the narrow interface the metrics collector (metrics.py) reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from server.config import Settings
from server.delivery.hub import NotifierHub
from server.durability.diskfull import DiskState
from server.durability.journal import Journal
from server.durability.snapshot import Snapshotter
from server.durability.store import Store
from server.ingest.queue import DelayQueue
from server.observability.counters import Counters

#: /health calls a full queue that released nothing for this long stalled.
STALL_SECONDS = 5.0
#: /health tries a small write to a store that could not be written at most this often (seconds).
STORE_PROBE_SECONDS = 1.0


class EngineProgress(Protocol):
    """The engine thread (server/processing.py, ``EngineThread``)."""

    fed: int
    epoch: float | None

    @property
    def processed(self) -> int: ...

    @property
    def alive(self) -> bool: ...

    def stream_events(self) -> dict[str, int]: ...

    def workers(self) -> list[dict]: ...


class InstanceCounts(Protocol):
    """The instance counts and the state budget (server/budget.py, ``StateBudget``)."""

    instances: dict[str, int]
    counted_at: float
    heaviest: tuple[str, int] | None
    inexact: dict
    runaways: dict[str, dict]
    max_bytes: int
    footprint: tuple  # (bytes, instances, nodes) at the last check


class Replay(Protocol):
    """A recovery's replay (server/durability/recovery.py)."""

    @property
    def remaining(self) -> int: ...


class WitnessCounts(Protocol):
    """Witness numbering (server/delivery/witnesses.py)."""

    witlog: object | None

    def activity(self) -> dict[str, int]: ...


class Health:
    """Read-only answers about the server, for the API and the metrics.

    ``journal`` and ``receiver`` are set by the daemon's start() (the journal
    only unless durability is off)."""

    def __init__(self, settings: Settings, queue: DelayQueue, disk: DiskState, store: Store, counters: Counters,
                 engine, hub: NotifierHub, snapshotter: Snapshotter, progress: EngineProgress,
                 counts: InstanceCounts, replay: Replay, witnesses: WitnessCounts,
                 subscriptions: Mapping[str, object]) -> None:
        self.settings = settings
        self._units_per_second = 1000.0 / settings.time_unit_ms
        self.queue = queue
        self.disk = disk
        self.store = store
        self.counters = counters
        self._engine = engine  # its running totals: engine_stats
        self.hub = hub
        self.snapshotter = snapshotter
        self._progress = progress
        self._counts = counts
        self._replay = replay
        self._witnesses = witnesses
        self._subscriptions = subscriptions  # the registrar's: read-only here
        self.journal: Journal | None = None
        self.receiver = None  # the TCP receiver (server/ingest/tcp.py)
        self.broken: Mapping[str, object] = {}  # the registrar's broken subscriptions (server/subscriptions/broken.py)
        self._store_probed = 0.0

    # ------------------------------------------------------------------ clock

    @property
    def engine_stats(self):
        """The engine's running totals (air/engine's ``EngineStats``), as of now: read through
        the engine (its event loop adds what it counted when they are read)."""
        return self._engine.stats

    def now(self) -> float:
        """The server clock in stream time units."""
        return time.time() * self._units_per_second  # (the TCP receivers stamp every event without a time)

    def horizon(self) -> float | None:
        """The latest t1 an event may have now (time: clock and max_future > 0), else None."""
        ahead = self.horizon_ahead()
        return None if ahead is None else self.now() + ahead

    def horizon_ahead(self) -> float | None:
        """How far past :meth:`now` the horizon is, in time units (None: no bound)."""
        s = self.settings
        if s.time != "clock" or not s.max_future:
            return None
        return s.max_future * 1000.0 / s.time_unit_ms

    # ------------------------------------------------------------------ health

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

    def epoch_lag(self) -> float:
        epoch = self._progress.epoch
        return 0.0 if epoch is None else max(self.now() - epoch, 0.0)

    def epoch_lag_seconds(self) -> float:
        """:meth:`epoch_lag` (stream time units) in seconds."""
        return self.epoch_lag() * self.settings.time_unit_ms / 1000.0

    @property
    def engine_alive(self) -> bool:
        return self._progress.alive

    @property
    def events_taken(self) -> int:
        """Events the engine thread has taken from the queue and through the
        engine, over every life of the data directory (a replay takes the
        journaled ones again)."""
        return self._progress.processed

    @property
    def replay_remaining(self) -> int:
        """Events of a recovery's replay the engine has still to take (0 once it is over)."""
        return self._replay.remaining

    def retained(self) -> dict | None:
        """The history the journal keeps (docs/design/backfill.md): ``{"from", "to"}`` event times,
        ``bytes``, ``segments``; None without a journal (durability off)."""
        if self.journal is None:
            return None
        got = self.journal.retained()
        got.pop("first", None)
        return got

    # ------------------------------------------------------------------ counts

    @property
    def witlog(self):
        """The witness log (None before start)."""
        return self._witnesses.witlog

    @property
    def tcp_connections(self) -> int:
        return self.receiver.connections if self.receiver else 0

    @property
    def counted_at(self) -> float:
        """When the last full pass of instance counts ended (monotonic)."""
        return self._counts.counted_at

    @property
    def heaviest(self) -> tuple[str, int] | None:
        """The subscription with the most instances at the last count, and how many."""
        return self._counts.heaviest

    @property
    def subscription_count(self) -> int:
        """Subscriptions registered now."""
        return len(self._subscriptions)

    def workers(self) -> list[dict]:
        """The engine worker processes (server/workers/), none when the engine runs on the engine thread."""
        return self._progress.workers()

    def inexact(self) -> dict[str, dict]:
        """The subscriptions that lost state (server/budget.py), as /health shows them (a copy)."""
        subs = self._subscriptions
        return {sid: m.public() for sid, m in list(self._counts.inexact.items()) if sid in subs}

    def witness_gaps(self) -> dict[str, list[dict]]:
        """Per subscription, the runs of witnesses the witness log lacks though
        they were numbered (server/durability/witgaps.py): ``[{"from", "to"}]``."""
        wlog = self._witnesses.witlog
        if wlog is None:
            return {}
        subs, broken = self._subscriptions, self.broken
        return {sid: [{"from": a, "to": b} for a, b in runs] for sid, runs in wlog.gaps().items()
                if sid in subs or sid in broken}

    def broken_subscriptions(self) -> dict[str, dict]:
        """The stored subscriptions that do not compile against this configuration (a copy):
        their name, why, since when, and what to do."""
        return {sid: {"name": b.name, **b.public()} for sid, b in list(self.broken.items())}

    def runaways(self) -> dict[str, dict]:
        """The runaways of the budget's last check (a copy)."""
        subs = self._subscriptions
        return {sid: dict(r) for sid, r in list(self._counts.runaways.items()) if sid in subs}

    def state(self) -> dict:
        """The automaton state's estimated size against its budget, at the last check."""
        fp = self._counts.footprint
        return {"bytes": fp[0], "instances": fp[1], "max_state_bytes": self._counts.max_bytes,
                "expired": self.engine_stats.expired}

    def instance_counts(self) -> dict[str, int]:
        """A copy of every subscription's last instance count (for /metrics)."""
        return dict(self._counts.instances)

    def instance_count(self, sid: str) -> int:
        """One subscription's last instance count, without copying them all."""
        return self._counts.instances.get(sid, 0)

    def activity(self) -> tuple[dict[str, int], dict[str, int]]:
        """Copies of the running totals of events per input stream and of
        witnesses per subscription (the console turns them into rates). The
        engine thread is their only writer; a dict copy is atomic under the GIL."""
        return self._progress.stream_events(), self._witnesses.activity()
