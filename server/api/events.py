"""/events: post a batch of events (JSON), as an alternative to the TCP port."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from air.formats import JsonDecoder, LineError
from server.api.deps import AUTH_ERRORS, DaemonDep, Ingest
from server.api.errors import errors
from server.api.schemas import EventsOut
from server.durability.diskfull import DiskFull
from server.ingest.limits import refusals, without
from server.ingest.queue import QueueClosed
from server.observability.counters import Count

router = APIRouter(prefix="/events", tags=["events"], responses=errors(*AUTH_ERRORS))

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
             summary="Send a batch of events (JSON)",
             responses=errors(400, 413, 415, 503, 507, why={
                 400: "The body is not JSON, or not an event, a list of events or {\"events\": [...]} (a list "
                      "whose items are not JSON is answered 202, each such item in 'rejected')",
                 413: f"The body is larger than max_body_bytes, or holds more than {MAX_BATCH} events: split it",
                 503: "The events were not accepted: the server is stopping, still recovering, or its queue "
                      "stayed full (or the journal did not sync) for 30 s; retry",
                 507: "The journal cannot be written (a full disk): 'accepted' and 'not_accepted_from' say "
                      "which events, if any, were accepted"}))
async def post_events(request: Request, d: DaemonDep, who: Ingest) -> EventsOut:
    """One event object, a list of them, or ``{"events": [...]}``. Each bad event
    is reported with its index and reason; the others are accepted -- also an
    item that is not JSON at all (``NaN``, ``Infinity``, a number out of range),
    as TCP refuses just that line: the list is split at its top-level commas and
    each item decoded on its own. A body that is not such a list answers 400. The answer
    comes once the accepted events are durable in the journal (per the
    ``durability`` setting). When the journal cannot be written (a full
    disk) the answer is 507 and none of the events is accepted -- unless the
    disk filled in the middle of a large request: the body then says which
    items were accepted (``accepted``) and from which one to resend
    (``not_accepted_from``)."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        d.counters.add(Count.HTTP_NOT_JSON)
        raise HTTPException(415, detail=f"the body must be JSON (content-type: application/json), not {ctype!r}")
    body = await request.body()
    decoder = JsonDecoder(d.engine.schema, clock=d.health.now if d.settings.time == "clock" else None,
                          time_unit_ms=d.settings.time_unit_ms, streams=d.declared)
    try:
        events, errors = decoder.decode_document(body)
    except LineError as exc:
        try:  # a list with an item that is not JSON (NaN): each item on its own, as TCP takes each line
            events, errors = await run_in_threadpool(decoder.decode_items, body)
        except LineError:
            raise HTTPException(400, detail=str(exc)) from None
    if len(events) + len(errors) > MAX_BATCH:
        d.counters.add(Count.HTTP_BATCH_TOO_LARGE)
        raise HTTPException(413, detail=f"at most {MAX_BATCH} events per request; split the batch")
    refused = refusals(events, len(body), horizon=d.horizon(), max_value=d.settings.max_value_bytes)
    if refused:  # indexes of the events list; report them as indexes of the body's items
        items = _item_indexes(len(events), errors)
        errors = sorted(errors + [(items[i], reason) for i, reason in refused.items()])
        events, _ = without(events, refused)
    rejected = [{"index": i, "error": reason} for i, reason in errors]
    if rejected:
        d.counters.add(Count.REJECTED_HTTP, len(rejected))

    def enqueue() -> int:
        if not d.accepting.wait(DURABLE_SECONDS):
            raise TimeoutError("the server is still recovering (putting back its queued and journaled events)")
        late = 0
        for i in range(0, len(events), QUEUE_PART):
            try:
                late += len(d.queue.put_batch(events[i:i + QUEUE_PART], timeout=30))
            except DiskFull as exc:
                raise exc.refusing_from(i + exc.first_refused) from None
        journal = d.queue.journal
        if journal is not None and events and not journal.wait_durable(journal.appended, DURABLE_SECONDS):
            if journal.sync_failure is not None:
                raise _NotSynced(str(journal.sync_failure))
            raise TimeoutError(f"the journal did not make the events durable within {DURABLE_SECONDS:g} s "
                               "(they are queued)")
        return late

    try:
        late = await run_in_threadpool(enqueue)
    except (QueueClosed, TimeoutError) as exc:
        raise HTTPException(503, detail=f"events not accepted: {exc}") from None
    except DiskFull as exc:
        return _refused(d, exc, len(events), errors)
    except _NotSynced as exc:
        d.counters.add(Count.DISK_FULL_REFUSALS_HTTP)
        return JSONResponse(status_code=507, content={
            "detail": f"{exc}: the {len(events)} events are in the journal and queued (they will be processed: "
                      "do not send them again) but could not be made durable; free space on the file system of "
                      "the data directory", "accepted": len(events)})
    d.counters.add(Count.RECEIVED_HTTP, len(events) - late)
    return EventsOut(accepted=len(events) - late, rejected=rejected, late=late)


class _NotSynced(Exception):
    """The events were journaled and queued, but the journal could not be synced."""


def _refused(d, exc: DiskFull, n_events: int, errors: list[tuple[int, str]]) -> JSONResponse:
    """507: the journal could not take the events from ``exc.first_refused`` on."""
    d.counters.add(Count.DISK_FULL_REFUSALS_HTTP)
    k = exc.first_refused
    if k:
        d.counters.add(Count.RECEIVED_HTTP, k)
        item = _item_indexes(n_events, errors)[k]
        what = (f"the first {k} of the {n_events} events were accepted (the body's items before index {item}); "
                f"those from item {item} on were not: send only those again")
    else:
        item = None
        what = f"none of the {n_events} events was accepted: send them again"
    return JSONResponse(status_code=507, headers={"Retry-After": "5"}, content={
        "detail": f"{exc}; {what} once space is freed ({exc.hint})",
        "accepted": k, "not_accepted_from": item,
        "disk_full": {"part": exc.part, "path": exc.path, "reason": exc.reason}})


def _item_indexes(n_events: int, errors: list[tuple[int, str]]) -> list[int]:
    """The body item index of each decoded event (the items not in ``errors``, in order)."""
    bad = {i for i, _ in errors}
    out, item = [], 0
    while len(out) < n_events:
        if item not in bad:
            out.append(item)
        item += 1
    return out
