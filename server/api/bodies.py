"""A large request body validated off the event loop, courteously.

FastAPI parses and validates a declared body on the event loop, before the
endpoint runs: for POST /subscriptions/batch with 10,000 queries (9 MB) that
is 60-100 ms of CPU that every WebSocket and every other request waited for,
and, as any thread that computes, it kept the interpreter's lock up to the
switch interval (20 ms in ``cayuga serve``) each time the TCP thread or the
engine thread wanted it back: the live events' worst latency as such a
registration began was 130-155 ms (BENCHMARKS.md, "Engine workers, round 27").
:func:`validate` does what FastAPI does, on the request's thread, giving the
lock away between two queries every half millisecond (``Courtesy``, through
``schemas.BETWEEN_ITEMS``), and refuses a bad body with the same
:class:`RequestValidationError` (hence the same 422, server/app.py);
:func:`body_schema` and :func:`with_bodies` give the OpenAPI document the
``requestBody`` FastAPI would have given it.
"""

from __future__ import annotations

import email.message
import json
import re
from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from server.api.schemas import BETWEEN_ITEMS
from server.courtesy import Courtesy

M = TypeVar("M", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body sent with ``content_type`` as JSON (strictly: none given, not)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def validate(model: type[M], raw: bytes, content_type: str | None) -> M:
    """``raw``, a request's body sent as ``content_type``, as ``model``: what a declared body parameter
    gives, refused as one is (:class:`RequestValidationError`). Call it off the event loop: it gives the
    interpreter's lock away every half millisecond between two queries (``Courtesy``)."""
    courtesy = BETWEEN_ITEMS.set(Courtesy())
    try:
        return _validate(model, raw, content_type)
    finally:
        BETWEEN_ITEMS.reset(courtesy)


def _validate(model: type[M], raw: bytes, content_type: str | None) -> M:
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        if not _is_json(content_type):  # FastAPI hands the bytes to the model, which refuses them (422: send JSON)
            return model.model_validate(raw)
        return model.model_validate_json(raw)  # (one pass: pydantic's parser, not a dict of it first)
    except ValidationError as exc:
        problems = exc.errors(include_url=False)
        if any(p["type"] == "json_invalid" for p in problems):
            try:  # the position, as FastAPI gives it (and whatever Python's json reads, as it reads it)
                return _validate_object(model, json.loads(raw))
            except json.JSONDecodeError as bad:
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body", bad.pos),
                                               "msg": "JSON decode error", "input": {},
                                               "ctx": {"error": bad.msg}}]) from None
            except RecursionError:  # deeper than Python's parser goes (FastAPI: a bare 400): where pydantic's stopped
                error = next(p for p in problems if p["type"] == "json_invalid")["ctx"]["error"]
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body", _offset(raw, error)),
                                               "msg": "JSON decode error", "input": {},
                                               "ctx": {"error": error.split(" at line ")[0]}}]) from None
        raise _refused(exc) from None


def _offset(raw: bytes, error: str) -> int:
    """The character of ``raw`` that pydantic's "... at line L column C" names (0 if it names none)."""
    found = re.search(r"at line (\d+) column (\d+)", error)
    if found is None:
        return 0
    line, column = int(found[1]), int(found[2])
    lines = raw.decode("utf-8", "replace").split("\n")
    return sum(len(x) + 1 for x in lines[:line - 1]) + column - 1


def _validate_object(model: type[M], obj) -> M:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise _refused(exc) from None


def _refused(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError([{**p, "loc": ("body", *p["loc"])} for p in exc.errors(include_url=False)])


#: The models :func:`body_schema` has named: FastAPI knows only the bodies it parses itself.
_MODELS: dict[str, type[BaseModel]] = {}


def body_schema(model: type[BaseModel]) -> dict:
    """The route's ``openapi_extra``: ``model`` as its required JSON body, its schema put in the
    document's components by :func:`with_bodies`."""
    _MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def with_bodies(document: dict) -> dict:
    """The OpenAPI ``document`` with the schemas of the bodies parsed here (and the models they use)
    in its components, where FastAPI would have put them."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, model in _MODELS.items():
        if name not in schemas:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for used, its in schema.pop("$defs", {}).items():
                schemas.setdefault(used, its)
            schemas[name] = schema
    return document
