"""How recovery works: what a start puts back, and in which order.

:meth:`Recovery.restore_then_run` loads the newest snapshot, puts its queued
events and then the journal after it back on the queue (before any new event
is accepted), reinstalls the stored subscriptions, and loads the snapshot's
instances. Subscriptions registered, and evictions applied, after that snapshot
come back where the replay reaches the point they happened at (:attr:`Recovery.due`),
so the engine takes exactly the events, in the order, it took before the crash
and numbers their witnesses as it did. Then the engine thread starts.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from air.engine import Engine, EngineError, Event
from air.engine.memory import paused_gc
from server.durability import witgaps
from server.durability.journal import Journal
from server.durability.snapshot import SnapshotFile, SnapshotStore
from server.durability.store import Store, StoredSubscription
from server.ingest.queue import DelayQueue
from server.subscriptions.registry import INSTALL_CHUNK, Pending, Registrar, Subscription

log = logging.getLogger("cayuga.daemon")


class ServerStarting(RuntimeError):
    """A change asked for while stored subscriptions are still being restored."""


@dataclass
class Eviction:
    """A recorded shedding of state a replay applies again (see server/budget.py,
    ``StateBudget._shed``)."""

    seq: int
    sid: str
    keep: int
    reason: str | None = None
    shared: bool = True


class Recovery:
    """A start's recovery, and the replay it leaves to the engine thread.

    The engine thread (server/processing.py, ``progress``) owns ``fed``;
    ``witnesses`` (server/delivery/witnesses.py) numbers witnesses from
    ``seq``; ``budget`` (server/budget.py) applies a recorded shedding again; ``checkpoints``
    (checkpoints.py) learns where the loaded snapshot stood; ``start_engine``
    starts the engine thread; ``stopping`` is set by a stop."""

    def __init__(self, store: Store, queue: DelayQueue, engine: Engine, snapshots: SnapshotStore,
                 registrar: Registrar, progress, witnesses, budget, checkpoints, start_engine: Callable[[], None],
                 stopping: threading.Event) -> None:
        self.store = store
        self.queue = queue
        self.engine = engine
        self.snapshots = snapshots
        self.registrar = registrar
        self.progress = progress
        self.witnesses = witnesses
        self.budget = budget
        self.checkpoints = checkpoints
        #: With an engine worker (server/workers/), how the snapshot's engine state reaches it (else: this engine)
        self.import_engine: Callable[[SnapshotFile, dict], dict] | None = None
        #: Backfilled subscriptions whose state the loaded snapshot lacks: run again (server/backfill/)
        self.on_backfill_redo: Callable[[list], None] | None = None
        self._start_engine = start_engine
        self.stopping = stopping
        self.journal: Journal | None = None  # set by the daemon's start() unless durability is off
        self.ready = threading.Event()  # stored subscriptions restored, engine thread running
        # set once recovery has put back what the queue held: new events (TCP, POST /events) wait for it
        self.accepting = threading.Event()
        self.restore_total = 0
        self.restored = 0
        self.recovered: dict = {}  # what the last start recovered (logged; /health)
        # a replay installs these subscriptions and applies these evictions at these `fed` points
        self.due: deque[tuple[int, list[Pending | Eviction]]] = deque()
        self.replay_until = 0  # `fed` at the end of a replay
        self.replaying = False  # a recovery's exact replay is under way (until `fed` reaches replay_until)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # the engine thread starts, or the stop wins

    # ------------------------------------------------------------------ the restore thread

    def start(self, stored: list[StoredSubscription]) -> None:
        """Recover in the background (:meth:`restore_then_run`)."""
        self.restore_total = len(stored)
        self._thread = threading.Thread(target=self.restore_then_run, args=(stored,), name="cayuga-restore",
                                        daemon=True)
        self._thread.start()

    def cancel(self, deadline: float) -> bool:
        """At a stop: if the restore is still under way, stop it (the engine
        thread then never starts) and wait for it until ``deadline``
        (monotonic); True if it was under way."""
        with self._start_lock:
            restoring = not self.ready.is_set()
            if restoring:
                self.stopping.set()  # the restore thread stops and never starts the engine thread
        if restoring and self._thread:
            self._thread.join(max(deadline - time.monotonic(), 0.1))
        return restoring

    def restore_then_run(self, stored: list) -> None:
        """The engine's only writer until it hands over to the engine thread.
        Stored CEL is not compiled again: each query is bound from its
        shape's compiled form, stored when the shape was first compiled (keyed
        by the compiler's version, so a new compiler compiles each shape once
        again); subscriptions are installed in chunks."""
        if stored:
            log.info("restoring %d subscriptions", len(stored))
        clock = time.perf_counter
        began = clock()
        shapes = self.registrar.shapes
        rows = self.store.shapes()
        if rows:
            shapes.load(rows)
            self.store.keep_shapes(shapes.keys())
        with paused_gc():  # a snapshot is a million small tuples, which live on
            found = self.snapshots.load_latest()
        snap, snap_file = found if found is not None else (None, None)
        exact = self.replayable(snap_file)
        del found
        if exact:  # a power cut's holes between witness-log segments: the replay fills them (witlog.py)
            numbered = dict(snap["witness_seq"]) if snap is not None else self.store.witness_base()
            if set_aside := self.witnesses.witlog.set_aside_after_holes(numbered):
                self.recovered["witness_segments_set_aside"] = set_aside
        gaps = self._witness_gaps(stored, snap, exact)
        if gaps and exact and snap is not None:
            del snap  # one snapshot's state in memory at a time
            snap, snap_file, gaps = self._rebuild(gaps, snap_file)
        if gaps:
            self._mark_gaps(gaps)
        seconds = self.recovered["seconds"] = {"snapshot_read": round(clock() - began, 2)}
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
            self.replaying = True
            if snap is None:
                self.witnesses.seq = self.store.witness_base()
        if exact:
            self._replay(snap_file.journal if snap_file else 0)
            self.replay_until = fed + len(self.queue)  # what the journal gives back, before any new event
        self.accepting.set()
        seconds["events_back"] = round(clock() - began, 2)  # new events are accepted from here on
        mark = snap.get("evictions", 0) if snap is not None else 0
        evictions = self.store.evictions(after=mark) if exact else []
        self.budget.seq = mark if exact else self.store.last_eviction()
        # broken at the last start, or recompiled against changed schemas (server/subscriptions/schemacheck.py):
        # installed afresh once the replay is over (the journal's old events and the snapshot's instances were
        # of what they no longer are); one that still does not compile stays broken (registrar.mark_broken)
        self.registrar.broken_rows = self.store.broken()
        # a backfilled subscription joined the engine with its history's state (server/backfill/): from a
        # snapshot taken before that point (the newer ones unreadable) nothing brings that state back, so
        # its backfill runs again (the witness log suppresses what it holds) instead of starting empty there
        redo = [st for st in stored if st.backfill is not None and (st.installed_at or 0) > fed]
        if redo:
            stored = [st for st in stored if st not in redo]
            log.warning("the snapshot loaded predates the hand-over of %s: their backfills run again",
                        ", ".join(st.id for st in redo))
            if self.on_backfill_redo is not None:
                self.on_backfill_redo(redo)
            self.restored += len(redo)
        fresh = {st.id for st in stored if st.fresh or st.id in self.registrar.broken_rows}
        # one installed afresh at or after the snapshot's point (seq_base) takes none of its instances (they
        # were of what it was before): the replay installs it there again; without a replay, afresh now
        renewed = {st.id for st in stored if st.seq_base is not None and (st.installed_at or 0) >= fed}
        if not exact:
            fresh |= renewed
        early = [st for st in stored if st.id not in fresh and (not exact or not installed_after(st, fed))]
        later = [st for st in stored if st.id not in fresh and exact and installed_after(st, fed)]
        for k in range(0, len(early), INSTALL_CHUNK):
            if self.stopping.is_set():
                return
            chunk = early[k:k + INSTALL_CHUNK]
            self.registrar.install([Pending.restored(st) for st in chunk], persist=False)
            self.restored += len(chunk)
        if later or evictions or (fresh and exact):
            deferred = fresh | {st.id for st in later}
            self.defer([st for st in stored if st.id in deferred], evictions, fresh)
        seconds["subscriptions"] = round(clock() - began, 2)
        self.progress.fed = fed if exact else max([fed] + [st.installed_at or 0 for st in stored])
        if snap is not None:
            with paused_gc(freeze=True):  # the instances live on: no collection should walk them (see install)
                self._load_snapshot(snap, snap_file, exact)
            del snap
        if not exact and fresh:  # no replay: afresh now, after the snapshot's instances
            pending = [Pending.restored(st) for st in stored if st.id in fresh]
            for p in pending:
                p.fresh = True
            for p in self.registrar.install(pending, persist=False):
                self.started_fresh(p)
            self.restored += len(pending)
        seconds["ready"] = round(clock() - began, 2)
        with self._start_lock:
            if self.stopping.is_set():
                return
            self._start_engine()
            self.ready.set()
        if stored:
            broken = len(self.registrar.broken)
            log.info("ready: %d subscriptions restored%s", len(self.registrar.subscriptions),
                     f", {broken} broken (GET /health names them)" if broken else "")

    def require_ready(self) -> None:
        """Raise :class:`ServerStarting` while the restore or the replay of
        later subscriptions is under way."""
        if not self.ready.is_set():
            raise ServerStarting(f"the server is starting: {self.restored} of {self.restore_total} stored "
                                 "subscriptions restored so far; retry shortly")
        if self.due:
            subs = sum(isinstance(x, Pending) for _f, items in self.due for x in items)
            raise ServerStarting(f"the server is replaying its journal: {subs} subscriptions registered after "
                                 "its last snapshot are still to come back, and evictions to apply again; "
                                 "retry shortly")

    @property
    def caught_up(self) -> bool:
        """Every stored subscription is installed (a recovery's replay has
        passed the points where the later ones were registered)."""
        return self.ready.is_set() and not self.due

    def settled(self) -> bool:
        """No replay decides what happens now: nothing is due and every
        journaled event has been taken again (evictions may be decided)."""
        return not self.due and self.progress.fed >= self.replay_until

    @property
    def remaining(self) -> int:
        """Events of a recovery's replay the engine has still to take (0 once it is over). At
        least 1 until the engine thread has installed what is due at its end (a subscription
        broken before, installed afresh once the replay is over: /health said the replay was
        over, and GET /subscriptions left it out, until the engine thread's next turn)."""
        return max(self.replay_until - self.progress.fed, 1) if self.replaying else 0

    # ------------------------------------------------------------------ the replay

    def replayable(self, snap_file: SnapshotFile | None, quiet: bool = False) -> bool:
        """Whether the journal holds every event since ``snap_file`` (or since
        the beginning): only then is a replay exact, and subscriptions
        registered since are installed again where they were."""
        if self.journal is None:
            return False
        expected = (snap_file.journal if snap_file else 0) + 1
        oldest = self.journal.oldest()  # from what the journal knows of its segments: nothing read twice
        if oldest is None or self.journal.appended < expected or oldest <= expected:
            return True
        if not quiet:
                log.error("the journal starts at record %d but recovery needs it from %d (%s): queued events and "
                      "partial matches of before cannot be recovered exactly; subscriptions start afresh",
                      oldest, expected, "no snapshot" if snap_file is None else snap_file.path.name)
        return False

    def _witness_gaps(self, stored: list[StoredSubscription], snap: dict | None,
                      exact: bool) -> dict[str, tuple[int, int]]:
        """The witnesses the starting point says were numbered that the witness
        log lacks (server/durability/witgaps.py), per stored subscription."""
        if snap is not None:
            expected = dict(snap["witness_seq"])
        elif exact:
            expected = self.store.witness_base()
        else:
            return {}
        return witgaps.missing(expected, self.witnesses.witlog.last_seqs(), {st.id for st in stored})

    def _rebuild(self, gaps: dict[str, tuple[int, int]], snap_file: SnapshotFile
                 ) -> tuple[dict | None, SnapshotFile | None, dict[str, tuple[int, int]]]:
        """An older starting point whose exact replay makes the witnesses of
        ``gaps`` again (witgaps.rebuild_point), and what it cannot make; else the
        snapshot ``snap_file`` again and the gaps."""
        older = [f for f in self.snapshots.files() if f.number < snap_file.number]
        with paused_gc():  # (a snapshot is a million small tuples)
            point = witgaps.rebuild_point(older, lambda f: self.replayable(f, quiet=True), self.snapshots.read,
                                          self.store.witness_base, self.witnesses.witlog.last_seqs(), gaps)
            if point is None:
                return self.snapshots.read(snap_file), snap_file, gaps
        state, f, rest = point
        rebuilt = {sid: (rest[sid][1] + 1 if sid in rest else a, b) for sid, (a, b) in gaps.items()}
        rebuilt = {sid: g for sid, g in rebuilt.items() if g[1] >= g[0]}
        log.warning("the witness log lacks witnesses %s that snapshot %s counts: %s made again by replaying the "
                    "journal from %s", witgaps.describe(gaps), snap_file.path.name,
                    "they are" if not rest else f"{witgaps.describe(rebuilt)} are",
                    f"snapshot {f.path.name}" if f is not None else "its first record")
        self.recovered["rebuilt"] = {sid: list(g) for sid, g in rebuilt.items()}
        return state, f, rest

    def _mark_gaps(self, gaps: dict[str, tuple[int, int]]) -> None:
        """Witnesses no replay can make again: marked in the log (numbering goes on
        after them), logged, and shown (/health, the watchers' notices)."""
        try:
            self.witnesses.witlog.note_gaps({sid: last for sid, (_first, last) in gaps.items()})
        except OSError as exc:  # readers still find the jump in the numbers (server/durability/witcursor.py)
            log.error("the witness log's gaps could not be marked in it: %s", exc)
        self.recovered["witness_gaps"] = {sid: list(g) for sid, g in gaps.items()}
        log.error("the witness log lacks witnesses %s although they were numbered, and no journal replay can make "
                  "them again (they are %s): no client can get them; watchers that ask for them are told "
                  "({\"control\": \"gap\"}), /health names them, and numbering goes on after them",
                  witgaps.describe(gaps, limit=20), witgaps.LOST)

    def defer(self, stored: list[StoredSubscription], evictions: list[tuple] = (), fresh: set[str] = frozenset()
              ) -> None:
        """Compile subscriptions registered after the snapshot; the engine
        thread installs each when the replay reaches the point it was
        registered at, and applies each eviction recorded after the snapshot
        at the point it was applied at (:attr:`due`). At one point,
        subscriptions come first: one installed there sees no instance older
        than itself, so the order changes nothing. Those of ``fresh`` are
        installed once the replay is over (:attr:`replay_until`), afresh."""
        pending = [Pending.restored(st) for st in stored]
        for p in pending:
            if p.id in fresh:
                p.fresh, p.installed_at = True, self.replay_until
        for e in self.registrar.compile_batch(pending, strict=False):
            self.registrar.mark_broken(pending[e["index"]], e.get("message"))
        plan_due([(p.installed_at, p) for p in pending if p.automata], evictions, self.due)
        self.restored += len(stored)
        if evictions:
            log.info("the replay applies %d recorded evictions again", len(evictions))

    def install_due(self) -> None:
        """On the engine thread: install (and evict) what the replay has reached."""
        while self.due and self.due[0][0] <= self.progress.fed:
            _at, items = self.due.popleft()
            pending = [x for x in items if isinstance(x, Pending)]
            if pending:
                reg = self.registrar
                reg.adopt(reg.add_chunk(self.engine, list(enumerate(pending)), strict=False), [], pending, False)
                for p in pending:
                    if p.id not in reg.subscriptions:
                        continue
                    if p.fresh:
                        self.started_fresh(p)
                    elif p.seq_base is not None:  # installed afresh here before: numbered on from there
                        self.witnesses.set_seq(p.id, p.seq_base)
            for x in items:
                if isinstance(x, Eviction):
                    self.budget.apply(x.sid, x.keep, replayed=True, reason=x.reason, shared=bool(x.shared))
                    self.budget.seq = x.seq

    def started_fresh(self, p: Pending | Subscription) -> None:
        """``p`` was just installed afresh (broken before, or recompiled against
        changed schemas): its witnesses are numbered on after what the witness
        log holds of it, and the store learns where, so that a later replay
        installs and numbers it the same."""
        base = max(self.witnesses.seq.get(p.id, 0), self.witnesses.witlog.last_seq(p.id))
        self.witnesses.set_seq(p.id, base)
        self.registrar.broken_rows.pop(p.id, None)
        try:
            self.store.installed_fresh(p.id, self.progress.fed, base)
        except sqlite3.Error as exc:  # the next start installs it afresh again
            log.warning("could not store that subscription %s was installed afresh: %s", p.id, exc)
        log.info("subscription %s installed afresh after %d events, its witnesses numbered on from %d",
                 p.id, self.progress.fed, base + 1)

    def take_recorded(self, fed: int) -> list[Eviction]:
        """The recorded sheddings due once ``fed`` events are taken, taken out of
        :attr:`due` (an engine worker applies them with the batch that reaches
        that point, before it checks: server/workers/dispatch.py)."""
        out: list[Eviction] = []
        for _at, items in (x for x in self.due if x[0] <= fed):
            out += [x for x in items if isinstance(x, Eviction)]
            items[:] = [x for x in items if not isinstance(x, Eviction)]
        while self.due and not self.due[0][1]:
            self.due.popleft()
        return out

    def check_done(self) -> None:
        """On the engine thread: note (and log) the end of the replay."""
        if self.replaying and not self.due and self.progress.fed >= self.replay_until:
            self.replaying = False
            log.info("recovery done: %d journaled events replayed", self.recovered.get("replayed_events", 0))

    def _load_snapshot(self, snap: dict, snap_file: SnapshotFile, exact: bool) -> None:
        """Put a snapshot's state into the engine (before the engine thread
        starts; its queued events are back already). Without an exact replay
        the witness numbers go on from the witness log's where that is
        further (fresh numbers for fresh witnesses)."""
        try:
            if self.import_engine is not None:  # an engine worker holds the instances: it reads them from the file
                counts = self.import_engine(snap_file, snap)
            else:
                counts = self.engine.import_state(snap["engine"])
        except EngineError as exc:
            log.error("snapshot %s does not fit the stored subscriptions (%s): they start without instances",
                      snap_file.path.name, exc)
            counts = {"instances": 0, "skipped": 0, "clashes": 0}
            lost = f"the partial matches of snapshot {snap_file.path.name} could not be loaded ({exc})"
            held = {o for node in snap["engine"].get("nodes", ()) for o, *_rest in
                    (node["states"] if isinstance(node, dict) else node[0])}
            for sid in self.registrar.subscriptions:  # said, not dropped silently: these lost what they held
                if sid in held or snap.get("workers", 1) > 1:
                    self.budget.lost_state(sid, lost, snap["fed"])
        seqs = dict(snap["witness_seq"])
        if not exact:
            for sid, n in self.witnesses.seq.items():
                seqs[sid] = max(n, seqs.get(sid, 0))
        self.witnesses.seq = seqs
        self.budget.load_marks(snap.get("inexact", {}))
        self.checkpoints.loaded(snap["fed"])
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
        records, events = requeue(self.journal, self.queue, after)
        self.recovered.update(replayed_records=records, replayed_events=events)
        if records:
            log.info("replaying %d journaled events (%d records after position %d)", events, records, after)


# ---------------------------------------------------------------------- shared with an engine worker's restart
# (server/workers/restart.py replays the journal to one worker the way a start replays it to the engine)


def installed_after(st: StoredSubscription, fed: int) -> bool:
    """Whether an exact replay from ``fed`` events installs ``st`` at its own point (registered after
    that point, or installed afresh there or later: it takes none of the snapshot's instances) rather
    than before the snapshot's instances are loaded."""
    if st.installed_at is not None and st.installed_at > fed:
        return True
    return st.seq_base is not None and (st.installed_at or 0) >= fed


def plan_due(subs: list[tuple[int, object]], evictions, due: deque | None = None) -> deque:
    """The points of a replay, in order, onto ``due``: each subscription ``(installed_at, item)`` and each
    recorded eviction (the store's rows: seq, fed, sid, keep, reason, shared) at the ``fed`` point it
    happened at; at one point, subscriptions first (one installed there sees no instance older than itself)."""
    due = deque() if due is None else due
    items = [(at, 0, i, x) for i, (at, x) in enumerate(subs)]
    items += [(fed, 1, seq, Eviction(seq, sid, keep, *rest)) for seq, fed, sid, keep, *rest in evictions]
    items.sort(key=lambda x: x[:3])
    for at, _k, _i, item in items:
        if due and due[-1][0] == at:
            due[-1][1].append(item)
        else:
            due.append((at, [item]))
    return due


def requeue(journal: Journal, queue: DelayQueue, after: int) -> tuple[int, int]:
    """Put ``journal``'s records after position ``after`` on ``queue``, in journal order (the arrival
    order they had, so that the queue releases them in the order it released them before): the
    records and events put back."""
    records = events = 0
    for record in journal.replay(after):
        if record.events:
            queue.restore(record.events)
            events += len(record.events)
        records += 1
    return records, events
