"""Backtest, then go live (issue 36): a subscription registered with "from" runs over
the retained history on an engine of its own and joins the live engine exactly at
the cut: its witnesses are `cayuga run`'s over history + live, none missing, none twice."""

from __future__ import annotations

import io
import json
import random

import pytest

from clients.client import CayugaClient
from clients.offline import run_offline
from clients.testing import wait_until
from clients.testing.market import STOCK
from tests.server.conftest import stock

RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
          "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")


def ticks(n: int, seed: int = 5) -> list[dict]:
    """Quotes of 5 names, t increasing with ties (several quotes at one time)."""
    rnd = random.Random(seed)
    out, t = [], 1
    for _ in range(n):
        t += rnd.choice((0, 1, 1, 2))
        out.append(stock(rnd.choice("ABCDE"), round(rnd.uniform(80, 100), 1), 1, t))
    return out


def shuffled_blocks(events: list[dict], size: int, seed: int = 9) -> list[list[dict]]:
    """Blocks in time order, each shuffled: the queue sorts them (never late: a block is taken whole)."""
    rnd = random.Random(seed)
    blocks = [events[i:i + size] for i in range(0, len(events), size)]
    for b in blocks:
        rnd.shuffle(b)
    return blocks


def cayuga_run(tmp_path, cel: str, events: list[dict]) -> list[dict]:
    f = tmp_path / "q.cel"
    f.write_text(cel)
    data = "".join(json.dumps(e) + "\n" for e in events).encode()
    return run_offline([STOCK], [f], io.BytesIO(data)).witnesses


def register(client: CayugaClient, cel: str, start, expect: int = 201) -> dict:
    r = client.http.post("/subscriptions", json={"cel": cel, "from": start})
    assert r.status_code == expect, r.text
    return r.json()


def all_witnesses(client: CayugaClient, sid: str, n: int) -> list[dict]:
    """Every witness from seq 1, each once (seq checked), as the witness log and the live stream give them."""
    got = []
    with client.frames(sid, from_=1, timeout=20) as frames:
        while len(got) < n:
            for line in next(frames).split("\n"):
                seq, _, body = line.partition(" ")
                assert int(seq) == len(got) + 1
                got.append(json.loads(body))
    return got


def wait_live(client: CayugaClient, sid: str) -> dict:
    wait_until(lambda: client.subscription(sid)["backfill"]["state"] in ("handing_over", "live"), 60,
               what="the backfill's hand-over")
    return client.subscription(sid)["backfill"]


def taken(client: CayugaClient, n: int) -> None:
    wait_until(lambda: client.health()["events_taken"] >= n, 30, what=f"{n} events taken")


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_history_then_live_equals_cayuga_run_with_no_gap_and_no_duplicate(start_server, tmp_path, workers):
    events = ticks(3000)
    start = events[600]["t1"]
    history, live = events[:2000], events[2000:]
    srv = start_server(engine_workers=workers)
    first, then = shuffled_blocks(history, 97), shuffled_blocks(live, 53)
    events = [e for b in first + then for e in b]  # the arrival order: `cayuga run` of this file breaks ties so too
    with CayugaClient(srv.base_url) as client:
        for block in first:
            client.post_events(block)
        taken(client, len(history))
        sub = register(client, RISING, start)
        assert sub["backfill"]["from"] == start and sub["backfill"]["state"] in ("running", "handing_over", "live")
        for block in then:  # while the backfill runs: history and live interleave
            client.post_events(block)
        taken(client, len(events))
        bf = wait_live(client, sub["id"])
        expected = cayuga_run(tmp_path, RISING, [e for e in events if e["t1"] >= start])
        assert len(expected) > 100
        got = all_witnesses(client, sub["id"], len(expected))
        replayed = [w.pop("replay", False) for w in got]
        assert got == expected
        k = replayed.count(True)
        assert replayed == [True] * k + [False] * (len(got) - k)  # history first, then live
        assert k == bf["witnesses"] > 0
        assert bf["events_done"] > 0 and bf["to"] is not None
        # live from here on, on the live engine
        end = max(e["t1"] for e in events)
        more = [stock("A", 10.0, 1, end + 1), stock("A", 20.0, 1, end + 2)]
        client.post_events(more)
        again = cayuga_run(tmp_path, RISING, [e for e in events + more if e["t1"] >= start])
        assert len(again) > len(expected)
        got = all_witnesses(client, sub["id"], len(again))
        assert [w.pop("replay", None) for w in got[k:]] == [None] * (len(again) - k)
        assert [{x: v for x, v in w.items() if x != "replay"} for w in got] == again


def test_from_before_the_retained_history_is_refused_with_the_range(client):
    client.post_events([stock("A", 10.0, 1, 100), stock("A", 11.0, 1, 105)])
    taken(client, 2)
    r = client.http.post("/subscriptions", json={"cel": RISING, "from": 99})
    assert r.status_code == 400
    body = r.json()
    assert body["retained"] == {"from": 100, "to": 105}
    assert "before the history the server retains: events from 100 to 105" in body["detail"]
    assert client.subscriptions() == []
    for bad in ("yesterday", "-3 parsecs"):
        r = client.http.post("/subscriptions", json={"cel": RISING, "from": bad})
        assert r.status_code == 400 and "duration" in r.json()["detail"], r.text
    r = client.http.post("/subscriptions/batch", json={"subscriptions": [{"cel": RISING, "from": 100}]})
    assert r.status_code == 422 and "POST /subscriptions" in r.text
    r = client.http.post("/subscriptions", json={"cel": "SELECT * FROM Nope", "from": 100})
    assert r.status_code == 400 and r.json()["errors"][0]["line"] == 1


def test_relative_and_retained_from(client, tmp_path):
    events = ticks(400)
    client.post_events(events)
    taken(client, len(events))
    newest = events[-1]["t1"]
    sub = register(client, RISING, "-100ms")  # time_unit_ms 1: 100 units before the newest event
    assert sub["backfill"]["from"] == newest - 100
    sub2 = register(client, RISING, "retained")
    assert sub2["backfill"]["from"] == events[0]["t1"]
    for s, start in ((sub, newest - 100), (sub2, events[0]["t1"])):
        wait_live(client, s["id"])
        expected = cayuga_run(tmp_path, RISING, [e for e in events if e["t1"] >= start])
        got = all_witnesses(client, s["id"], len(expected))
        assert [{x: v for x, v in w.items() if x != "replay"} for w in got] == expected
        assert all(w["replay"] is True for w in got)


def test_preview_gives_the_first_witnesses_and_their_count_and_installs_nothing(client, tmp_path):
    events = ticks(1500)
    client.post_events(events)
    taken(client, len(events))
    expected = cayuga_run(tmp_path, RISING, events)
    r = client.http.post("/subscriptions/preview", json={"cel": RISING, "from": "retained", "limit": 7})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["count"] == len(expected) and got["truncated"] is True
    assert got["witnesses"] == expected[:7]
    assert (got["from"], got["to"], got["events"]) == (events[0]["t1"], events[-1]["t1"], len(events))
    assert client.subscriptions() == []
    start = events[700]["t1"]
    r = client.http.post("/subscriptions/preview", json={"cel": RISING, "from": start, "limit": 10000})
    later = cayuga_run(tmp_path, RISING, [e for e in events if e["t1"] >= start])
    assert r.json()["witnesses"] == later and r.json()["truncated"] is False
    r = client.http.post("/subscriptions/preview", json={"cel": RISING, "from": 0})
    assert r.status_code == 400 and r.json()["retained"]["from"] == events[0]["t1"]
    r = client.http.post("/subscriptions/preview", json={"cel": "SELECT * FROM Stock WHERE", "limit": 5})
    assert r.status_code == 400 and "line" in r.json()["errors"][0]
    r = client.http.post("/subscriptions/preview", json={"cel": RISING, "limit": 10001})
    assert r.status_code == 422


def test_retention_is_on_health_and_metrics(client):
    client.post_events([stock("A", 10.0, 1, 1000), stock("A", 11.0, 1, 2000)])
    taken(client, 2)
    kept = client.health()["retained"]
    assert kept["from"] == 1000 and kept["to"] == 2000 and kept["bytes"] > 0 and kept["segments"] == 1
    metrics = client.http.get("/metrics").text
    assert "cayuga_journal_retained_from_seconds 1.0" in metrics
    assert f"cayuga_journal_retained_bytes {float(kept['bytes'])}" in metrics


def test_a_deleted_backfill_stops_and_leaves_nothing(client):
    events = ticks(2000)
    client.post_events(events)
    taken(client, len(events))
    sub = register(client, RISING, "retained")
    client.unsubscribe(sub["id"])
    assert client.subscriptions() == []
    client.post_events([stock("A", 10.0, 1, events[-1]["t1"] + 5)])
    taken(client, len(events) + 1)


def test_a_stop_during_a_backfill_leaves_nothing_behind_and_the_restart_runs_it_again(start_server, tmp_path):
    events = ticks(20000, seed=3)
    srv = start_server()
    with CayugaClient(srv.base_url) as client:
        for i in range(0, len(events), 5000):
            client.post_events(events[i:i + 5000])
        taken(client, len(events))
        sid = register(client, RISING, "retained")["id"]
    srv.stop()  # drained at once: the backfill's thread and engine process end with it (the fixture checks)
    again = start_server()
    with CayugaClient(again.base_url) as client:
        wait_live(client, sid)
        expected = cayuga_run(tmp_path, RISING, events)
        got = all_witnesses(client, sid, len(expected))
        assert [{k: v for k, v in w.items() if k != "replay"} for w in got] == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_a_live_backfilled_subscription_comes_back_from_the_snapshot_with_nodes_of_its_own(start_server, tmp_path,
                                                                                          workers):
    """Restarted once live: installed unmerged again (an identical query registered before it shares
    nothing with it), its instances from the snapshot: witnesses go on as `cayuga run`'s."""
    events = ticks(3000, seed=21)
    srv = start_server(engine_workers=workers)
    with CayugaClient(srv.base_url) as client:
        plain = client.subscribe(cel=RISING)["id"]  # the same query, live only: it would merge
        client.post_events(events[:2000])
        taken(client, 2000)
        sid = register(client, RISING, "retained")["id"]
        wait_until(lambda: client.subscription(sid)["backfill"]["state"] == "live", 60, what="live")
        client.post_events(events[2000:2500])
        taken(client, 2500)
    srv.stop()
    again = start_server(engine_workers=workers)
    with CayugaClient(again.base_url) as client:
        assert client.subscription(sid)["backfill"]["state"] == "live"
        client.post_events(events[2500:])
        taken(client, len(events))
        expected = cayuga_run(tmp_path, RISING, events)
        got = all_witnesses(client, sid, len(expected))
        assert [{k: v for k, v in w.items() if k != "replay"} for w in got] == expected
        assert all_witnesses(client, plain, len(expected)) == expected  # the live-only one saw all of them too
