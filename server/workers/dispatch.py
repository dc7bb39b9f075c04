"""The engine thread when an engine worker runs the automata (``engine_workers:
1``): it takes batches from the queue in the order the queue releases them,
hands them to the worker (server/workers/worker.py) without waiting for the
one before to come back (at most :data:`MAX_IN_FLIGHT` at once: a slow worker
slows the queue, hence the receivers and the senders, and never loses
anything), and takes the results back in order: each batch's witnesses,
encoded by the worker, are numbered, logged and offered to the clients here
(server/delivery/witnesses.py, ``deliver_encoded``), exactly as the engine
thread of ``engine_workers: 0`` does with its own.

Everything else it does between batches is the engine thread's too: the API's
commands (run against the main process's catalogue engine, which sends every
change on to the worker: server/workers/mirror.py), a recovery's later
subscriptions and recorded sheddings (those ride on the batch they follow, so
the worker applies them before it checks), the state budget's decisions (the
worker decides, this thread records them, then the worker applies them),
instance counts, and snapshots (taken with nothing in flight: the worker's
child writes the file, server/durability/checkpoints.py).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import queue as stdqueue
import time
from collections import deque
from typing import Callable

from air.engine import EngineError
from server.budgetcheck import Cap, CheckResult, Decision, Outcome
from server.delivery.witnesses import EncodedBatch
from server.observability.counters import Count
from server.processing import EngineThread
from server.workers import codec
from server.workers.link import WorkerGone, WorkerLink

log = logging.getLogger("cayuga.daemon")

#: Batches handed to the worker and not yet back: enough to keep it busy while this
#: thread delivers the last one's witnesses, few enough to bound what a crash replays.
MAX_IN_FLIGHT = 3


class WorkerEngineThread(EngineThread):
    """:class:`server.processing.EngineThread` with the engine in a worker
    process (see the module's docstring). ``link`` is the worker's
    (server/workers/link.py); :attr:`engine` is the catalogue
    (server/workers/mirror.py)."""

    def __init__(self, engine, queue, settings, counters, latency, stopping, link: WorkerLink) -> None:
        super().__init__(engine, queue, settings, counters, latency, stopping)
        self.link = link
        # of each batch not yet back: (events, when sent, the recorded sheddings it carries, events taken after it)
        self.in_flight: deque[tuple[int, float, list, int]] = deque()
        self._deciding: list[Decision] = []  # decisions sent to the worker to apply (its answer comes in order)
        self._deciding_at = 0
        self._watched_version = -1
        self._fields = [f.name for f in dataclasses.fields(engine.stats)]
        self.hub = None  # wired by the daemon: which internal streams clients watch

    # ------------------------------------------------------------------ what others ask of the worker

    def set_cap(self, sid: str, cap: Cap) -> None:
        self.link.command("set_cap", sid, tuple(cap))

    def counts(self, got: Callable[[dict], None]) -> None:
        """Instance counts of every subscription, to ``got`` when they come (any thread)."""
        def done(fut) -> None:
            if fut.exception() is None:
                got(fut.result())
        self.link.command("counts").add_done_callback(done)

    def snapshot(self, tmp, part: dict, fork: bool) -> None:
        """Have the worker write a snapshot file (server/durability/checkpoints.py): forked, or here and now."""
        self.link.call("snapshot", str(tmp), part, fork, timeout=60 if fork else 600)

    def import_snapshot(self, snap_file) -> dict:
        """The engine's state of a snapshot file, loaded by the worker (a recovery)."""
        return self.link.call("import_snapshot", str(snap_file.path), timeout=600)

    def state_counts(self, sid: str, timeout: float) -> dict[str, int]:
        return self.link.call("state_counts", sid, timeout=timeout)

    def instance_count(self, sid: str | None = None, timeout: float = 10.0) -> int:
        return self.link.call("instance_count", sid, timeout=timeout)

    @property
    def alive(self) -> bool:
        return super().alive and self.link.alive

    def workers(self) -> list[dict]:
        link, flight = self.link, list(self.in_flight)
        return [{"worker": 0, "pid": link.process.pid if link.process is not None else None, "alive": link.alive,
                 "gone": link.gone, "in_flight_batches": len(flight),
                 "in_flight_events": sum(n for n, *_rest in flight)}]

    def runs_on(self, sid: str) -> str:
        return "worker 0"

    @property
    def processed(self) -> int:
        """Events taken and back from the worker (their witnesses delivered); :attr:`fed` counts those sent too."""
        return self.fed - sum(n for n, *_rest in list(self.in_flight))

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        queue, size, link = self.queue, self.settings.batch_size, self.link
        recovery, budget, checkpoints = self.recovery, self.budget, self.checkpoints
        in_flight = self.in_flight
        while True:
            self._apply_commands()
            self._sync_watched()
            if self.engine.diverged is not None:
                self.error = self.engine.diverged
            if link.gone is not None:
                self.error = link.gone
                log.error("%s: the engine thread stops; restart the server", link.gone)
                return
            if recovery.due:  # later subscriptions, at the point they were registered (sheddings ride on batches)
                recovery.install_due()
            recovery.check_done()
            if not self._take_results(block=False):
                return
            now = time.monotonic()
            budget.refresh(now)
            if not in_flight and checkpoints.due(now):
                checkpoints.take(now)
            batch = None
            if len(in_flight) < MAX_IN_FLIGHT:
                limit = min(size, budget.until_check(self.fed))
                if recovery.due:
                    limit = min(limit, recovery.due[0][0] - self.fed)
                wait = 0.0 if in_flight else budget.idle(now)
                batch = queue.get_batch(limit, timeout=wait) if limit > 0 else None
                if batch:
                    self._send(batch)
            if in_flight and not batch:
                if not self._take_results(block=True):
                    return
            if self.stopping.is_set() and not batch and not len(queue) and not in_flight:
                self._apply_commands()
                return

    def _send(self, batch: list) -> None:
        self._sync_watched()  # a client that came while this thread waited for events hears this batch's too
        self.fed += len(batch)
        self._count_batch(batch)
        recorded = self.recovery.take_recorded(self.fed)
        self.link.send(codec.encode_batch(self.fed, [(e.sid, e.keep, e.reason, e.shared, e.seq) for e in recorded],
                                          batch))
        self.in_flight.append((len(batch), time.perf_counter(), recorded, self.fed))

    def quiesce(self) -> bool:
        """Take back every batch in flight (on this thread): the worker's state is
        then the one this process's parts describe (a snapshot's cut). False
        when the thread must stop."""
        while self.in_flight and self.link.gone is None:
            if not self._take_results(block=True, for_commands=False):
                return False
        return not self.in_flight

    def _take_results(self, block: bool, for_commands: bool = True) -> bool:
        """Take what the worker has sent back, in order (waiting for one with
        ``block``, unless an API command waits and ``for_commands``); False
        when the thread must stop (the witness log could not take a batch
        while the server stopped)."""
        results = self.link.results
        while True:
            try:
                tag, body = results.get(timeout=0.05) if block else results.get_nowait()
            except stdqueue.Empty:
                if (block and self.link.gone is None and self.in_flight
                        and not (for_commands and self._commands.qsize())):
                    continue  # (an API command waiting is run first, then the wait goes on)
                return True
            block = False
            if tag == codec.RESULT:
                if not self._result(codec.decode_result(body)):
                    return False
            elif tag == codec.ANSWER:
                self._applied(body)
            else:  # the worker has gone
                return True

    def _result(self, result: list) -> bool:
        _events, groups, internal, stats, epoch, errors, check, outcomes = result
        n, sent, recorded, fed = self.in_flight[0]  # taken off once delivered (``processed`` counts it then)
        self.latency.observe((time.perf_counter() - sent) / max(n, 1))
        st = self.engine.stats
        for name, value in zip(self._fields, stats):
            setattr(st, name, value)
        self.epoch = epoch
        for e in errors:
            self.error = e
            self.counters.add(Count.ENGINE_ERRORS)
            log.error("engine failed on an event: %s", e)
        if not self.witnesses.deliver_encoded(EncodedBatch(groups, internal)):
            return False
        self.in_flight.popleft()
        budget = self.budget
        for r, outcome in zip(recorded, outcomes):  # a replay's recorded sheddings, applied before the check
            budget.applied(Decision(r.sid, r.keep, r.reason or "", bool(r.shared)), Outcome(*outcome),
                           replayed=True, fed=fed)
            budget.seq = r.seq
        if check is not None:
            found = CheckResult(*check)
            decisions = budget.on_check(found, fed)  # recorded durably first (none when that failed)
            if found.decisions:  # the worker waits for the word
                self._deciding, self._deciding_at = decisions, fed
                self.link.send(codec.APPLY + pickle.dumps(decisions, pickle.HIGHEST_PROTOCOL))
        return True

    def _applied(self, value) -> None:
        outcomes, fp = value
        for d, outcome in zip(self._deciding, outcomes):
            self.budget.applied(d, Outcome(*outcome), fed=self._deciding_at)
        self._deciding = []
        self.budget.footprint = tuple(fp)

    def _sync_watched(self) -> None:
        """Tell the worker which internal streams clients watch (their witnesses are then encoded)."""
        hub = self.hub
        if hub is None or hub.version == self._watched_version:
            return
        self._watched_version = hub.version
        self.link.command("watch_streams", hub.watched_streams())

    def feed(self, batch: list) -> None:  # the worker feeds: nothing runs here
        raise EngineError("the engine runs in a worker process: batches go through the loop")
