"""SASE subscriptions through the server: registered with ``{"sase": ...}``
alone or in a batch, validated with positioned errors and warnings, matched
with negation and a window, restored after a restart with their partial
matches, run by an engine worker; and a store made before SASE takes them."""

from __future__ import annotations

import sqlite3

import pytest

from clients.client import CayugaAPIError, CayugaClient
from clients.testing import wait_until
from clients.testing.witnesses import logged_witnesses
from server.durability.store import Store, StoredSubscription
from server.serve import RunningServer
from tests.server.conftest import make_settings

STREAMS = {"SHELF": {"tag": "string", "shelf": "string"}, "COUNTER": {"tag": "string"},
           "EXIT": {"tag": "string", "gate": "int"}}
SHOP = ("EVENT SEQ(SHELF x, !(COUNTER y), EXIT z)\nWHERE [tag] AND x.shelf = 'A'\nWITHIN 12 hours\n"
        "RETURN x.tag, z.gate")
H = 3_600_000


def ev(stream: str, t1: int, **values) -> dict:
    return {"stream": stream, "t1": t1, **values}


def declare(c: CayugaClient) -> None:
    for name, schema in STREAMS.items():
        c.declare_stream(name, schema)


def witnesses(c: CayugaClient, base_url: str, sid: str, n: int) -> list[dict]:
    import json

    wait_until(lambda: c.http.get("/stats").json()["subscriptions"][sid]["witnesses"] >= n, 30,
               what=f"{n} witnesses of {sid}")
    return [json.loads(body) for _, body in logged_witnesses(base_url, sid, n)][:n]


def test_register_a_sase_query_and_get_every_match_with_negation_and_a_window(server):
    with CayugaClient(server.base_url) as c:
        declare(c)
        sub = c.subscribe(sase=SHOP, name="shoplifting")
        detail = c.subscription(sub["id"])
        assert detail["kind"] == "sase" and detail["text"] == SHOP and sub["warnings"] == []
        assert sub["outputs"] == [sub["id"]] and sub["internal_streams"] == [f"{sub['id']}__u"]
        assert detail["air"].startswith("<NFAs>") and 'InputStreamName="SHELF"' in detail["air"]
        c.post_events([ev("SHELF", 1 * H, tag="t1", shelf="A"), ev("SHELF", 2 * H, tag="t1", shelf="A"),
                       ev("SHELF", 2 * H + 1, tag="t2", shelf="B"), ev("EXIT", 3 * H, tag="t1", gate=1),
                       ev("COUNTER", 4 * H, tag="t1"), ev("EXIT", 5 * H, tag="t1", gate=2),
                       ev("SHELF", 6 * H, tag="t3", shelf="A"), ev("EXIT", 19 * H, tag="t3", gate=3),
                       ev("EXIT", 19 * H + 1, tag="t2", gate=4)])
        got = witnesses(c, server.base_url, sub["id"], 2)
        assert sorted((w["t0"], w["t1"], w["tag"], w["gate"]) for w in got) == [
            (1 * H, 3 * H, "t1", 1), (2 * H, 3 * H, "t1", 1)]  # t1 paid at 4h; t3 outside 12 h; t2 not at A
        assert c.http.get("/stats").json()["subscriptions"][sub["id"]]["witnesses"] == 2


def test_validate_gives_positioned_errors_refusals_and_warnings(client):
    declare(client)
    v = client.validate(sase=SHOP)
    assert v["valid"] and v["errors"] == [] and v["warnings"] == [] and "<NFAs>" in v["air"]
    v = client.validate(sase="EVENT SEQ(SHELF x, EXTI z)")
    assert not v["valid"] and v["errors"] == [{
        "kind": "name", "line": 1, "column": 20, "excerpt": "  EVENT SEQ(SHELF x, EXTI z)\n                     ^",
        "message": "unknown event type 'EXTI'; did you mean 'EXIT'? (an event type is a declared stream; "
                   "declared: COUNTER, DUAL, EXIT, SHELF, Stock)"}]
    (e,) = client.validate(sase="EVENT SEQ(!(COUNTER y), EXIT z) WITHIN 1 hour")["errors"]
    assert e["kind"] == "refused" and (e["line"], e["column"]) == (1, 11) and "docs/design/sase.md" in e["message"]
    (w,) = client.validate(sase="EVENT SEQ(SHELF x,\n  EXIT z) WHERE [tag]")["warnings"]
    assert w["code"] == "unbounded_instances" and (w["line"], w["column"]) == (2, 3)
    with pytest.raises(CayugaAPIError) as info:
        client.subscribe(sase="EVENT SEQ(SHELF x, !(COUNTER y))")
    assert info.value.status == 400 and info.value.body["errors"][0]["kind"] == "refused"  # as a CEL error
    r = client.http.post("/subscriptions", json={"sase": SHOP, "cel": "SELECT * FROM Stock"})
    assert r.status_code == 422 and "exactly one of 'cel'" in r.text and "'sase'" in r.text


def test_a_batch_mixes_sase_and_cel(client):
    declare(client)
    subs = client.subscribe_many([{"sase": SHOP}, "SELECT * FROM FILTER{gate > 1}(EXIT) PUBLISH Far",
                                  {"sase": "EVENT SEQ(SHELF x, EXIT z) WHERE [tag] WITHIN 1 hour PUBLISH Quick"}])
    assert [s["kind"] for s in subs] == ["sase", "cel", "sase"] and subs[2]["outputs"] == ["Quick"]


def test_a_restart_restores_the_subscription_and_its_partial_matches(tmp_path):
    settings = make_settings(tmp_path)
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        declare(c)
        sub = c.subscribe(sase=SHOP)
        c.post_events([ev("SHELF", 1 * H, tag="t1", shelf="A")])
        wait_until(lambda: c.http.get("/stats").json()["subscriptions"][sub["id"]]["instances"] >= 1, 30,
                   what="the partial match")
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        assert c.subscription(sub["id"])["kind"] == "sase"
        c.post_events([ev("EXIT", 2 * H, tag="t1", gate=7)])
        (w,) = witnesses(c, srv.base_url, sub["id"], 1)
        assert (w["t0"], w["t1"], w["tag"], w["gate"]) == (1 * H, 2 * H, "t1", 7)


def test_an_engine_worker_runs_it_the_same(start_server):
    srv = start_server(engine_workers=1)
    with CayugaClient(srv.base_url) as c:
        declare(c)
        sub = c.subscribe(sase="EVENT SEQ(SHELF x, EXIT z, !(COUNTER y)) WHERE [tag] WITHIN 5 RETURN z.gate")
        c.post_events([ev("SHELF", 1, tag="a", shelf="A"), ev("EXIT", 2, tag="a", gate=1),
                       ev("SHELF", 3, tag="b", shelf="A"), ev("EXIT", 4, tag="b", gate=2),
                       ev("COUNTER", 6, tag="b"), ev("COUNTER", 9, tag="z")])
        (w,) = witnesses(c, srv.base_url, sub["id"], 1)
        assert (w["t0"], w["t1"], w["gate"]) == (1, 6, 1)  # a: t = 5, reported at 6; b: paid at 6 <= 7


def test_a_store_made_before_sase_takes_sase_subscriptions(tmp_path):
    path = tmp_path / "store.db"
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE subscriptions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('cel', 'air')), text TEXT NOT NULL, name TEXT,
            created REAL NOT NULL);
        CREATE TABLE counters (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO subscriptions (id, kind, text, name, created) VALUES ('s1', 'cel', 'SELECT * FROM Stock', NULL, 1);
        INSERT INTO subscriptions (id, kind, text, name, created) VALUES ('s7', 'air', '<NFA/>', 'x', 2);
        INSERT INTO counters VALUES ('subscription', 9);
    """)
    db.close()
    store = Store(path)
    try:
        store.save_subscription(StoredSubscription("s10", "sase", SHOP, None, 3.0))
        assert [(s.id, s.kind) for s in store.subscriptions()] == [("s1", "cel"), ("s7", "air"), ("s10", "sase")]
        assert store.peek_ids(1) == ["s11"]
    finally:
        store.close()
    Store(path).close()  # opened again: nothing more to do
