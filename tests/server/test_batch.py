"""Registering many subscriptions at once: POST /subscriptions/batch (all or
nothing, each error with its index), ``cayuga register``, and restoring them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clients.cli import main as cli
from clients.client import CayugaAPIError, CayugaClient
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, collect, make_settings, stock

UP = ("SELECT Name, Price_1 AS Before, Price AS After FROM FILTER{{Name = '{s}'}}(Stock) "
      "NEXT{{$1.Name = $2.Name AND $2.Price > 1.05 * $1.Price}} Stock")


def test_a_batch_gets_consecutive_ids_and_its_subscriptions_deliver(client):
    first = client.subscribe(cel=UP.format(s="X"))
    subs = client.subscribe_many([UP.format(s=s) for s in ("IBM", "MSFT", "DELL")]
                                 + [{"cel": UP.format(s="HP") + " PUBLISH HpUp", "name": "hp"}])
    n = int(first["id"][1:])
    assert [s["id"] for s in subs] == [f"s{n + k}" for k in range(1, 5)]
    assert [s["outputs"] for s in subs] == [[f"s{n + 1}"], [f"s{n + 2}"], [f"s{n + 3}"], ["HpUp"]]
    assert subs[3]["name"] == "hp" and [s["id"] for s in client.subscriptions()] == [first["id"]] + \
        [s["id"] for s in subs]
    with client.watch(subs[1]["id"], timeout=10) as msft, client.watch(subs[3]["id"], timeout=10) as hp:
        client.post_events([stock("MSFT", 10.0, 1, 1), stock("HP", 10.0, 1, 2), stock("IBM", 50.0, 1, 3),
                            stock("MSFT", 11.0, 1, 4), stock("HP", 12.0, 1, 5)])
        assert collect(msft, 1) == [{"stream": f"s{n + 2}", "t0": 1, "t1": 4, "Name": "MSFT", "Before": 10.0,
                                     "After": 11.0}]
        assert collect(hp, 1) == [{"stream": "HpUp", "t0": 2, "t1": 5, "Name": "HP", "Before": 10.0, "After": 12.0}]
    assert client.subscription(subs[0]["id"])["text"] == UP.format(s="IBM")


def test_a_batchs_answer_is_its_response_models_json_with_each_ones_warnings(client):
    """The answer is made off the event loop a subscription at a time (server/api/subscriptions.py's
    ``_batch_body``): still :class:`SubscriptionBatchOut` exactly, each with what GET says of it and
    its warnings, as POST /subscriptions gives them."""
    from server.api.schemas import SubscriptionBatchOut

    texts = [UP.format(s=s) for s in ("IBM", "MSFT")] + ["SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Over"]
    r = client.http.post("/subscriptions/batch", json={"subscriptions": [{"cel": t} for t in texts]})
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    got = r.json()
    assert SubscriptionBatchOut.model_validate(got).model_dump(mode="json", by_alias=True) == got
    one = client.http.post("/subscriptions", json={"cel": UP.format(s="IBM")}).json()  # (the same again)
    for sub, text in zip(got["subscriptions"], texts):
        described = client.subscription(sub["id"])
        assert {k: sub[k] for k in ("id", "kind", "name", "outputs", "internal_streams", "created", "websocket",
                                    "exact", "limits")} == {k: described[k] for k in ("id", "kind", "name", "outputs",
                                                                                     "internal_streams", "created",
                                                                                     "websocket", "exact", "limits")}
    first = got["subscriptions"][0]["warnings"]
    assert [w["code"] for w in first] == ["unbounded_instances"] and first[0]["line"] == 1
    assert [{k: v for k, v in w.items() if k != "automaton"} for w in first] == \
        [{k: v for k, v in w.items() if k != "automaton"} for w in one["warnings"]]
    assert got["subscriptions"][2]["warnings"] == []


@pytest.mark.parametrize("piece", [1, 2, 3, 4])
def test_a_batchs_answer_in_pieces_is_one_json_document(client, monkeypatch, piece):
    """The answer goes out in pieces of ``ANSWER_PIECE`` subscriptions (a 46 MB answer joined into one
    string held the interpreter's lock 60-80 ms): any size of piece against three subscriptions,
    the same document as the response model's."""
    from server.api import subscriptions
    from server.api.schemas import SubscriptionBatchOut

    monkeypatch.setattr(subscriptions, "ANSWER_PIECE", piece)
    texts = [UP.format(s=s) for s in ("IBM", "MSFT", "DELL")]
    r = client.http.post("/subscriptions/batch", json={"subscriptions": [{"cel": t} for t in texts]})
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    got = json.loads(r.content)
    assert SubscriptionBatchOut.model_validate(got).model_dump(mode="json", by_alias=True) == got
    assert [s["outputs"] for s in got["subscriptions"]] == [[s["id"]] for s in got["subscriptions"]]
    assert len(got["subscriptions"]) == 3 and len({s["id"] for s in got["subscriptions"]}) == 3
    # the list of subscriptions goes out the same way: the response model's JSON, every page of it
    from server.api.schemas import SubscriptionOut

    listed = client.http.get("/subscriptions")
    assert listed.status_code == 200 and listed.headers["content-type"] == "application/json"
    every = json.loads(listed.content)
    assert [SubscriptionOut.model_validate(s).model_dump(mode="json", by_alias=True) for s in every] == every
    assert [s["id"] for s in every] == [s["id"] for s in got["subscriptions"]]
    assert all(s["instances"] == 0 and s["exact"] and s["broken"] is None for s in every)
    for offset, limit in ((0, 1), (1, 2), (2, 5), (3, 1)):
        page = client.http.get("/subscriptions", params={"offset": offset, "limit": limit})
        assert json.loads(page.content) == every[offset:offset + limit]


def test_a_batch_with_errors_registers_nothing_and_takes_no_id(server, client):
    before = client.subscribe(cel=UP.format(s="A"))["id"]
    bad = ["SELECT Name FROM FILTER{Name = 'B'}(Stock)",
           "SELECT Name FROM FILTER{Name = 'C'}(Stock)\n  NEXT{$2.Prize > 1} Stock",
           {"cel": "SELECT Name FROM FILTER{Name = 'D'}(Stok)"}]
    with pytest.raises(CayugaAPIError) as info:
        client.subscribe_many(bad)
    assert info.value.status == 400
    errors = info.value.body["errors"]
    assert [(e["index"], e["kind"], e["line"], e["column"]) for e in errors] == [(1, "name", 2, 8), (2, "name", 1, 37)]
    assert errors[0]["excerpt"] == "    NEXT{$2.Prize > 1} Stock\n         ^"
    assert "did you mean 'Price'" in errors[0]["message"]
    assert [s["id"] for s in client.subscriptions()] == [before]
    assert client.subscribe(cel=UP.format(s="E"))["id"] == f"s{int(before[1:]) + 1}"
    # an error of the engine (here: a stream published with another schema) undoes the whole batch too
    client.declare_stream("Temp", {"Room": "string"})
    with pytest.raises(CayugaAPIError) as info:
        client.subscribe_many([UP.format(s="F"), "SELECT Name, Price FROM Stock PUBLISH Temp"])
    assert [(e["index"], e["kind"]) for e in info.value.body["errors"]] == [(1, "bind")]
    assert len(client.subscriptions()) == 2 and len(server.daemon.engine.owners) == 2


def test_a_query_may_read_what_an_earlier_one_of_its_batch_publishes(client):
    subs = client.subscribe_many([
        "SELECT Price AS IBMPrice FROM FILTER{Name = 'IBM' AND Price > 83}(Stock) PUBLISH IBMHigh",
        "SELECT IBMPrice, Price AS MSFTPrice FROM IBMHigh NEXT{$2.Name = 'MSFT'}(Stock) PUBLISH Pair"])
    with client.watch(subs[1]["id"], timeout=10) as pairs:
        client.post_events([stock("IBM", 90.0, 1, 1), stock("MSFT", 30.0, 1, 2)])
        assert collect(pairs, 1) == [{"stream": "Pair", "t0": 1, "t1": 2, "IBMPrice": 90.0, "MSFTPrice": 30.0}]


def test_a_failed_single_registration_takes_no_id_either(client):
    first = client.subscribe(cel=UP.format(s="A"))["id"]
    with pytest.raises(CayugaAPIError) as info:
        client.subscribe(cel="SELECT Nam FROM Stock")
    assert info.value.body["errors"][0]["column"] == 8 and "index" not in info.value.body["errors"][0]
    assert info.value.body["detail"].startswith("line 1, column 8: unknown attribute 'Nam'")
    assert client.subscribe(cel=UP.format(s="B"))["id"] == f"s{int(first[1:]) + 1}"


def test_restart_restores_from_the_stored_compiled_shapes(tmp_path, monkeypatch):
    """A restart compiles nothing while the stored shapes are of this compiler
    version; with another version each shape is compiled once, and the old
    forms are dropped."""
    import air.cel.shapes

    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        ids = [s["id"] for s in c.subscribe_many([UP.format(s=f"S{k}") for k in range(40)]
                                                 + ["SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Any"])]
        assert srv.daemon.shapes.stats() == {"shapes": 2, "hits": 39, "misses": 2, "uncacheable": 0}
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        assert [s["id"] for s in c.subscriptions()] == ids
        assert srv.daemon.shapes.stats() == {"shapes": 2, "hits": 41, "misses": 0, "uncacheable": 0}
        with c.watch(ids[7], timeout=10) as m:
            c.post_events([stock("S7", 1.0, 1, 1), stock("S7", 2.0, 1, 2)])
            assert collect(m, 1)[0] == {"stream": ids[7], "t0": 1, "t1": 2, "Name": "S7", "Before": 1.0,
                                        "After": 2.0}
    monkeypatch.setattr(air.cel.shapes, "COMPILER_VERSION", "cel-next")
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        assert [s["id"] for s in c.subscriptions()] == ids
        assert srv.daemon.shapes.stats() == {"shapes": 2, "hits": 39, "misses": 2, "uncacheable": 0}
        assert all('"cel-next"]' in key for key, _ in srv.daemon.store.shapes())
        assert len(srv.daemon.store.shapes()) == 2
    assert_no_cayuga_threads()


def test_cayuga_register_a_directory_and_a_jsonl_file(server, tmp_path):
    d = tmp_path / "queries"
    d.mkdir()
    for s in ("IBM", "MSFT"):
        (d / f"up_{s}.cel").write_text(UP.format(s=s))
    (d / "notes.txt").write_text("not a query")  # a directory's other files are left alone
    lines = tmp_path / "more.jsonl"
    lines.write_text(json.dumps(UP.format(s="DELL")) + "\n\n"
                     + json.dumps({"cel": UP.format(s="HP"), "name": "hp"}) + "\n")
    result = CliRunner().invoke(cli, ["register", str(d), str(lines), "--url", server.base_url, "--batch", "3"])
    assert result.exit_code == 0, result.output
    out = [line.split(" ", 1) for line in result.stdout.splitlines()]
    assert [w for _, w in out] == [str(d / "up_IBM.cel"), str(d / "up_MSFT.cel"), f"{lines}:1", f"{lines}:3"]
    with CayugaClient(server.base_url) as c:
        subs = c.subscriptions()
    assert [s["id"] for s in subs] == [i for i, _ in out]
    assert [s["name"] for s in subs] == ["up_IBM", "up_MSFT", None, "hp"]


def test_cayuga_register_prints_each_warning_with_its_file_and_registers_all(server, tmp_path, monkeypatch):
    import clients.words

    for s in ("A", "B"):
        (tmp_path / f"up_{s}.cel").write_text(UP.format(s=s))
    (tmp_path / "up_C.cel").write_text(UP.format(s="C").replace("1.05 * $1.Price", "1.05 * $1.Price AND DUR < 1 HOUR"))
    column = UP.format(s="A").index("NEXT") + 1
    result = CliRunner().invoke(cli, ["register", str(tmp_path), "--url", server.base_url])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3  # standard output: only "<id> <where>"
    for s in ("A", "B"):
        assert (f"{tmp_path / f'up_{s}.cel'}: line 1, column {column}: warning: NEXT keeps each partial match"
                in result.stderr)
    assert "up_C.cel: line" not in result.stderr
    assert result.stderr.count("warning: ") == 2 and result.stderr.count("DUR < 1 HOUR}") == 2
    assert "registered 3 queries" in result.stderr

    monkeypatch.setattr(clients.words, "MAX_WARNINGS", 1)  # a command prints so many, then how many more
    (tmp_path / "up_C.cel").unlink()
    result = CliRunner().invoke(cli, ["register", str(tmp_path), "--url", server.base_url])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning: ") == 1
    assert "cayuga: 1 more warning not shown (2 warnings in all)" in result.stderr


def test_cayuga_register_reports_each_error_with_its_file_and_registers_nothing(server, tmp_path):
    (tmp_path / "a.cel").write_text(UP.format(s="A"))
    (tmp_path / "b.cel").write_text("SELECT Name\nFROM FILTER{Volume > 'x'}(Stock)")
    result = CliRunner().invoke(cli, ["register", str(tmp_path), "--url", server.base_url])
    assert result.exit_code == 1
    assert f"{tmp_path / 'b.cel'}: line 2, column 20: cannot compare int with string" in result.stderr
    assert "registered 0 of 2 queries" in result.stderr
    with CayugaClient(server.base_url) as c:
        assert c.subscriptions() == []


def test_cayuga_register_names_the_line_of_a_jsonl_item_with_an_unknown_field(server, tmp_path):
    """Issue 35: a refused body's errors (422) named the server's URL and printed a dict."""
    lines = tmp_path / "q.jsonl"
    lines.write_text(json.dumps(UP.format(s="A")) + "\n" + json.dumps({"query": UP.format(s="B")}) + "\n")
    result = CliRunner().invoke(cli, ["register", str(lines), "--url", server.base_url])
    assert result.exit_code == 1
    from server.api.schemas import query_fields

    assert result.stderr.splitlines()[0] == (f"{lines}:2: unknown field 'query': send the query as {query_fields()} "
                                             "(the other fields: name, max_instances, max_state_bytes, from)")
    assert "registered 0 of 2 queries" in result.stderr


def test_cayuga_register_says_what_to_rename_a_file_of_no_query_language_to(tmp_path):
    (tmp_path / "up.txt").write_text(UP.format(s="A"))
    (tmp_path / "up.cel").write_text("<NFA/>")
    for name, said in (("up.txt", "a query file's suffix says its language (.cel for CEL, .xml for AIR XML, .sase "
                                  "for SASE), and .txt says none (it looks like CEL: rename it up.cel); or a .jsonl "
                                  "file holds one query a line"),
                       ("up.cel", "a .cel file is read as CEL, and this one starts with '<' (it looks like AIR XML: "
                                  "rename it up.xml)")):
        # refused before any request: the URL is never reached
        result = CliRunner().invoke(cli, ["register", str(tmp_path / name), "--url", "http://127.0.0.1:9"])
        assert (result.exit_code, result.stderr) == (2, f"cayuga: {tmp_path / name}: {said}\n")
