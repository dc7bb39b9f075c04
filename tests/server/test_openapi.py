"""The OpenAPI contract (issue 25): every operation of a real server's
/openapi.json has a stable snake_case operationId, a summary and a
description; every 4xx and 5xx it declares carries the one error body; 401 and
the bearer scheme where the token applies; real media types. And the real
error answers of a running server are declared for their operation and are
that error body."""

from __future__ import annotations

import re

import httpx
import pytest

from server.api.schemas import ErrorOut
from tests.server.conftest import stock

TOKEN = "contract-token"
ERROR_REF = "#/components/schemas/ErrorOut"
#: The probes answer 503 with their own body (the state), not an error, and need no token.
PROBES = {"/health", "/livez", "/readyz"}
#: The operation ids client generators name their methods after: changing one breaks clients.
OPERATION_IDS = {
    ("get", "/streams"): "list_streams",
    ("post", "/streams"): "declare_stream",
    ("get", "/streams/{name}"): "get_stream",
    ("get", "/subscriptions"): "list_subscriptions",
    ("post", "/subscriptions"): "create_subscription",
    ("post", "/subscriptions/batch"): "create_subscriptions",
    ("post", "/subscriptions/validate"): "validate_subscription",
    ("post", "/subscriptions/preview"): "preview_subscription",
    ("get", "/subscriptions/{sid}"): "get_subscription",
    ("delete", "/subscriptions/{sid}"): "delete_subscription",
    ("get", "/subscriptions/{sid}/automaton"): "get_automaton",
    ("get", "/subscriptions/{sid}/automaton/instances"): "get_automaton_instances",
    ("post", "/events"): "post_events",
    ("get", "/health"): "get_health",
    ("get", "/livez"): "get_liveness",
    ("get", "/readyz"): "get_readiness",
    ("get", "/metrics"): "get_metrics",
    ("get", "/stats"): "get_stats",
    ("get", "/whoami"): "get_whoami",
    ("get", "/audit"): "get_audit",
}
#: The scope each operation's token needs (issue 38; [] any token of the server): clients and operators read it
#: from the security requirement, tests/server/test_scopes.py holds the server to it.
SCOPES = {"list_streams": ["watch"], "declare_stream": ["manage"], "get_stream": ["watch"],
          "list_subscriptions": ["watch"], "create_subscription": ["manage"], "create_subscriptions": ["manage"],
          "validate_subscription": ["manage"], "preview_subscription": ["manage"], "get_subscription": ["watch"], "delete_subscription": ["manage"],
          "get_automaton": ["watch"], "get_automaton_instances": ["watch"], "post_events": ["ingest"],
          "get_metrics": ["metrics"], "get_stats": ["watch"], "get_whoami": [], "get_audit": ["admin"]}


@pytest.fixture
def srv(start_server):
    return start_server(auth_tokens=[TOKEN], max_body_bytes=1024)


@pytest.fixture
def doc(srv) -> dict:
    r = httpx.get(srv.base_url + "/openapi.json", timeout=10)  # open: the contract is no secret
    assert r.status_code == 200
    return r.json()


def _operations(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


def test_every_operation_is_named_described_and_declares_its_errors(doc):
    ops = list(_operations(doc))
    assert {(m, p): op.get("operationId") for m, p, op in ops} == OPERATION_IDS
    for method, path, op in ops:
        where = f"{method.upper()} {path}"
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", op["operationId"]), where
        assert op.get("summary", "").strip() and op.get("description", "").strip(), f"{where}: undescribed"
        for status, answer in op["responses"].items():
            assert answer.get("description", "").strip(), f"{where} {status}: undescribed"
            if int(status) < 400 or path in PROBES:
                continue
            assert answer["content"] == {"application/json": {"schema": {"$ref": ERROR_REF}}}, (where, status)
        if path in PROBES:
            assert "security" not in op and "401" not in op["responses"], where
        else:
            assert op["security"] == [{"bearerAuth": SCOPES[op["operationId"]]}], where
            assert "401" in op["responses"] and "429" in op["responses"], where
            assert ("403" in op["responses"]) == bool(SCOPES[op["operationId"]]), where
            assert "**Scope:**" in op["description"], where
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearerAuth"][
            "description"]}
    # the error body is the model the server builds its answers from, and FastAPI's own
    # (a list of validation errors, which this server never sends) is gone
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert schemas["ErrorOut"]["required"] == ["detail"] and schemas["ErrorOut"]["additionalProperties"] is False
    assert set(schemas["ErrorOut"]["properties"]) == set(ErrorOut.model_fields)


def test_real_media_types(doc, srv):
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert sorted(t.split(";")[0] for t in metrics) == ["application/openmetrics-text", "text/plain"]
    r = httpx.get(srv.base_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.headers["content-type"] in metrics  # the declared type, parameters and all
    events = doc["paths"]["/events"]["post"]["requestBody"]["content"]
    assert list(events) == ["application/json"]
    assert httpx.get(srv.base_url + "/docs", timeout=10).status_code == 200  # Swagger UI reads the document


def _declared(doc: dict, method: str, path: str, status: int) -> dict:
    responses = doc["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} answered {status}, which it does not declare"
    return responses[str(status)]


def test_real_error_answers_are_declared_and_match_the_error_body(doc, srv):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=srv.base_url, headers=auth, timeout=30) as c:
        assert c.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH Pub"}).status_code == 201
        assert c.post("/subscriptions", json={"cel": "SELECT * FROM Pub PUBLISH Reader"}).status_code == 201
        sid = c.get("/subscriptions").json()[0]["id"]
        calls = [  # (operation, the request, the status it must answer)
            ("get", "/subscriptions", httpx.Request("GET", srv.base_url + "/subscriptions"), 401),
            ("get", "/metrics", httpx.Request("GET", srv.base_url + "/metrics",
                                              headers={"Authorization": "Bearer wrong"}), 401),
            ("post", "/subscriptions", c.build_request("POST", "/subscriptions",
                                                       json={"cel": "SELECT * FROM Stock NEXT{Nme = } Stock"}), 400),
            ("post", "/subscriptions", c.build_request("POST", "/subscriptions", json={"name": "neither"}), 422),
            ("get", "/subscriptions/{sid}", c.build_request("GET", "/subscriptions/s999"), 404),
            ("get", "/streams/{name}", c.build_request("GET", "/streams/Nope"), 404),
            ("get", "/subscriptions/{sid}/automaton", c.build_request("GET", "/subscriptions/s999/automaton"), 404),
            ("post", "/streams", c.build_request("POST", "/streams",
                                                 json={"name": "Stock", "schema": {"Other": "int"}}), 409),
            ("delete", "/subscriptions/{sid}", c.build_request("DELETE", f"/subscriptions/{sid}"), 409),
            ("post", "/events", c.build_request("POST", "/events", json=[stock("IBM", 1.0, 1, t)
                                                                        for t in range(1, 100)]), 413),
            ("post", "/events", c.build_request("POST", "/events", content=b"IBM,1.0,1",
                                                headers={"content-type": "text/plain"}), 415),
            ("post", "/events", c.build_request("POST", "/events", content=b"{not json",
                                                headers={"content-type": "application/json"}), 400),
            ("get", "/stats", c.build_request("GET", "/stats", params={"limit": -1}), 422),
        ]
        for method, path, request, status in calls:
            r = c.send(request)
            assert r.status_code == status, (method, path, r.status_code, r.text[:300])
            declared = _declared(doc, method, path, status)
            assert declared["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}
            body = ErrorOut.model_validate_json(r.content)  # no field missing, none the schema does not know
            assert body.detail.strip(), (method, path)
            if status == 401:
                assert r.headers["www-authenticate"] == "Bearer"
            if status == 409 and method == "delete":
                assert len(body.readers or []) == 1  # the extra field the 409 carries, typed as declared
            if status == 400 and path == "/subscriptions":
                assert body.errors and body.errors[0]["line"] == 1


def test_the_bearer_scheme_reads_the_token_as_before(srv):
    """The scheme word in any case, as before the bearer scheme was declared."""
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}"):
        assert httpx.get(srv.base_url + "/streams", headers={"Authorization": header}, timeout=10).status_code == 200
    for header in (f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x"):
        r = httpx.get(srv.base_url + "/streams", headers={"Authorization": header}, timeout=10)
        assert r.status_code == 401 and "Authorization: Bearer <token>" in r.json()["detail"], header
