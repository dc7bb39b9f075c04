"""POST /subscriptions/preview: what a query would have matched over history,
installing nothing (docs/design/backfill.md). The same history reader as a
backfill (server/durability/history.py), in a fresh engine process of its
own that reads the journal itself (engine.py), to the journal's position when
the preview began: the first ``limit`` witnesses and the count of them all."""

from __future__ import annotations

import json
import time

from server.backfill.engine import BackfillEngine

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
    eng = BackfillEngine(backfills.settings, "cayuga-preview")
    witnesses: list[dict] = []
    count = 0
    try:
        eng.start(list(backfills.inputs().values()), p.id, p.automata)
        eng.open_history(backfills.journal, start)  # read in its process, as a backfill's
        more = True
        while more or eng.asked:
            while more and eng.room:
                eng.ask_all(CHUNK)
            fed, cols = eng.answer()
            more = more and fed > 0
            for _sid, _streams, payloads in cols.groups():
                count += len(payloads)
                for payload in payloads[:max(limit - len(witnesses), 0)]:
                    witnesses.append(json.loads(payload))
    finally:
        eng.stop()
    return {"witnesses": witnesses, "count": count, "from": start,
            "to": eng.epoch if eng.given else start, "events": eng.given, "truncated": count > len(witnesses)}
