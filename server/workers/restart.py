"""An engine worker that dies is started again (issue 32, "durability per worker").

When a worker process ends while the server runs (kill -9, a crash, the
kernel's OOM killer), the engine thread (server/workers/dispatch.py) calls
:meth:`Restarter.check` between batches, which, on that same thread:

1. starts a fresh worker process (server/workers/link.py) in the dead one's
   place, with the streams declared, the watched internal streams and the
   subscription caps;
2. rebuilds its state as recovery rebuilds the engine at a start
   (server/durability/recovery.py, whose seams it reuses): the subscriptions
   placed on it that the newest snapshot knows are installed, its part of that
   snapshot is loaded (none yet: it starts empty, from the journal's
   beginning), and the journal after the snapshot is put back, in journal
   order, on a private queue (server/ingest/queue.py) that releases the events
   in the order the live queue released them; the worker is fed them up to the
   point the live stream's delivered witnesses have reached (``processed``),
   in batches that end at the state budget's check points, with every
   subscription registered after the snapshot installed, and every recorded
   shedding applied, at the point it happened;
3. drops what the worker emits while it catches up: every one of those
   witnesses was delivered already (its number ``seq`` at or below the
   subscription's delivered one);
4. sends it again the batches that were in flight when it died (their
   witnesses were never delivered: numbered and delivered now, once each), and
   the engine thread goes on.

The other workers keep their state and their batches in flight; the queue is
not taken from while the worker catches up, so ingest waits (back-pressure:
senders are blocked, nothing is dropped). ``/health`` says ``degraded`` and
names the worker and its progress meanwhile (:meth:`Restarter.about`).

A worker that dies :data:`MAX_DEATHS` times within :data:`DEATH_WINDOW`
seconds, or dies again while it catches up, or cannot be caught up (no
journal: ``durability: off``; a journal that no longer reaches back to the
snapshot) is not started again: its subscriptions get no more events, and each
is marked — inexact with the reason (/health, GET /subscriptions/{id}, a
``{"control": "inexact"}`` notice to its watchers), its ``runs_on`` says
nowhere, and /health stays degraded (/livez answers 503: a restart of the
server brings it back, from the snapshot and the journal).
"""

from __future__ import annotations

import logging
import pickle
import queue as stdqueue
import threading
import time
from collections import deque
from concurrent.futures import Future

from air.engine import EngineError, Event
from server.budgetcheck import CheckResult, Decision, Outcome
from server.delivery.witnesses import NumberMap
from server.durability.recovery import Eviction, installed_after, plan_due, requeue
from server.ingest.queue import DelayQueue
from server.processing import where_busy
from server.workers import codec
from server.workers.link import WorkerGone, WorkerLink
from server.workers.placement import ALL

log = logging.getLogger("cayuga.daemon")

#: A worker that dies this many times within DEATH_WINDOW seconds is not started again.
MAX_DEATHS = 3
DEATH_WINDOW = 60.0
#: Seconds a restarted worker may take for one step of its catch-up (a batch, loading its snapshot part).
STEP_TIMEOUT = 600.0
#: Seconds a running worker may owe a batch before /health says it is not answering (stopped by a
#: signal or a debugger, starved of a core, or that long on one batch): events wait meanwhile.
SILENT_SECONDS = 15.0


class Spawner:
    """Starts the new worker processes from one thread that lives until the daemon stops
    (:meth:`close`, after the workers have stopped): a worker asks the kernel to kill it
    when its parent *thread* ends (PR_SET_PDEATHSIG, server/workers/worker.py), and the
    engine thread, which restarts workers, ends before the shutdown snapshot they write."""

    def __init__(self) -> None:
        self._requests: stdqueue.Queue = stdqueue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None

    def start(self, link: WorkerLink, timeout: float = 60.0) -> None:
        """``link.start()`` on the spawner's thread (raises what it raised)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="cayuga-worker-spawner", daemon=True)
            self._thread.start()
        done: Future = Future()
        self._requests.put((link, done), timeout=timeout)
        done.result(timeout=timeout)

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            link, done = item
            try:
                link.start()
                done.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the engine thread
                done.set_exception(exc)

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (once every worker it started has stopped)."""
        if self._thread is not None and self._thread.is_alive():
            self._requests.put(None, timeout=timeout)
            self._thread.join(timeout)


class CatchUpFailed(RuntimeError):
    """The restarted worker could not be caught up (the message says why)."""


class Restarter:
    """The restarts of one :class:`~server.workers.dispatch.WorkerEngineThread`'s workers
    (see the module's docstring). Written on the engine thread; /health reads copies."""

    def __init__(self, thread) -> None:
        self.thread = thread
        n = len(thread.links)
        self.restarts = [0] * n  # times each worker was started again
        self.deaths: dict[int, deque[float]] = {}  # worker -> when it died (monotonic), within DEATH_WINDOW
        self.abandoned: dict[int, str] = {}  # worker -> why it is no longer started again
        self.catching_up: dict[int, dict] = {}  # worker -> {"events_done", "events_total"} while it catches up
        self.last_death: dict[int, str] = {}  # worker -> why it last ended
        self.spawner = Spawner()
        self.ending = False  # the server's stop ended the workers it waited for: none is started again

    # ------------------------------------------------------------------ what /health shows

    def about(self, w: int) -> dict:
        """Worker ``w``'s restarts, as /health shows them."""
        progress = self.catching_up.get(w)
        if w in self.abandoned:
            state = "stopped"
        elif progress is not None:
            state = "catching_up"
        elif self.thread.links[w].gone is not None:
            state = "restarting"
        else:
            state = "not_answering" if self.silent(w) is not None or self.thread.links[w].stopped() else "running"
        owed = self.owed(w)
        return {"state": state, "restarts": self.restarts[w], "catch_up": dict(progress) if progress else None,
                "last_death": self.last_death.get(w), "stopped_because": self.abandoned.get(w),
                "oldest_batch_s": None if owed is None else round(owed, 3),
                "busy_in": self.thread.links[w].where}

    def owed(self, w: int) -> float | None:
        """Seconds since worker ``w`` was sent the oldest batch it has not answered (None: it owes none).
        A result it has sent that waits behind another worker's (the engine thread takes a batch's
        results in order) is an answer: with one worker stopped, the others are not said to be."""
        try:
            flights = tuple(self.thread.in_flight)  # (the engine thread's: a copy, read once)
        except RuntimeError:  # changed while copied: the next look sees it
            return None
        results = self.thread.links[w].results
        answered = results.waiting() if results is not None else 0
        for f in flights:
            if w in f.workers and w not in f.got:
                if answered:  # (its results come in the order of its batches)
                    answered -= 1
                    continue
                return max(0.0, time.perf_counter() - f.sent)
        return None

    def silent(self, w: int) -> float | None:
        """:meth:`owed`, once it is SILENT_SECONDS or more (a running worker only)."""
        owed = self.owed(w)
        return owed if owed is not None and owed >= SILENT_SECONDS else None

    def trouble(self) -> list[str]:
        """What /health says of workers that are not running, or not answering (empty while every one runs
        and answers)."""
        out = []
        for w, link in enumerate(self.thread.links):
            progress = self.catching_up.get(w)
            if w in self.abandoned:
                out.append(f"engine worker {w} is stopped ({self.abandoned[w]}): its subscriptions get no events; "
                           "restart the server")
            elif progress is not None:
                out.append(f"engine worker {w} died and was started again; it is catching up: "
                           f"{progress['events_done']} of {progress['events_total']} events replayed "
                           "(events wait in the queue meanwhile)")
            elif link.gone is not None:
                out.append(f"engine worker {w} died and is being started again")
            elif (silent := self.silent(w)) is not None:
                pid = link.process.pid if link.process is not None else None
                out.append(f"engine worker {w} (pid {pid}) has not answered a batch sent {silent:.0f} s ago: "
                           f"{_why_silent(link.where)}; events wait in the queue meanwhile (nothing is dropped), "
                           "and it is not restarted while it lives (it would run the batch again)")
            elif link.stopped():  # (said at once, before it owes a batch that long)
                out.append(f"engine worker {w} (pid {link.process.pid}) is stopped (a signal or a debugger): it "
                           "answers nothing until it is continued (SIGCONT); events for it wait in the queue "
                           "meanwhile (nothing is dropped)")
        return out

    # ------------------------------------------------------------------ the engine thread

    def check(self) -> bool:
        """On the engine thread, between batches: start every dead worker again (see
        the module's docstring). False when the engine thread must stop."""
        t = self.thread
        for w, link in enumerate(t.links):
            if link.gone is None or w in self.abandoned:
                continue
            if self.ending:  # (daemon.py's _end_stuck_workers: the journal replays its events at the next start)
                return False
            if not self._restart(w):
                return False
        return True

    def _restart(self, w: int) -> bool:
        t = self.thread
        old = t.links[w]
        why = self.last_death[w] = old.gone
        now = time.monotonic()
        deaths = self.deaths.setdefault(w, deque())
        deaths.append(now)
        while deaths and now - deaths[0] > DEATH_WINDOW:
            deaths.popleft()
        if len(deaths) >= MAX_DEATHS:
            self._abandon(w, f"it died {len(deaths)} times within {DEATH_WINDOW:.0f} s, the last: {why}")
            return True
        if t.recovery.journal is None:
            self._abandon(w, f"{why}; with durability: off there is no journal to catch a new one up from")
            return True
        log.error("%s: starting it again, from the newest snapshot and the journal (events wait meanwhile)", why)
        if old.results is not None:
            old.results.drain()  # (read to its end: the answers it sent before it died)
        while not old.applied.empty():  # what it applied before it died is counted
            t._applied(w, old.applied.get_nowait())
        unanswered = t._deciding.pop(w, ([], 0))  # recorded: the catch-up applies them at their point
        link = WorkerLink(old.settings, name=old.name)
        link.on_snapshot = old.on_snapshot
        link.on_result = old.on_result
        old.stop(timeout=5)  # (it has ended: this reaps it and closes its end)
        if t.checkpoints is not None:
            t.checkpoints.snapshotter.remote_lost(f"{old.name} died")
        target = t.processed
        self.catching_up[w] = {"events_done": 0, "events_total": 0}
        try:
            self.spawner.start(link)
            t.links[w] = link  # the one list the catalogue (mirror.py) and the daemon share
            t.numbered[w] = NumberMap()  # it numbers its subscriptions and streams afresh (learnt from its results)
            self.restarts[w] += 1
            catch_up = CatchUp(self, w, link, target, unanswered)
            replayed = catch_up.run()
        except (CatchUpFailed, WorkerGone, EngineError, OSError, TimeoutError, stdqueue.Full) as exc:
            self.catching_up.pop(w, None)
            if self.ending:  # the server's stop ended it (daemon.py): not a failure, and nothing is lost
                log.info("engine worker %d's catch-up was ended by the server's stop (%s); the next start "
                         "replays the journal", w, exc)
                link.kill()
                return False
            self._abandon(w, f"it died ({why}) and could not be caught up: {exc}")
            if link.alive:
                link.stop(timeout=5)
            return True
        self.catching_up.pop(w, None)
        t.seed(w)  # it numbered what it caught up on from 0: on from the delivered witnesses now
        for f in t.in_flight:  # the batches it had not answered: answered now, their witnesses delivered once
            catch_up.install_until(f.fed - f.events)  # (one registered while they were in flight, at its point)
            if w in f.workers:
                f.got.pop(w, None)
                link.send(f.messages[w])
        catch_up.install_until(t.fed)
        log.warning("engine worker %d is running again (restart %d): %d events replayed to it", w,
                    self.restarts[w], replayed)
        return True

    def close(self) -> None:
        """At the daemon's stop, after the workers have stopped."""
        self.spawner.close()

    def _abandon(self, w: int, why: str) -> None:
        """Worker ``w`` is not started again: its subscriptions are marked, never silently left."""
        t = self.thread
        t.engine.stopped[w] = why  # (a registration placed there is refused, saying so)
        for f in t.in_flight:  # what it was sent is not waited for
            if w in f.workers:
                f.workers = tuple(x for x in f.workers if x != w)
                f.got.pop(w, None)
        sids = [sid for sid, x in list(t.placement.worker_of.items()) if x in (w, ALL)]
        reason = f"engine worker {w} is stopped: {why}; restart the server"
        for sid in sids:
            t.budget.lost_state(sid, reason, t.processed)
        self.abandoned[w] = why  # last: a reader that sees it stopped sees its subscriptions marked (/health)
        log.error("%s; its %d subscriptions get no events and are marked inexact", reason, len(sids))


class CatchUp:
    """Bring a freshly started worker ``w`` to ``target`` events (see the module's docstring)."""

    def __init__(self, restarter: Restarter, w: int, link: WorkerLink, target: int,
                 unanswered: tuple[list[Decision], int]) -> None:
        self.r, self.w, self.link, self.target = restarter, w, link, target
        self.t = restarter.thread
        self.unanswered = {(d.sid, unanswered[1]): d for d in unanswered[0]}

    def run(self) -> int:
        t, w, link = self.t, self.w, self.link
        recovery, engine = t.recovery, t.engine
        found = recovery.snapshots.load_latest()
        snap, snap_file = found if found is not None else (None, None)
        if not recovery.replayable(snap_file, quiet=True):
            raise CatchUpFailed("the journal no longer reaches back to "
                                f"{snap_file.path.name if snap_file else 'its beginning'}")
        cut = snap["fed"] if snap is not None else 0
        if cut > self.target:
            raise CatchUpFailed(f"the newest snapshot is at {cut} events, past the {self.target} delivered")
        queue = DelayQueue(max(self.target, 1))
        if snap is not None:
            queue.restore([Event(*e) for e in snap["queue"]["events"]], snap["queue"])
        requeue(recovery.journal, queue, snap_file.journal if snap_file else 0)
        queue.close(drain=True)  # everything may leave, in the order the live queue released it
        total = self.target - cut
        self.r.catching_up[w] = {"events_done": 0, "events_total": total}
        # the worker as the snapshot had it: streams, watched streams, caps, its subscriptions of then
        engine.rebuild(w, None)
        t.tell_side_files(w, link)  # (a file of its own: the dead one's may end torn)
        if t.hub is not None:
            link.command("watch_streams", t.hub.watched_streams())
        for sid, cap in list(t.budget.caps.items()):
            link.command("set_cap", sid, tuple(cap))
        stored = {st.id: st for st in recovery.store.subscriptions()}
        mine = [sid for sid, x in list(t.placement.worker_of.items()) if x in (w, ALL)]
        later = [sid for sid in mine if sid in stored and installed_after(stored[sid], cut)]
        early = [sid for sid in mine if sid not in set(later)]
        for sid in later:  # joined from a backfill after the snapshot: its history's state is in no snapshot
            if stored[sid].backfill is not None:
                t.budget.lost_state(sid, f"engine worker {w} died after its backfill's hand-over and before a "
                                         "snapshot held the state it brought; it runs on without it", t.processed)
        engine.rebuild(w, early)
        if snap is not None:
            self._load(snap, snap_file, early)
        mark = snap.get("evictions", 0) if snap is not None else 0
        evictions = [e for e in recovery.store.evictions(after=mark) if e[1] <= self.target
                     and t.placement.worker_of.get(e[2]) in (w, ALL)]
        self.due = plan_due([(stored[sid].installed_at, sid) for sid in later], evictions)
        self.active = set(early)
        return self._feed(queue, cut)

    def install_until(self, fed: int) -> None:
        """Install the subscriptions registered at or before ``fed`` events that are not yet
        (registered while batches past the catch-up's end were in flight)."""
        for at, items in self.due:
            if at > fed:
                break
            subs = [x for x in items if isinstance(x, str)]
            if subs:
                self.t.engine.rebuild(self.w, subs)
                self.active.update(subs)
                items[:] = [x for x in items if not isinstance(x, str)]
        while self.due and not self.due[0][1]:
            self.due.popleft()

    def _load(self, snap: dict, snap_file, early: list[str]) -> None:
        """The worker's part of the snapshot, as a start loads it (dispatch.py, ``import_snapshot``)."""
        n, saved = len(self.t.links), snap.get("workers", 1)
        if saved not in (1, n):
            raise CatchUpFailed(f"the snapshot {snap_file.path.name} was taken with engine_workers {saved}")
        path = snap_file.path if saved == 1 or self.w == 0 else snap_file.path.with_name(
            snap_file.path.name + f".w{self.w}")
        try:
            self.link.call("import_snapshot", str(path), timeout=STEP_TIMEOUT)
        except EngineError as exc:  # said, not dropped silently: as recovery does
            lost = f"engine worker {self.w} was restarted and the partial matches of {snap_file.path.name} " \
                   f"could not be loaded ({exc})"
            for sid in early:
                self.t.budget.lost_state(sid, lost, snap["fed"])

    def _feed(self, queue: DelayQueue, fed: int) -> int:
        """Feed the worker the events from ``fed`` to the target, a batch at a time (each
        ending at the budget's check points and where something is due), the subscriptions
        registered since installed at their point and the recorded sheddings applied with the
        batch that reaches theirs (before its check), as a start's replay does; its witnesses
        are dropped."""
        t, w, link = self.t, self.w, self.link
        size, budget = t.settings.batch_size, t.budget
        reads = _reads(t.engine, self.active)
        start, dropped = fed, 0
        while True:
            if self.due and self.due[0][0] <= fed and any(isinstance(x, str) for x in self.due[0][1]):
                self.install_until(fed)
                reads = _reads(t.engine, self.active)
            if fed >= self.target:
                break
            limit = min(size, budget.until_check(fed), self.target - fed)
            nxt = next((at for at, _items in self.due if at > fed), None)
            if nxt is not None:
                limit = min(limit, nxt - fed)
            batch = queue.get_batch(limit, 0)
            if len(batch) < limit:
                raise CatchUpFailed(f"the journal gave {fed + len(batch) - start} of the {self.target - start} "
                                    "events to replay")
            checks = budget.until_check(fed) <= len(batch)  # every worker is sent the batch that ends at one
            fed += len(batch)
            recorded = self._recorded(fed)
            events = batch if reads is None else [ev for ev in batch if ev.stream in reads]
            if not events and not recorded and not checks:
                continue  # nothing of it for this worker: as the live stream sent it nothing
            link.send(codec.encode_batch(fed, [(e.sid, e.keep, e.reason, e.shared, e.seq) for e in recorded],
                                         events))
            dropped += self._answer(fed, recorded)
            self.r.catching_up[w] = {"events_done": fed - start, "events_total": self.target - start}
        link.call("instance_count", None, timeout=STEP_TIMEOUT)  # it has taken every change sent (or died: raises)
        while not link.applied.empty():  # the answers to the empty words of its checks
            link.applied.get_nowait()
        log.info("engine worker %d caught up: %d events replayed, %d witnesses it made again dropped (delivered "
                 "before)", w, fed - start, dropped)
        return fed - start

    def _recorded(self, fed: int) -> list[Eviction]:
        """The recorded sheddings due once ``fed`` events are taken, taken out of :attr:`due`."""
        out: list[Eviction] = []
        for at, items in self.due:
            if at > fed:
                break
            out += [x for x in items if isinstance(x, Eviction)]
            items[:] = [x for x in items if not isinstance(x, Eviction)]
        while self.due and not self.due[0][1]:
            self.due.popleft()
        return out

    def _answer(self, fed: int, recorded: list[Eviction]) -> int:
        """Take the result of the batch just sent: its witnesses dropped (how many), the
        recorded sheddings' outcomes counted where the dead worker never said them, and a
        check's new decisions answered with none (only what was recorded is applied)."""
        try:
            tag, body = self.link.results.get(timeout=STEP_TIMEOUT)
        except Exception:  # noqa: BLE001 - queue.Empty
            raise CatchUpFailed(f"no answer from the restarted worker within {STEP_TIMEOUT:.0f} s") from None
        if tag != codec.RESULT:
            raise WorkerGone(self.link.gone or "the restarted worker has ended")
        _events, groups, internal, _stats, _epoch, _errors, check, outcomes, _places, cols = codec.decode_result(body)
        self.t.numbered[self.w].learn(cols, self.t.witnesses.witlog)  # the numbers it tells, dropped witnesses or not
        for r, outcome in zip(recorded, outcomes):
            d = self.unanswered.pop((r.sid, fed), None)
            if d is not None:
                self.t.budget.applied(d, Outcome(*outcome), fed=fed, worker=self.w)
        if check is not None and CheckResult(*check).decisions:
            self.link.send(codec.APPLY + pickle.dumps([], pickle.HIGHEST_PROTOCOL))
        return sum(len(g[2]) for g in groups) + sum(len(g[2]) for g in internal) + cols.count()


def _why_silent(where: dict | None) -> str:
    """Why a worker has not answered, as far as its watch has said (server/workers/worker.py)."""
    if where is None:
        return "it is stopped (a signal, a debugger), waiting for a core, or that long on one batch"
    return where_busy(where)


def _reads(engine, sids: set[str]) -> set[str] | None:
    """The streams ``sids`` read (None with one worker: it is sent every event)."""
    if len(engine.links) == 1:
        return None
    return {s for sid in sids for s in engine.reads_of.get(sid, ())}

