"""Runaway queries (issues 19 and 31). A FOLD whose rebind is always true makes
one instance per event, and every event visits each of them: the whole server
slows. /health names such a subscription by what it costs — the instances each
event of its stream visits, its share of the engine's work, how much it grows
per event — from the state budget's checks (server/budget.py), which come at
fixed points of the input: the tests wait for what they assert, never for a
clock. A runaway given a cap (``max_instances``) stays within it after every
check, and is marked inexact, while honest subscriptions go on exactly."""

from __future__ import annotations

import time

from clients.client import CayugaClient
from clients.testing import wait_until
from server.budget import CAP_CHECK_EVENTS, CHECK_EVENTS, RUNAWAY_VISITS
from tests.server.conftest import stock

RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND "
          "$2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")
RUNAWAY = "SELECT * FROM Stock FOLD{$2.Price < 0, true, } Stock"


def _events(start: int, n: int) -> list[dict]:
    """Quotes of 10 stocks; each stock's price rises 10% every tenth of its quotes (Rising matches)."""
    return [stock(f"S{i % 10}", 10.0 * (1.1 if (i // 10) % 10 == 9 else 1.0), 1, i) for i in range(start, start + n)]


def test_health_names_the_runaway_by_what_it_costs(start_server):
    srv = start_server(time="event")
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        rising = c.subscribe(cel=RISING)["id"]
        runaway = c.subscribe(cel=RUNAWAY)["id"]
        assert c.health()["status"] == "ok" and c.health()["holding_back"] is None
        # the first check sees it above RUNAWAY_VISITS; the second sees it grow by one per event
        sent = 2 * CHECK_EVENTS
        with c.sender() as snd:
            snd.send_many(_events(1, sent))
        h = wait_until(lambda: (h := c.health())["runaways"] and h, what="the runaway named")
        assert h["status"] == "warning" and list(h["runaways"]) == [runaway], h
        heavy = h["holding_back"]
        assert heavy["subscription"] == runaway
        assert heavy["visits_per_event"] >= RUNAWAY_VISITS and heavy["share"] > 0.5
        assert h["runaways"][runaway]["growth_per_event"] == 1.0
        assert "FOLD" in heavy["reason"] and "DUR" in heavy["reason"] and "max_instances" in heavy["reason"]
        assert c.subscription(runaway)["runaway"]["visits_per_event"] == heavy["visits_per_event"]
        assert c.subscription(rising)["runaway"] is None
        assert h["inexact"] == {}  # named, not shed: the default budget holds it
        witnesses = d.activity()[1].get(rising, 0)
        assert witnesses > 0
        with c.sender() as snd:  # events still flow, and Rising still matches
            snd.send_many(_events(sent + 1, 500))
        wait_until(lambda: d.activity()[1].get(rising, 0) > witnesses, what="Rising's new witnesses")
        c.unsubscribe(runaway)
        wait_until(lambda: c.health()["holding_back"] is None, what="the warning gone with the subscription")
        assert c.health()["status"] == "ok"


def test_a_runaway_with_a_cap_stays_within_it_after_every_check(start_server):
    """Counted only once a second, a runaway used to grow by as many instances as
    events came meanwhile; now a capped one is brought back to 90% of its cap at
    every CAP_CHECK_EVENTS-th event, whatever the machine's speed."""
    limit = 200
    srv = start_server(time="event", engine_workers=0)  # white-box: it counts on the engine thread itself
    d = srv.daemon
    seen: list[tuple[int, int]] = []
    feed = d.processing.feed
    with CayugaClient(srv.base_url) as c:
        runaway = c.subscribe(cel=RUNAWAY, max_instances=limit)["id"]

        def counting_feed(batch):  # engine thread: the runaway's instances after each batch, before the check
            feed(batch)
            seen.append((d.processing.fed, d.engine.instance_count(runaway)))

        d.processing.feed = counting_feed
        with c.sender() as snd:
            snd.send_many(_events(1, 6000))
        wait_until(lambda: d.events_taken == 6000, what="the events processed")
        sub = c.subscription(runaway)
    keep = int(limit * 0.9)
    # at most what it kept at the last check plus the events since (one instance each)
    assert all(n <= keep + (fed % CAP_CHECK_EVENTS or CAP_CHECK_EVENTS) for fed, n in seen if fed > CAP_CHECK_EVENTS)
    assert max(n for _fed, n in seen) <= keep + CAP_CHECK_EVENTS
    assert sub["exact"] is False and sub["inexact"]["instances_lost"] >= 6000 - keep - CAP_CHECK_EVENTS
    assert sub["runaway"] is None  # within its cap it costs little


def test_health_names_the_heaviest_subscription_when_the_queue_fills(start_server):
    """The engine falls behind (the queue more than half full): /health names the
    subscription with the most live instances."""
    srv = start_server(queue_capacity=10)
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        light = c.subscribe(cel="SELECT * FROM FILTER{Price < 0}(Stock)")["id"]
        pairs = c.subscribe(cel="SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock")["id"]
        now = int(time.time() * 1000)
        c.post_events([stock(f"S{i}", 1.0, 1, now) for i in range(5)])  # 5 instances wait for their pair
        wait_until(lambda: d.heaviest == (pairs, 5), what="a count pass")
        assert c.health()["holding_back"] is None  # the queue is empty: nothing held back
        c.post_events([stock("IBM", 1.0, 1, now + 600_000)] * 8)  # due in ten minutes: they wait
        h = c.health()
        assert h["status"] == "warning" and h["holding_back"]["subscription"] == pairs != light
        assert "8 of 10 queued events" in h["holding_back"]["reason"]
