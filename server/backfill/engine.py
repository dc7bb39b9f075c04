"""The engine a backfill or a preview runs on: an engine worker process of its
own (server/workers/worker.py on its socket pair, as ``engine_workers`` starts
them), so that the history it runs through takes neither the live engine
thread nor this interpreter's lock; it runs at a lower CPU priority than the
server (``nice`` +10): the live path goes first. See docs/design/backfill.md.

A backfill's engine reads the history itself (:meth:`BackfillEngine.open_history`):
it follows the journal's files in order (server/durability/history.py's
HistoryReader, in that process), while this process pins what it has still to
read, samples the queue's last release and the journal's segments for each
request (:meth:`BackfillEngine.ask`), and takes back each batch's witnesses.
Reading and sorting a million events held this interpreter's lock for most of a
second at a backfill's start (the live path's p99 in the hundreds of
milliseconds), and every event went through this process twice (decoded from
the journal, encoded for the pipe) and once more there. A preview feeds the
engine the same way, to the journal's position when it began (:meth:`BackfillEngine.ask_all`)."""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout

from server.config import Settings
from server.delivery.encoding import Columns, pack_columns
from server.durability.history import cut_point
from server.workers import codec
from server.workers.link import WorkerGone, WorkerLink, worker_settings

log = logging.getLogger("cayuga.backfill")

#: Seconds a batch of history may take in the backfill's engine before it is given up.
BATCH_TIMEOUT = 120.0
#: History requests out before the first one's answer is taken back: the engine process reads
#: and feeds the next while this process delivers one (at 2 the engine process waited for the
#: next batch a tenth of the time, when this process still read the journal: 6.4 -> 5.8 s for
#: 1M ticks at 3).
IN_FLIGHT = 3
#: How much less CPU priority the backfill's engine process has than the server.
NICE = 10
NO_WITNESSES = pack_columns([])


class BackfillEngine:
    """One subscription alone on an engine of its own, which reads history and feeds it in batches."""

    def __init__(self, settings: Settings, name: str, replay: bool = False) -> None:
        # the live server's state budget does not apply to history: the hand-over brings the state
        # back under it (the budget's next check sees it)
        self.link = WorkerLink(worker_settings(settings, max_state_bytes=1 << 62, max_instances_per_subscription=0,
                                               engine_workers=1), name=name)
        self.replay = replay  # witnesses marked "replay": true
        self.epoch = None
        self.errors = 0  # events the engine failed on (the live engine counts and skips them too)
        self._added = None  # the answer to the subscription's add, until it is checked (see start)
        self.journal = None  # the journal it reads history from (open_history)
        self._pin = None
        self._asked: deque = deque()  # history requests not answered yet (ask)
        self._held = None  # a preview's journal snapshot: what it reads (ask_all)
        self.scanned = 0  # history events read from the journal (t1 >= from)
        self.given = 0  # of those, fed

    def start(self, schemas, sid: str, automata) -> None:
        self.link.start()
        try:
            os.setpriority(os.PRIO_PROCESS, self.link.process.pid, min(os.getpriority(os.PRIO_PROCESS, 0) + NICE, 19))
        except OSError as exc:  # it runs at the server's priority
            log.debug("could not lower the backfill engine's priority: %s", exc)
        self.link.command("unchecked")
        if self.replay:
            self.link.command("replay")
        for schema in schemas:
            self.link.command("declare", schema)
        # not waited for: the history is read while the process starts (its errors come at the first batch)
        self._added = self.link.command("add", sid, tuple(automata))

    def _ready(self) -> None:
        """Raise what the subscription's add raised in the engine process, if it did."""
        if self._added is not None:
            added, self._added = self._added, None
            added.result(BATCH_TIMEOUT)

    # ------------------------------------------------------------------ history read in the engine's process

    def open_history(self, journal, start) -> None:
        """Have the engine process read the retained journal's events from event time ``start`` on."""
        first = journal.retained()["first"]
        self.journal, self._pin = journal, journal.pin(first)
        self.link.command("history_open", start, first)

    @property
    def room(self) -> bool:
        """Fewer than ``IN_FLIGHT`` history requests are out."""
        return len(self._asked) < IN_FLIGHT

    @property
    def asked(self) -> int:
        return len(self._asked)

    def ask(self, queue, limit: int) -> None:
        """Ask for the next ``limit`` events of history the live ``queue`` has certainly
        released (HistoryReader.below, in the engine process)."""
        last = queue.last_released  # before the journal's position: every later record has t1 at least this
        segments, upto = self.journal.snapshot()
        self._asked.append(self.link.command("history", segments, upto, last, limit))

    def ask_all(self, limit: int) -> None:
        """A preview's request: the next ``limit`` retained events, queued ones too, of what the
        journal held at the first request, in order (HistoryReader.below with no bound, in the engine process)."""
        if self._held is None:
            self._held = self.journal.snapshot()
        segments, upto = self._held
        self._asked.append(self.link.command("history", segments, upto, math.inf, limit))

    def answer(self) -> tuple[int, Columns]:
        """The oldest request's answer: how many events it fed, and their witnesses packed as
        the witness log holds them (marked ``"replay": true``)."""
        return self._answered(self._asked.popleft())

    def cut(self, queue, start) -> tuple[int, Columns]:
        """On the engine thread, between two batches, nothing asked: feed the rest of the
        history the live engine has taken (HistoryReader.take_cut, in the engine process)."""
        if self._asked:
            raise RuntimeError("history requests are out: take their answers first")
        upto, queued = cut_point(self.journal, queue, start)
        segments, _ = self.journal.snapshot()  # (at least up to upto: the journal only grows)
        return self._answered(self.link.command("history_cut", segments, upto, queued))

    def _answered(self, fut) -> tuple[int, Columns]:
        self._ready()
        try:
            n, scanned, pos, body = fut.result(BATCH_TIMEOUT)
        except FutureTimeout:
            raise WorkerGone(f"the backfill engine {self.link.name} took more than {BATCH_TIMEOUT:.0f} s "
                             "for a batch of history") from None
        self.scanned, self.given = scanned, self.given + n
        self.journal.move_pin(self._pin, pos + 1)  # what it has still to read
        if body is None:
            return n, NO_WITNESSES
        out = codec.decode_result(body[1:])
        self.epoch = out[4]
        self.errors += len(out[5])
        return n, out[9]

    def export_state(self, pickled: bool = False) -> dict | bytes:
        """Its state (``pickled``: as pickle bytes, for an engine worker to read)."""
        self._ready()
        return self.link.call("export_state", pickled)

    def stop(self) -> None:
        self.link.stop(timeout=5.0)
        if self._pin is not None:
            self.journal.unpin(self._pin)
            self._pin = None
