"""TLS on both ports (issue 38): real handshakes on loopback, each port each
case -- a good certificate, a CA the client does not trust, an expired
certificate, plain text on a TLS port, mutual TLS without (or with a wrong)
client certificate -- and the errors a person reads. Certificates are made in
the test (clients/testing/tls.py, trustme); none is committed."""

from __future__ import annotations

import json
import socket
import ssl

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus
from websockets.sync.client import connect

from clients.client import CayugaClient, TcpSender, explain_tls, tls_context
from clients.testing import collect, make_tls_files, stock, wait_until
from server.observability.counters import TLS_HANDSHAKE_FAILED, TLS_PLAINTEXT
from server.security.tls import TlsError

TOKEN = "adm1n-token"
ALL = "SELECT * FROM Stock PUBLISH All"


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Certificates of CAs the server does not know."""
    return make_tls_files(tmp_path_factory.mktemp("other"))


def _http(srv, ctx) -> int:
    return httpx.get(srv.base_url + "/health", verify=ctx, timeout=10).status_code


def _ws(srv, ctx, sid: str) -> None:
    url = srv.base_url.replace("https://", "wss://") + f"/ws/subscriptions/{sid}"
    with connect(url, ssl=ctx, additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=10) as ws:
        ws.close()


def _tcp(srv, ctx) -> int:
    """A TLS connection to the event port, answered #resume (its handshake and token done)."""
    s = TcpSender("127.0.0.1", srv.tcp_port, token=TOKEN, ssl_context=ctx, sender_id="probe", timeout=10)
    s.close(timeout=10)
    return s.resume


def _failures(srv, port: str) -> int:
    return srv.daemon.counters.get(TLS_HANDSHAKE_FAILED[port])


def test_a_good_certificate_serves_every_port(start_server, tls):
    srv = start_server(auth_tokens=[TOKEN], **tls.settings())
    assert srv.base_url.startswith("https://")
    with CayugaClient(srv.base_url, token=TOKEN, cacert=str(tls.ca)) as c:
        assert c.health()["status"] == "ok"
        sub = c.subscribe(cel=ALL)  # REST over TLS
        with c.watch(sub["id"], timeout=10) as matches:  # wss://
            with c.sender() as s:  # the TCP port, TLS with the same certificate
                s.send(stock("IBM", 1.0, 1, 1))
            c.post_events([stock("IBM", 2.0, 2, 2)])
            assert [w["Price"] for w in collect(matches, 2)] == [1.0, 2.0]
        assert s.errors == []
        assert c.whoami()["tls"] is True
    raw = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    with tls_context(str(tls.ca)).wrap_socket(raw, server_hostname="localhost") as t:
        assert t.version() in ("TLSv1.2", "TLSv1.3")
        assert any(("DNS", "localhost") == n for n in t.getpeercert()["subjectAltName"])
    assert _failures(srv, "http") == _failures(srv, "tcp") == 0


def test_a_certificate_from_an_unknown_ca_is_refused_on_every_port(start_server, tls, other):
    srv = start_server(auth_tokens=[TOKEN], **tls.settings())
    sid = CayugaClient(srv.base_url, token=TOKEN, cacert=str(tls.ca)).subscribe(cel=ALL)["id"]
    wrong = tls_context(str(other.ca))
    with pytest.raises(httpx.ConnectError) as http:
        _http(srv, wrong)
    with pytest.raises(ssl.SSLCertVerificationError):
        _ws(srv, wrong, sid)
    with pytest.raises(ssl.SSLCertVerificationError) as tcp:
        _tcp(srv, wrong)
    for exc in (http.value, tcp.value):
        assert "give --cacert (or CAYUGA_CACERT) with the CA that signed it" in explain_tls(exc, srv.base_url)
    wait_until(lambda: _failures(srv, "http") == 2 and _failures(srv, "tcp") == 1,
               what="the server to count the failed handshakes")
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know the test CA either
        _tcp(srv, tls_context())


def test_an_expired_certificate_is_refused_on_every_port(start_server, tmp_path):
    old = make_tls_files(tmp_path / "old", expired=True)
    srv = start_server(auth_tokens=[TOKEN], **old.settings())
    ctx = tls_context(str(old.ca))
    with pytest.raises(httpx.ConnectError) as http:
        _http(srv, ctx)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
        _ws(srv, ctx, "s1")
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
        _tcp(srv, ctx)
    assert "certificate has expired" in explain_tls(http.value, srv.base_url)
    assert "renew it" in explain_tls(http.value, srv.base_url)
    assert srv.daemon.security.tls.expires < srv.daemon.security.tls.loaded_at


def test_plain_text_on_a_tls_port_is_refused_with_a_clear_error(start_server, tls):
    srv = start_server(auth_tokens=[TOKEN], **tls.settings())
    plain = srv.base_url.replace("https://", "http://")
    r = httpx.get(plain + "/subscriptions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 400
    assert r.json()["detail"].startswith(f"this server speaks HTTPS only (its tls_certfile is set): use "
                                         f"https://127.0.0.1:{srv.http_port}/subscriptions (wss:// for WebSockets)")
    with pytest.raises(InvalidStatus) as ws:
        connect(plain.replace("http://", "ws://") + "/ws/subscriptions/s1", open_timeout=10)
    assert ws.value.response.status_code == 400 and b"HTTPS only" in ws.value.response.body
    with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10) as s:
        s.sendall(f"#token {TOKEN}\n".encode() + json.dumps(stock("IBM", 1.0, 1, 1)).encode() + b"\n")
        answer = s.makefile("rb").read().decode()
    assert answer == ("error: this port takes TLS only (the server has tls_certfile set): connect with TLS, e.g. "
                      "cayuga send --url https://HOST:HTTP_PORT --cacert CA.pem (TcpSender(..., ssl_context=...)); "
                      "closing\n")
    assert srv.daemon.counters.get(TLS_PLAINTEXT["http"]) == 2
    assert srv.daemon.counters.get(TLS_PLAINTEXT["tcp"]) == 1
    assert srv.daemon.counters.get(TLS_HANDSHAKE_FAILED["tcp"]) == 0
    with CayugaClient(srv.base_url.replace("https://", "http://"), token=TOKEN) as c:
        assert c.http.get("/health").status_code == 400  # nothing plain is served, /health included


def test_mutual_tls_wants_a_client_certificate_on_every_port(start_server, tls, other):
    srv = start_server(auth_tokens=[TOKEN], **tls.settings(mutual=True))
    good = tls_context(str(tls.ca), str(tls.client_cert), str(tls.client_key))
    with CayugaClient(srv.base_url, token=TOKEN, ssl_context=good) as c:
        sid = c.subscribe(cel=ALL)["id"]
        with c.watch(sid, timeout=10) as matches:
            with c.sender() as s:
                s.send(stock("IBM", 1.0, 1, 1))
            assert collect(matches, 1)[0]["Name"] == "IBM"
    assert _tcp(srv, good) == 0
    for ctx, words in ((tls_context(str(tls.ca)), "give --cert and --key"),  # no client certificate
                       (tls_context(str(tls.ca), str(other.client_cert), str(other.client_key)),  # another CA's
                        "its tls_client_ca did not sign it")):
        with pytest.raises(httpx.HTTPError) as http:
            _http(srv, ctx)
        with pytest.raises((OSError, InvalidMessage, ConnectionClosed)) as ws:  # websockets: "did not receive a valid HTTP response", or closed
            _ws(srv, ctx, sid)
        with pytest.raises(ssl.SSLError) as tcp:
            _tcp(srv, ctx)
        assert ws.value is not None  # websockets says only that the handshake got no answer; cayuga watch asks REST
        for exc in (http.value, tcp.value):  # first (GET /subscriptions/{id}), which says why
            assert words in explain_tls(exc, srv.base_url), exc
    wait_until(lambda: _failures(srv, "http") == 4 and _failures(srv, "tcp") == 2,
               what="the server to count the refused client certificates")


def test_tls_files_that_cannot_be_used_stop_the_start_and_say_why(tmp_path, tls, other):
    from clients.testing import server_settings
    from server.serve import RunningServer

    cases = [({"tls_certfile": tmp_path / "gone.pem"}, f"tls_certfile {tmp_path / 'gone.pem'}: no such file"),
             ({"tls_certfile": tls.cert, "tls_keyfile": other.key},
              "the private key in tls_keyfile does not belong to the certificate in tls_certfile"),
             ({"tls_certfile": tls.key, "tls_keyfile": tls.key}, "tls_certfile must be PEM"),
             ({"tls_certfile": tls.cert, "tls_keyfile": tls.key, "tls_client_ca": tls.key},
              "tls_client_ca holds no PEM certificate")]
    for i, (overrides, words) in enumerate(cases):
        with pytest.raises(TlsError) as info:
            RunningServer(server_settings(tmp_path / f"data{i}", **overrides))
        assert words in str(info.value)


def test_cayuga_serve_refuses_to_start_on_a_missing_certificate(tmp_path):
    import subprocess

    from clients.testing import cayuga_command, cayuga_env

    env = {**cayuga_env(), "CAYUGA_TLS_CERTFILE": str(tmp_path / "cert.pem")}
    r = subprocess.run(cayuga_command("serve", "--data-dir", str(tmp_path / "data"), "--http-port", "0",
                                      "--tcp-port", "0"), env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"cayuga: TLS: tls_certfile {tmp_path / 'cert.pem'}: no such file; give a PEM certificate" in r.stderr
