"""Issue 36 at the command line, against a real server: ``cayuga register
--from``, ``cayuga preview``, the BACKFILL column of ``cayuga subscriptions``
and ``cayuga watch`` saying on standard error where the replayed witnesses end
(standard output stays the witness JSON)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clients.cli import main as cli
from clients.cli_backfill import backfill_words
from clients.testing import RISING, stock, wait_until
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "example9.jsonl"  # six quotes from t1 = 33000000: Rising finds two witnesses


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def history(server, client, tmp_path):
    """A server that retains the six example quotes, and the Rising query in a file."""
    client.post_events([json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()])
    wait_until(lambda: client.preview({"cel": RISING}, "retained")["events"] == 6, 30,
               what="the six quotes to be retained")
    query = tmp_path / "rising.cel"
    query.write_text(RISING + "\n")
    return query


def test_register_from_the_retained_history_then_list_show_and_watch(server, client, history):
    url = server.base_url
    alone = run("register", history, "--wait", "--url", url)
    assert alone.exit_code == 2 and "--wait waits for the backfills of --from: give --from too" in alone.stderr
    registered = run("register", history, "--from", "retained", "--wait", "--url", url)
    assert registered.exit_code == 0, registered.output
    assert registered.stdout == f"s1 {history}\n"
    assert f"{history}: s1 runs over the history from t1 = " in registered.stderr
    assert "cayuga watch s1 --from-start prints its witnesses" in registered.stderr
    assert registered.stderr.endswith("cayuga: 1 backfill live\n")
    b = client.subscription("s1")["backfill"]
    assert b["state"] == "live"  # --wait returned once it was
    assert (b["witnesses"], b["events_done"]) == (2, 6)

    listed = run("subscriptions", "--url", url)
    assert listed.exit_code == 0, listed.output
    head, row = listed.stdout.splitlines()
    assert head.split() == ["ID", "NAME", "LANGUAGE", "OUTPUTS", "INSTANCES", "EXACT", "BACKFILL"]
    assert row.endswith(f"live (2 witnesses replayed from t1 = {b['from']})")
    shown = run("subscriptions", "show", "s1", "--url", url)
    assert f"backfill    live (2 witnesses replayed from t1 = {b['from']})" in shown.stdout

    # a live witness after the two of history: watch prints all three, and says where history ended
    client.post_events([stock("IBM", 200.0, 100, 33900000)])
    wait_until(lambda: client.subscription("s1")["last_seq"] >= 3, 30, what="a live witness")
    watched = run("watch", "s1", "--from-start", "--count", "3", "--url", url, "--retry-for", "5")
    assert watched.exit_code == 0, watched.output
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [w.get("replay") for w in lines] == [True, True, None]
    assert [(w["Before"], w["After"]) for w in lines[:2]] == [(85, 91), (81, 91)]
    assert ('cayuga: replay ended: witnesses #1-#2 were history ("replay": true); those after are live\n'
            in watched.stderr)


def test_register_from_before_the_retained_history_says_the_range(server, client, history):
    refused = run("register", history, "--from", "1", "--url", server.base_url)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(f"cayuga: {history}: ")
    assert "events from 33000000 to 33840000" in refused.stderr and "--from retained" in refused.stderr
    assert client.subscriptions() == []
    bad = run("register", history, "--from", "yesterday", "--url", server.base_url)
    assert bad.exit_code == 2
    assert "'yesterday' is not a time: give an event time (e.g. 33000000), 'retained', or a duration" in bad.stderr


def test_preview_prints_the_first_witnesses_and_the_count(server, client, history):
    shown = run("preview", history, "--from", "retained", "--limit", "1", "--url", server.base_url)
    assert shown.exit_code == 0, shown.output
    (first,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert (first["Name"], first["Before"], first["After"]) == ("IBM", 85, 91) and "replay" not in first
    assert shown.stderr == ("cayuga: 2 witnesses over 6 events (t1 = 33000000 to 33840000); the first 1 "
                            "printed (--limit)\n")
    inline = run("preview", RISING, "--from", "retained", "--url", server.base_url)  # the text itself
    assert inline.exit_code == 0, inline.output
    assert len(inline.stdout.splitlines()) == 2 and inline.stderr.startswith("cayuga: 2 witnesses over 6 events")
    assert client.subscriptions() == []  # nothing registered

    typo = run("preview", RISING.replace("$2.Price >=", "$2.Prise >="), "--from", "retained", "--url",
               server.base_url)
    assert typo.exit_code == 1 and typo.stdout == ""
    column = RISING.index("$2.Price") + 1
    assert f"query: line 1, column {column}: unknown attribute '$2.Prise'" in typo.stderr
    assert "^" in typo.stderr and "cayuga: query has 1 error: nothing was run" in typo.stderr
    early = run("preview", history, "--url", server.base_url)  # the last hour: before the 14 minutes retained
    assert early.exit_code == 1 and early.stdout == ""
    assert "events from 33000000 to 33840000" in early.stderr and "--from retained" in early.stderr


def test_backfill_words_say_how_far_it_is():
    assert backfill_words(None) == "-"
    running = {"from": 0, "to": None, "events_done": 450, "events_total": 1000, "witnesses": 3, "state": "running"}
    assert backfill_words(running) == "running 45% (450/1000 events, 3 witnesses)"
    assert backfill_words({**running, "events_total": None, "witnesses": 1}) == "running (450 events, 1 witness)"
    assert backfill_words({**running, "state": "handing_over"}).startswith("handing_over 45%")
    assert backfill_words({**running, "state": "failed", "error": "disk full"}) == "failed: disk full"
