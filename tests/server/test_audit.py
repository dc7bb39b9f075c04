"""Who changed what (issue 38): every registration, deletion, stream
declaration and refused token in the audit log, with the token's name (never
its secret) and the client's address; read with GET /audit (admin), across a
restart and across rotated files."""

from __future__ import annotations

import json
import stat

import pytest

from clients.client import CayugaAPIError, CayugaClient
from server.security.audit import FILE, AuditLog

TOKENS = [{"name": "ops", "token": "ops-secret-1", "scopes": ["admin"]},
          {"name": "deployer", "token": "deploy-secret-2", "scopes": ["manage", "watch"]},
          {"name": "dashboard", "token": "dash-secret-3", "scopes": ["watch"]},
          {"name": "team-own", "token": "own-secret-4", "scopes": ["manage", "watch"], "own": True}]
SECRETS = [t["token"] for t in TOKENS]


def _client(srv, name: str) -> CayugaClient:
    return CayugaClient(srv.base_url, token=next(t["token"] for t in TOKENS if t["name"] == name))


def _strip(records: list[dict]) -> list[dict]:
    """The records without their times (checked apart)."""
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


def test_the_audit_log_says_who_changed_what_and_survives_a_restart(start_server, tmp_path):
    srv = start_server(auth_tokens=TOKENS)
    with _client(srv, "deployer") as dep, _client(srv, "team-own") as own, _client(srv, "dashboard") as dash:
        dep.declare_stream("Temp", {"Room": "string", "Celsius": "float"})
        dep.declare_stream("Temp", {"Room": "string", "Celsius": "float"})  # the same again: no change, no record
        s1, s2 = (s["id"] for s in dep.subscribe_many([{"cel": "SELECT * FROM Temp PUBLISH Warm", "name": "warm"},
                                                       "SELECT * FROM Warm PUBLISH Warmer"]))
        s3 = own.subscribe(cel="SELECT * FROM Stock PUBLISH Mine")["id"]
        with pytest.raises(CayugaAPIError):
            dash.unsubscribe(s3)  # watch only: refused, and recorded
        dep.unsubscribe(s1, cascade=True)  # deletes s2 too
    with CayugaClient(srv.base_url, token="not-a-token") as stranger, pytest.raises(CayugaAPIError):
        stranger.streams()
    srv.stop()

    again = start_server(auth_tokens=TOKENS)  # the same data directory
    with _client(again, "ops") as ops, _client(again, "team-own") as own:
        assert [s["id"] for s in own.subscriptions()] == [s3]  # still its own after the restart
        own.unsubscribe(s3)
        log = ops.audit()
    assert log["more"] is False
    assert _strip(log["records"]) == [
        {"action": "stream.declare", "token": "deployer", "address": "127.0.0.1", "port": "http", "stream": "Temp",
         "schema": {"Room": "string", "Celsius": "float"}},
        {"action": "subscription.register", "token": "deployer", "address": "127.0.0.1", "port": "http",
         "subscriptions": [s1, s2], "names": ["warm", None]},
        {"action": "subscription.register", "token": "team-own", "address": "127.0.0.1", "port": "http",
         "subscriptions": [s3], "names": [None]},
        {"action": "auth.failure", "token": "dashboard", "address": "127.0.0.1", "port": "http", "reason": "scope",
         "what": "DELETE /subscriptions/{sid}"},
        {"action": "subscription.delete", "token": "deployer", "address": "127.0.0.1", "port": "http",
         "subscriptions": [s2, s1]},
        {"action": "auth.failure", "token": None, "address": "127.0.0.1", "port": "http", "reason": "wrong",
         "what": "GET /streams"},
        {"action": "subscription.delete", "token": "team-own", "address": "127.0.0.1", "port": "http",
         "subscriptions": [s3]}]
    assert all(r["time"].endswith("Z") and r["time"][10] == "T" for r in log["records"])
    with _client(again, "ops") as ops:  # who registered, then who deleted, a subscription
        assert [(r["action"], r["token"]) for r in ops.audit(subscription=s2)["records"]] == [
            ("subscription.register", "deployer"), ("subscription.delete", "deployer")]
        assert [r["what"] for r in ops.audit(action="auth.failure", token="dashboard")["records"]] == [
            "DELETE /subscriptions/{sid}"]
        assert len(ops.audit(limit=2)["records"]) == 2 and ops.audit(limit=2)["more"] is True
    path = tmp_path / "data" / "audit" / FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert not [s for s in SECRETS + ["not-a-token"] if s in text]
    assert [json.loads(line)["action"] for line in text.splitlines()][-1] == "subscription.delete"


def test_the_audit_log_rotates_and_is_read_across_its_files(tmp_path):
    log = AuditLog(tmp_path / "audit", max_bytes=4096, files=3)
    try:
        for i in range(300):
            log.record("subscription.register", token="deployer", address="10.0.0.1", subscriptions=[f"s{i}"],
                       names=[None])
    finally:
        log.close()
    files = sorted(p.name for p in (tmp_path / "audit").iterdir())
    assert files == [FILE, f"{FILE}.1", f"{FILE}.2"]
    assert all((tmp_path / "audit" / f).stat().st_size <= 4096 for f in files)
    kept, more = log.read(limit=10_000)
    ids = [r["subscriptions"][0] for r in kept]
    assert not more and ids == [f"s{i}" for i in range(300 - len(ids), 300)] and 50 < len(ids) < 300
    newest, more = log.read(limit=5)
    assert more and [r["subscriptions"][0] for r in newest] == [f"s{i}" for i in range(295, 300)]
    assert log.read(subscription=ids[0])[0][0]["subscriptions"] == [ids[0]]  # in the oldest file kept
    assert log.read(subscription="s0") == ([], False)  # rotated away


def test_a_flood_without_a_token_is_one_record_a_minute_per_address(start_server):
    """Requests without a token cost a writer nothing to send: written one by one they would rotate
    the records of changes out of the log. One record a minute per address, with how many more came."""
    srv = start_server(auth_tokens=TOKENS)
    now = [0.0]
    srv.daemon.security.repeats.clock = lambda: now[0]  # the window's clock, moved by the test alone
    with CayugaClient(srv.base_url) as anonymous:
        for _ in range(50):
            assert anonymous.http.get("/streams").status_code == 401
        now[0] += 60
        assert anonymous.http.get("/subscriptions").status_code == 401
    with _client(srv, "ops") as ops:
        records = ops.audit(action="auth.failure")["records"]
        metrics = ops.http.get("/metrics").text
    assert [(r["reason"], r["what"], r.get("repeated")) for r in records] == [
        ("missing", "GET /streams", None), ("missing", "GET /subscriptions", 49)]
    assert 'cayuga_auth_failures_total{port="http",reason="missing"} 51.0' in metrics  # the metric has them all
