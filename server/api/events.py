"""/events: post a batch of events (JSON), as an alternative to the TCP port."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from server.api.deps import DaemonDep, require_token
from server.api.schemas import EventsOut
from server.formats import JsonDecoder, LineError
from server.limits import refusals, without
from server.queue import QueueClosed

router = APIRouter(prefix="/events", tags=["events"], dependencies=[Depends(require_token)])

MAX_BATCH = 100_000
#: Events queued at once (the queue takes them in parts of this size while it has room).
QUEUE_PART = 4096
#: Seconds an answer waits for the events to be durable in the journal (then 503).
DURABLE_SECONDS = 30.0

_EXAMPLE = [{"stream": "Stock", "t0": 1, "t1": 1, "Name": "IBM", "Price": 84.5, "Volume": 300}]
_BODY = {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
               "description": "One event object, a list of them, or {\"events\": [...]}"},
    "example": _EXAMPLE}}}


@router.post("", status_code=202, response_model=EventsOut, openapi_extra={"requestBody": _BODY},
             responses={400: {"description": "The body is not JSON"},
                        413: {"description": "The body is larger than max_body_bytes, or has too many events"},
                        415: {"description": "The body is not application/json"}})
async def post_events(request: Request, d: DaemonDep) -> EventsOut:
    """One event object, a list of them, or ``{"events": [...]}``. Each bad event
    is reported with its index and reason; the others are accepted. The answer
    comes once the accepted events are durable in the journal (per the
    ``durability`` setting)."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        d.counters.add("http_not_json")
        raise HTTPException(415, detail=f"the body must be JSON (content-type: application/json), not {ctype!r}")
    body = await request.body()
    decoder = JsonDecoder(d.engine.schema, clock=d.now if d.settings.time == "clock" else None,
                          time_unit_ms=d.settings.time_unit_ms, streams=d.declared)
    try:
        events, errors = decoder.decode_document(body)
    except LineError as exc:
        raise HTTPException(400, detail=str(exc)) from None
    if len(events) + len(errors) > MAX_BATCH:
        d.counters.add("http_batch_too_large")
        raise HTTPException(413, detail=f"at most {MAX_BATCH} events per request; split the batch")
    refused = refusals(events, len(body), horizon=d.horizon(), max_value=d.settings.max_value_bytes)
    if refused:  # indexes of the events list; report them as indexes of the body's items
        items = _item_indexes(len(events), errors)
        errors = sorted(errors + [(items[i], reason) for i, reason in refused.items()])
        events, _ = without(events, refused)
    rejected = [{"index": i, "error": reason} for i, reason in errors]
    if rejected:
        d.counters.add("rejected_http", len(rejected))

    def enqueue() -> int:
        if not d.accepting.wait(DURABLE_SECONDS):
            raise TimeoutError("the server is still recovering (putting back its queued and journaled events)")
        late = 0
        for i in range(0, len(events), QUEUE_PART):
            late += len(d.queue.put_batch(events[i:i + QUEUE_PART], timeout=30))
        journal = d.queue.journal
        if journal is not None and events and not journal.wait_durable(journal.appended, DURABLE_SECONDS):
            raise TimeoutError(f"the journal did not make the events durable within {DURABLE_SECONDS:g} s "
                               "(they are queued)")
        return late

    try:
        late = await run_in_threadpool(enqueue)
    except (QueueClosed, TimeoutError) as exc:
        raise HTTPException(503, detail=f"events not accepted: {exc}") from None
    d.counters.add("received_http", len(events) - late)
    return EventsOut(accepted=len(events) - late, rejected=rejected, late=late)


def _item_indexes(n_events: int, errors: list[tuple[int, str]]) -> list[int]:
    """The body item index of each decoded event (the items not in ``errors``, in order)."""
    bad = {i for i, _ in errors}
    out, item = [], 0
    while len(out) < n_events:
        if item not in bad:
            out.append(item)
        item += 1
    return out
