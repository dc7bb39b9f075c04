"""/subscriptions: register CEL or AIR (one, or many at once), validate, list, describe, delete."""

from __future__ import annotations

from typing import Iterable

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from server.api import bodies
from server.api.deps import AUTH_ERRORS, DaemonDep, Manage, Watch, client_address, operation, require_reach
from server.api.errors import errors
from server.api.schemas import (PreviewIn, PreviewOut, SubscriptionBatchIn, SubscriptionBatchOut, SubscriptionCreated,
                                SubscriptionDetail, SubscriptionIn, SubscriptionOut, SubscriptionRegistered,
                                ValidationOut)
from server.budget import Cap
from server.config import parse_bytes
from server.courtesy import Courtesy
from server.daemon import Subscription, SubscriptionError, SubscriptionInUse
from server.durability.history import FromError
from server.subscriptions.broken import Broken

router = APIRouter(prefix="/subscriptions", tags=["subscriptions"], responses=errors(*AUTH_ERRORS))
#: What POST /subscriptions and /subscriptions/batch may answer besides their success.
_REGISTER_ERRORS = (403, 413, 422, 503, 507)


def _common(d, s: Subscription) -> dict:
    mark = d.budget.inexact.get(s.id)
    cap = d.budget.caps.get(s.id)
    return dict(id=s.id, kind=s.kind, name=s.name, outputs=s.outputs, internal_streams=s.internal,
                created=s.created, instances=d.instance_count(s.id), websocket=f"/ws/subscriptions/{s.id}",
                exact=mark is None, inexact=mark.public() if mark is not None else None,
                limits={"max_instances": cap.max_instances, "max_state_bytes": cap.max_state_bytes}
                if cap is not None else None, backfill=d.backfill(s.id))


def _from_refused(exc: FromError) -> JSONResponse:
    """A ``from`` that cannot be served: 400, with the range that can."""
    return JSONResponse(status_code=400, content={"detail": str(exc), "retained": exc.retained})


def _broken_out(d, b, detail: bool = False):
    """A broken subscription (server/subscriptions/broken.py): what it was registered with, and why it does not run."""
    cap = d.budget.caps.get(b.id)
    common = dict(id=b.id, kind=b.kind, name=b.name, outputs=[], internal_streams=[], created=b.created,
                  instances=0, websocket=f"/ws/subscriptions/{b.id}", broken=b.public(),
                  limits={"max_instances": cap.max_instances, "max_state_bytes": cap.max_state_bytes}
                  if cap is not None else None)
    if detail:
        last = d.witlog.last_seq(b.id) if d.witlog is not None else 0
        return SubscriptionDetail(**common, text=b.text, air="", last_seq=last, runs_on="nowhere (broken)")
    return SubscriptionOut(**common)


def _in_order(d) -> list:
    """The subscriptions and the broken ones, in registration order (ids are given in that order)."""
    subs = list(d.subscriptions.values())
    if not d.broken:
        return subs
    return sorted(subs + list(d.broken.values()), key=lambda s: (len(s.id), s.id))


def _out(d, s: Subscription, detail: bool = False):
    if isinstance(s, Broken):
        return _broken_out(d, s, detail)
    common = _common(d, s)
    if detail:
        last = d.witlog.last_seq(s.id) if d.witlog is not None else 0
        return SubscriptionDetail(**common, text=s.text, air=s.air, last_seq=last,
                                  runaway=d.budget.runaways.get(s.id), runs_on=d.processing.runs_on(s.id))
    return SubscriptionOut(**common)


def _cap(d, body: SubscriptionIn, where: str = "") -> Cap | None:
    """The caps a registration body asks for (None: none); a bad size is a 422 that says what to write."""
    if body.max_instances is None and body.max_state_bytes is None:
        return None
    size = None
    if body.max_state_bytes is not None:
        try:
            size = parse_bytes(body.max_state_bytes, what=f"{where}max_state_bytes", percent_of=d.budget.max_bytes)
        except ValueError as exc:
            raise HTTPException(422, detail=str(exc)) from None
    return Cap(body.max_instances, size)


def _identical(d, kind: str, text: str, who) -> list[Subscription]:
    """The subscriptions registered with this very query (same kind, same text but for surrounding blanks)
    that ``who`` reaches."""
    text = text.strip()
    return [s for s in list(d.subscriptions.values())
            if s.kind == kind and s.text.strip() == text and d.security.reaches(who, s)]


def _may_name(d, who, request: Request, names: list[str | None]) -> None:
    """403 unless ``who`` may register subscriptions of these names (a token limited to name prefixes)."""
    for i, name in enumerate(names):
        problem = who.naming_problem(name)
        if problem is not None:
            where = f"subscriptions[{i}]: " if len(names) > 1 else ""
            d.security.refuse(who, client_address(request), "http", operation(request), None,
                              f"{where}{problem}; nothing was registered")


def _reads_in_reach(d, who, request: Request, subs: list[Subscription]) -> None:
    """A token that reaches only some subscriptions must not read, through one
    of its own, the outputs of others: subscriptions that do are deleted again
    (before any client could reach them: server/api/ws.py checks the same) and
    the answer is 403."""
    if not who.restricted:
        return
    bad = {s.id: r for s in subs if (r := d.security.reads_out_of_reach(who, s, d.subscriptions, d.declared))}
    if not bad:
        return
    for s in reversed(subs):
        try:
            d.remove_subscription(s.id, cascade=True)
        except KeyError:
            pass
    d.security.owners.forget([s.id for s in subs])
    streams = sorted({x for r in bad.values() for x in r})
    d.security.refuse(who, client_address(request), "http", operation(request), None,
                      f"the query reads {', '.join(streams)}, published by subscriptions token {who.name} does not "
                      f"reach (it reaches only {who.reach_text()}); nothing was registered")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SubscriptionCreated,
             summary="Register a subscription (CEL or AIR)",
             responses={200: {"model": SubscriptionCreated,
                              "description": "A subscription with this name and this very query exists: it is "
                                             "returned, nothing new is registered"},
                        **errors(400, *_REGISTER_ERRORS, why={
                            400: "The query has errors: 'errors' lists each with its line, column and excerpt"})})
async def create_subscription(body: SubscriptionIn, d: DaemonDep, response: Response, who: Manage,
                              request: Request):
    """Register a subscription. Registering the identical query again is
    flagged: without a name (or under another name) a second subscription is
    made and ``same_as`` lists the earlier ones; with the name of one that
    has the identical query, that one is returned (200) and nothing is
    registered, so a named registration can be repeated safely. ``warnings``
    lists each clause that keeps automaton instances without a time bound
    (e.g. a NEXT without ``DUR < ...``), with its position and the fix; the
    subscription is registered all the same. ``max_instances`` and
    ``max_state_bytes`` cap its state (server/budget.py). A registration is
    written to the audit log with the token's name (GET /audit)."""
    cap = _cap(d, body)
    _may_name(d, who, request, [body.name])

    def add():
        same = _identical(d, body.kind, body.text, who)
        if body.name:
            for s in same:
                if s.name == body.name:
                    return s, d.subscription_warnings(s), [], False
        if body.from_ is not None:  # history first, then live (server/backfill/)
            sub, warnings = d.register_from(body.kind, body.text, body.name, body.from_)
        else:
            sub, warnings = d.register_subscription(body.kind, body.text, body.name)
        d.security.own(who, [sub])
        _reads_in_reach(d, who, request, [sub])
        d.security.registered(who, [sub], client_address(request))
        if cap is not None:
            d.set_cap(sub.id, cap)
        return sub, warnings, [s.id for s in same], True

    try:
        sub, warnings, same_as, created = await run_in_threadpool(add)
    except SubscriptionError as exc:
        return JSONResponse(status_code=400, content={"detail": str(exc), "errors": exc.errors})
    except FromError as exc:
        return _from_refused(exc)
    if not created:
        response.status_code = status.HTTP_200_OK
    return SubscriptionCreated(**_common(d, sub), warnings=warnings, same_as=same_as, registered_now=created)


@router.post("/batch", status_code=status.HTTP_201_CREATED, response_model=SubscriptionBatchOut,
             summary="Register many subscriptions at once, all or nothing",
             responses=errors(400, *_REGISTER_ERRORS, why={
                 400: "Some queries have errors: none is registered; 'errors' lists each with its index in the "
                      "batch and its position"}), openapi_extra=bodies.body_schema(SubscriptionBatchIn))
async def create_subscriptions(d: DaemonDep, who: Manage, request: Request):
    """Register many subscriptions at once, all or nothing, with consecutive
    ids in the order given; a query may read the output of an earlier one.
    Each carries its own ``warnings`` (as POST /subscriptions)."""
    raw, content_type = await request.body(), request.headers.get("content-type")

    def add() -> list[bytes]:
        # off the event loop, the body's validation too (server/api/bodies.py): 10,000 queries held it 100 ms
        body = bodies.validate(SubscriptionBatchIn, raw, content_type)
        with_from = [i for i, s in enumerate(body.subscriptions) if s.from_ is not None]
        if with_from:
            raise HTTPException(422, detail=f"subscriptions[{with_from[0]}].from: a subscription with history is "
                                            "registered alone, with POST /subscriptions")
        items, caps, courtesy = [], [], Courtesy()
        for i, s in enumerate(body.subscriptions):
            items.append((s.kind, s.text, s.name))
            caps.append(_cap(d, s, f"subscriptions[{i}]."))
            courtesy()
        _may_name(d, who, request, [name for _kind, _text, name in items])
        done = d.register_subscriptions(items)
        subs = [sub for sub, _w in done]
        d.security.own(who, subs)
        _reads_in_reach(d, who, request, subs)
        d.security.registered(who, subs, client_address(request))
        for (sub, _w), cap in zip(done, caps):
            if cap is not None:
                d.set_cap(sub.id, cap)
        return _batch_body(d, done)

    try:
        answer = await run_in_threadpool(add)
    except SubscriptionError as exc:
        return JSONResponse(status_code=400, content={"detail": str(exc), "errors": exc.errors})
    return StreamingResponse(iter(answer), status_code=status.HTTP_201_CREATED, media_type="application/json")


#: A long answer (a batch's, a list of subscriptions) goes out in pieces of this many subscriptions
#: (about 2 MB of a batch of per-symbol queries with their warnings).
ANSWER_PIECE = 500


def _pieces(models: Iterable[BaseModel], head: bytes, tail: bytes) -> list[bytes]:
    """The JSON of ``models`` between ``head`` and ``tail``, comma-separated, in pieces of ANSWER_PIECE, made on
    the request's thread a model at a time, letting the other threads have the interpreter's lock between two:
    made by a response model on the event loop, 10,000 per-symbol queries' batch answer (46 MB with their
    warnings) held the loop, hence every WebSocket, 0.7 s (BENCHMARKS.md, "Engine workers, round 25"); joined
    into one string and encoded, it held the lock 60-80 ms more, and the live events waited ("round 27")."""
    made = []
    courtesy = Courtesy()
    for model in models:  # (made as they are taken: the courtesy covers making them too)
        made.append(model.model_dump_json(by_alias=True).encode())
        courtesy()
    return [head, *((b"," if at else b"") + b",".join(made[at:at + ANSWER_PIECE])
                    for at in range(0, len(made), ANSWER_PIECE)), tail]


def _batch_body(d, done: list) -> list[bytes]:
    """:class:`SubscriptionBatchOut`'s JSON, in pieces (:func:`_pieces`)."""
    return _pieces((SubscriptionRegistered(**_common(d, sub), warnings=warnings) for sub, warnings in done),
                   b'{"subscriptions":[', b"]}")


@router.post("/preview", response_model=PreviewOut, response_model_by_alias=True,
             summary="Run a query over history without registering it",
             responses=errors(400, 413, 422, 503, why={
                 400: "The query has errors ('errors', with positions), or 'from' is before the retained history "
                      "('retained': its range) or not a time"}))
async def preview_subscription(body: PreviewIn, d: DaemonDep, who: Manage):
    """The first ``limit`` witnesses the query would have made over the retained
    history from ``from`` (default: all of it), and how many there are, run on an
    engine of its own; nothing is installed (docs/design/backfill.md)."""
    start = body.from_ if body.from_ is not None else "retained"
    try:
        got = await run_in_threadpool(d.preview, body.kind, body.text, start, body.limit)
    except SubscriptionError as exc:
        return JSONResponse(status_code=400, content={"detail": str(exc), "errors": exc.errors})
    except FromError as exc:
        return _from_refused(exc)
    return JSONResponse(content=got)


@router.post("/validate", response_model=ValidationOut, summary="Check a query without registering it",
             responses=errors(413, 422))
async def validate_subscription(body: SubscriptionIn, d: DaemonDep, who: Manage) -> ValidationOut:
    """Every error a registration would meet (``valid``: false, each with its
    position), or the outputs and the AIR it compiles to; registers nothing.
    ``warnings``, as POST /subscriptions would give them, do not make it invalid."""
    v = await run_in_threadpool(d.validate_subscription, body.kind, body.text)
    return ValidationOut(valid=not v.errors, errors=v.errors, outputs=v.outputs, air=v.air, warnings=v.warnings)


@router.get("", response_model=list[SubscriptionOut], summary="List the subscriptions", responses=errors(422))
def list_subscriptions(d: DaemonDep, who: Watch,
                       offset: int = Query(0, ge=0, description="Skip this many (in registration order)."),
                       limit: int | None = Query(None, ge=1, description="Return at most this many.")):
    """The subscriptions in registration order, or a page of them (``offset``, ``limit``); for a token that
    reaches only some, those. A broken one (its stored query no longer compiles against the configuration)
    is listed too, with ``broken``: why, since when and what to do."""
    subs = _in_order(d)  # registration order
    if who.restricted:
        subs = [s for s in subs if d.security.reaches(who, s)]
    end = None if limit is None else offset + limit
    # the response model's JSON, made here in pieces (:func:`_pieces`): 10,000 made on the event loop held it 22-31 ms
    return StreamingResponse(iter(_pieces((_out(d, s) for s in subs[offset:end]), b"[", b"]")),
                             media_type="application/json")


@router.get("/{sid}", response_model=SubscriptionDetail, summary="Describe a subscription",
            responses=errors(404, 422))
def get_subscription(sid: str, d: DaemonDep, who: Watch, request: Request):
    """One subscription with its query, its AIR and the seq of its newest witness (``last_seq``); a broken
    one with ``broken`` (why it does not run, since when, what to do) and no AIR."""
    s = d.subscriptions.get(sid) or d.broken.get(sid)
    if s is None:
        raise HTTPException(404, detail=f"no subscription {sid!r}; GET /subscriptions lists them")
    require_reach(request, who, s)
    return _out(d, s, detail=True)


@router.delete("/{sid}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a subscription",
               responses=errors(404, 409, 422, 503, 507, why={
                   409: "Other subscriptions read its outputs: 'readers' names them (or use cascade=true)"}))
async def delete_subscription(sid: str, d: DaemonDep, who: Manage, request: Request, cascade: bool = Query(
        False, description="Also delete every subscription that reads its outputs (and theirs).")) -> Response:
    """Stop and forget a subscription; its WebSocket clients are closed (1001). A
    broken one is forgotten (it ran nothing). A deletion (with every subscription
    a cascade deleted) is written to the audit log with the token's name (GET /audit)."""
    def remove() -> None:
        d.recovery.require_ready()  # while restoring, 503 (retry), not a 404 for what is not back yet
        s = d.subscriptions.get(sid) or d.broken.get(sid)
        if s is None:
            raise KeyError(sid)
        require_reach(request, who, s)
        if cascade and who.restricted:
            _cascade_in_reach(d, who, request, sid)
        d.security.deleted(who, d.remove_subscription(sid, cascade), client_address(request))

    try:
        await run_in_threadpool(remove)
    except KeyError:
        raise HTTPException(404, detail=f"no subscription {sid!r}; GET /subscriptions lists them") from None
    except SubscriptionInUse as exc:
        return JSONResponse(status_code=409, content={"detail": str(exc), "readers": exc.readers})
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _cascade_in_reach(d, who, request: Request, sid: str) -> None:
    """403 unless ``who`` reaches every subscription a cascading delete of ``sid`` would delete."""
    doomed, todo = {sid}, [sid]
    while todo:
        for r in d.readers_of(todo.pop()):
            if r not in doomed:
                doomed.add(r)
                todo.append(r)
    out = sorted(r for r in doomed if (s := d.subscriptions.get(r) or d.broken.get(r)) is not None
                 and not d.security.reaches(who, s))
    if out:
        d.security.refuse(who, client_address(request), "http", operation(request), None,
                          f"cascade=true would delete {', '.join(out[:10])}, which token {who.name} does not reach "
                          f"(it reaches only {who.reach_text()}); nothing was deleted")
