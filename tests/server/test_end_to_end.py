"""The server end to end: REST, TCP in, WebSocket out, with exact witnesses."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from clients.client import CayugaAPIError, CayugaClient
from tests.server.conftest import collect, stock

PAIRS = "SELECT Name, Price_1 AS First, Price AS Second FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"


def test_register_cel_watch_and_send_over_tcp(client):
    sub = client.subscribe(cel=PAIRS, name="pairs")
    assert sub["outputs"] == ["Pairs"] and sub["websocket"] == f"/ws/subscriptions/{sub['id']}"
    with client.watch(sub["id"], timeout=10) as matches:
        with client.sender() as s:
            s.send_many([stock("IBM", 10.0, 1, 1), stock("MSFT", 5.0, 1, 2), stock("IBM", 11.5, 1, 3),
                         stock("MSFT", 6.0, 1, 4)])
        got = collect(matches, 2)
    assert got == [
        {"stream": "Pairs", "t0": 1, "t1": 3, "Name": "IBM", "First": 10.0, "Second": 11.5},
        {"stream": "Pairs", "t0": 2, "t1": 4, "Name": "MSFT", "First": 5.0, "Second": 6.0},
    ]


def test_resubscription_across_two_subscriptions(client):
    ibm = client.subscribe(cel="SELECT Price AS IBMPrice FROM FILTER{Name='IBM' AND Price > 83}(Stock) "
                               "PUBLISH IBMStock")
    pair = client.subscribe(cel="SELECT IBMPrice, Price AS MSFTPrice FROM IBMStock NEXT{$2.Name='MSFT'}(Stock) "
                                "PUBLISH IBM_MSFT_PAIR")
    assert client.subscription(pair["id"])["outputs"] == ["IBM_MSFT_PAIR"]
    with client.watch(pair["id"], timeout=10) as pairs, client.watch(stream="IBMStock", timeout=10) as ibms:
        client.post_events([stock("IBM", 90.0, 1, 1), stock("IBM", 80.0, 1, 2), stock("MSFT", 30.0, 1, 3)])
        assert collect(pairs, 1) == [{"stream": "IBM_MSFT_PAIR", "t0": 1, "t1": 3, "IBMPrice": 90.0,
                                      "MSFTPrice": 30.0}]
        assert collect(ibms, 1) == [{"stream": "IBMStock", "t0": 1, "t1": 1, "IBMPrice": 90.0}]
    assert ibm["id"] != pair["id"]


def test_air_subscription_and_its_description(client):
    air = open("tests/conformance/air/T4.xml").read()
    sub = client.subscribe(air=air)
    detail = client.subscription(sub["id"])
    assert detail["kind"] == "air" and detail["text"] == air and "<NFA>" in detail["air"]
    assert [s["id"] for s in client.subscriptions()] == [sub["id"]]
    with client.watch(sub["id"], timeout=10) as m:
        client.post_events({"events": [stock("IBM", 150.0, 1, 5), stock("IBM", 50.0, 1, 6)]})
        assert collect(m, 1) == [{"stream": "T4", "t0": 5, "t1": 5, "Name": "IBM", "Price": 150.0, "Volume": 1}]
    client.unsubscribe(sub["id"])
    with pytest.raises(CayugaAPIError) as info:
        client.subscription(sub["id"])
    assert info.value.status == 404


def test_malformed_lines_get_an_error_line_and_the_connection_stays_open(client):
    sub = client.subscribe(cel="SELECT * FROM FILTER{Price > 100}(Stock) PUBLISH Big")
    with client.watch(sub["id"], timeout=10) as m:
        with client.sender() as s:
            s.send('{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": "x", "Volume": 1}')
            s.send("garbage")
            s.send(stock("IBM", 150.0, 2, 2))
            errors = s.close()
        assert collect(m, 1) == [{"stream": "Big", "t0": 2, "t1": 2, "Name": "IBM", "Price": 150.0, "Volume": 2}]
    assert errors == ["error line 1: attribute 'Price' must be float, got 'x'",
                      "error line 2: invalid JSON: expected a JSON object at column 1"]
    assert 'cayuga_events_rejected_total{source="tcp"} 2.0' in client.http.get("/metrics").text


def test_other_line_formats_per_connection(client):
    sub = client.subscribe(cel="SELECT Name FROM FILTER{Volume = 7}(Stock) PUBLISH Sevens")
    with client.watch(sub["id"], timeout=10) as m:
        with client.sender(fmt="cayuga") as s:
            s.send("IBM, 1.0, 7, Stock, 1, 1")
        with client.sender(fmt="csv") as s:
            s.send("stream,t0,t1,Name,Price,Volume")
            s.send("Stock,2,2,MSFT,2.0,7")
        assert collect(m, 2) == [{"stream": "Sevens", "t0": 1, "t1": 1, "Name": "IBM"},
                                 {"stream": "Sevens", "t0": 2, "t1": 2, "Name": "MSFT"}]


def test_events_without_timestamps_get_the_server_clock(client, server):
    import time

    sub = client.subscribe(cel="SELECT * FROM Stock PUBLISH All")
    before = time.time() * 1000
    with client.watch(sub["id"], timeout=10) as m:
        with client.sender() as s:
            s.send({"stream": "Stock", "Name": "IBM", "Price": 1.0, "Volume": 1})
        (w,) = collect(m, 1)
    assert w["t0"] == w["t1"] and before - 1 <= w["t1"] <= time.time() * 1000 + 1


def test_streams_api(client):
    assert client.declare_stream("Temp", {"Room": "string", "Celsius": "float"}) == {
        "name": "Temp", "schema": {"Room": "string", "Celsius": "float"}, "kind": "declared"}
    again = client.http.post("/streams", json={"name": "Temp", "schema": {"Room": "string", "Celsius": "float"}})
    assert again.status_code == 200
    clash = client.http.post("/streams", json={"name": "Temp", "schema": {"Room": "string"}})
    assert clash.status_code == 409 and "already exists as Temp(Room string, Celsius float)" in clash.json()["detail"]
    client.subscribe(cel="SELECT Room FROM FILTER{Celsius > 30}(Temp) PUBLISH Hot")
    names = {s["name"]: s["kind"] for s in client.streams()}
    assert names == {"Stock": "declared", "Temp": "declared", "Hot": "published"}
    assert client.http.get("/streams/Nope").status_code == 404


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/subscriptions", {"cel": "SELECT * FROM Stock NEXT{$1.Name = } Stock"}, 400, "line 1, column 36"),
    ("/subscriptions", {"cel": "SELECT * FROM Bonds"}, 400, "unknown stream 'Bonds'"),
    ("/subscriptions", {"cel": "x", "air": "<NFA/>"}, 422, "give exactly one of 'cel'"),
    ("/subscriptions", {"air": "<NFA><Node/></NFA>"}, 400, "element <Node>: The attribute 'NodeType' is required"),
    ("/subscriptions", {}, 422, "give exactly one of 'cel'"),
    ("/streams", {"name": "S", "schema": {"a": "integr"}}, 422, "unknown attribute type 'integr'"),
    ("/streams", {"name": "9S", "schema": {"a": "int"}}, 422, "name: the stream name '9S' starts with a digit"),
    ("/streams", {"name": "S"}, 422, "schema: Field required"),
])
def test_bad_bodies_are_4xx_with_what_to_fix(client, path, body, status, fragment):
    r = client.http.post(path, json=body)
    assert r.status_code == status, r.text
    assert fragment in r.text


def test_an_unknown_body_field_names_the_fields_a_query_goes_in(client):
    """Issue 35: {"query": ...} was "body.query: Extra inputs are not permitted"."""
    from server.api.schemas import QUERY_LANGUAGES

    for path, body, where in (("/subscriptions", {"query": "SELECT * FROM Stock"}, "body"),
                              ("/subscriptions/validate", {"query": "SELECT * FROM Stock"}, "body"),
                              ("/subscriptions/batch", {"subscriptions": [{"cel": "Stock"}, {"query": "Stock"}]},
                               "body.subscriptions.1")):
        r = client.http.post(path, json=body)
        assert r.status_code == 422, r.text
        (error,) = r.json()["errors"]
        assert error["where"] == where
        assert error["problem"].startswith("unknown field 'query': send the query as 'cel' (CEL text)")
        assert error["problem"].endswith(" (the other fields: name, max_instances, max_state_bytes, from)")
        assert all(f"'{k}' ({v})" in error["problem"] for k, v in QUERY_LANGUAGES.items())  # the one list
        assert r.json()["detail"] == f"invalid request body: {where}: {error['problem']}"
    assert client.subscriptions() == []


def test_cel_error_body_has_line_column_and_excerpt(client):
    r = client.http.post("/subscriptions", json={"cel": "SELECT *\nFROM Stock NEXT{$1.Nme = $2.Name} Stock"})
    assert r.status_code == 400
    (err,) = r.json()["errors"]
    assert (err["line"], err["column"]) == (2, 17)
    assert "Nme" in err["message"] and err["excerpt"].splitlines()[1].strip() == "^"


def test_validate_registers_nothing_and_lists_every_syntax_error(client):
    r = client.http.post("/subscriptions/validate", json={"cel": "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock"})
    assert r.json()["valid"] is True and "<NFA>" in r.json()["air"]
    bad = client.validate(cel="SELECT * FROM FILTER{Price > } (Stock) NEXT{Name = } Stock")
    assert bad["valid"] is False and len(bad["errors"]) == 2
    assert client.subscriptions() == []


def test_post_events_reports_each_bad_event(client):
    r = client.post_events([stock("IBM", 1.0, 1, 1), {"stream": "Nope"}, {"stream": "Stock", "t1": 2}])
    assert r["accepted"] == 1
    assert r["rejected"] == [{"index": 1, "error": "unknown stream 'Nope'; declare it first"},
                             {"index": 2, "error": "stream Stock: missing attribute 'Name'"}]


def test_unknown_subscription_websocket_is_closed_with_4404(client):
    with pytest.raises(CayugaAPIError) as info:
        with client.watch("s999", timeout=5) as m:
            next(m)
    assert info.value.status == 4404


def test_health_and_metrics(client, server):
    h = client.health()
    assert h["status"] == "ok" and h["engine_thread"] is True and h["tcp_port"] == server.tcp_port
    text = client.http.get("/metrics").text
    for name in ("cayuga_events_received_total", "cayuga_events_late_total", "cayuga_queue_depth",
                 "cayuga_epoch_lag_seconds", "cayuga_instances", "cayuga_witnesses_total", "cayuga_client_drops_total",
                 "cayuga_engine_latency_seconds_bucket"):
        assert name in text
    assert client.http.get("/docs").status_code == 200
    assert "/subscriptions/validate" in client.http.get("/openapi.json").json()["paths"]


def test_auth_tokens(start_server):
    srv = start_server(auth_tokens=["sekret"])
    with CayugaClient(srv.base_url) as anon:
        with pytest.raises(CayugaAPIError) as info:
            anon.streams()
        assert info.value.status == 401 and "Authorization: Bearer" in str(info.value)
        assert anon.health()["status"] == "ok"  # health stays open for probes
        assert anon.health()["engine_build"] in ("compiled", "python")
    with CayugaClient(srv.base_url, token="sekret") as c:
        assert [s["name"] for s in c.streams()] == ["Stock"]


def test_instance_counts_reach_the_api_and_metrics(client):
    """The engine thread recounts instances per subscription in the background
    (a bounded slice per loop); the API and /metrics show the counts."""
    subs = [client.subscribe(cel=PAIRS.replace("Pairs", f"Pairs{i}")) for i in range(5)]
    client.post_events([stock("IBM", 10.0, 1, 1), stock("MSFT", 5.0, 1, 2)])  # one run waits per symbol
    from clients.testing import wait_until

    wait_until(lambda: [client.subscription(s["id"])["instances"] for s in subs] == [2] * 5,
               what="2 instances counted for each subscription")
    metrics = client.http.get("/metrics").text
    assert f'cayuga_subscription_instances{{subscription="{subs[0]["id"]}"}} 2.0' in metrics
    client.unsubscribe(subs[0]["id"])
    assert [s["id"] for s in client.subscriptions()] == [s["id"] for s in subs[1:]]


def test_subscriptions_are_listed_in_pages(client):
    ids = [client.subscribe(cel=PAIRS.replace("Pairs", f"Page{i}"))["id"] for i in range(5)]
    assert [s["id"] for s in client.subscriptions()] == ids
    assert [s["id"] for s in client.subscriptions(offset=1, limit=2)] == ids[1:3]
    assert [s["id"] for s in client.subscriptions(offset=4, limit=10)] == ids[4:]
    assert client.subscriptions(offset=9) == []
    with pytest.raises(CayugaAPIError) as info:
        client.subscriptions(limit=0)
    assert info.value.status == 422 and "limit" in str(info.value.body)


def test_batched_websocket_frames_carry_the_same_witnesses_in_fewer_messages(client):
    sub = client.subscribe(cel="SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH All")
    n = 3000
    with client.frames(sub["id"], batch=1, timeout=10) as single, \
            client.frames(sub["id"], batch=250, timeout=10) as batched:
        with client.sender() as s:
            s.send_lines("".join(f'{{"stream": "Stock", "t1": {i}, "Name": "IBM", "Price": 1.0, "Volume": {i}}}\n'
                                 for i in range(n)).encode(), n)
        one = [next(single) for _ in range(n)]
        frames, lines = [], []
        while len(lines) < n:
            frames.append(next(batched))
            lines.extend(frames[-1].split("\n"))
    assert all("\n" not in m for m in one)
    assert lines == one and [json.loads(x)["Volume"] for x in lines] == list(range(n))
    assert len(frames) < n / 10 and max(f.count("\n") + 1 for f in frames) <= 250
    delivered = [x for x in client.http.get("/metrics").text.splitlines()
                 if x.startswith("cayuga_witnesses_delivered_total")]
    assert delivered == [f"cayuga_witnesses_delivered_total {2 * n}.0"]


@pytest.mark.parametrize("batch", ["0", "10001", "x"])
def test_a_bad_batch_parameter_closes_with_4400(client, batch):
    sub = client.subscribe(cel="SELECT * FROM Stock PUBLISH All")
    with connect(client.ws_url(sub["id"]) + f"?batch={batch}", open_timeout=10) as ws:
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    assert info.value.rcvd.code == 4400 and "from 1 to 10000" in info.value.rcvd.reason


def test_one_chunk_per_subscription_reaches_every_format_and_the_log_alike(client):
    """A subscription with two output streams: its plain watcher, its seq watcher, a
    watcher of one of its streams (``<sid>:<seq>``) and a resume from the witness log
    all see the same witness bytes with the same numbers, 1, 2, 3, ... in order (the
    batch's witnesses are numbered, encoded once and shared: server/delivery/hub.py's Chunk)."""
    sub = client.subscribe(cel="SELECT Name, Price_1 AS First, Price AS Second FROM (SELECT Name, Price FROM "
                               "FILTER{Price > 10}(Stock) PUBLISH Dear) NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs2")
    sid = sub["id"]
    assert sub["outputs"] == ["Dear", "Pairs2"]
    n = 2000  # events of 7 names; the odd ones are dear (a Dear witness each)
    lines = "".join(f'{{"stream": "Stock", "t1": {i}, "Name": "N{i % 7}", "Price": {5.0 + 10 * (i % 2)}, '
                    f'"Volume": {i}}}\n' for i in range(n)).encode()
    with client.frames(sid, batch=1000, timeout=10) as plain, \
            client.frames(sid, batch=300, timeout=10, seq=True) as numbered, \
            client.frames(stream="Dear", batch=1, timeout=10, seq=True) as dear:
        with client.sender() as s:
            s.send_lines(lines, n)
        # Pairs2: a dear event and the next of its name (seven events later)
        want = n // 2 + sum(1 for i in range(1, n, 2) if i + 7 < n)
        got_plain, got_seq = [], []
        while len(got_plain) < want:
            got_plain.extend(next(plain).split("\n"))
        while len(got_seq) < want:
            got_seq.extend(next(numbered).split("\n"))
        got_dear = [next(dear) for _ in range(n // 2)]
    seqs = [int(x.partition(" ")[0]) for x in got_seq]
    assert seqs == list(range(1, want + 1))
    assert [x.partition(" ")[2] for x in got_seq] == got_plain
    dear_numbered = [f"{sid}:{x}" for x in got_seq if '"stream":"Dear"' in x]
    assert got_dear == dear_numbered and len(got_dear) == n // 2
    with client.frames(sid, batch=1000, timeout=10, from_=1) as again:
        resumed = []
        while len(resumed) < want:
            resumed.extend(next(again).split("\n"))
    assert resumed == got_seq


def test_a_body_that_is_not_a_json_object_and_an_unknown_path_say_what_to_send(client):
    """Issue 35: 'body.15: JSON decode error', 'Input should be a valid dictionary ...' (curl -d without a
    content-type) and 'Not Found' said nothing a newcomer could act on."""
    cases = [
        (dict(content='{"cel": "Stock"', headers={"content-type": "application/json"}), 422,
         "invalid request body: body: not JSON: Expecting ',' delimiter at character 15 of the body"),
        (dict(content='{"cel": "Stock"}', headers={"content-type": "application/x-www-form-urlencoded"}), 422,
         "invalid request body: body: the body must be a JSON object, sent with content-type: application/json "
         "(this one came as application/x-www-form-urlencoded)"),
        (dict(headers={"content-type": "application/json"}), 422,
         "invalid request body: body: the body must be a JSON object, sent with content-type: application/json "
         "(this one is empty)"),
    ]
    for kw, status, detail in cases:
        r = client.http.post("/subscriptions", **kw)
        assert (r.status_code, r.json()["detail"]) == (status, detail)
    r = client.http.get("/subscription")
    assert (r.status_code, r.json()) == (404, {"detail": "no such endpoint: GET /subscription; GET /docs lists the "
                                                         "API's operations"})
    r = client.http.put("/subscriptions")
    assert (r.status_code, r.json()["detail"]) == (405, "PUT is not an operation of /subscriptions; GET /docs "
                                                        "lists the API's operations")
    assert r.headers["allow"]  # starlette's Allow header is kept
    assert client.http.get("/subscriptions/s9").json()["detail"] == "no subscription 's9'; GET /subscriptions lists them"
