"""/streams: declare, list and describe event streams."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Response, status

from air.engine import EngineError
from air.model import Attribute, ModelError, StreamSchema, normalize_type
from server.api.deps import DaemonDep, require_token
from server.api.schemas import StreamIn, StreamOut

router = APIRouter(prefix="/streams", tags=["streams"], dependencies=[Depends(require_token)])


def _out(d, schema: StreamSchema) -> StreamOut:
    kind = "declared" if schema.name in d.declared else "published"
    return StreamOut(name=schema.name, schema_={a.name: a.type for a in schema.attributes}, kind=kind)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StreamOut, response_model_by_alias=True,
             responses={200: {"description": "Already declared with this schema"},
                        409: {"description": "Already exists with another schema"}})
def declare_stream(body: StreamIn, d: DaemonDep, response: Response) -> StreamOut:
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


@router.get("", response_model=list[StreamOut], response_model_by_alias=True)
def list_streams(d: DaemonDep) -> list[StreamOut]:
    return [_out(d, s) for name, s in sorted(d.engine.streams.items()) if name != "DUAL"]


@router.get("/{name}", response_model=StreamOut, response_model_by_alias=True)
def get_stream(name: str, d: DaemonDep) -> StreamOut:
    s = d.engine.schema(name)
    if s is None:
        raise HTTPException(404, detail=f"no stream named {name!r}; declare it with POST /streams")
    return _out(d, s)
