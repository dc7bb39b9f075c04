"""The engine thread: the only thread that touches the engine once the server is ready.

:class:`EngineThread` pops batches from the queue and feeds them to the engine;
between batches it runs the commands the API submits (:meth:`EngineThread.submit`),
installs what a recovery's replay has reached, hands the batch's witnesses over
for delivery, recounts instances and forks snapshots. :class:`Evictions` keeps
the instance counts per subscription and brings one above
max_instances_per_subscription back to the limit, recording each eviction so a
replay applies it again at the same point.
"""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from operator import attrgetter
from typing import Callable, Mapping

from air.engine import Engine, LateEvent
from server.config import Settings
from server.durability.diskfull import DiskFull
from server.durability.store import Store
from server.ingest.queue import DelayQueue
from server.observability.counters import Count

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


class EngineThread:
    """The engine thread and what it alone writes: :attr:`fed` (events taken
    from the queue, over every life of the data dir), :attr:`changes`
    (subscriptions installed or removed), the engine's epoch, the last
    engine error and the events per input stream.

    The daemon wires in, before :meth:`start`, the parts the loop calls
    between batches: ``recovery`` (server/durability/recovery.py),
    ``evictions`` (:class:`Evictions`), ``witnesses``
    (server/delivery/witnesses.py) and ``checkpoints``
    (server/durability/checkpoints.py)."""

    def __init__(self, engine: Engine, queue: DelayQueue, settings: Settings, counters, latency,
                 stopping: threading.Event) -> None:
        self.engine = engine
        self.queue = queue
        self.settings = settings
        self.counters = counters
        self.latency = latency  # the histogram of processing time per event
        self.stopping = stopping
        self.recovery = self.evictions = self.witnesses = self.checkpoints = None  # wired by the daemon
        self._commands: stdqueue.Queue = stdqueue.Queue(maxsize=1000)
        self.thread: threading.Thread | None = None
        self.fed = 0  # events the engine thread has taken from the queue, over every life of the data dir
        self.changes = 0  # subscriptions installed or removed (a snapshot is due after a change too)
        self.epoch = None
        self.error: str | None = None
        # for the console's rates; written by the engine thread only, read as copies (see stream_events())
        self._stream_events: dict[str, int] = {}  # input stream -> events taken from the queue

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stream_events(self) -> dict[str, int]:
        """A copy of the events taken per input stream (a dict copy is atomic under the GIL)."""
        return dict(self._stream_events)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="cayuga-engine", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread:
            self.thread.join(timeout)

    def submit(self, fn: Callable[[Engine], object]) -> Future:
        """Run ``fn(engine)`` on the engine thread between batches."""
        fut: Future = Future()
        if not self.thread or not self.thread.is_alive():
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

    def _loop(self) -> None:
        """Batches from the queue through the engine; between batches, control
        commands and instance counting. The thread sleeps in the queue until
        events, a command or the next counting pass are due."""
        eng = self.engine
        perf = time.perf_counter
        queue = self.queue
        size = self.settings.batch_size
        recovery, evictions, witnesses, checkpoints = self.recovery, self.evictions, self.witnesses, self.checkpoints
        while True:
            self._apply_commands()
            now = time.monotonic()
            idle = evictions.idle(now)
            limit = evictions.batch_limit(size)
            if recovery.due:  # a replay: install the later subscriptions exactly where they were installed
                recovery.install_due()
                if recovery.due:
                    limit = min(limit, recovery.due[0][0] - self.fed)
            recovery.check_done()
            batch = queue.get_batch(limit, timeout=idle)
            if batch:
                self.fed += len(batch)
                self._count_batch(batch)
                start = perf()
                self.feed(batch)
                self.epoch = eng.epoch
                self.latency.observe((perf() - start) / len(batch))
                if not witnesses.deliver():  # stopped while the witness log could not take the batch
                    return
            now = time.monotonic()
            evictions.refresh(now)
            if checkpoints.due(now):
                checkpoints.take(now)
            if self.stopping.is_set() and not batch and not len(queue):
                self._apply_commands()
                return

    def _count_batch(self, batch: list) -> None:
        """Add a batch's events per stream to the console's totals (engine thread)."""
        totals = self._stream_events
        for name, n in Counter(map(_STREAM_OF, batch)).items():
            totals[name] = totals.get(name, 0) + n

    def feed(self, batch: list) -> None:
        """Feed a batch to the engine; an event it fails on is counted and logged, the rest go on."""
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
                self.error = f"{type(exc).__name__}: {exc}"
                self.counters.add(Count.ENGINE_ERRORS)
                log.exception("engine failed on %r", batch[i])
                i += 1


class Evictions:
    """Instance counts per subscription (refreshed by the engine thread, for
    the API and /metrics) and max_instances_per_subscription: a subscription
    found above it loses its oldest instances. Each eviction is recorded in
    the store (:attr:`seq`: the last one applied) so that a recovery's replay
    applies it again at the same point (server/durability/recovery.py).

    ``progress`` is the :class:`EngineThread` (``fed``, ``changes``);
    ``recovery`` says whether a replay is still under way (no eviction of its
    own is decided before it is over); ``storing(what)`` wraps a store write."""

    def __init__(self, engine: Engine, settings: Settings, store: Store, counters, progress: EngineThread,
                 subscriptions: Mapping, storing: Callable) -> None:
        self.engine = engine
        self.settings = settings
        self.store = store
        self.counters = counters
        self.progress = progress
        self.recovery = None  # wired by the daemon
        self.journal = None  # set by the daemon's start() unless durability is off: only then are evictions recorded
        self._subscriptions = subscriptions
        self._storing = storing
        self.instances: dict[str, int] = {}  # per subscription, refreshed by the engine thread
        self._count_queue: list[str] = []  # subscriptions still to count in the current pass
        self._count_next_pass = 0.0  # monotonic time
        self._count_pass_cost = 0.0  # engine-thread seconds spent on the current pass
        self.counted_at = time.monotonic()  # when the last full pass of instance counts ended
        self.watched: set[str] = set()  # near max_instances_per_subscription: recounted every batch
        self._pass_heaviest: tuple[str, int] = ("", 0)  # the most instances the current pass found
        self.heaviest: tuple[str, int] | None = None  # ... and the last full pass (or a watched recount)
        self._eviction_log: dict[str, tuple[float, int]] = {}  # sid -> (last logged, evictions not logged since)
        self.seq = 0  # the last eviction applied (Store.evictions); a snapshot includes those up to it

    def forget(self, sid: str) -> None:
        """A subscription has gone (engine thread)."""
        self.watched.discard(sid)
        self._eviction_log.pop(sid, None)
        self.instances.pop(sid, None)

    def idle(self, now: float) -> float:
        """How long the engine thread may wait for events before the next count is due."""
        return 0.0 if self._count_queue else min(max(self._count_next_pass - now, 0.001), COUNT_PASS_SECONDS)

    def batch_limit(self, size: int) -> int:
        """The batch size: smaller while one is watched, so that a runaway is
        recounted (and evicted) every tenth of the limit."""
        if not self.watched:
            return size
        tenth = int(self.settings.max_instances_per_subscription * WATCH_SLACK)
        return min(size, max(MIN_WATCHED_BATCH, tenth))

    def refresh(self, now: float) -> None:
        """Recount instances per subscription for the API and /metrics, a few
        subscriptions per loop iteration: at most COUNT_BUDGET_SECONDS of
        engine-thread time per call, and the next full pass no sooner than
        COUNT_PASS_SECONDS after the last began nor before the engine has had
        (1 - COUNT_SHARE) / COUNT_SHARE times the last pass's cost to itself,
        so that counting 100K subscriptions never stalls the events (nor spins
        while the server is idle)."""
        eng = self.engine
        limit = self.settings.max_instances_per_subscription
        # a replay applies the evictions recorded then (Recovery.due), and decides none of its own before it
        # has given back every event the journal had: a count at another moment would evict elsewhere
        evicting = self.recovery.settled()
        if self.watched:
            self._recount_watched(limit, evicting)
        todo = self._count_queue
        if not todo:
            if now < self._count_next_pass:
                return
            self._count_next_pass = now + COUNT_PASS_SECONDS
            self._count_pass_cost = 0.0
            self._pass_heaviest = ("", 0)
            todo.extend(reversed(list(self._subscriptions)))
        perf = time.perf_counter
        start = perf()
        deadline = start + COUNT_BUDGET_SECONDS
        counts = self.instances
        watch = limit * WATCH_SHARE
        over = []
        while todo:
            sid = todo.pop()
            if eng.has_owner(sid):
                counts[sid] = n = eng.instance_count(sid)
                if n > watch:
                    self.watched.add(sid)
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
        eng, counts, over = self.engine, self.instances, []
        high = limit + max(1, int(limit * WATCH_SLACK))
        for sid in list(self.watched):
            if not eng.has_owner(sid):
                self.watched.discard(sid)
                continue
            counts[sid] = n = eng.instance_count(sid)
            if n > high and evicting:
                over.append(sid)
            elif n <= limit * WATCH_SHARE:
                self.watched.discard(sid)
            if self.heaviest is None or n > self.heaviest[1] or sid == self.heaviest[0]:
                self.heaviest = (sid, n)
        if over:
            self._evict(over)

    def _evict(self, sids: list[str]) -> None:
        """Bring subscriptions found above max_instances_per_subscription
        back to it, oldest instances first (engine thread, between batches).
        Each eviction is recorded — ``(fed, sid, keep)``, durably, before it
        is applied — so that a recovery replaying the journal applies it
        again at the same point (``Recovery.defer``); without a journal there is
        no exact replay, and nothing to record."""
        keep = self.settings.max_instances_per_subscription
        seqs = [0] * len(sids)
        if self.journal is not None:
            try:
                with self._storing("an eviction could not be recorded; it is tried again at the next count"):
                    seqs = self.store.save_evictions([(self.progress.fed, sid, keep) for sid in sids])
            except DiskFull:  # not applied unrecorded: a replay could not apply it again
                return
        for sid, seq in zip(sids, seqs):
            self.apply(sid, keep)
            if seq:
                self.seq = seq

    def apply(self, sid: str, keep: int, replayed: bool = False) -> int:
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
        self.instances[sid] = eng.instance_count(sid) if removed else before
        if removed:
            self.progress.changes += 1
            self.counters.add(Count.INSTANCES_EVICTED, removed)
            self.counters.add(Count.INSTANCE_EVICTIONS)
            if shared:
                self.counters.add(Count.INSTANCES_EVICTED_SHARED, shared)
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
