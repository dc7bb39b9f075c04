"""POST /subscriptions/preview: what a query would have matched over history,
installing nothing (docs/design/backfill.md). The same history reader as a
backfill (server/durability/history.py), on a fresh engine process of its
own (engine.py): the first ``limit`` witnesses and the count of them all."""

from __future__ import annotations

import json
import time

from server.backfill.engine import BackfillEngine
from server.durability.history import HistoryReader

#: Largest ``limit`` a preview may ask for.
MAX_LIMIT = 10_000
#: Events fed to the preview's engine at a time.
CHUNK = 8192


def preview(backfills, kind: str, text: str, start_value, limit: int) -> dict:
    """Run ``text`` over the retained history from ``start_value`` (a ``from``)
    on an engine of its own; FromError or SubscriptionError for a bad one."""
    start = backfills.resolve(start_value)
    p = backfills.compile(f"preview{time.monotonic_ns()}", kind, text, None)
    with backfills.previews:  # a few engine processes at once: later requests wait their turn
        return _run(backfills, p, start, limit)


def _run(backfills, p, start, limit: int) -> dict:
    reader = HistoryReader(backfills.journal, start)
    eng = BackfillEngine(backfills.settings, "cayuga-preview")
    witnesses: list[dict] = []
    count = 0
    end = None
    try:
        eng.start(list(backfills.inputs().values()), p.id, p.automata)
        for chunk in reader.everything(CHUNK):
            end = chunk[-1].t1
            for _sid, _streams, payloads in eng.feed(chunk).groups():
                count += len(payloads)
                for payload in payloads[:max(limit - len(witnesses), 0)]:
                    witnesses.append(json.loads(payload))
    finally:
        reader.close()
        eng.stop()
    return {"witnesses": witnesses, "count": count, "from": start, "to": end if end is not None else start,
            "events": reader.given, "truncated": count > len(witnesses)}
