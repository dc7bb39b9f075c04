"""The engine thread when engine workers run the automata (``engine_workers:
N``, 1 by default): it takes batches from the queue in the order the queue
releases them, hands each worker (server/workers/worker.py) the events of the
streams its subscriptions read (server/workers/placement.py; every worker, an
empty batch if need be, at the state budget's check points, which are the same
for all), without waiting for the one before to come back (at most :data:`MAX_IN_FLIGHT` at once: a slow worker
slows the queue, hence the receivers and the senders, and never loses
anything), and takes the results back in order — a batch's, from each worker
it went to, in the workers' order: each subscription runs on one worker, so
its witnesses and their numbers are those of one engine — and the witnesses,
encoded by the workers, are numbered, logged and offered to the clients here
(server/delivery/witnesses.py, ``deliver_encoded``), exactly as the engine
thread of ``engine_workers: 0`` does with its own.

Everything else it does between batches is the engine thread's too: the API's
commands (run against the main process's catalogue engine, which sends every
change on to the worker: server/workers/mirror.py), a recovery's later
subscriptions and recorded sheddings (those ride on the batch they follow, so
the worker applies them before it checks), the state budget's decisions (each
worker decides on its share of ``max_state_bytes``, this thread records them,
then the worker applies them), instance counts, and snapshots (taken with
nothing in flight: worker 0's child writes the file, the others' children
their parts, server/durability/checkpoints.py). A worker that dies is started
again and caught up between batches (server/workers/restart.py): each flight
keeps the message each worker was sent, to send it again to the new one.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import queue as stdqueue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from air.engine import EngineError
from server.budgetcheck import Cap, CheckResult, Decision, Outcome
from server.delivery.encoding import EncodedBatch
from server.delivery.witnesses import NumberMap
from server.observability.counters import Count
from server.processing import EngineThread
from server.workers import codec, rows
from server.workers.link import WorkerGone, WorkerLink, WorkerStopped

log = logging.getLogger("cayuga.daemon")

#: Batches handed to the workers and not yet back: enough to keep them busy while this
#: thread delivers the last one's witnesses, few enough to bound what a crash replays.
MAX_IN_FLIGHT = 3

#: Seconds the loop waits for events while batches are out before it looks at the
#: workers again (a result back, or a worker's end, ends the wait sooner).
RESULT_WAIT = 0.05

#: Seconds a start waits at most for the workers' interpreters before its ports take anything
#: (one still starting then: the first batches wait for it).
WORKER_START_TIMEOUT = 120.0


def batch_limit(batch_size: int, workers: int) -> int:
    """Events the loop takes from the queue at most per batch: ``batch_size`` for each
    worker. A batch is dealt out, so each of N workers gets about 1/N of it; what a batch
    costs apart from its events (a message each way per worker, its encoding and decoding,
    the wake-ups, the delivery's passes) would otherwise be paid N times as often. With
    8 workers on two cores, 8 x 1,024 events a batch instead of 1,024 cost the main process
    25% less an event and the workers 15% less (BENCHMARKS.md, "Engine workers, round 6").
    Under a light load nothing changes: a batch is what the queue has released."""
    return batch_size * max(1, workers)


@dataclass
class Flight:
    """A batch handed to some workers and not yet back from all of them."""

    events: int
    sent: float  # perf_counter when sent
    fed: int  # events taken once it is
    workers: tuple[int, ...]  # those it went to, in order
    recorded: dict[int, list] = field(default_factory=dict)  # worker -> the recorded sheddings it carries
    got: dict[int, list] = field(default_factory=dict)  # worker -> its result, once back
    messages: dict[int, bytes] = field(default_factory=dict)  # worker -> what it was sent (again, once restarted)
    places: dict[int, list[int]] | None = None  # worker -> where in the batch its events were (row scaling)


class WorkerEngineThread(EngineThread):
    """:class:`server.processing.EngineThread` with the engine in worker
    processes (see the module's docstring). ``links`` are the workers'
    (server/workers/link.py); :attr:`engine` is the catalogue
    (server/workers/mirror.py), which knows where each subscription runs."""

    def __init__(self, engine, queue, settings, counters, latency, stopping, links: list[WorkerLink]) -> None:
        super().__init__(engine, queue, settings, counters, latency, stopping)
        self.links = links
        for link in links:  # a worker's end wakes this thread where it waits for events (see _loop)
            link.on_result = queue.nudge
        self.placement = engine.placement
        self.in_flight: deque[Flight] = deque()
        self._sending = 0  # the events of a batch being dealt to the workers
        self._deciding: dict[int, tuple[list[Decision], int]] = {}  # worker -> decisions sent to it to apply, at
        self._watched_version = -1
        self._fields = [f.name for f in dataclasses.fields(engine.stats)]
        self._stats: dict[int, tuple] = {}  # worker -> its engine's running totals
        self._epochs: dict[int, object] = {}
        self.hub = None  # wired by the daemon: which internal streams clients watch
        self.events_of = [0] * len(links)  # events each worker has taken and sent back
        self.numbered = [NumberMap() for _ in links]  # each worker's numbers of subscriptions and streams
        #: instances each worker held at the last count (a row-scaled subscription's share on each)
        self.instances_of = [0] * len(links)
        self.gc_of: dict[int, list[int]] = {}  # worker -> its collector's collections per generation, at the last count
        #: worker -> the CPU seconds of its batches by part (codec.CPU_PARTS), at the last count (its current process)
        self.cpu_parts_of: dict[int, dict[str, float]] = {}
        from server.workers.restart import Restarter

        self.restarter = Restarter(self)  # a worker that dies is started again (server/workers/restart.py)

    def await_workers(self) -> None:
        """Wait until every worker has started: has answered a command, and so has taken what
        was sent before it (the streams declared). A start calls it before the TCP receiver and
        the HTTP port take anything: else the first events wait in the pipe for a worker's
        interpreter and imports while /health says ok. On two cores (Python 3.12) that was a
        stall of 16-50 ms in three runs of five at the start of `bench latency`; on 16 cores,
        with up to 15 workers starting at once, 0.2-0.5 s (BENCHMARKS.md, "Engine workers,
        round 8"). Gives up when the server stops, or after :data:`WORKER_START_TIMEOUT` (said
        in the log); one that has died is started again by the loop (restart.py)."""
        futures = [link.command("stats") for link in self.links]
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        for w, fut in enumerate(futures):
            while not self.stopping.is_set():
                try:
                    fut.result(timeout=0.1)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        log.warning("engine worker %d has not started within %.0f s; starting without it (events "
                                    "for it wait until it has)", w, WORKER_START_TIMEOUT)
                        break
                except Exception:  # noqa: BLE001 - it has died: the loop starts it again (restart.py)
                    break

    @property
    def link(self) -> WorkerLink:
        return self.links[0]

    # ------------------------------------------------------------------ what others ask of the workers

    def set_cap(self, sid: str, cap: Cap) -> None:
        for link in self.links:  # a worker that does not run it keeps it for nothing (and has it if it comes)
            link.command("set_cap", sid, tuple(cap))

    def counts(self, got: Callable[[tuple], None]) -> None:
        """Instance counts of every subscription, and the counting's cost, to ``got`` when every worker's came."""
        answers: dict[int, tuple] = {}
        lock = threading.Lock()

        def done(fut, w: int) -> None:
            with lock:  # one that died meanwhile (restart.py) counts nothing this pass: the pass still ends
                answers[w] = fut.result() if fut.exception() is None else ({}, 0.0, None, None)
                if answers[w][2] is not None:
                    self.gc_of[w] = answers[w][2]
                if answers[w][3] is not None:
                    self.cpu_parts_of[w] = dict(zip(codec.CPU_PARTS, answers[w][3]))
                self.instances_of[w] = sum(answers[w][0].values())
                if len(answers) < len(self.links):
                    return
            # C-level passes (this runs on the link's thread, under the main process's lock: a Python
            # step a subscription was 3 ms at 10,000, BENCHMARKS.md, "Engine workers, round 26")
            merged: dict[str, int] = {}
            several: set[str] = set()  # counted by more than one worker (row-scaled)
            for counts, _cost, _gc, _parts in answers.values():
                several |= merged.keys() & counts.keys()
                merged.update(counts)
            parts = {sid: {w: a[0][sid] for w, a in answers.items() if sid in a[0]} for sid in several}
            for sid, of in parts.items():  # a row-scaled subscription's: summed over its workers
                merged[sid] = sum(of.values())
            got((merged, max(a[1] for a in answers.values()), parts))

        for w, link in enumerate(self.links):
            link.command("counts").add_done_callback(lambda fut, w=w: done(fut, w))

    def snapshot(self, tmp, part: dict, fork: bool) -> int:
        """Have the workers write a snapshot (server/durability/checkpoints.py): worker 0 the file
        with ``part`` and its engine's state, each other worker its engine's state into a part
        file beside it; forked (their ends come to the snapshotter), or here and now. Returns how
        many children write it."""
        n = len(self.links)
        if n > 1:
            part = {**part, "workers": n, "engine_parts": [part_name(tmp, w) for w in range(1, n)],
                    "placement": dict(self.placement.worker_of), "rows": rows.recorded(self.placement)}
        futures = [self.links[0].command("snapshot", str(tmp), part, fork)]
        futures += [self.links[w].command("snapshot", str(part_path(tmp, w)), {"part": w}, fork)
                    for w in range(1, n)]
        for link, fut in zip(self.links, futures):
            link.result(fut, timeout=60 if fork else 600)  # (not from a stopped one: the journal covers it)
        return n

    def import_snapshot(self, snap_file, snap: dict) -> dict:
        """A snapshot's engine states, loaded by the workers (a recovery): worker by worker as it was
        written; a snapshot of one engine (the engine thread, or one worker) is given whole to
        each worker, which keeps its own subscriptions' instances."""
        n, saved = len(self.links), snap.get("workers", 1)
        rows.check_snapshot(snap_file.path.name, snap, self.placement)
        if saved != n:
            if saved > 1:
                raise EngineError(f"the snapshot {snap_file.path.name} was taken with engine_workers {saved}, "
                                  f"and this server runs {n}: its partial matches cannot be carried over")
            paths = [snap_file.path] * n
        else:
            paths = [snap_file.path] + [snap_file.path.with_name(snap_file.path.name + f".w{w}")
                                        for w in range(1, n)]
        futures = [link.command("import_snapshot", str(p)) for link, p in zip(self.links, paths)]
        counts = []
        for link, fut in zip(self.links, futures):
            try:
                counts.append(self._loaded(link, fut))
            except WorkerGone:  # it died: the engine thread starts it again from this snapshot (restart.py)
                pass
        return {k: sum(c[k] for c in counts) for k in ("instances", "skipped", "clashes")}

    def _loaded(self, link: WorkerLink, fut, timeout: float = 600.0) -> dict:
        """A worker's answer to ``import_snapshot``: ``timeout`` seconds of its running, not of its
        being stopped (SIGSTOP, a debugger: a start waited 600 s for one, then failed its recovery).
        While it stays stopped the start waits for it, said once in the log (and on /health, which
        names it): the snapshot is its state, and nothing runs without it. A stop meanwhile ends the
        wait (the engine thread is then never started, and nothing of this start is kept)."""
        said = False
        while True:
            try:
                return link.result(fut, timeout)
            except WorkerStopped as exc:
                if self.stopping.is_set():
                    return {"instances": 0, "skipped": 0, "clashes": 0}
                if not said:
                    log.warning("%s: the start waits for it to load the snapshot's partial matches; continue it "
                                "(SIGCONT)", exc)
                    said = True

    def state_counts(self, sid: str, timeout: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.placement.workers_of(sid):  # a row-scaled one's: summed over its key groups
            for state, count in self._ask(w, "state_counts", sid, timeout=timeout).items():
                out[state] = out.get(state, 0) + count
        return out

    def instance_count(self, sid: str | None = None, timeout: float = 10.0) -> int:
        if sid is not None:
            return sum(self._ask(w, "instance_count", sid, timeout=timeout) for w in self.placement.workers_of(sid))
        return sum(self._ask(w, "instance_count", None, timeout=timeout) for w in range(len(self.links)))

    def _ask(self, w: int, name: str, *args, timeout: float):
        """A command's answer from worker ``w``; TimeoutError (the API's 503, retry, with this
        message) while it is dead and being started again, or stopped: a stopped one
        (:class:`WorkerStopped`, /health names it too) is said within ``link.STOPPED_SECONDS``, not
        once ``timeout`` has passed."""
        link = self.links[w]
        try:
            return link.result(link.command(name, *args), timeout)
        except WorkerGone as exc:
            raise TimeoutError(f"engine worker {w} has ended and is being started again ({exc})") from None
        except WorkerStopped:
            pid = link.process.pid if link.process is not None else None
            raise WorkerStopped(f"engine worker {w} (pid {pid}) is stopped (a signal or a debugger): it answers "
                                "once it is continued (SIGCONT)") from None

    @property
    def alive(self) -> bool:
        return super().alive and self.gone() is None  # (one that died and is started again does not count)

    def gone(self) -> str | None:
        """Why a worker is no longer there and is not started again (None while every one runs)."""
        return next((link.gone for w, link in enumerate(self.links)
                     if link.gone is not None and w in self.restarter.abandoned), None)

    def workers(self) -> list[dict]:
        flight = list(self.in_flight)
        instances = list(self.instances_of)
        out = []
        for w, link in enumerate(self.links):
            mine = [f for f in flight if w in f.workers and w not in f.got]
            out.append({"worker": w, "pid": link.process.pid if link.process is not None else None,
                        "alive": link.alive, "started": link.started, "gone": link.gone,
                        "subscriptions": self.placement.count_on(w),
                        "in_flight_batches": len(mine), "in_flight_events": sum(f.events for f in mine),
                        "events": self.events_of[w], "instances": instances[w],
                        "cpu_seconds": link.cpu_seconds(), "cpu_wait_seconds": link.cpu_wait_seconds(),
                        "cpu_parts": self.cpu_parts_of.get(w),
                        "gc_collections": self.gc_of.get(w),
                        **self.restarter.about(w)})
        return out

    def runs_on(self, sid: str) -> str:
        for w in self.placement.workers_of(sid):
            if w in self.restarter.abandoned:
                return f"nowhere: engine worker {w} is stopped ({self.restarter.abandoned[w]}); restart the server"
        return rows.runs_on(self.placement, sid)

    @property
    def processed(self) -> int:
        """Events taken and back from the workers (their witnesses delivered); :attr:`fed` counts those sent too."""
        return self.fed - sum(f.events for f in list(self.in_flight)) - self._sending

    # ------------------------------------------------------------------ the loop

    def tell_side_files(self, w: int, link: WorkerLink | None = None) -> None:
        """Have worker ``w`` write its batches' payloads beside the witness log itself
        (server/durability/witside.py): the main process then writes records that refer
        to them, and reads them only for a client that watches (before its first batch)."""
        wlog = self.witnesses.witlog if self.witnesses is not None else None
        if wlog is not None:
            (link or self.links[w]).command("side_files", str(wlog.dir), w)

    def seed(self, w: int, sids=None) -> None:
        """Tell worker ``w`` where the numbering of its subscriptions stands (``sids``: of those
        only; None: all placed whole on it): the main process's last seq of each, with none of
        their witnesses on their way (encoding.py's ``LocalNumbers``: it numbers on from them)."""
        wit, worker_of = self.witnesses, self.placement.worker_of
        if wit is None or w in self.restarter.abandoned:
            return
        seq = wit.seq
        if sids is None:
            seeds = {sid: n for sid, n in seq.items() if worker_of.get(sid) == w}
        else:
            seeds = {sid: seq.get(sid, 0) for sid in sids if worker_of.get(sid) == w}
        if seeds:
            self.links[w].command("seqs", seeds)

    def _reseed(self) -> bool:
        """The workers told where the numbering stands of the subscriptions whose seq was set here
        other than by numbering their results (recovery's, a backfill's), or that one told wrong
        (witnesses.py's ``reseed``): once the batches in flight are back (their witnesses would be
        numbered after). False when the thread must stop."""
        if self.in_flight and not self.quiesce():
            return False
        wit = self.witnesses
        everything, sids = wit.reseed_all, wit.reseed
        wit.reseed, wit.reseed_all = set(), False
        for w in range(len(self.links)):
            self.seed(w, None if everything else sids)
        return True

    def _loop(self) -> None:
        queue, size = self.queue, batch_limit(self.settings.batch_size, len(self.links))
        recovery, budget, checkpoints = self.recovery, self.budget, self.checkpoints
        in_flight = self.in_flight
        for w in range(len(self.links)):
            self.tell_side_files(w)
        wit = self.witnesses
        if wit is not None:  # the workers number their subscriptions' witnesses; this process checks them
            wit.reseed, wit.reseed_all = set(), True
            self.engine.seq_of = lambda sid: wit.seq.get(sid, 0)
        while True:
            self._apply_commands()
            self._sync_watched()
            if self.engine.diverged is not None:
                self.error = self.engine.diverged
            if not self.restarter.check():  # a dead worker is started again and caught up (ingest waits)
                return
            if recovery.due:  # later subscriptions, at the point they were registered (sheddings ride on batches)
                recovery.install_due()
            recovery.check_done()
            if not self._take_results(block=False):
                return
            if wit is not None and (wit.reseed or wit.reseed_all) and not self._reseed():
                return
            now = time.monotonic()
            budget.refresh(now)
            if not in_flight and checkpoints.due(now):
                checkpoints.take(now)
            batch = None
            limit = min(size, budget.until_check(self.fed)) if len(in_flight) < MAX_IN_FLIGHT else 0
            if limit > 0 and recovery.due:
                limit = min(limit, recovery.due[0][0] - self.fed)
            if limit > 0:
                # events that come while batches are out go at once (not after those are back):
                # a result back ends the wait too (this thread waits on the results channels as well)
                batch = queue.get_batch(limit, timeout=RESULT_WAIT if in_flight else budget.idle(now),
                                        fds=[link.results.fileno() for link in self.links if link.results is not None])
                if batch:
                    self._send(batch)
            elif in_flight:
                if not self._take_results(block=True):
                    return
            if self.stopping.is_set() and not batch and not len(queue) and not in_flight:
                self._apply_commands()
                return

    def _send(self, batch: list) -> None:
        self._sync_watched()  # a client that came while this thread waited for events hears this batch's too
        self._sending = len(batch)  # not through yet, and not in flight yet either (:attr:`processed`)
        self.fed += len(batch)
        counted = self._count_batch(batch)
        n = len(self.links)
        recorded = self.recovery.take_recorded(self.fed)
        places = None
        if n == 1:
            parts = {0: batch}
        else:
            stream = next(iter(counted)) if len(counted) == 1 else None  # (the batch's one stream)
            if not self.placement.split:
                readers = self.placement.readers
                if stream is not None:
                    parts = dict.fromkeys(readers(stream), batch)
                else:
                    parts = {}
                    for ev in batch:
                        for w in readers(ev.stream):
                            parts.setdefault(w, []).append(ev)
            else:  # by the events' values too (row scaling, constant routes), with their places in the batch
                parts, places = rows.split(batch, self.placement, stream)
            if self.budget.until_check(self.fed - len(batch)) <= len(batch):  # a check point: every worker checks
                for w in range(n):
                    parts.setdefault(w, [])
        by_worker: dict[int, list] = {}
        for r in recorded:  # a row-scaled subscription's: applied by each worker to its key group's instances
            for w in self.placement.workers_of(r.sid):
                by_worker.setdefault(w, []).append(r)
                parts.setdefault(w, [])
        workers = tuple(w for w in sorted(parts) if w not in self.restarter.abandoned)
        sent: dict[int, bytes] = {}
        same: dict[int, bytes] = {}  # the message of a part several workers get whole, nothing recorded for them
        for w in workers:
            mine = by_worker.get(w, [])
            part = parts[w]
            msg = None if mine else same.get(id(part))  # (column scaling: every reader of the stream gets the batch)
            if msg is None:
                msg = codec.encode_batch(self.fed, [(e.sid, e.keep, e.reason, e.shared, e.seq) for e in mine],
                                         part, counted if n == 1 else None)  # (one worker: its counts)
                if not mine:
                    same[id(part)] = msg
            sent[w] = msg
            try:
                self.links[w].send(sent[w])
            except WorkerGone:  # it has just died: sent again once it is restarted
                pass
        if workers:
            self.in_flight.append(Flight(len(batch), time.perf_counter(), self.fed, workers, by_worker, messages=sent,
                                         places=places))
        self._sending = 0
        if not workers:  # no worker reads these events: taken, and through (as one engine would count them)
            self._totals(0)

    def quiesce(self) -> bool:
        """Take back every batch in flight (on this thread): the workers' state is
        then the one this process's parts describe (a snapshot's cut). False
        when the thread must stop."""
        while self.in_flight and self.gone() is None:
            if not self.restarter.check():  # (one that died is started again, and answers them)
                return False
            if not self._take_results(block=True, for_commands=False):
                return False
        return not self.in_flight

    def _take_results(self, block: bool, for_commands: bool = True) -> bool:
        """Take back what the workers have sent, a batch at a time, in order (waiting
        for the first with ``block``, unless an API command waits and
        ``for_commands``); False when the thread must stop (the witness log
        could not take a batch while the server stopped)."""
        for w, link in enumerate(self.links):  # what applying a check's decisions removed
            if link.results is not None:
                link.results.pump(0)  # (what has come: else a waiting answer would end every wait at once)
            while not link.applied.empty():
                self._applied(w, link.applied.get_nowait())
        if self.budget.unnoticed and not self._deciding:  # every worker's cut is in: their watchers told once
            self.budget.send_notices()
        while self.in_flight:
            head = self.in_flight[0]
            for w in head.workers:
                if w not in head.got:
                    got = self._next_result(w, block, for_commands)
                    if got is None:
                        return True
                    head.got[w] = got
            if not self._deliver(head):
                return False
            self.in_flight.popleft()
            block = False
        return True

    def _next_result(self, w: int, block: bool, for_commands: bool) -> list | None:
        """Worker ``w``'s next batch result, or None."""
        link = self.links[w]
        while True:
            try:
                tag, body = link.results.get(timeout=0.05) if block else link.results.get_nowait()
            except stdqueue.Empty:
                if block and link.gone is None and not (for_commands and self._commands.qsize()):
                    for other in self.links:  # what the others answered meanwhile is read (restart.py's owed)
                        if other is not link and other.results is not None:
                            other.results.pump(0)
                    continue  # (an API command waiting is run first, then the wait goes on)
                return None
            if tag == codec.RESULT:
                return codec.decode_result(body)
            return None  # the worker has gone

    def _deliver(self, head: Flight) -> bool:
        self.latency.observe((time.perf_counter() - head.sent) / max(head.events, 1))
        budget = self.budget
        merging = rows.Merge() if head.places is not None else None
        for w in head.workers:
            events, groups, internal, stats, epoch, errors, check, outcomes, places, cols = head.got[w]
            self.events_of[w] += events
            self._stats[w], self._epochs[w] = stats, epoch
            for e in errors:
                self.error = e
                self.counters.add(Count.ENGINE_ERRORS)
                log.error("engine failed on an event: %s", e)
            if places and merging is not None:  # a row-scaled subscription's: numbered once all are here
                groups = merging.take(w, groups, places, head.places.get(w, []))
            delivered = self.witnesses.deliver_columns(cols, self.numbered[w])  # (all but the row-scaled: merged below)
            if not delivered or not self.witnesses.deliver_encoded(EncodedBatch(groups, internal)):
                return False
            for r, outcome in zip(head.recorded.get(w, ()), outcomes):  # a replay's, applied before the check
                budget.applied(Decision(r.sid, r.keep, r.reason or "", bool(r.shared)), Outcome(*outcome),
                               replayed=True, fed=head.fed, worker=w, notice=False)
                budget.seq = max(budget.seq, r.seq)
            if check is not None:
                found = CheckResult(*check)
                decisions = budget.on_check(found, head.fed, worker=w)  # recorded durably first (none: it failed)
                if found.decisions:  # the worker waits for the word (a dead one's restart applies them: recorded)
                    self._deciding[w] = (decisions, head.fed)
                    try:
                        self.links[w].send(codec.APPLY + pickle.dumps(decisions, pickle.HIGHEST_PROTOCOL))
                    except WorkerGone:
                        pass
        if merging is not None and merging.groups and not self.witnesses.deliver_encoded(merging.batch()):
            return False
        self._totals(head.events)  # (this batch is taken off the flights once delivered)
        return True

    def _totals(self, delivering: int) -> None:
        """The engine's running totals and epoch, as one engine's: what each worker made is
        summed (witnesses, resubscribed events, errors, instances shed or expired); what every
        worker sees of the same input is counted once (the events: those taken, plus the
        resubscribed; epochs and late events: the most any worker counted)."""
        st, stats = self.engine.stats, list(self._stats.values())
        if len(stats) == 1:  # (one worker: its totals are the engine's, as they are)
            for name, value in zip(self._fields, stats[0]):
                setattr(st, name, value)
        else:
            for i, name in enumerate(self._fields):
                values = [s[i] for s in stats]
                if values and isinstance(values[0], str):
                    setattr(st, name, next((v for v in reversed(values) if v), ""))
                elif name in ("epochs", "late"):
                    setattr(st, name, max(values, default=0))
                else:
                    setattr(st, name, sum(values))
        if len(self.links) > 1:
            st.events = self.processed + delivering + st.resubscribed
        epochs = [e for e in self._epochs.values() if e is not None]
        self.epoch = max(epochs) if epochs else None

    def _applied(self, w: int, value) -> None:
        outcomes, fp = value
        decisions, fed = self._deciding.pop(w, ([], 0))
        for d, outcome in zip(decisions, outcomes):
            self.budget.applied(d, Outcome(*outcome), fed=fed, worker=w, notice=False)
        self.budget.footprint_of(w, tuple(fp))

    def _sync_watched(self) -> None:
        """Tell the workers which internal streams clients watch (their witnesses are then encoded)."""
        hub = self.hub
        if hub is None or hub.version == self._watched_version:
            return
        self._watched_version = hub.version
        streams = hub.watched_streams()
        for link in self.links:
            link.command("watch_streams", streams)

    def feed(self, batch: list) -> None:  # the workers feed: nothing runs here
        raise EngineError("the engine runs in worker processes: batches go through the loop")


def part_path(tmp, w: int):
    """Where worker ``w`` (1 and up) writes its part of the snapshot whose file is ``tmp``."""
    from pathlib import Path

    final = Path(tmp).with_suffix(".bin")
    return final.with_name(final.name + f".w{w}.tmp")


def part_name(tmp, w: int) -> str:
    """The published name of worker ``w``'s part, beside the snapshot file."""
    from pathlib import Path

    return Path(tmp).with_suffix(".bin").name + f".w{w}"
