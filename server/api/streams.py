"""/streams: declare, list and describe event streams."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Response, status

from air.engine import EngineError
from air.model import Attribute, ModelError, StreamSchema, normalize_type
from server.api.deps import DaemonDep, require_token
from server.api.errors import errors
from server.api.schemas import StreamIn, StreamOut

router = APIRouter(prefix="/streams", tags=["streams"], dependencies=[Depends(require_token)], responses=errors(401))


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
def declare_stream(body: StreamIn, d: DaemonDep, response: Response) -> StreamOut:
    """Declare a stream events can be sent on, with its attributes in schema
    order. Declaring it again with the same schema is harmless (200)."""
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
    return _out(d, schema)


@router.get("", response_model=list[StreamOut], response_model_by_alias=True, summary="List the streams")
def list_streams(d: DaemonDep) -> list[StreamOut]:
    """Every stream by name: the declared input streams and the streams subscriptions publish."""
    return [_out(d, s) for name, s in sorted(d.engine.streams.items()) if name != "DUAL"]


@router.get("/{name}", response_model=StreamOut, response_model_by_alias=True, summary="Describe a stream",
            responses=errors(404, 422))
def get_stream(name: str, d: DaemonDep) -> StreamOut:
    """One stream's schema, and whether it is declared or published by a subscription."""
    s = d.engine.schema(name)
    if s is None:
        raise HTTPException(404, detail=f"no stream named {name!r}; declare it with POST /streams")
    return _out(d, s)
