"""A large body validated off the event loop (server/api/bodies.py): POST /subscriptions/batch
validates its body on the request's thread, not on the loop that carries every WebSocket,
giving the interpreter's lock away between its queries, and refuses a bad body as FastAPI
refuses a declared one, with the same 422."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from clients.client import CayugaClient
from server.api import bodies
from server.api.schemas import SubscriptionBatchIn
from server.serve import RunningServer
from tests.server.conftest import make_settings

UP = "SELECT * FROM FILTER{{Name = '{s}'}}(Stock) NEXT{{$1.Name = $2.Name AND $2.Price > $1.Price}} Stock"

#: (content-type, body): bodies a careless client sends
BAD = [
    ("application/json", b""), ("application/json", b"{"), ("application/json", b"[1,2"),
    ("application/json", b"nope"), ("application/json", b"[]"), ("application/json", b"{}"),
    ("application/json", b"\xff\xfe"), ("application/json", b'{"subscriptions": []}'),
    ("application/json", b'{"subscriptions": [{"query": "x"}]}'),
    ("application/json", b'{"subscriptions": [{"cel": 5}]}'),
    ("application/json", b'{"subscriptions": [{"cel": "a", "air": "b"}]}'),
    ("application/json", b'{"subscriptions": [{"cel": "x"}], "z": 1}'),
    ("application/json", b'{"subscriptions": [{"cel": "x", "name": "bad name!"}]}'),
    ("application/json", b'{"subscriptions": [{"cel": "x", "max_instances": 0}]}'),
    ("application/json", b'{"subscriptions": [{"cel": "x", "max_state_bytes": [1]}]}'),
    ("application/json; charset=utf-8", b'{"subscriptions": [{"cel": "x"}, {"sase": null}]}'),
    ("text/plain", b'{"subscriptions": [{"cel": "x"}]}'), (None, b'{"subscriptions": [{"cel": "x"}]}'),
]
#: and bodies it means
GOOD = [
    ("application/json", b'{"subscriptions": [{"cel": "x", "name": "up", "max_instances": 5}]}'),
    ("application/vnd.api+json", b'{"subscriptions": [{"cel": "x"}, {"air": "<NFA/>", "max_state_bytes": "1MiB"}]}'),
    ("application/json", b'{"subscriptions": [{"cel": NaN}]}'),  # (refused: Python's json reads NaN, as FastAPI)
    ("application/json", b'{"subscriptions": [{"cel": "\\u00e9t\\u00e9"}], "subscriptions": [{"cel": "y"}]}'),
]


@pytest.fixture
def twin(tmp_path, start_server):
    """A server with two more routes taking a batch's body: one as FastAPI parses a declared
    body, one as POST /subscriptions/batch does (:func:`bodies.validate` on a thread of the pool); each
    answers what it got. (After ``start_server``'s
    servers are stopped, it checks that no thread is left.)"""
    srv = RunningServer(make_settings(tmp_path, data_dir=tmp_path / "twin"))

    @srv.app.post("/probe/declared")
    async def declared(body: SubscriptionBatchIn):
        return body.model_dump(mode="json", by_alias=True)

    @srv.app.post("/probe/parsed")
    async def parsed(request: Request):
        raw, content_type = await request.body(), request.headers.get("content-type")
        body = await run_in_threadpool(bodies.validate, SubscriptionBatchIn, raw, content_type)
        return body.model_dump(mode="json", by_alias=True)

    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _post(base: str, path: str, content_type: str | None, body: bytes) -> tuple[int, dict]:
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(base + path, content=body, headers=headers)
    return r.status_code, r.json()


def test_a_body_parsed_off_the_loop_is_refused_and_taken_as_a_declared_one(twin):
    """Every body gets the same status and the same problems from both routes, but for
    pydantic's words for a JSON array (its JSON parser says "array" where Python's says "list")."""
    for content_type, body in BAD + GOOD:
        a = _post(twin.base_url, "/probe/declared", content_type, body)
        b = _post(twin.base_url, "/probe/parsed", content_type, body)
        assert json.loads(json.dumps(b).replace("a valid array", "a valid list")) == json.loads(json.dumps(a)), \
            (content_type, body)
        assert (a[0] == 422) == ((content_type, body) in BAD or b"NaN" in body), (content_type, body, a)


def test_json_nested_past_pythons_parser_is_a_422_that_says_where(twin):
    """FastAPI answered such a body a bare 400 ("There was an error parsing the body")."""
    status, answer = _post(twin.base_url, "/probe/parsed", "application/json", b"[" * 100_000)
    assert status == 422
    assert answer["errors"] == [{"where": "body", "problem": "not JSON: recursion limit exceeded at character 201 "
                                                             "of the body"}]


def test_the_batchs_body_is_validated_off_the_loop_giving_the_lock_away_between_queries(twin, monkeypatch):
    """Not on the event loop, and with a ``Courtesy`` called before each query (a thread that
    validated 10,000 kept the interpreter's lock from the live events up to 20 ms at a time)."""
    seen = []

    class Counted:
        def __init__(self):
            seen.append(("made", _where()))

        def __call__(self):
            seen.append(("called", _where()))

    monkeypatch.setattr(bodies, "Courtesy", Counted)
    with CayugaClient(twin.base_url) as c:
        subs = c.subscribe_many([UP.format(s=s) for s in ("IBM", "MSFT", "DELL")])
        assert seen == [("made", "off the loop")] + [("called", "off the loop")] * 3
        assert [s["id"] for s in subs] == ["s1", "s2", "s3"]
        seen.clear()
        c.subscribe(cel=UP.format(s="HP"))  # one alone: FastAPI validates it on the loop, no courtesy to give
        assert seen == []


def _where() -> str:
    try:
        asyncio.get_running_loop()
        return "on the event loop"
    except RuntimeError:
        return "off the loop"


def test_the_document_gives_the_batch_its_body_as_fastapi_did(twin, server):
    """The server's document (its body's schema put in by :func:`bodies.with_bodies`) has what
    FastAPI draws for a declared body (the twin's probe declares one)."""
    ours = httpx.get(server.base_url + "/openapi.json").json()
    assert ours["paths"]["/subscriptions/batch"]["post"]["requestBody"] == {
        "required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/"
                                                                              "SubscriptionBatchIn"}}}}
    fastapis = httpx.get(twin.base_url + "/openapi.json").json()
    assert fastapis["paths"]["/probe/declared"]["post"]["requestBody"]["content"] == \
        ours["paths"]["/subscriptions/batch"]["post"]["requestBody"]["content"]
    fastapis_own = {"HTTPValidationError", "ValidationError"}  # FastAPI's 422 of the probe (ours documents its own)
    assert ours["components"]["schemas"] == {k: v for k, v in fastapis["components"]["schemas"].items()
                                             if k not in fastapis_own}
