"""/stats: the server's running totals as JSON, for the console's live charts.

Only totals and gauges: the client turns two readings into rates (events/s,
witnesses/s) and a windowed latency percentile (from the histogram's bucket
counts), so the server keeps no per-client state. Reads what the daemon and
the engine already publish; never waits for the engine thread.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Query

from server.api.deps import AUTH_ERRORS, DaemonDep, Watch
from server.api.errors import errors
from server.observability.counters import Count

router = APIRouter(tags=["system"], responses=errors(*AUTH_ERRORS))


def _latency_buckets(hist) -> list[list[float]]:
    """``[[upper bound in seconds, cumulative count], ...]``, the last bound +Inf (as null)."""
    out = []
    for metric in hist.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                out.append([None if le == float("inf") else le, int(s.value)])
    return out


@router.get("/stats", summary="Running totals as JSON (the console's charts)", responses=errors(422))
def get_stats(d: DaemonDep, who: Watch, offset: int = Query(0, ge=0, description="First subscription (registration order)."),
          limit: int = Query(200, ge=0, le=10_000, description="At most this many subscriptions.")) -> dict:
    """Totals since the server started: events received and processed (per
    input stream too), witnesses (per subscription too), and the gauges queue
    depth, epoch lag and instances; latency as histogram buckets. For a token
    that reaches only some subscriptions, the per-subscription figures (and
    ``subscription_count``) are those of its own."""
    c = d.counters.snapshot()
    es = d.engine.stats
    per_stream, per_sub = d.activity()
    mine = [s.id for s in list(d.subscriptions.values()) if d.security.reaches(who, s)] if who.restricted \
        else list(d.subscriptions)
    subs = mine[offset:offset + limit]
    inexact = d.budget.inexact
    return {
        "time": time.time(),
        "received": c[Count.RECEIVED_TCP] + c[Count.RECEIVED_HTTP],
        "rejected": c[Count.REJECTED_TCP] + c[Count.REJECTED_HTTP],
        "late": d.queue.late + es.late,
        "events": sum(per_stream.values()),
        "processed": es.events,
        "witnesses": es.witnesses,
        "delivered": c[Count.DELIVERED],
        "queue_depth": len(d.queue),
        "epoch_lag": d.epoch_lag(),  # in stream time units
        "epoch_lag_seconds": d.epoch_lag() * d.settings.time_unit_ms / 1000.0,
        # the stream's own time (its events' t1, stream units): the newest received, and the floor below
        # which an event is late (the newest released to the engine); the lag of the epoch behind the
        # newest event, in seconds of stream time (when events carry their times, e.g. a replay of 1970's)
        "time_unit_ms": d.settings.time_unit_ms,
        "stream_time": d.queue.newest,
        "late_before": d.queue.last_released,
        "stream_lag_seconds": (None if d.queue.newest is None or d.epoch() is None
                               else max(d.queue.newest - d.epoch(), 0.0) * d.settings.time_unit_ms / 1000.0),
        "clients": d.hub.client_count,
        "latency_buckets": _latency_buckets(d.latency),
        "streams": per_stream,
        "subscription_count": len(mine),
        # "inexact": the subscription lost partial matches (server/budget.py; /health says why), only when it has
        "subscriptions": {sid: {"witnesses": per_sub.get(sid, 0), "instances": d.instance_count(sid),
                                **({"inexact": inexact[sid].instances_lost} if sid in inexact else {})}
                          for sid in subs},
        "inexact": len(inexact),
        # the engine worker processes (engine_workers), each: events taken (totals: the client makes a rate),
        # instances, batches in flight and the oldest one's age, where its engine is on a batch that has run a
        # second or more (busy_in), CPU seconds (and those of its batches by part: cpu_parts), the seconds it was
        # ready to run and waited for a CPU (cpu_wait_seconds), restarts and state (server/workers/restart.py)
        "workers": [{k: w[k] for k in ("worker", "state", "events", "instances", "in_flight_batches",
                                       "oldest_batch_s", "busy_in", "cpu_seconds", "cpu_wait_seconds", "cpu_parts",
                                       "restarts")}
                    for w in d.workers()],
        # a subscription's batches whose first seq a worker numbered otherwise than this process (whose numbers
        # stand; docs/design/worker-witlog.md, stage 2): 0 unless the two fell out of step
        "worker_seqs_told_wrong": c[Count.WORKER_SEQS_TOLD_WRONG],
    }
