"""The engine a backfill or a preview runs on: an engine worker process of its
own (server/workers/worker.py on its socket pair, as ``engine_workers`` starts
them), so that the history it runs through takes neither the live engine
thread nor this interpreter's lock. See docs/design/backfill.md."""

from __future__ import annotations

import queue as stdqueue

from server.config import Settings
from server.workers import codec
from server.workers.link import WorkerGone, WorkerLink

#: Seconds a batch of history may take in the backfill's engine before it is given up.
BATCH_TIMEOUT = 120.0


class BackfillEngine:
    """One subscription alone on an engine of its own, fed history in batches."""

    def __init__(self, settings: Settings, name: str) -> None:
        st = settings.model_dump()
        # the live server's state budget does not apply to history: the hand-over brings the state
        # back under it (the budget's next check sees it)
        st.update(max_state_bytes=1 << 62, max_instances_per_subscription=0, engine_workers=1)
        self.link = WorkerLink(st, name=name)
        self.fed = 0
        self.epoch = None

    def start(self, schemas, sid: str, automata) -> None:
        self.link.start()
        for schema in schemas:
            self.link.command("declare", schema)
        self.link.call("add", sid, tuple(automata))

    def feed(self, events: list) -> list:
        """Feed ``events``; their witnesses as ``[(sid, streams, payloads)]``, encoded as the
        witness log holds them."""
        if not events:
            return []
        self.fed += len(events)
        self.link.send(codec.encode_batch(self.fed, [], events))
        try:
            tag, body = self.link.results.get(timeout=BATCH_TIMEOUT)
        except stdqueue.Empty:
            raise WorkerGone(f"the backfill engine {self.link.name} took more than {BATCH_TIMEOUT:.0f} s "
                             "for a batch") from None
        if body is None:
            raise WorkerGone(self.link.gone or f"the backfill engine {self.link.name} has ended")
        out = codec.decode_result(body)
        self.epoch = out[4]
        if out[5]:
            raise RuntimeError(f"the backfill engine failed on events: {'; '.join(out[5][:3])}")
        return [tuple(g) for g in out[1]]

    def export_state(self) -> dict:
        return self.link.call("export_state")

    def stop(self) -> None:
        self.link.stop(timeout=5.0)
