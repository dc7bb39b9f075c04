"""Scoped tokens (issue 38): each scope against every operation of the OpenAPI
document (generated from it: a new route cannot skip its scope), the
WebSocket and TCP paths; tokens limited to their own subscriptions or to name
prefixes; repeated wrong tokens slowed down per address, never another
address."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from clients.client import CayugaAPIError, CayugaClient, SenderRefused, TcpSender
from clients.testing import collect, stock
from server.config import SCOPES
from server.security.throttle import FIRST_WAIT, FREE_FAILURES, MAX_ADDRESSES, MAX_WAIT, AuthThrottle

#: One token per scope, named after it; and two that reach only some subscriptions.
TOKENS = [{"name": s, "token": f"{s}-secret", "scopes": [s]} for s in SCOPES] + [
    {"name": "team-own", "token": "own-secret", "scopes": ["manage", "watch"], "own": True},
    {"name": "team-a", "token": "prefix-secret", "scopes": ["manage", "watch"], "prefixes": ["a_"]}]
#: The operations anyone may call.
OPEN = {("get", "/health"), ("get", "/livez"), ("get", "/readyz")}


def secret(name: str) -> str:
    return next(t["token"] for t in TOKENS if t["name"] == name)


def _client(srv, name: str | None = None, address: str | None = None) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address) if address else None
    return httpx.Client(base_url=srv.base_url, timeout=30, transport=transport,
                        headers={"Authorization": f"Bearer {secret(name)}"} if name else {})


def _ws(srv, path: str, token: str | None, address: str = "127.0.0.1"):
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10, source_address=(address, 0))
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return connect(f"ws://127.0.0.1:{srv.http_port}{path}", sock=sock, additional_headers=headers, open_timeout=10)


def _closed(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    return info.value.rcvd.code, info.value.rcvd.reason


def _operations(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


def test_every_operation_answers_each_scope_as_its_openapi_document_declares(start_server):
    srv = start_server(auth_tokens=TOKENS)
    with _client(srv, "admin") as admin:
        sid = admin.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()["id"]
    doc = httpx.get(srv.base_url + "/openapi.json", timeout=10).json()
    ops = list(_operations(doc))
    assert {(m, p) for m, p, op in ops if "security" not in op} == OPEN  # every other one declares a scope
    params = {"sid": sid, "name": "Stock"}
    clients = {s: _client(srv, s) for s in SCOPES}
    tried = 0
    try:
        for method, path, op in ops:
            if (method, path) in OPEN:
                continue
            (requirement,) = op["security"]
            needed = requirement["bearerAuth"]  # [] (any token of the server) or [scope]
            assert len(needed) <= 1 and set(needed) <= set(SCOPES), (method, path, needed)
            url = path.format(**params)
            body = {"json": {}} if "requestBody" in op else {}  # a body the operation refuses: never its scope
            for scope, c in clients.items():
                r = c.request(method.upper(), url, **body)
                if not needed or scope in (needed[0], "admin"):
                    assert r.status_code not in (401, 403, 429), (method, path, scope, r.status_code, r.text)
                else:
                    assert r.status_code == 403, (method, path, scope, r.status_code)
                    assert r.json() == {"detail": f"token {scope} lacks the {needed[0]} scope that {method.upper()} "
                                                  f"{path} needs (its scopes: {scope}); use a token with {needed[0]} "
                                                  f"(or admin), or add {needed[0]} to this token's scopes in "
                                                  "auth_tokens", "missing_scope": needed[0]}
                tried += 1
            with _client(srv) as anonymous:
                assert anonymous.request(method.upper(), url, **body).status_code == 401
            with _client(srv, address=f"127.0.1.{tried % 250 + 1}") as wrong:  # an address each: none is slowed
                wrong.headers["Authorization"] = "Bearer not-a-token"
                r = wrong.request(method.upper(), url, **body)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path)
    finally:
        for c in clients.values():
            c.close()
    assert tried == len(SCOPES) * (len(ops) - len(OPEN))


def test_websockets_need_the_watch_scope(start_server):
    srv = start_server(auth_tokens=TOKENS)
    with CayugaClient(srv.base_url, token=secret("admin")) as admin:
        sid = admin.subscribe(cel="SELECT * FROM Stock PUBLISH All")["id"]
        for path in (f"/ws/subscriptions/{sid}", "/ws/streams/All"):
            for scope in SCOPES:
                with _ws(srv, path, secret(scope)) as ws:
                    if scope in ("watch", "admin"):
                        admin.post_events([stock("IBM", 1.0, 1, None)])
                        assert json.loads(ws.recv(timeout=10))["Name"] == "IBM"
                    else:
                        code, reason = _closed(ws)
                        assert code == 4403 and reason.startswith(f"forbidden: token {scope} lacks the watch scope")
            for token in (None, "not-a-token"):
                with _ws(srv, path, token, address="127.0.2.1") as ws:
                    assert _closed(ws) == (4401, "missing or wrong token")


def test_the_tcp_port_needs_the_ingest_scope(start_server):
    srv = start_server(auth_tokens=TOKENS)
    for scope in SCOPES:
        if scope in ("ingest", "admin"):
            s = TcpSender("127.0.0.1", srv.tcp_port, token=secret(scope), sender_id=f"by-{scope}", ack=True)
            s.send(stock("IBM", 1.0, 1, None))
            assert s.wait_acked(1, 30) and s.close(10) == []
        else:
            with pytest.raises(SenderRefused) as info:
                TcpSender("127.0.0.1", srv.tcp_port, token=secret(scope), sender_id="x")
            assert info.value.answer == (f"error line 1: forbidden: token {scope} lacks the ingest scope that "
                                         f"sending events over TCP needs (its scopes: {scope}); use a token with "
                                         f"ingest (or admin), or add ingest to this token's scopes in auth_tokens; "
                                         "closing")


def test_a_token_limited_to_its_own_subscriptions(start_server):
    srv = start_server(auth_tokens=TOKENS)
    with CayugaClient(srv.base_url, token=secret("admin")) as admin, \
            CayugaClient(srv.base_url, token=secret("team-own")) as own:
        theirs = admin.subscribe(cel="SELECT * FROM Stock PUBLISH Theirs", name="theirs")["id"]
        mine = own.subscribe(cel="SELECT * FROM Stock PUBLISH Mine")["id"]
        reader = admin.subscribe(cel="SELECT * FROM Mine PUBLISH ReadsMine")["id"]
        assert [s["id"] for s in own.subscriptions()] == [mine]
        assert own.whoami() == {"auth": True, "tls": False, "name": "team-own", "scopes": ["watch", "manage"],
                                "effective_scopes": ["watch", "manage"], "own": True, "prefixes": []}
        for call in (lambda: own.subscription(theirs), lambda: own.unsubscribe(theirs),
                     lambda: own.http.get(f"/subscriptions/{theirs}/automaton").raise_for_status()):
            with pytest.raises((CayugaAPIError, httpx.HTTPStatusError)) as info:
                call()
            assert "403" in str(info.value)
        r = own.http.get(f"/subscriptions/{theirs}")
        assert r.json() == {"detail": f"token team-own reaches only those it registered, not subscription {theirs}; "
                                      "use a token that reaches it (admin reaches every one)", "missing_scope": None}
        with _ws(srv, f"/ws/subscriptions/{theirs}", secret("team-own")) as ws:
            assert _closed(ws) == (4403, f"forbidden: token team-own does not reach subscription {theirs}")
        with _ws(srv, "/ws/streams/Theirs", secret("team-own")) as ws:
            assert _closed(ws)[0] == 4403
        assert [x["name"] for x in own.streams()] == ["Mine", "Stock"]  # not the streams others publish
        assert list(own.http.get("/stats").json()["subscriptions"]) == [mine]

        before = [s["id"] for s in admin.subscriptions()]
        with pytest.raises(CayugaAPIError) as info:  # reading what others publish, through a query of its own
            own.subscribe(cel="SELECT * FROM Theirs PUBLISH Copy")
        assert info.value.status == 403 and "the query reads Theirs, published by subscriptions token team-own " \
                                            "does not reach" in str(info.value)
        assert [s["id"] for s in admin.subscriptions()] == before  # nothing was registered

        with pytest.raises(CayugaAPIError) as info:  # a cascade would delete a subscription of another's
            own.unsubscribe(mine, cascade=True)
        assert info.value.status == 403 and f"cascade=true would delete {reader}" in str(info.value)
        admin.unsubscribe(reader)
        own.unsubscribe(mine)
        assert own.subscriptions() == []


def test_a_token_limited_to_name_prefixes(start_server):
    srv = start_server(auth_tokens=TOKENS)
    with CayugaClient(srv.base_url, token=secret("admin")) as admin, \
            CayugaClient(srv.base_url, token=secret("team-a")) as team:
        ax = admin.subscribe(cel="SELECT * FROM Stock PUBLISH AX", name="a_x")["id"]
        admin.subscribe(cel="SELECT * FROM Stock PUBLISH BY", name="b_y")
        for name in (None, "b_mine"):
            with pytest.raises(CayugaAPIError) as info:
                team.subscribe(cel="SELECT * FROM Stock PUBLISH Mine", name=name)
            assert info.value.status == 403 and "registers only subscriptions named with a prefix of its own (a_)" \
                in str(info.value)
        with pytest.raises(CayugaAPIError) as info:
            team.subscribe_many([{"cel": "SELECT * FROM Stock PUBLISH M1", "name": "a_1"},
                                 {"cel": "SELECT * FROM Stock PUBLISH M2"}])
        assert info.value.status == 403 and str(info.value).startswith("HTTP 403: subscriptions[1]: token team-a")
        mine = team.subscribe(cel="SELECT * FROM AX PUBLISH Mine", name="a_mine")["id"]  # reads a_x: in reach
        assert [s["id"] for s in team.subscriptions()] == [ax, mine]
        with team.watch(ax, timeout=10) as matches:
            admin.post_events([stock("IBM", 1.0, 1, None)])
            assert collect(matches, 1)[0]["stream"] == "AX"


def test_wrong_tokens_slow_their_address_down_and_no_other(start_server):
    srv = start_server(auth_tokens=TOKENS)
    now = [1000.0]
    srv.daemon.security.throttle.clock = lambda: now[0]  # the backoff's clock, moved by the test alone
    slow, other = "127.0.3.1", "127.0.3.2"
    with _client(srv, address=slow) as bad:
        bad.headers["Authorization"] = "Bearer guess"
        for _ in range(FREE_FAILURES + 1):  # the free failures, then one that closes the address for FIRST_WAIT
            assert bad.get("/streams").status_code == 401
    with _client(srv, "admin", address=slow) as good_but_slowed:
        r = good_but_slowed.get("/streams")  # while it waits, no token of that address is even looked at
        assert r.status_code == 429 and r.headers["retry-after"] == str(int(FIRST_WAIT))
        assert r.json()["detail"].startswith(f"too many wrong tokens from {slow}: retry in 1 s")
    with _client(srv, "admin", address=other) as elsewhere:
        assert elsewhere.get("/streams").status_code == 200
    with _ws(srv, "/ws/streams/Stock", secret("admin"), address=slow) as ws:
        assert _closed(ws) == (4429, f"too many wrong tokens from {slow}: retry in 1 s")
    with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10, source_address=(slow, 0)) as s:
        s.sendall(f"#token {secret('ingest')}\n".encode())
        assert s.makefile("rb").read() == f"error line 1: too many wrong tokens from {slow}: retry in 1 s; " \
                                          "closing\n".encode()
    now[0] += FIRST_WAIT
    with _client(srv, "admin", address=slow) as good:
        assert good.get("/streams").status_code == 200
        good.headers["Authorization"] = "Bearer guess again"
        assert good.get("/streams").status_code == 401
        assert good.get("/streams").headers["retry-after"] == str(int(2 * FIRST_WAIT))  # doubled
        good.headers["Authorization"] = f"Bearer {secret('admin')}"
        assert good.get("/audit").status_code == 429  # the admin token too, from that address, for now
    with _client(srv, "admin") as admin:
        audit = admin.get("/audit", params={"address": slow}).json()["records"]
        metrics = admin.get("/metrics").text
    assert [r["reason"] for r in audit if r["action"] == "auth.failure"] == ["wrong"] * (FREE_FAILURES + 2)
    assert [(r["failures"], r["wait_seconds"]) for r in audit if r["action"] == "auth.throttled"] == [(6, 1), (7, 2)]
    assert 'cayuga_auth_failures_total{port="http",reason="throttled"} 4.0' in metrics
    assert 'cayuga_auth_failures_total{port="tcp",reason="throttled"} 1.0' in metrics
    assert f'cayuga_auth_failures_total{{port="http",reason="wrong"}} {FREE_FAILURES + 2}.0' in metrics
    assert "guess" not in json.dumps(audit)  # a wrong token is never written down either


def test_the_backoff_doubles_to_its_cap_forgets_and_stays_bounded():
    now = [0.0]
    t = AuthThrottle(clock=lambda: now[0])
    waits = [t.failed("a") for _ in range(FREE_FAILURES + 9)]
    assert waits[:FREE_FAILURES] == [0.0] * FREE_FAILURES
    assert waits[FREE_FAILURES:] == [min(FIRST_WAIT * 2 ** k, MAX_WAIT) for k in range(9)]
    assert t.wait("a") == MAX_WAIT and t.wait("b") == 0.0
    now[0] += 3600  # quiet for an hour: forgotten
    assert t.wait("a") == 0.0 and t.failed("a") == 0.0 and t.failures("a") == 1
    for i in range(MAX_ADDRESSES + 10):
        t.failed(f"10.0.{i // 250}.{i % 250}")
    assert len(t) == MAX_ADDRESSES
