"""/health and /metrics.

/health is open (for probes) and says "degraded" with a reason when the engine
thread failed, the event queue is stalled or part of the data directory
cannot be written (``disk_full``: per part, what failed, where, since when;
``reason`` says it in one line), until it can be written again; from SIGTERM until the server
exits it answers 503 with status "draining" (take it out of rotation). /metrics needs a token when
``auth_tokens`` is set, like every other data route (Prometheus sends one with
``authorization: {credentials: ...}``). It is answered on the event loop from
counters and copies, never waiting for the engine thread or a worker thread,
so it stays fast under load; ``cayuga_instances`` is refreshed by the engine
thread in the background (see ``Daemon._refresh_counts``: at least every
second while idle, every few seconds with 100K subscriptions).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.api.deps import DaemonDep, require_token
from server.engine import BUILD

router = APIRouter(tags=["system"])


@router.get("/health", responses={503: {"description": "Draining: the server is stopping (SIGTERM)"}})
async def health(request: Request, d: DaemonDep) -> JSONResponse:
    alive = d.engine_alive
    draining = request.app.state.draining.is_set()
    if draining:
        status = "draining"  # receivers closed, the queue and clients being drained; then the server exits
    elif not d.ready.is_set():
        status = "starting"  # restoring stored subscriptions; the engine thread starts after
    else:
        status = "ok" if alive and d.engine_error is None else "degraded"
    stalled = d.queue_stalled()
    disk = d.disk_status()
    if (stalled or disk) and status == "ok":
        status = "degraded"
    reasons = [f"{v['error']} at {v['path']}" for v in disk.values()] + ([stalled] if stalled else [])
    if d.engine_error:
        reasons.append(f"engine error: {d.engine_error}")
    return JSONResponse(status_code=503 if draining else 200, content={
        "status": status,
        "reason": "; ".join(reasons) or None,
        "disk_full": disk,
        "queue_stalled": stalled,
        "restored": {"done": d.restored, "total": d.restore_total},
        # what this start recovered: the snapshot loaded, its instances and queued events, the journal replayed
        "recovered": d.recovered,
        # events of that recovery's journal replay the engine has still to take (0: caught up)
        "replay_remaining": d.replay_remaining,
        # events the engine has taken from the queue over every life of the data directory
        "events_taken": d.events_taken,
        "engine_thread": alive,
        "engine_build": BUILD,  # "compiled" or "python" (cayuga build-engine)
        "engine_error": d.engine_error,
        "queue_depth": len(d.queue),
        "subscriptions": len(d.subscriptions),
        "clients": d.hub.client_count,
        "tcp_port": d.receiver.port if d.receiver else None,
    })


@router.get("/metrics", dependencies=[Depends(require_token)])
async def metrics(d: DaemonDep) -> Response:
    return Response(generate_latest(d.registry), media_type=CONTENT_TYPE_LATEST)
