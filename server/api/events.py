"""/events: post a batch of events (JSON), as an alternative to the TCP port."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException
from fastapi.concurrency import run_in_threadpool

from server.api.deps import DaemonDep, require_token
from server.api.schemas import EventsOut
from server.formats import JsonDecoder, LineError
from server.queue import QueueClosed

router = APIRouter(prefix="/events", tags=["events"], dependencies=[Depends(require_token)])

MAX_BATCH = 100_000


@router.post("", status_code=202, response_model=EventsOut)
async def post_events(d: DaemonDep, body: Any = Body(..., examples=[
        [{"stream": "Stock", "t0": 1, "t1": 1, "Name": "IBM", "Price": 84.5, "Volume": 300}]])) -> EventsOut:
    """One event object, a list of them, or ``{"events": [...]}``. Each bad event
    is reported with its index and reason; the others are accepted."""
    if isinstance(body, dict) and "events" in body and "stream" not in body:
        body = body["events"]
    items = body if isinstance(body, list) else [body]
    if len(items) > MAX_BATCH:
        raise HTTPException(413, detail=f"at most {MAX_BATCH} events per request; split the batch")
    decoder = JsonDecoder(d.engine.schema, clock=d.now, time_unit_ms=d.settings.time_unit_ms)
    events, rejected = [], []
    for i, obj in enumerate(items):
        try:
            events.append(decoder.from_mapping(obj))
        except LineError as exc:
            rejected.append({"index": i, "error": str(exc)})
    if rejected:
        d.counters.add("rejected_http", len(rejected))

    def enqueue() -> int:
        late = 0
        for ev in events:
            if not d.queue.put(ev, timeout=30):
                late += 1
        return late

    try:
        late = await run_in_threadpool(enqueue)
    except (QueueClosed, TimeoutError) as exc:
        raise HTTPException(503, detail=f"events not accepted: {exc}") from None
    d.counters.add("received_http", len(events) - late)
    return EventsOut(accepted=len(events) - late, rejected=rejected, late=late)
