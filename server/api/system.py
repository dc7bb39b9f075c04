"""/health and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.api.deps import DaemonDep
from server.engine import BUILD

router = APIRouter(tags=["system"])


@router.get("/health")
def health(d: DaemonDep) -> dict:
    alive = d.engine_alive
    if not d.ready.is_set():
        status = "starting"  # restoring stored subscriptions; the engine thread starts after
    else:
        status = "ok" if alive and d.engine_error is None else "degraded"
    return {
        "status": status,
        "restored": {"done": d.restored, "total": d.restore_total},
        "engine_thread": alive,
        "engine_build": BUILD,  # "compiled" or "python" (cayuga build-engine)
        "engine_error": d.engine_error,
        "queue_depth": len(d.queue),
        "subscriptions": len(d.subscriptions),
        "clients": d.hub.client_count,
        "tcp_port": d.receiver.port if d.receiver else None,
    }


@router.get("/metrics")
def metrics(d: DaemonDep) -> Response:
    return Response(generate_latest(d.registry), media_type=CONTENT_TYPE_LATEST)
