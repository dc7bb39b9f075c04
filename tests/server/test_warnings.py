"""Registration warnings over the API (issue 31): POST /subscriptions, its
batch form and /subscriptions/validate name each NEXT, FOLD or AIR state that
keeps automaton instances without a time bound, with its position and the
fix; the query registers all the same, and every other field is as before."""

from __future__ import annotations

from clients.client import CayugaClient
from tests.conftest import ROOT

RISING = ("SELECT Name, Price_1 AS Before, Price AS After\n"
          "FROM Stock NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock\n"
          "PUBLISH Rising")
BOUNDED = RISING.replace("$2.Price >= 1.05 * $1.Price", "$2.Price >= 1.05 * $1.Price AND DUR < 1 HOUR")
RUNAWAY = "SELECT * FROM Stock FOLD{$2.Price < 0, true, } Stock"
WARNING_FIELDS = {"code", "message", "fix", "automaton", "state", "stream", "operator", "line", "column", "excerpt"}


def _client(server) -> CayugaClient:
    return CayugaClient(server.base_url)


def test_register_and_validate_warn_of_a_next_without_a_time_bound(server):
    with _client(server) as c:
        v = c.validate(cel=RISING)
        assert v["valid"] is True and v["errors"] == [] and "<NFA>" in v["air"]
        [w] = v["warnings"]
        assert set(w) == WARNING_FIELDS
        assert (w["code"], w["operator"], w["automaton"], w["state"], w["stream"]) == (
            "unbounded_instances", "NEXT", "Rising", "1", "Stock")
        assert (w["line"], w["column"]) == (2, RISING.split("\n")[1].index("NEXT") + 1)
        assert w["excerpt"] == "  " + RISING.split("\n")[1] + "\n  " + " " * (w["column"] - 1) + "^"
        assert "DUR < 1 HOUR" in w["fix"]
        assert c.subscriptions() == []

        r = c.http.post("/subscriptions", json={"cel": RISING})
        assert r.status_code == 201
        sub = r.json()
        assert sub["warnings"] == [w]  # registered all the same
        assert (sub["id"], sub["outputs"], sub["same_as"], sub["registered_now"]) == ("s1", ["Rising"], [], True)
        assert [s["id"] for s in c.subscriptions()] == ["s1"]

        assert c.validate(cel=BOUNDED)["warnings"] == []
        assert c.subscribe(cel=BOUNDED.replace("Rising", "Bounded"))["warnings"] == []


def test_a_runaway_fold_warns_and_an_invalid_query_has_errors_only(server):
    with _client(server) as c:
        [w] = c.subscribe(cel=RUNAWAY)["warnings"]
        assert (w["operator"], w["automaton"], w["column"]) == ("FOLD", "s1", RUNAWAY.index("FOLD") + 1)
        [v] = c.validate(cel=RUNAWAY)["warnings"]
        assert {**v, "automaton": "s1"} == w  # validate names its automata "validate"
        bad = c.validate(cel=RUNAWAY.replace("Price <", "Prise <"))
        assert bad["valid"] is False and bad["warnings"] == []


def test_a_repeated_named_registration_warns_again(server):
    with _client(server) as c:
        first = c.subscribe(cel=RISING, name="rising")
        r = c.http.post("/subscriptions", json={"cel": RISING, "name": "rising"})
        assert r.status_code == 200 and r.json()["registered_now"] is False
        assert r.json()["warnings"] == first["warnings"] and len(first["warnings"]) == 1


def test_a_batch_carries_each_items_warnings_resubscription_included(server):
    reader = "SELECT * FROM Rising NEXT{$1.Name = $2.Name AND $2.After > $1.After} Rising PUBLISH Twice"
    nested = ("SELECT * FROM (SELECT Name, Price FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs)\n"
              "  NEXT{$1.Name = $2.Name AND DUR < 1 HOUR} Stock PUBLISH Later")
    with _client(server) as c:
        subs = c.subscribe_many([RISING, BOUNDED.replace("Rising", "Bounded"), reader, nested])
        assert [s["id"] for s in subs] == ["s1", "s2", "s3", "s4"]
        assert [[(w["automaton"], w["stream"], w["line"]) for w in s["warnings"]] for s in subs] == [
            [("Rising", "Stock", 2)], [], [("Twice", "Rising", 1)], [("Pairs", "Stock", 1)]]
        # and a query reading a registered one's output, alone
        [w] = c.subscribe(cel=reader.replace("Twice", "Thrice"))["warnings"]
        assert (w["stream"], w["column"]) == ("Rising", reader.index("NEXT") + 1)


def test_air_warns_with_the_automaton_state_and_line(server):
    text = (ROOT / "examples" / "example9.xml").read_text()
    lines = text.split("\n")
    with _client(server) as c:
        got = c.subscribe(air=text)["warnings"]
        assert [(w["automaton"], w["state"], w["operator"]) for w in got] == [("s1", "A", None), ("s1", "B", None)]
        for w in got:
            assert lines[w["line"] - 1].startswith(f'<Node NodeID="{w["state"]}"')
            assert 'Const="3600000"' in w["fix"]
        assert [w["state"] for w in c.validate(air=text)["warnings"]] == ["A", "B"]


def test_openapi_documents_the_warnings(server):
    with _client(server) as c:
        schemas = c.http.get("/openapi.json").json()["components"]["schemas"]
    ref = {"$ref": "#/components/schemas/WarningOut"}
    assert set(schemas["WarningOut"]["properties"]) == WARNING_FIELDS
    assert all(p.get("description") for p in schemas["WarningOut"]["properties"].values())
    for name in ("SubscriptionCreated", "SubscriptionRegistered", "ValidationOut"):
        field = schemas[name]["properties"]["warnings"]
        assert field["items"] == ref and field["description"], name
    assert schemas["SubscriptionBatchOut"]["properties"]["subscriptions"]["items"] == {
        "$ref": "#/components/schemas/SubscriptionRegistered"}
