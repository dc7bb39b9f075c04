"""When snapshots are taken, what they hold, and what each published one lets go.

:class:`Checkpoints` decides between batches whether a snapshot is due (after
snapshot_events events or snapshot_seconds, once something changed; again
after a failed one), forks the writer (snapshot.py), and once a snapshot is
published drops the journal segments and recorded evictions no kept snapshot
needs. A graceful stop writes a last one in-process (:meth:`Checkpoints.final`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import deque
from typing import Callable

from air.engine import Engine
from air.engine.memory import paused_gc
from server.config import Settings
from server.durability.diskfull import DiskState
from server.durability.journal import Journal
from server.durability.snapshot import SnapshotFile, SnapshotStore, Snapshotter
from server.durability.store import Store
from server.ingest.queue import DelayQueue
from server.observability.counters import Count

log = logging.getLogger("cayuga.daemon")

#: A snapshot that could not be written (a full disk) is tried again this often (seconds).
SNAPSHOT_RETRY_SECONDS = 5.0


class Checkpoints:
    """Snapshot scheduling (engine thread, between batches).

    ``progress`` is the engine thread (``fed``, ``changes``: server/processing.py),
    ``budget`` (server/budget.py) knows the last recorded shedding applied (``seq``) and the inexact marks, ``witnesses`` the
    witness numbers and the witness log (server/delivery/witnesses.py)."""

    def __init__(self, settings: Settings, engine: Engine, queue: DelayQueue, store: Store, disk: DiskState,
                 counters, progress, budget, witnesses) -> None:
        self.settings = settings
        self.engine = engine
        self.queue = queue
        self.store = store
        self.disk = disk
        self.counters = counters
        self.progress = progress
        self.budget = budget
        self.witnesses = witnesses
        self.remote = None  # an engine worker's engine thread (server/workers/dispatch.py), when there is one
        self.journal: Journal | None = None  # set by the daemon's start() unless durability is off
        self.snapshots = SnapshotStore(settings.data_dir / "snapshots")
        self.snapshotter = Snapshotter(self.snapshots, before_publish=self.before_publish,
                                       after_publish=self.after_publish, disk=disk)
        self._fork_mark = 0  # budget.seq of the snapshot being written
        self._fork_changes = 0  # progress.changes when the snapshot being written was forked
        #: a snapshot is due as soon as none is being written (a backfill's hand-over: server/backfill/)
        self.wanted = False
        #: called with progress.changes of each snapshot published (durable) by this process
        self.on_published: Callable[[int], None] | None = None
        self._marks: deque[int] = deque()  # budget.seq of the snapshots published by this process, oldest first
        self._snap_fed = 0
        self._snap_changes = 0
        self._snap_at = time.monotonic()

    def loaded(self, fed: int) -> None:
        """A recovery loaded a snapshot taken at ``fed``: the next is due from there."""
        self._snap_fed, self._snap_changes = fed, self.progress.changes

    def state(self) -> dict:
        """Everything a snapshot holds (called in the forked child, or on the
        engine thread once it has stopped)."""
        return {**self.main_state(), "engine": self.engine.export_state()}

    def main_state(self) -> dict:
        """A snapshot's state but the engine's (an engine worker adds that: server/workers/)."""
        return {"version": 1, "created": time.time(), "fed": self.progress.fed, "evictions": self.budget.seq,
                "journal": self.journal.appended if self.journal is not None else 0,
                "queue": self.queue.export_state(), "witness_seq": dict(self.witnesses.seq),
                "inexact": self.budget.export_marks()}

    def due(self, now: float) -> bool:
        s = self.settings
        if self.snapshotter.running:
            return False
        if self.wanted and self.disk.failing("snapshot") is None:
            return True
        if self.disk.failing("snapshot") is not None and now - self._snap_at >= SNAPSHOT_RETRY_SECONDS:
            return True  # the last one could not be written: try again even if nothing changed since
        fed, changes = self.progress.fed, self.progress.changes
        if fed == self._snap_fed and changes == self._snap_changes:
            return False
        return (fed - self._snap_fed >= s.snapshot_events
                or (s.snapshot_seconds > 0 and now - self._snap_at >= s.snapshot_seconds))

    def take(self, now: float) -> None:
        """On the engine thread, between batches: fork the snapshot writer."""
        journal = self.journal
        if self.snapshotter.running:
            return
        if self.remote is not None and not self.remote.quiesce():  # nothing in flight: the worker's state
            return                                                   # is the one this process describes
        self._fork_mark = self.budget.seq  # before the fork: its watcher publishes it
        self._fork_changes = self.progress.changes
        position = (lambda: journal.appended if journal is not None else 0)
        try:
            if self.remote is not None:  # the engine's state is an engine worker's: its child writes the file
                started = self.snapshotter.fork_remote(self.queue.lock, position, self.main_state,
                                                       lambda tmp, part: self.remote.snapshot(tmp, part, fork=True),
                                                       children=len(self.remote.links))
            else:
                started = self.snapshotter.fork(self.queue.lock, position, self.state)
        except OSError as exc:  # the snapshot directory cannot be read: said and counted, never the engine's end
            self.snapshotter.failed += 1
            self.snapshotter.last_error = str(exc)
            log.error("a snapshot could not be started (%s); the journal still covers everything; the next is "
                      "tried on schedule (snapshot_seconds, snapshot_events)", exc)
            self._snap_fed, self._snap_changes, self._snap_at = self.progress.fed, self.progress.changes, now
            self.wanted = False
            return
        if started:
            self.wanted = False
            self._snap_fed, self._snap_changes, self._snap_at = self.progress.fed, self.progress.changes, now
            self.counters.add(Count.SNAPSHOT_FORKS)

    def before_publish(self) -> None:
        # every journal record and every witness the snapshot counts is on disk before the snapshot is:
        # after a power cut a snapshot past the journal's end would take the events its senders send
        # again (told by #resume where the journal ends) a second time
        if self.journal is not None:
            self.journal.sync()
        if self.witnesses.witlog is not None:
            self.witnesses.witlog.sync()

    def after_publish(self, kept: list[SnapshotFile]) -> None:
        """Journal segments before the oldest snapshot kept are no longer
        needed, nor the evictions every kept snapshot includes (known once
        each kept snapshot was written by this process)."""
        if self.journal is not None and kept:
            self.journal.truncate_before(kept[-1].journal + 1)
        if self.on_published is not None:
            self.on_published(self._fork_changes)
        self._marks.append(self._fork_mark)
        while len(self._marks) > max(len(kept), 1):
            self._marks.popleft()
        if kept and len(self._marks) >= len(kept):
            try:
                self.store.prune_evictions(min(self._marks))
            except sqlite3.Error as exc:  # they stay: a later snapshot prunes them
                log.warning("could not prune recorded evictions from the store: %s", exc)

    def final(self) -> None:
        """At a graceful stop, once the engine thread has ended: the state
        it ended in, so a restart replays nothing."""
        try:
            position = self.journal.appended if self.journal is not None else 0
            self._fork_mark = self.budget.seq
            self._fork_changes = self.progress.changes
            self.before_publish()
            if self.remote is not None:  # the engine workers write it, then it is published here
                tmp, final = self.snapshots.next_path(position)
                children = self.remote.snapshot(tmp, self.main_state(), fork=False)
                self.after_publish(self.snapshots.publish(tmp, final, children - 1))
                return
            with paused_gc():  # a million instances become a million tuples
                state = self.state()
            self.after_publish(self.snapshots.write(state, position))
        except TimeoutError as exc:  # an engine worker that does not answer (stopped: server/workers/link.py)
            log.warning("no shutdown snapshot: %s; the next start replays the journal instead", exc)
        except Exception:  # noqa: BLE001 - the journal still covers everything
            log.exception("the shutdown snapshot failed; the next start replays the journal instead")
