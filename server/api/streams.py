"""/streams: declare, list and describe event streams."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from air.engine import EngineError
from air.model import Attribute, ModelError, StreamSchema, normalize_type
from server.api.deps import AUTH_ERRORS, DaemonDep, Manage, Watch, client_address, operation
from server.api.errors import errors
from server.api.schemas import StreamIn, StreamOut

router = APIRouter(prefix="/streams", tags=["streams"], responses=errors(*AUTH_ERRORS))


def _out(d, schema: StreamSchema) -> StreamOut:
    kind = "declared" if schema.name in d.declared else "published"
    return StreamOut(name=schema.name, schema_={a.name: a.type for a in schema.attributes}, kind=kind)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StreamOut, response_model_by_alias=True,
             summary="Declare an input stream",
             responses={200: {"model": StreamOut, "description": "Already declared with this very schema: "
                                                                  "nothing changed"},
                        **errors(409, 413, 422, 503, 507, why={
                            409: "A stream of this name exists with another schema (or a subscription publishes it)",
                            422: "The name or a type is not valid, or the schema is empty: the body says which",
                            503: "The server is starting (restoring its subscriptions): retry shortly"})})
def declare_stream(body: StreamIn, d: DaemonDep, response: Response, who: Manage, request: Request) -> StreamOut:
    """Declare a stream events can be sent on, with its attributes in schema
    order. Declaring it again with the same schema is harmless (200). A
    declaration is written to the audit log (GET /audit)."""
    if not body.schema_:
        raise HTTPException(422, detail="a stream needs at least one attribute in 'schema'")
    try:
        schema = StreamSchema(body.name, tuple(Attribute(k, normalize_type(v)) for k, v in body.schema_.items()))
    except ModelError as exc:
        raise HTTPException(422, detail=str(exc)) from None
    try:
        created = d.declare_stream(schema)
    except EngineError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    if not created:
        response.status_code = status.HTTP_200_OK
    else:
        d.security.declared(who, schema.name, {a.name: a.type for a in schema.attributes}, client_address(request))
    return _out(d, schema)


def _hidden(d, who, name: str) -> list[str]:
    """The subscriptions out of ``who``'s reach that publish stream ``name`` (a declared stream: none)."""
    return [] if name in d.declared else d.security.stream_publishers_out_of_reach(who, name, d.subscriptions)


@router.get("", response_model=list[StreamOut], response_model_by_alias=True, summary="List the streams")
def list_streams(d: DaemonDep, who: Watch) -> list[StreamOut]:
    """Every stream by name: the declared input streams and the streams subscriptions publish (for a token
    that reaches only some subscriptions: those that only they publish)."""
    return [_out(d, s) for name, s in sorted(d.engine.streams.items())
            if name != "DUAL" and not (who.restricted and _hidden(d, who, name))]


@router.get("/{name}", response_model=StreamOut, response_model_by_alias=True, summary="Describe a stream",
            responses=errors(404, 422))
def get_stream(name: str, d: DaemonDep, who: Watch, request: Request) -> StreamOut:
    """One stream's schema, and whether it is declared or published by a subscription."""
    s = d.engine.schema(name)
    if s is None:
        raise HTTPException(404, detail=f"no stream named {name!r}; declare it with POST /streams")
    hidden = _hidden(d, who, name) if who.restricted else []
    if hidden:
        d.security.refuse(who, client_address(request), "http", operation(request), None,
                          f"stream {name} is published by subscriptions token {who.name} does not reach "
                          f"({', '.join(hidden[:5])}); it reaches only {who.reach_text()}")
    return _out(d, s)
