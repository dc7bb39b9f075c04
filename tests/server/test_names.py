"""Issue 19: names an AIR document (or CEL, or POST /streams) carries follow
one rule (air/names.py) — they end up in URLs, file paths, metric labels and
log lines. A bad one is refused with a 400 (422 for a request body's field)
that names what is wrong and the rule; a good one works end to end."""

from __future__ import annotations

import threading

import httpx
import pytest

from air.names import IDENTIFIER_RULE, NAME_RULE
from clients.client import CayugaAPIError
from tests.server.conftest import collect, stock

GOOD_AIR = """<NFA>
<Node NodeID="{node}" NodeType="START" InputStreamName="{input}">
<ForwardEdge Destination="1">
<SchemaMap>
<OldNewAttrPair OldAttrSource="EV" OldAttr="Name" NewAttr="{attr}"/>
<OldNewAttrPair OldAttrSource="EV" OldAttr="Price" NewAttr="Price"/>
</SchemaMap>
</ForwardEdge>
</Node>
<Node NodeID="1" NodeType="INTERMEDIATE_OR_END">
<Schema>
<AttrName Name="{attr}" Type="string"/>
<AttrName Name="Price" Type="float"/>
</Schema>
<OutputStreamName Name="{output}" Type="OUT"/>
</Node>
</NFA>
"""


def air(output="Cheap", input="Stock", attr="Name", node="0") -> str:
    return GOOD_AIR.format(output=output, input=input, attr=attr, node=node)


LONG = "x" * 10_000
BAD_NAMES = {"slash": "a/b", "dots": "../../x", "10 KB": LONG, "space": "a b", "empty": "",
             "unicode": "Aktie\u00e9", "percent": "a%2Fb"}


def _refused(call, status: int) -> dict:
    with pytest.raises(CayugaAPIError) as info:
        call()
    assert info.value.status == status, info.value.body
    return info.value.body


@pytest.mark.parametrize("where", ["output", "input", "attr", "node"])
@pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_an_air_name_that_breaks_the_rule_is_refused_with_the_rule(client, where, bad):
    body = _refused(lambda: client.subscribe(air=air(**{where: bad})), 400)
    assert NAME_RULE in body["detail"]
    assert LONG not in body["detail"] and LONG not in str(body["errors"])  # a 10 KB name is not echoed back
    err = body["errors"][0]
    assert err["kind"] == "air" and err["line"] > 0 and NAME_RULE in err["message"]
    assert client.subscriptions() == []
    assert [s["name"] for s in client.streams()] == ["Stock"]


def test_a_batch_with_one_bad_air_name_registers_nothing(client):
    body = _refused(lambda: client.subscribe_many([{"air": air("Fine")}, {"air": air("a/b")}]), 400)
    assert body["errors"][0]["index"] == 1 and NAME_RULE in body["errors"][0]["message"]
    assert client.subscriptions() == []


def test_validate_reports_a_bad_air_name(client):
    res = client.validate(air=air("../../x"))
    assert res["valid"] is False and NAME_RULE in res["errors"][0]["message"]


def test_a_cel_name_longer_than_the_limit_is_refused_with_the_rule(client):
    body = _refused(lambda: client.subscribe(cel=f"SELECT Name FROM Stock PUBLISH {LONG}"), 400)
    assert IDENTIFIER_RULE in body["detail"] and LONG not in body["detail"]
    assert body["errors"][0]["column"] == len("SELECT Name FROM Stock PUBLISH ") + 1


@pytest.mark.parametrize("n", [201, 10_240])
def test_a_cel_publish_name_just_over_the_limit_is_refused_and_validate_says_so(client, n):
    body = _refused(lambda: client.subscribe(cel=f"SELECT Name FROM Stock PUBLISH {'P' * n}"), 400)
    assert f"({n} characters) is too long" in body["detail"] and IDENTIFIER_RULE in body["detail"]
    assert not client.validate(cel=f"SELECT Name FROM Stock PUBLISH {'P' * n}")["valid"]
    assert client.subscriptions() == []


# issue 33: a subscription's name is a name like any other
BAD_LABELS = {"slash": "a/b", "dots": "../../x", "empty": "", "NUL": "a\u0000b", "201": "x" * 201,
              "10 KB": LONG, "space": "a b"}


@pytest.mark.parametrize("bad", BAD_LABELS.values(), ids=BAD_LABELS.keys())
def test_a_subscription_name_that_breaks_the_rule_is_refused_with_the_rule(server, bad):
    with httpx.Client(base_url=server.base_url) as h:
        for path, body in (("/subscriptions", {"cel": "SELECT * FROM Stock PUBLISH Q", "name": bad}),
                           ("/subscriptions/batch", {"subscriptions": [{"cel": "SELECT * FROM Stock PUBLISH Q"},
                                                                       {"cel": "SELECT * FROM Stock PUBLISH R",
                                                                        "name": bad}]})):
            r = h.post(path, json=body)
            assert r.status_code == 422, r.text
            detail = r.json()["detail"]
            assert "the subscription name" in detail and NAME_RULE in detail and LONG not in r.text, detail
        assert h.get("/subscriptions").json() == []


def test_a_good_subscription_name_is_taken(client):
    for name in ("pairs_2", "9lives", "N" * 200):
        assert client.subscribe(cel="SELECT * FROM Stock PUBLISH Q", name=name)["name"] == name


def test_a_name_the_cel_compiler_makes_too_long_is_refused(client):
    name = "P" * 199  # fits; the compiler's P..._1 (201 characters) does not
    client.declare_stream("Long", {name: "float", "Name": "string"})
    body = _refused(lambda: client.subscribe(cel="SELECT * FROM Long NEXT{$1.Name = $2.Name} Long"), 400)
    assert NAME_RULE in body["detail"] and "_1" in body["detail"]


@pytest.mark.parametrize("bad", ["a/b", "9lives", LONG, "a-b"])
def test_post_streams_refuses_a_bad_stream_or_attribute_name_with_the_rule(server, bad):
    with httpx.Client(base_url=server.base_url) as h:
        for body in ({"name": bad, "schema": {"x": "int"}}, {"name": "Fine", "schema": {bad: "int"}}):
            r = h.post("/streams", json=body)
            assert r.status_code == 422, r.text
            assert IDENTIFIER_RULE in r.json()["detail"] and LONG not in r.text
        assert [s["name"] for s in h.get("/streams").json()] == ["Stock"]


def test_a_good_air_name_works_end_to_end(server, client):
    sid = client.subscribe(air=air(output="Cheap_2", attr="Sym", node="n0"))["id"]
    assert client.subscription(sid)["outputs"] == ["Cheap_2"]
    with httpx.Client(base_url=server.base_url) as h:
        assert h.get("/streams/Cheap_2").json()["schema"] == {"Sym": "string", "Price": "float"}
    ready = threading.Event()
    got: list = []

    def watch():
        with client.watch(stream="Cheap_2", timeout=20) as ws:
            ready.set()
            got.extend(collect(ws, 2))

    t = threading.Thread(target=watch)
    t.start()
    assert ready.wait(20)
    client.post_events([stock("IBM", 1.0, 1, 1), stock("MSFT", 2.0, 1, 2)])
    t.join(30)
    assert not t.is_alive()
    assert [(w["stream"], w["Sym"], w["Price"]) for w in got] == [("Cheap_2", "IBM", 1.0), ("Cheap_2", "MSFT", 2.0)]


def test_the_original_compilers_numeric_stream_names_still_load(client):
    """94.xml publishes stream "94", which LONG_MONOTONIC_INC.xml reads: a name may start with a digit in AIR."""
    sid = client.subscribe(air=air(output="94"))["id"]
    assert client.subscription(sid)["outputs"] == ["94"]
    client.subscribe(air=air(output="Again", input="94"))


def test_a_websocket_for_an_unknown_long_name_is_closed_with_a_reason_that_fits(server):
    """A close reason over 123 bytes (it quoted the whole name) broke the connection
    without a close frame; now the name is cut short in it."""
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    for kind in ("streams", "subscriptions"):
        with connect(f"ws://127.0.0.1:{server.http_port}/ws/{kind}/{'x' * 200}", open_timeout=20) as ws:
            with pytest.raises(ConnectionClosedError) as info:
                ws.recv(timeout=20)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4404
        assert "(200 characters)" in info.value.rcvd.reason
