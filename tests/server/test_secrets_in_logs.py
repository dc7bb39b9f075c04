"""No secret in a log line (issue 25): a real ``cayuga serve`` with auth
tokens, at log level info (access log on), is called with the token in query
strings -- over HTTP and as a browser's WebSocket sends it -- and its whole
output must not hold the token. Tokens are compared in constant time."""

from __future__ import annotations

import base64

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from clients.testing import ServerProcess
from server.security.tokens import TokenTable
from server.observability.redact import redact

SECRET = "s3cr3t-tok"


def test_a_token_in_a_query_string_never_reaches_the_log(tmp_path):
    with ServerProcess(tmp_path / "data", tmp_path / "server.log",
                       {"CAYUGA_AUTH_TOKENS": f'["{SECRET}"]'}) as srv:
        srv.wait_up()
        auth = {"Authorization": f"Bearer {SECRET}"}
        sid = httpx.post(f"{srv.base_url}/subscriptions", headers=auth, timeout=10,
                         json={"cel": "SELECT * FROM Stock PUBLISH Everything"}).json()["id"]
        assert httpx.get(f"{srv.base_url}/streams?token={SECRET}&x=1", headers=auth, timeout=10).status_code == 200
        assert httpx.get(f"{srv.base_url}/streams?token={SECRET}", timeout=10).status_code == 401
        ws_url = f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}?token={SECRET}"
        with connect(ws_url, open_timeout=10) as ws:  # the console's way: the token in the URL
            ws.close()
    log = (tmp_path / "server.log").read_text()
    assert "/streams?token=***&x=1" in log, log[-3000:]  # the access log is on, and redacted
    assert "WebSocket /ws/subscriptions/" in log and "token=***" in log
    assert SECRET not in log, [line for line in log.splitlines() if SECRET in line]


def test_redact_keeps_everything_but_secret_values():
    assert redact("GET /ws/subscriptions/s1?from=3&token=abc&x=1 HTTP/1.1") == \
        "GET /ws/subscriptions/s1?from=3&token=***&x=1 HTTP/1.1"
    assert redact('"WebSocket /ws/streams/Rising?TOKEN=a%20b" [accepted]') == \
        '"WebSocket /ws/streams/Rising?TOKEN=***" [accepted]'
    assert redact("/health") == "/health" and redact("tokens=2 at x") == "tokens=2 at x"


def test_tokens_compare_whole_and_exact():
    def token_ok(token, tokens):
        return TokenTable(tokens).identify(token) is not None

    assert token_ok("abc", ["x", "abc"])
    assert TokenTable(["x", "abc"]).identify("abc").name == "auth_tokens[1]"  # a name, never the secret
    assert not token_ok("ab", ["abc"]) and not token_ok("abcd", ["abc"])
    assert not token_ok("", ["abc"]) and not token_ok(None, ["abc"])
    assert token_ok("[0123]", ["[0123]"]) and token_ok("ümlaut", ["ümlaut"])


def _bearer(token: str) -> str:
    return "cayuga.bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def test_a_browser_sends_the_token_in_a_subprotocol(start_server):
    """What the console does (a browser's WebSocket has no Authorization header):
    the server picks ``cayuga`` and takes the token from ``cayuga.bearer.<base64url>``."""
    srv = start_server(auth_tokens=["sekret", "ümlaut/+="])
    with httpx.Client(base_url=srv.base_url, headers={"Authorization": "Bearer sekret"}, timeout=10) as c:
        sid = c.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH Everything"}).json()["id"]
        url = f"ws://127.0.0.1:{srv.http_port}/ws/subscriptions/{sid}"
        for token in ("sekret", "ümlaut/+="):
            with connect(url, subprotocols=["cayuga", _bearer(token)], open_timeout=10) as ws:
                assert ws.subprotocol == "cayuga"
                c.post("/events", json=[{"stream": "Stock", "Name": "IBM", "Price": 1.0, "Volume": 1, "t1": 1}])
                assert b"IBM" in ws.recv(timeout=10).encode()
        for offered in (["cayuga", _bearer("wrong")], ["cayuga", "cayuga.bearer.%%%"], ["cayuga"]):
            with connect(url, subprotocols=offered, open_timeout=10) as ws:
                with pytest.raises(ConnectionClosed) as info:
                    ws.recv(timeout=10)
                assert info.value.rcvd.code == 4401
