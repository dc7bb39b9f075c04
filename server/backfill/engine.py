"""The engine a backfill or a preview runs on: an engine worker process of its
own (server/workers/worker.py on its socket pair, as ``engine_workers`` starts
them), so that the history it runs through takes neither the live engine
thread nor this interpreter's lock; it runs at a lower CPU priority than the
server (``nice`` +10): the live path goes first. See docs/design/backfill.md."""

from __future__ import annotations

import logging
import os
import queue as stdqueue
from collections import deque

from server.config import Settings
from server.delivery.witnesses import Columns, pack_columns
from server.workers import codec
from server.workers.link import WorkerGone, WorkerLink

log = logging.getLogger("cayuga.backfill")

#: Seconds a batch of history may take in the backfill's engine before it is given up.
BATCH_TIMEOUT = 120.0
#: Batches sent before the first one's witnesses are taken back: the engine process feeds
#: one while this process reads, encodes and delivers another (at 2 the engine process
#: waited for the next batch a tenth of the time: 6.4 -> 5.8 s for 1M ticks at 3).
IN_FLIGHT = 3
#: How much less CPU priority the backfill's engine process has than the server.
NICE = 10
NO_WITNESSES = pack_columns([])


class BackfillEngine:
    """One subscription alone on an engine of its own, fed history in batches."""

    def __init__(self, settings: Settings, name: str, replay: bool = False) -> None:
        st = settings.model_dump()
        # the live server's state budget does not apply to history: the hand-over brings the state
        # back under it (the budget's next check sees it)
        st.update(max_state_bytes=1 << 62, max_instances_per_subscription=0, engine_workers=1)
        self.link = WorkerLink(st, name=name)
        self.replay = replay  # witnesses marked "replay": true
        self.fed = 0
        self.epoch = None
        self.errors = 0  # events the engine failed on (the live engine counts and skips them too)
        self._sent: deque[int] = deque()

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
        self.link.call("add", sid, tuple(automata))

    @property
    def busy(self) -> bool:
        """A batch is in flight (its witnesses not taken back yet)."""
        return bool(self._sent)

    def send(self, events: list) -> bool:
        """Send a batch (False: ``IN_FLIGHT`` are out already: take one back first)."""
        if len(self._sent) >= IN_FLIGHT:
            return False
        self.fed += len(events)
        self.link.send(codec.encode_batch(self.fed, [], events))
        self._sent.append(len(events))
        return True

    def take(self) -> Columns:
        """The oldest batch in flight's witnesses, packed as the witness log holds them
        (server/delivery/witnesses.py's ``Columns``; marked ``"replay": true`` for a backfill)."""
        self._sent.popleft()
        try:
            tag, body = self.link.results.get(timeout=BATCH_TIMEOUT)
        except stdqueue.Empty:
            raise WorkerGone(f"the backfill engine {self.link.name} took more than {BATCH_TIMEOUT:.0f} s "
                             "for a batch") from None
        if body is None:
            raise WorkerGone(self.link.gone or f"the backfill engine {self.link.name} has ended")
        out = codec.decode_result(body)
        self.epoch = out[4]
        self.errors += len(out[5])
        return out[9]  # (the engine marked them replay: cmd_replay)

    def feed(self, events: list) -> Columns:
        """:meth:`send` and :meth:`take` (nothing else in flight)."""
        if self._sent:
            raise RuntimeError("batches are in flight: take them back first")
        if not events:
            return NO_WITNESSES
        self.send(events)
        return self.take()

    def export_state(self, pickled: bool = False) -> dict | bytes:
        """Its state (``pickled``: as pickle bytes, for an engine worker to read)."""
        return self.link.call("export_state", pickled)

    def stop(self) -> None:
        self.link.stop(timeout=5.0)
