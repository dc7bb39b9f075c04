"""/health, the probes /livez and /readyz, and /metrics.

/health is open (for probes) and says "degraded" with a reason when the engine
thread failed, the event queue is stalled or part of the data directory
cannot be written (``disk_full``: per part, what failed, where, since when;
``reason`` says it in one line), until it can be written again; from SIGTERM until the server
exits it answers 503 with status "draining" (take it out of rotation); "warning" when one
subscription holds the engine back (``holding_back``: see :func:`holding_back`). /metrics needs a token with
the ``metrics`` scope when ``auth_tokens`` is set (Prometheus sends one with
``authorization: {credentials: ...}``). It is answered on the event loop from
counters and copies, never waiting for the engine thread or a worker thread,
so it stays fast under load; the live instances (``cayuga_instances``,
``cayuga_subscription_instances``) are recounted by the engine thread in the
background (see ``Evictions.refresh`` in server/processing.py: at least every
second while idle, every few seconds with 100K subscriptions).
"""

from __future__ import annotations

from typing import NamedTuple

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import choose_encoder

from air.engine import BUILD
from server.api.deps import AUTH_ERRORS, DaemonDep, needs
from server.api.errors import errors
from server.api.schemas import ProbeOut
from server.durability.witgaps import LOST
from server.subscriptions.broken import FIX

router = APIRouter(tags=["system"])

#: /metrics' media types: Prometheus text, or OpenMetrics when the scraper's Accept asks.
_METRICS_TYPES = {"text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}},
                  "application/openmetrics-text; version=1.0.0; charset=utf-8": {"schema": {"type": "string"}}}

#: /health names the subscription with the most live instances when the event queue is
#: fuller than this share of its capacity (the engine is falling behind) ...
QUEUE_SHARE = 0.5


def holding_back(d) -> dict | None:
    """The subscription that holds the engine back, or None: the worst
    runaway of the state budget's last check (server/budget.py: every event of
    its stream visits a thousand or more of its instances, and it grows with
    them), else, when the event queue is more than half full, the one with
    the most live instances (the engine thread's background count)."""
    runaways = d.runaways()
    if runaways:
        sid, r = max(runaways.items(), key=lambda kv: (kv[1]["visits_per_event"], kv[0]))
        return {"subscription": sid, "name": d.subscriptions[sid].name, "instances": r["instances"],
                "visits_per_event": r["visits_per_event"], "share": r["share"], "reason": r["reason"]}
    heaviest = d.heaviest
    if heaviest is None or heaviest[0] not in d.subscriptions:
        return None
    sid, n = heaviest
    depth, capacity = len(d.queue), d.queue.capacity
    if depth <= capacity * QUEUE_SHARE:
        return None
    reason = (f"the engine is falling behind ({depth} of {capacity} queued events wait for it), and this "
              f"subscription holds the most live instances ({n})")
    return {"subscription": sid, "name": d.subscriptions[sid].name, "instances": n, "reason": reason}


def _inexact_reason(inexact: dict[str, dict]) -> str | None:
    if not inexact:
        return None
    parts = [f"{sid} lost {m['instances_lost']} partial matches since its witness {m['since_seq']} ({m['reason']})"
             for sid, m in sorted(inexact.items())[:5]]
    more = f" and {len(inexact) - 5} more" if len(inexact) > 5 else ""
    return (f"{len(inexact)} subscription{'s are' if len(inexact) > 1 else ' is'} inexact (state was shed: their "
            f"witnesses may lack some): " + "; ".join(parts) + more
            + ". Raise max_state_bytes or the subscription's cap, or bound it in time; delete and register it "
            "again to start it afresh")


def _gaps_reason(gaps: dict[str, list[dict]]) -> str | None:
    if not gaps:
        return None
    runs = [(sid, g) for sid, gs in sorted(gaps.items()) for g in gs]
    parts = [f"{sid} {g['from']}-{g['to']}" if g["to"] > g["from"] else f"{sid} {g['from']}" for sid, g in runs[:5]]
    more = f" and {len(runs) - 5} more" if len(runs) > 5 else ""
    return (f"the witness log lacks witnesses that were numbered ({', '.join(parts)}{more}): they are {LOST}; no "
            "client can get them (a watcher that asks is sent {\"control\": \"gap\"} and goes on after them); "
            "this lasts until retention deletes that part of the log or the subscription is deleted")


def _broken_reason(broken: dict[str, dict]) -> str | None:
    if not broken:
        return None
    parts = [f"{sid}{' (' + b['name'] + ')' if b['name'] else ''}: {b['reason']}"
             for sid, b in sorted(broken.items())[:5]]
    more = f" and {len(broken) - 5} more" if len(broken) > 5 else ""
    n = len(broken)
    return (f"{n} stored subscription{'s do' if n > 1 else ' does'} not compile against this configuration and "
            f"{'do' if n > 1 else 'does'} not run (broken): " + "; ".join(parts) + more + f". {FIX}")


class Status(NamedTuple):
    """The server's status for the probes, the reasons, and what they come from."""

    status: str
    reasons: list[str]
    disk: dict
    stalled: str | None
    heavy: dict | None
    inexact: dict
    gaps: dict
    broken: dict

    @property
    def ready(self) -> bool:
        """Takes events and subscriptions and keeps up: ``ok``, ``warning``, or ``degraded`` only because
        of what some subscriptions lost (inexact, witnesses missing from the log) or do not run (broken),
        not the server."""
        return self.status in ("ok", "warning") or (
            self.status == "degraded" and bool(self.inexact or self.gaps or self.broken) and not self.disk
            and not self.stalled)


def _state(request: Request, d) -> Status:
    """The server's status for the probes (``ok``, ``warning``, ``degraded``,
    ``starting``, ``draining``), the reasons, and what they come from."""
    alive = d.engine_alive
    if request.app.state.draining.is_set():
        status = "draining"  # receivers closed, the queue and clients being drained; then the server exits
    elif not d.ready.is_set():
        status = "starting"  # restoring stored subscriptions; the engine thread starts after
    else:
        status = "ok" if alive and d.engine_error is None else "degraded"
    stalled = d.queue_stalled()
    disk = d.disk_status()
    inexact = d.inexact()
    gaps = d.witness_gaps()
    broken = d.broken_subscriptions()
    workers = d.worker_trouble()  # a worker restarted and catching up, or stopped (server/workers/restart.py)
    if (stalled or disk or inexact or gaps or broken or workers) and status == "ok":
        status = "degraded"
    heavy = holding_back(d)
    if heavy and status == "ok":
        status = "warning"
    reasons = [f"{v['error']} at {v['path']}" for v in disk.values()] + ([stalled] if stalled else []) + workers
    if d.engine_error:
        reasons.append(f"engine error: {d.engine_error}")
    elif status == "degraded" and not alive:
        reasons.append("the engine thread is not running: restart the server")
    if inexact:
        reasons.append(_inexact_reason(inexact))
    if broken:
        reasons.append(_broken_reason(broken))
    if gaps:
        reasons.append(_gaps_reason(gaps))
    if heavy:
        reasons.append(f"subscription {heavy['subscription']} holds the engine back: {heavy['reason']}")
    return Status(status, reasons, disk, stalled, heavy, inexact, gaps, broken)


@router.get("/health", summary="The server's whole state (open, no token)",
            responses={200: {"description": "The state: 'status' is ok, warning, degraded or starting, with "
                                            "'reason' and what it comes from"},
                       503: {"description": "Draining: the server is stopping (SIGTERM); the same document, "
                                            "'status': 'draining'",
                             "content": {"application/json": {"schema": {"type": "object"}}}}})
async def get_health(request: Request, d: DaemonDep) -> JSONResponse:
    """Everything a person or a dashboard wants to know; 200 but while draining.
    Probes use /livez and /readyz, which answer 503 where they fail."""
    workers = d.workers()  # (first: a worker it says is stopped or restarting, the status below says so too)
    status, reasons, disk, stalled, heavy, inexact, gaps, broken = _state(request, d)
    return JSONResponse(status_code=503 if status == "draining" else 200, content={
        "status": status,
        "reason": "; ".join(reasons) or None,
        "disk_full": disk,
        "queue_stalled": stalled,
        "holding_back": heavy,
        # subscriptions that lost partial matches when state was shed (server/budget.py), until deleted
        "inexact": inexact,
        # witnesses the witness log lacks though they were numbered (server/durability/witgaps.py), per
        # subscription: [{"from", "to"}], until retention deletes that part of the log
        "witness_gaps": gaps,
        # stored subscriptions that no longer compile against this configuration: kept, not run
        # (server/subscriptions/broken.py), per id: name, reason, since, upstream, fix
        "broken": broken,
        # runaways of the state budget's last check: what each costs the engine
        "runaways": d.runaways(),
        # automaton state: estimated bytes and instances at the last check, against max_state_bytes
        "state": d.state(),
        "restored": {"done": d.restored, "total": d.restore_total},
        # what this start recovered: the snapshot loaded, its instances and queued events, the journal replayed
        "recovered": d.recovered,
        # events of that recovery's journal replay the engine has still to take (0: caught up)
        "replay_remaining": d.replay_remaining,
        # events the engine has taken from the queue over every life of the data directory
        "events_taken": d.events_taken,
        "engine_thread": d.engine_alive,
        "engine_build": BUILD,  # "compiled" or "python" (cayuga build-engine)
        # engine_workers: 0 runs the automata on the engine thread; else the worker processes, each with its state
        "engine_workers": d.settings.engine_workers,
        "workers": workers,
        # the history the journal keeps for backfills and previews (retain_duration, retain_bytes):
        # {"from", "to"} event times, "bytes", "segments"; null with durability off
        "retained": d.retained(),
        "engine_error": d.engine_error,
        "queue_depth": len(d.queue),
        "subscriptions": len(d.subscriptions),
        "clients": d.hub.client_count,
        "tcp_port": d.receiver.port if d.receiver else None,
        # receivers: 1 reads the TCP connections' lines in a process of its own (server/ingest/readers.py):
        # its pid, how often it was started again (it died: its connections ended, their senders resumed),
        # and the CPU the one running now has used
        "receivers": d.settings.receivers,
        "tcp_reader": _tcp_reader(d),
    })


def _tcp_reader(d) -> dict | None:
    readers = d.receiver.readers if d.receiver else None
    return None if readers is None else {"pid": readers.pid, "restarts": readers.restarts,
                                         "cpu_seconds": readers.cpu_seconds()}


@router.get("/livez", summary="Liveness probe (open, no token)", response_model=ProbeOut,
            responses={503: {"model": ProbeOut, "description": "The engine thread has died: restart the server"}})
async def get_liveness(d: DaemonDep) -> JSONResponse:
    """Liveness: 503 only when a restart would help -- the engine thread is gone
    once the server was up. Starting, draining, a full disk, a stalled queue or
    an error on one event (the thread survives it) are not: a restart would
    lose the work under way, not fix it."""
    if d.ready.is_set() and not d.engine_alive:
        last = f" (last engine error: {d.engine_error})" if d.engine_error else ""
        return JSONResponse(status_code=503, content={"status": "dead",
                                                      "reason": f"the engine thread is not running{last}"})
    return JSONResponse(status_code=200, content={"status": "alive"})


@router.get("/readyz", summary="Readiness probe (open, no token)", response_model=ProbeOut,
            responses={503: {"model": ProbeOut,
                             "description": "Not ready: starting, degraded or draining ('reason' says why)"}})
async def get_readiness(request: Request, d: DaemonDep) -> JSONResponse:
    """Readiness: 200 when the server takes events and subscriptions and keeps
    up (``ok``, or ``warning``: one subscription holds it back, or ``degraded``
    only because some subscriptions are inexact, lack witnesses in the log or are broken); 503 while it
    starts, drains or is degraded otherwise (a dead engine, a stalled queue, a full disk)."""
    state = _state(request, d)
    # what some subscriptions lost or do not run leaves the server able to take events and serve
    ready = state.ready and (state.status != "degraded" or (d.engine_alive and d.engine_error is None))
    return JSONResponse(status_code=200 if ready else 503, content={"status": state.status,
                                                                     "reason": "; ".join(state.reasons) or None})


@router.get("/metrics", dependencies=[needs("metrics")], summary="Prometheus metrics",
            response_class=Response,  # no media type of its own: the 200 declares both, the 401 is JSON
            responses={200: {"description": "The metrics, in the format the scraper's Accept asks for",
                             "content": _METRICS_TYPES}, **errors(*AUTH_ERRORS)})
async def get_metrics(request: Request, d: DaemonDep) -> Response:
    """Prometheus text, or OpenMetrics when the scraper's ``Accept`` asks for it."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(d.registry), media_type=content_type)
