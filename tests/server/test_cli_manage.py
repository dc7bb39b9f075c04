"""What a newcomer meets at the command line (issue 35): ``cayuga subscriptions``
(list, show, delete) and ``cayuga streams``, and refusals worded in the
commands' terms, without HTTP statuses or WebSocket close codes: each says
what to do next, with exit status 1."""

from __future__ import annotations

import json
import socket

from click.testing import CliRunner

from clients.cli import main as cli
from clients.client import CayugaClient
from clients.testing import RISING


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_subscriptions_lists_shows_and_deletes(server, client):
    url = server.base_url
    empty = run("subscriptions", "--url", url)
    assert (empty.exit_code, empty.stdout) == (0, "")
    assert empty.stderr == f"cayuga: the server at {url} has no subscriptions: cayuga register QUERY.cel adds one\n"
    rising = client.subscribe(cel=RISING, name="rising")["id"]
    reader = client.subscribe(cel="SELECT Name FROM Rising PUBLISH Names")["id"]

    listed = run("subscriptions", "--url", url)  # the group alone lists
    assert listed.exit_code == 0, listed.output
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["ID", "NAME", "LANGUAGE", "OUTPUTS", "INSTANCES", "EXACT"],
        [rising, "rising", "cel", "Rising", "0", "exact"],
        [reader, "-", "cel", "Names", "0", "exact"]]
    assert run("subscriptions", "list", "--url", url).stdout == listed.stdout
    as_json = run("subscriptions", "--url", url, "--json")
    assert [json.loads(line)["id"] for line in as_json.stdout.splitlines()] == [rising, reader]

    shown = run("subscriptions", "--url", url, "show", rising)  # the group's --url holds for show
    assert shown.exit_code == 0, shown.output
    rows = dict(line.split(None, 1) for line in shown.stdout.split("query:")[0].splitlines())
    assert rows["name"] == "rising" and rows["outputs"] == "Rising" and rows["exact"] == "yes"
    assert rows["witnesses"].startswith(f"0 so far (cayuga watch {rising} --from-start")
    assert shown.stdout.split("query:\n")[1] == f"  {RISING}\n"
    assert json.loads(run("subscriptions", "show", rising, "--url", url, "--json").stdout)["air"].startswith("<")

    refused = run("subscriptions", "delete", rising, "--url", url)
    assert refused.exit_code == 1
    assert refused.stderr == (f"cayuga: {rising} is not deleted: {reader} reads its outputs; delete it first, "
                              "or give --cascade to delete it too\n")
    deleted = run("subscriptions", "delete", rising, "--cascade", "--url", url)
    assert (deleted.exit_code, deleted.stdout) == (0, f"deleted {rising}\n")
    assert client.subscriptions() == []

    for args in (("show", "s99"), ("delete", "s99")):
        missing = run("subscriptions", *args, "--url", url)
        assert missing.exit_code == 1
        assert missing.stderr == f"cayuga: no subscription 's99' on {url}: cayuga subscriptions lists them\n"


def test_streams_lists_the_declared_and_the_published(server, client):
    client.subscribe(cel=RISING)
    result = run("streams", "--url", server.base_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "NAME    KIND       ATTRIBUTES",
        "Rising  published  Name string, Before float, After float",
        "Stock   declared   Name string, Price float, Volume int"]
    assert {json.loads(x)["name"] for x in run("streams", "--url", server.base_url, "--json").stdout.split()} == \
        {"Stock", "Rising"}


def test_watch_says_what_is_missing_and_where_to_look_without_a_code(server, client):
    url = server.base_url
    for args, said in ((("nosuch",), f"no subscription 'nosuch' on {url}: cayuga subscriptions lists them"),
                       (("s99",), f"no subscription 's99' on {url}: cayuga subscriptions lists them"),
                       (("--stream", "Nosuch"), f"no stream 'Nosuch' on {url}: cayuga streams lists them")):
        result = run("watch", *args, "--url", url, "--retry-for", "60")
        assert (result.exit_code, result.stderr) == (1, f"cayuga: {said}\n")
    sid = client.subscribe(cel=RISING)["id"]
    beyond = run("watch", sid, "--from", "5", "--url", url)
    assert (beyond.exit_code, beyond.stderr) == (
        1, f"cayuga: from 5 is beyond the end of {sid}: its last witness is 0; --from 1 waits for the next\n")


def test_watch_and_subscriptions_with_a_wrong_token_say_how_to_give_one(start_server):
    srv = start_server(auth_tokens=["s3cret"])
    want = (f"cayuga: the server at {srv.base_url} wants a token (none was given, or it is not one of the "
            "server's auth_tokens): give --token, or set CAYUGA_TOKEN\n")
    for args in (("watch", "s1"), ("subscriptions",), ("streams",), ("subscriptions", "show", "s1")):
        result = run(*args, "--url", srv.base_url, "--token", "wrong")
        assert (result.exit_code, result.stderr) == (1, want), args
    with CayugaClient(srv.base_url, token="s3cret") as c:
        assert c.subscriptions() == []


def test_a_stopped_server_is_named_with_what_to_check():
    with socket.socket() as closed:  # bound, never listening: a port that refuses connections and stays ours
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = run("subscriptions", "--url", url)
    assert result.exit_code == 1
    assert result.stderr == (f"cayuga: cannot reach the server at {url}: [Errno 111] Connection refused; is cayuga "
                             "serve running there? (--url or CAYUGA_URL names another)\n")
