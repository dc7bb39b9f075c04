"""TLS through ``cayuga serve`` and the ``cayuga`` clients as a user runs them
(issue 38): the certificate reloaded on SIGHUP with a sender and a watcher
connected (none dropped, no event or witness lost, the next connections get
the new certificate, a broken file leaves the old one in use); ``cayuga
register``, ``send`` and ``watch`` over TLS with ``--cacert`` (and
``--cert``/``--key`` for mutual TLS), and what they say without them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import httpx
import pytest

from clients.client import CayugaClient, TcpSender, tls_context
from clients.testing import (ServerProcess, cayuga_command, cayuga_env, collect, make_tls_files, stock,
                             stop_process, wait_until)

TOKEN = "s3rve-token"
ALL = "SELECT * FROM Stock PUBLISH All"


def _install(files, live) -> None:
    """Put ``files``' certificate and key where the server reads them, each replaced whole."""
    for src, name in ((files.cert, "cert.pem"), (files.key, "key.pem")):
        shutil.copyfile(src, live / f"{name}.tmp")
        os.replace(live / f"{name}.tmp", live / name)


def _trusts(srv, ca) -> bool:
    """Whether a new connection trusting only ``ca`` gets through (the certificate it is shown now)."""
    try:
        return httpx.get(srv.base_url + "/health", verify=tls_context(str(ca)), timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _metric(srv, ca, line: str) -> float:
    text = httpx.get(srv.base_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"},
                     verify=tls_context(str(ca)), timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


def test_sighup_reloads_the_certificate_without_dropping_a_connection_or_an_event(tmp_path):
    first, second = make_tls_files(tmp_path / "first"), make_tls_files(tmp_path / "second")
    live = tmp_path / "live"
    live.mkdir()
    _install(first, live)
    env = {"CAYUGA_TLS_CERTFILE": str(live / "cert.pem"), "CAYUGA_TLS_KEYFILE": str(live / "key.pem"),
           "CAYUGA_AUTH_TOKENS": f'["{TOKEN}"]'}
    with ServerProcess(tmp_path / "data", settings=env, cacert=first.ca) as srv:
        client = CayugaClient(srv.base_url, token=TOKEN, cacert=str(first.ca))
        sid = client.subscribe(cel=ALL)["id"]
        sender = TcpSender("127.0.0.1", srv.tcp_port, token=TOKEN, ssl_context=client.tcp_ssl_context,
                           sender_id="through-reload", ack=True)
        try:
            with client.watch(sid, timeout=30) as matches:
                sender.send_many(stock("IBM", float(i), i, i + 1) for i in range(100))
                assert sender.wait_acked(100, 30)
                assert [w["Volume"] for w in collect(matches, 100)] == list(range(100))

                _install(second, live)
                srv.proc.send_signal(signal.SIGHUP)
                wait_until(lambda: _trusts(srv, second.ca), 30, what="a new connection to get the new certificate")
                assert not _trusts(srv, first.ca)
                assert _metric(srv, second.ca, 'cayuga_tls_reloads_total{result="ok"}') == 1

                # the connections made before go on, with the session they have
                sender.send_many(stock("IBM", float(i), i, i + 1) for i in range(100, 200))
                assert sender.wait_acked(200, 30)
                assert [w["Volume"] for w in collect(matches, 100)] == list(range(100, 200))

                (live / "cert.pem").write_text("not a certificate\n")  # a reload that fails keeps the old one
                srv.proc.send_signal(signal.SIGHUP)
                wait_until(lambda: _metric(srv, second.ca, 'cayuga_tls_reloads_total{result="failed"}') == 1, 30,
                           what="the failed reload to be counted")
                assert _trusts(srv, second.ca)
                sender.send(stock("IBM", 1.0, 200, 201))
                assert sender.wait_acked(201, 30) and collect(matches, 1)[0]["Volume"] == 200
        finally:
            assert sender.close(timeout=10) == []
            client.close()
        log = srv.log_tail(20_000)
    assert f"TLS: reloaded {live / 'cert.pem'}: new connections get it, open ones keep theirs" in log
    assert "still serving the certificate loaded before" in log


@pytest.fixture
def tls_server(tmp_path, request):
    """``cayuga serve`` with TLS (mutual TLS when the test is parametrized so) and a token."""
    files = make_tls_files(tmp_path / "tls")
    mutual = getattr(request, "param", False)
    srv = ServerProcess(tmp_path / "data", settings={**files.env(mutual), "CAYUGA_AUTH_TOKENS": f'["{TOKEN}"]'},
                        cacert=files.ca, client_cert=(files.client_cert, files.client_key) if mutual else None)
    with srv:
        yield srv, files, mutual


def _cayuga(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cayuga_command(*args), env={**cayuga_env(), "CAYUGA_TOKEN": TOKEN}, capture_output=True,
                          text=True, timeout=120, **kw)


@pytest.mark.parametrize("tls_server", [False, True], ids=["tls", "mutual-tls"], indirect=True)
def test_the_cayuga_clients_over_tls(tls_server, tmp_path):
    srv, files, mutual = tls_server
    tls_args = files.client_args(mutual)
    query = tmp_path / "all.cel"
    query.write_text(ALL)
    reg = _cayuga("register", str(query), "--url", srv.base_url, *tls_args)
    assert reg.returncode == 0, reg.stderr
    sid = reg.stdout.split()[0]
    events = tmp_path / "events.jsonl"
    events.write_text("".join(f'{{"stream": "Stock", "Name": "IBM", "Price": {i}.0, "Volume": {i}, "t1": {i + 1}}}\n'
                              for i in range(50)))
    watcher = subprocess.Popen(cayuga_command("watch", sid, "--from-start", "--count", "50", "--url", srv.base_url,
                                              *tls_args), env={**cayuga_env(), "CAYUGA_TOKEN": TOKEN},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sent = _cayuga("send", str(events), "--url", srv.base_url, *tls_args)
        assert sent.returncode == 0, sent.stderr
        out, err = watcher.communicate(timeout=120)
    finally:
        stop_process(watcher)
    assert watcher.returncode == 0, err
    assert [line.count('"Volume"') for line in out.splitlines()] == [1] * 50

    # without the CA, each says what to do (and does not retry for a minute)
    for args in (("send", str(events)), ("watch", sid), ("register", str(query))):
        r = _cayuga(*args, "--url", srv.base_url, *(["--cert", str(files.client_cert), "--key",
                                                      str(files.client_key)] if mutual else []))
        assert r.returncode == 1, (args, r.stderr)
        assert "is not signed by a CA this client trusts: give --cacert (or CAYUGA_CACERT)" in r.stderr, r.stderr
    if mutual:  # without a client certificate
        for args in (("send", str(events)), ("watch", sid), ("register", str(query))):
            r = _cayuga(*args, "--url", srv.base_url, "--cacert", str(files.ca))
            assert r.returncode == 1, (args, r.stderr)
            assert "wants a client certificate (its tls_client_ca is set): give --cert and --key" in r.stderr, \
                (args, r.stderr)
    plain = _cayuga("send", str(events), "--url", srv.base_url.replace("https", "http"))  # told at once
    assert plain.returncode == 1 and "HTTPS only" in plain.stderr, plain.stderr
    wrong = _cayuga("watch", sid, "--url", srv.base_url.replace("https", "http"), "--cacert", str(files.ca))
    assert wrong.returncode == 2 and "the URL http://" in wrong.stderr and "is not https://" in wrong.stderr


def test_spark_source_and_sink_check_their_tls_files_before_spark_starts(tmp_path):
    """cayuga spark source/sink take --cacert/--cert/--key as the other commands do (a run over TLS:
    tests/spark/test_source_sink.py); a URL or files that cannot be used are a usage error at once."""
    from click.testing import CliRunner

    from clients.cli import main

    files = make_tls_files(tmp_path / "tls")
    events = tmp_path / "e.jsonl"
    events.write_text('{"stream": "Stock", "Name": "IBM", "Price": 1.0, "Volume": 1}\n')
    runner = CliRunner()
    for args in (["spark", "sink", "s1", "--output", str(tmp_path / "out")],
                 ["spark", "source", str(events)]):
        r = runner.invoke(main, [*args, "--url", "http://127.0.0.1:1", "--cacert", str(files.ca)])
        assert r.exit_code == 2 and "the URL http://127.0.0.1:1 is not https://" in r.output, r.output
        r = runner.invoke(main, [*args, "--url", "https://127.0.0.1:1", "--key", str(files.client_key)])
        assert r.exit_code == 2 and "--key needs --cert" in r.output, r.output
        r = runner.invoke(main, [*args, "--url", "https://127.0.0.1:1", "--cacert", str(files.key)])
        assert r.exit_code == 2 and f"--cacert {files.key}: not a PEM CA certificate" in r.output, r.output
