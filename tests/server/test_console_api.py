"""The API the console reads: a subscription's automaton as a graph, live
instances per state, /stats; and the pages (console, offline /docs)."""

from __future__ import annotations

import time

import pytest

from air.engine import Engine, Event
from air.expr import parse_air_expr
from clients.client import CayugaAPIError, CayugaClient
from clients.testing import wait_until
from server.api.automaton import expr_text
from server.console import vendor
from tests.conftest import STOCK
from tests.server.conftest import stock

RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
          "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")


def wait_for(fn, timeout: float = 10.0):
    return wait_until(fn, timeout, what=getattr(fn, "__name__", "the condition"))


def test_the_automaton_graph_of_the_readme_query(client):
    sid = client.subscribe(cel=RISING)["id"]
    g = client.http.get(f"/subscriptions/{sid}/automaton").json()
    assert g["outputs"] == ["Rising"] and [a["name"] for a in g["automata"]] == ["Rising"]
    states = {s["key"]: s for s in g["states"]}
    assert [(k, s["start"], s["end"], s["input_stream"]) for k, s in states.items()] == [
        ("0/0", True, False, "Stock"), ("0/1", False, False, "Stock"), ("0/2", False, True, None)]
    assert [a["name"] for a in states["0/1"]["schema"]] == ["Name_1", "Price_1", "Volume_1"]
    assert states["0/2"]["outputs"] == [{"name": "Rising", "type": "OUT"}]
    assert (states["0/0"]["instances"], states["0/1"]["instances"], states["0/2"]["instances"]) == (None, 0, None)
    edges = [(e["kind"], e["from"], e["to"], e["predicate"]) for e in g["edges"]]
    assert edges == [
        ("forward", "0/0", "0/1", "TRUE"),
        ("filter", "0/1", "0/1", "EV.Name = NODE.Name_1 AND EV.Price >= 1.05 * NODE.Price_1"),
        ("forward", "0/1", "0/2", "TRUE"),
    ]
    assert g["edges"][2]["map"] == ["Name := EV.Name", "Before := NODE.Price_1", "After := EV.Price"]
    assert g["links"] == [] and g["resubscriptions"] == {"reads": [], "read_by": []}


def test_resubscription_links_between_subscriptions_and_within_one(client):
    ibm = client.subscribe(cel="SELECT Price AS IBMPrice FROM FILTER{Name='IBM'}(Stock) PUBLISH IBMStock",
                           name="ibm")["id"]
    pair = client.subscribe(cel="SELECT IBMPrice, Price AS MSFTPrice FROM IBMStock NEXT{$2.Name='MSFT'}(Stock) "
                                "PUBLISH Pair")["id"]
    a = client.http.get(f"/subscriptions/{ibm}/automaton").json()
    b = client.http.get(f"/subscriptions/{pair}/automaton").json()
    assert a["resubscriptions"] == {"reads": [], "read_by": [{"stream": "IBMStock", "subscription": pair,
                                                               "name": None}]}
    assert b["resubscriptions"] == {"reads": [{"stream": "IBMStock", "subscription": ibm, "name": "ibm"}],
                                    "read_by": []}
    # a nested PUBLISH makes two automata in one subscription, linked by the inner stream
    nested = client.subscribe(cel="(SELECT Name, Price FROM FILTER{Price > 10}(Stock) PUBLISH Dear) "
                                  "NEXT{$1.Name = $2.Name} Stock PUBLISH DearPair")["id"]
    n = client.http.get(f"/subscriptions/{nested}/automaton").json()
    assert [a["name"] for a in n["automata"]] == ["Dear", "DearPair"]
    assert n["links"] == [{"from": "0/1", "to": "1/0", "stream": "Dear"}]


def test_live_instances_per_state_and_stats(client):
    sid = client.subscribe(cel=RISING)["id"]
    client.post_events([stock("IBM", 90.0, 1, 1), stock("MSFT", 20.0, 1, 2), stock("IBM", 99.0, 1, 3),
                        stock("Dell", 50.0, 1, 4)])

    def counts():
        c = client.http.get(f"/subscriptions/{sid}/automaton/instances").json()
        return c if c["instances"]["0/1"] == 3 else None  # IBM@90 is consumed by IBM@99; three runs wait

    c = wait_for(counts)
    assert c == {"id": sid, "instances": {"0/0": 0, "0/1": 3, "0/2": 0}, "total": 3}
    graph = client.http.get(f"/subscriptions/{sid}/automaton").json()
    assert [s["instances"] for s in graph["states"]] == [None, 3, None]

    before = time.time()
    s = wait_for(lambda: (lambda j: j if j["subscriptions"][sid]["witnesses"] == 1 else None)(
        client.http.get("/stats").json()))
    after = time.time()
    assert s["received"] == 4 and s["events"] == 4 and s["streams"] == {"Stock": 4}
    assert s["witnesses"] == 1 and s["subscription_count"] == 1
    assert s["subscriptions"][sid]["witnesses"] == 1
    assert s["queue_depth"] == 0 and s["stream_time"] == 4
    # the epoch is the last event's t1 (4 ms after 1970): the lag is the server's clock minus that, in ms
    assert before * 1000 - 4 <= s["epoch_lag"] <= after * 1000 - 4
    assert before - 0.004 <= s["epoch_lag_seconds"] <= after - 0.004
    bounds, counts = zip(*s["latency_buckets"])  # cumulative, one observation per batch of events
    assert bounds[-1] is None and len(bounds) > 2 and list(bounds[:-1]) == sorted(set(bounds[:-1]))
    assert list(counts) == sorted(counts) and 1 <= counts[-1] <= 4  # 1 to 4 batches of the 4 events
    assert client.http.get("/stats", params={"limit": 0}).json()["subscriptions"] == {}
    client.unsubscribe(sid)
    assert client.http.get(f"/subscriptions/{sid}/automaton").status_code == 404
    assert client.http.get(f"/subscriptions/{sid}/automaton/instances").status_code == 404


def test_pages_are_open_and_data_needs_the_token(start_server):
    srv = start_server(auth_tokens=["sekret"])
    with CayugaClient(srv.base_url) as anon:
        page = anon.http.get("/")
        assert page.status_code == 200 and '<script type="module" src="/console/js/app.js">' in page.text
        docs = anon.http.get("/docs").text
        assert "/console/vendor/swagger-ui/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
        assert anon.http.get("/console/vendor/swagger-ui/swagger-ui-bundle.js").status_code == 200
        assert anon.http.get("/console/vendor/dagre/dagre.esm.js").status_code == 200
        assert anon.http.get("/redoc").status_code == 404  # it would need a CDN
        for path in ("/stats", "/subscriptions/s1/automaton", "/subscriptions/s1/automaton/instances"):
            assert anon.http.get(path).status_code == 401, path
    with CayugaClient(srv.base_url, token="sekret") as c:
        sid = c.subscribe(cel=RISING)["id"]
        assert c.http.get(f"/subscriptions/{sid}/automaton").status_code == 200
        assert c.http.get("/stats").status_code == 200
        with pytest.raises(CayugaAPIError):
            c.unsubscribe("s999")


@pytest.mark.parametrize("text, shown", [
    ("EV.Price >= 1.05 * NODE.Price", "EV.Price >= 1.05 * NODE.Price"),
    ("(EV.a + EV.b) * 2 > 1", "(EV.a + EV.b) * 2 > 1"),
    ("EV.a - (EV.b - EV.c) = 0", "EV.a - (EV.b - EV.c) = 0"),
    ("EV.a - EV.b - EV.c = 0", "EV.a - EV.b - EV.c = 0"),
    ("EV.a * EV.b ^ 2 < 3", "EV.a * EV.b ^ 2 < 3"),
    ("CONTAINS(EV.Name, 'IB') = 1", "CONTAINS(EV.Name, 'IB') = 1"),
])
def test_predicates_read_as_written(text, shown):
    assert expr_text(parse_air_expr(text, predicate=True)) == shown


def test_state_counts_are_per_owner_even_on_merged_states():
    eng = Engine()
    eng.declare(STOCK)
    from air.cel import compile_cel

    def autos(name):
        return compile_cel(RISING.replace("Rising", name), {"Stock": STOCK}, name_prefix=name).automata

    eng.add(autos("A"), owner="a")
    eng.run([Event("Stock", ("IBM", 90.0, 1), 1, 1)])
    eng.add(autos("B"), owner="b")  # merged with a's states, starts empty
    eng.run([Event("Stock", ("MSFT", 20.0, 1), 2, 2)])
    eng.flush()
    assert eng.state_counts("a") == {"0/0": 0, "0/1": 2, "0/2": 0}
    assert eng.state_counts("b") == {"0/0": 0, "0/1": 1, "0/2": 0}
    assert sum(eng.state_counts("a").values()) == eng.instance_count("a")


def test_vendored_assets_match_the_lock_file():
    assert vendor.check() == []
