"""The engine thread: the only thread that touches the engine once the server is ready.

:class:`EngineThread` pops batches from the queue and feeds them to the engine;
between batches it runs the commands the API submits (:meth:`EngineThread.submit`),
installs what a recovery's replay has reached, hands the batch's witnesses over
for delivery, checks the state budget at fixed points of the input and
recounts instances (server/budget.py), and forks snapshots.
"""

from __future__ import annotations

import logging
import queue as stdqueue
import sys
import threading
import time
from concurrent.futures import Future
from typing import Callable

from air.engine import Engine, LateEvent
from air.engine.convert import stream_counts
from server.config import Settings
from server.ingest.queue import DelayQueue
from server.observability.counters import Count

log = logging.getLogger("cayuga.daemon")

#: Seconds the in-process engine may be on one batch before /health names where it is (:meth:`EngineThread.trouble`;
#: server/workers/restart.py says the same of a worker that owes a batch that long).
BUSY_SECONDS = 15.0

def where_busy(where: dict) -> str:
    """Where an engine on one batch that long is (``FunctionRegistry.running_in``), as /health says it."""
    if where["function"] is None:
        return f"its engine is at {where['at']}"
    return (f"its engine is in the function {where['function']}, which has not returned (at {where['at']}): fix or "
            "bound that function (a lookup without a timeout, a loop that does not end)")


class EngineThread:
    """The engine thread and what it alone writes: :attr:`fed` (events taken
    from the queue, over every life of the data dir), :attr:`changes`
    (subscriptions installed or removed), the engine's epoch, the last
    engine error and the events per input stream.

    The daemon wires in, before :meth:`start`, the parts the loop calls
    between batches: ``recovery`` (server/durability/recovery.py),
    ``budget`` (server/budget.py), ``witnesses``
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
        self.recovery = self.budget = self.witnesses = self.checkpoints = None  # wired by the daemon
        self._commands: stdqueue.Queue = stdqueue.Queue(maxsize=1000)
        self.thread: threading.Thread | None = None
        self.fed = 0  # events the engine thread has taken from the queue, over every life of the data dir
        self.busy_since: float | None = None  # when the engine began the batch it is on (monotonic; None: none)
        self._in_batch = 0  # of those, the batch being fed and delivered now
        self.changes = 0  # subscriptions installed or removed (a snapshot is due after a change too)
        self.epoch = None
        self.error: str | None = None
        # for the console's rates; written by the engine thread only, read as copies (see stream_events())
        self._stream_events: dict[str, int] = {}  # input stream -> events taken from the queue

    def workers(self) -> list[dict]:
        """The engine worker processes and how each is (none: the engine runs on this thread)."""
        return []

    def runs_on(self, sid: str) -> str:
        """Where a subscription's automata run."""
        return "engine thread"

    @property
    def processed(self) -> int:
        """Events taken from the queue and through the engine (their witnesses delivered), over every
        life of the data dir: :attr:`fed` but the batch under way."""
        return self.fed - self._in_batch

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
        # none waiting, seen without the queue's lock (twice a batch: get_nowait raised Empty each time);
        # one put meanwhile is taken at the next call, and its wake() ends any wait for events
        if not self._commands.queue:
            return
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
        recovery, budget, witnesses, checkpoints = self.recovery, self.budget, self.witnesses, self.checkpoints
        while True:
            self._apply_commands()
            now = time.monotonic()
            idle = budget.idle(now)
            limit = min(size, budget.until_check(self.fed))  # a batch ends at each of the budget's check points
            if recovery.due:  # a replay: install the later subscriptions exactly where they were installed
                recovery.install_due()
                if recovery.due:
                    limit = min(limit, recovery.due[0][0] - self.fed)
            recovery.check_done()
            batch = queue.get_batch(limit, timeout=idle)
            if batch:
                self._in_batch = len(batch)
                self.fed += len(batch)
                self._count_batch(batch)
                start = perf()
                self.feed(batch)
                self.epoch = eng.epoch
                self.latency.observe((perf() - start) / len(batch))
                if not witnesses.deliver():  # stopped while the witness log could not take the batch
                    return
                budget.at_check(self.fed)  # after the numbering: a shedding now affects later witnesses
                self._in_batch = 0
            now = time.monotonic()
            budget.refresh(now)
            if checkpoints.due(now):
                checkpoints.take(now)
            if self.stopping.is_set() and not batch and not len(queue):
                self._apply_commands()
                return

    def _count_batch(self, batch: list) -> dict[str, int]:
        """Add a batch's events per stream to the console's totals (engine thread); returns them."""
        totals = self._stream_events
        counted = stream_counts(batch)
        for name, n in counted.items():
            totals[name] = totals.get(name, 0) + n
        return counted

    def trouble(self) -> list[str]:
        """What /health says of an engine that has been on one batch BUSY_SECONDS or more: where it
        is (a user function that does not return holds it; the registered function on its
        stack, and the innermost place), as server/workers/restart.py says of a worker."""
        since, thread = self.busy_since, self.thread
        if since is None or thread is None or (busy := time.monotonic() - since) < BUSY_SECONDS:
            return []
        where = self.engine.functions.running_in(sys._current_frames().get(thread.ident))
        return [f"the engine thread has been on one batch for {busy:.0f} s: {where_busy(where)}; events wait in "
                "the queue meanwhile"]

    def feed(self, batch: list) -> None:
        """Feed a batch to the engine; an event it fails on is counted and logged, the rest go on."""
        self.busy_since = time.monotonic()
        try:
            self._feed(batch)
        finally:
            self.busy_since = None

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
                self.error = f"{type(exc).__name__}: {exc}"
                self.counters.add(Count.ENGINE_ERRORS)
                log.exception("engine failed on %r", batch[i])
                i += 1
