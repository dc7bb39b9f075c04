"""Every operation of /openapi.json under schemathesis-generated requests,
on a real server, with and without auth. What it proves: every answer is one
that /openapi.json documents for its operation (its status code, content type
and body schema) and none is a 5xx (each request has a timeout: a hang fails
too), and the server stays healthy after each operation's examples. With auth, without the token every route
but the open probes (/health, /livez, /readyz) answers 401, and with the token
none does (the token opens)."""

from __future__ import annotations

import pytest
import schemathesis
from schemathesis.checks import (
    content_type_conformance, not_a_server_error, response_schema_conformance, status_code_conformance,
)
from hypothesis import given, settings

from tests.conftest import examples
from tests.fuzz.conftest import healthy

TOKEN = "fuzz-token"
#: The routes open without a token: the probes.
OPEN = ("/health", "/livez", "/readyz")


@pytest.fixture(scope="module")
def open_server(fuzz_server):
    return fuzz_server()


@pytest.fixture(scope="module")
def auth_server(fuzz_server):
    return fuzz_server(auth_tokens=[TOKEN])


def _operations(base_url: str):
    """Every operation of the server's /openapi.json (WebSockets are not in it)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


#: What each answer must be: no 5xx, and documented (status code, content type, body schema).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _no_server_error(case, base_url: str, headers: dict | None = None):
    response = case.call(base_url=base_url, headers=headers, timeout=30)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
    case.validate_response(response, checks=CHECKS, headers=headers)  # raises, saying what differs
    return response


def test_no_request_breaks_the_server(open_server):
    ops = _operations(open_server.base_url)
    assert len(ops) >= 10

    for op in ops:
        @given(case=op.as_strategy())
        @settings(examples(0.25))  # per operation, on a real server
        def run(case):
            _no_server_error(case, open_server.base_url)

        run()
        healthy(open_server.base_url)


def test_with_auth_no_token_is_401_and_the_token_opens(auth_server):
    for op in _operations(auth_server.base_url):
        @given(case=op.as_strategy())
        @settings(examples(0.1))  # per operation, two requests each
        def run(case):
            # without a token: schemathesis may make up an Authorization header from the bearer scheme, and
            # wrong tokens from one address are slowed down (429) after a few (server/security/throttle.py)
            for name in [h for h in (case.headers or {}) if h.lower() == "authorization"]:
                del case.headers[name]
            r = _no_server_error(case, auth_server.base_url)
            if case.path not in OPEN:
                assert r.status_code == 401, (case.method, case.path, r.status_code)
            r = _no_server_error(case, auth_server.base_url, {"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code != 401, (case.method, case.path, r.text[:300])

        run()
        healthy(auth_server.base_url, TOKEN)
