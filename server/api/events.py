"""/events: post a batch of events (JSON), as an alternative to the TCP port."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from server.api.deps import DaemonDep, require_token
from server.api.schemas import EventsOut
from server.formats import JsonDecoder, LineError
from server.queue import QueueClosed

router = APIRouter(prefix="/events", tags=["events"], dependencies=[Depends(require_token)])

MAX_BATCH = 100_000
#: Events queued at once (the queue takes them in parts of this size while it has room).
QUEUE_PART = 4096

_EXAMPLE = [{"stream": "Stock", "t0": 1, "t1": 1, "Name": "IBM", "Price": 84.5, "Volume": 300}]
_BODY = {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
               "description": "One event object, a list of them, or {\"events\": [...]}"},
    "example": _EXAMPLE}}}


@router.post("", status_code=202, response_model=EventsOut, openapi_extra={"requestBody": _BODY},
             responses={400: {"description": "The body is not JSON"},
                        415: {"description": "The body is not application/json"}})
async def post_events(request: Request, d: DaemonDep) -> EventsOut:
    """One event object, a list of them, or ``{"events": [...]}``. Each bad event
    is reported with its index and reason; the others are accepted."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise HTTPException(415, detail=f"the body must be JSON (content-type: application/json), not {ctype!r}")
    body = await request.body()
    decoder = JsonDecoder(d.engine.schema, clock=d.now, time_unit_ms=d.settings.time_unit_ms,
                          streams=d.declared)
    try:
        events, errors = decoder.decode_document(body)
    except LineError as exc:
        raise HTTPException(400, detail=str(exc)) from None
    if len(events) + len(errors) > MAX_BATCH:
        raise HTTPException(413, detail=f"at most {MAX_BATCH} events per request; split the batch")
    rejected = [{"index": i, "error": reason} for i, reason in errors]
    if rejected:
        d.counters.add("rejected_http", len(rejected))

    def enqueue() -> int:
        late = 0
        for i in range(0, len(events), QUEUE_PART):
            late += len(d.queue.put_batch(events[i:i + QUEUE_PART], timeout=30))
        return late

    try:
        late = await run_in_threadpool(enqueue)
    except (QueueClosed, TimeoutError) as exc:
        raise HTTPException(503, detail=f"events not accepted: {exc}") from None
    d.counters.add("received_http", len(events) - late)
    return EventsOut(accepted=len(events) - late, rejected=rejected, late=late)
