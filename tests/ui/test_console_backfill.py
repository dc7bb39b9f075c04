"""Issue 36 in the console: a query tried on the last hour of retained events
before it is registered (its count and first witnesses, or the server's
errors with line, column and caret), a subscription registered from the
retained history (its backfill's bar, marked live after the hand-over, and its
replayed witnesses marked in the matches pane, before the live ones)."""

from __future__ import annotations

from clients.client import CayugaClient
from clients.testing import RISING, waiting
from tests.conftest import ROOT
from tests.server.conftest import stock
from tests.ui.conftest import expect

EXAMPLE = ROOT / "examples" / "example9.jsonl"  # six quotes: Rising finds two witnesses in them
TYPO = RISING.replace("$2.Price >=", "$2.Prise >=")


def wait_until(fn, timeout: float = 30.0) -> None:
    waiting.wait_until(fn, timeout, what=getattr(fn, "__name__", "the condition"))


def _js(value) -> str:
    """A value as the page writes it (JavaScript's String(): 85.0 is "85")."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _send_example(c: CayugaClient) -> None:
    import json

    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    assert c.post_events(events)["accepted"] == 6


def test_try_on_the_last_hour_shows_the_count_and_the_first_witnesses_or_the_errors(server, page, shots):
    with CayugaClient(server.base_url) as c:
        _send_example(c)
        preview = {}

        def previewed():  # the six events are retained once the server has taken them
            preview.update(c.preview({"cel": RISING}, "retained"))
            return preview["events"] == 6

        wait_until(previewed)
        assert preview["count"] == 2 and not preview["truncated"]
        page.goto(server.base_url + "/")
        page.locator("#query").fill(RISING)
        expect(page.locator("#validation")).to_contain_text("valid CEL")
        button = page.locator("#try-history")
        expect(button).to_have_text("Try on the last hour")
        button.click()
        status = page.locator("#preview-status")
        # the quotes span 14 minutes: less than the hour, so it runs over all of them and says so
        expect(status).to_have_text(f"2 witnesses over all the retained events (less than an hour is kept): "
                                    f"6 events from t1 = {preview['from']} to {preview['to']}")
        expect(status).to_have_attribute("data-count", "2")
        rows = page.locator("#preview-witnesses tbody tr")
        expect(rows).to_have_count(2)
        got = rows.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.textContent))")
        keys = list(preview["witnesses"][0])
        assert got == [[_js(w[k]) for k in keys if k != "replay"] for w in preview["witnesses"]]
        shots("tried")
        assert c.subscriptions() == []  # nothing was registered

        # a typo: the server's 400, with line, column and the caret under it, and the mark in the editor
        page.locator("#query").fill(TYPO)
        expect(page.locator("#errors li.error")).to_have_count(1)
        expect(button).to_be_enabled()
        button.click()
        column = TYPO.index("$2.Prise") + 1
        expect(status).to_contain_text(f"line 1, column {column}: unknown attribute '$2.Prise'")
        assert "^" in status.text_content().split("\n")[-1]
        expect(status).to_have_class("status invalid preview-error")
        expect(page.locator("#preview-witnesses tbody tr")).to_have_count(0)
        expect(page.locator("#editor mark.error-mark")).to_have_text("$2.Prise")
        shots("typo")


def test_a_subscription_from_the_retained_history_shows_its_backfill_and_its_replayed_witnesses(
        server, page, shots):
    with CayugaClient(server.base_url) as c:
        _send_example(c)
        wait_until(lambda: c.preview({"cel": RISING}, "retained")["events"] == 6)
        page.goto(server.base_url + "/")
        page.locator("#query").fill(RISING)
        expect(page.locator("#register")).to_be_enabled()
        # the last hour reaches before the 14 minutes kept: refused, with the range and what to pick
        page.locator("#sub-from").select_option("-1h")
        page.locator("#register").click()
        validation = page.locator("#validation")
        expect(validation).to_have_text(
            "not registered: from 30240000 is before the history the server retains: events from 33000000 to "
            '33840000 (retain_duration, retain_bytes); pick a later start, or "from all retained events"')
        expect(validation).to_have_class("status invalid")
        expect(page.locator("#register")).to_be_enabled()
        assert c.subscriptions() == []
        shots("refused")
        page.locator("#sub-from").select_option("retained")
        page.locator("#register").click()
        expect(page.locator("#validation")).to_contain_text("registered as s1: it runs over the retained events")
        sub = c.subscription("s1")
        assert sub["backfill"]["from"] is not None

        # the bar over its matches: live once it handed over, with what it found
        box = page.locator("#backfill")
        expect(box).to_be_visible()
        expect(box).to_have_attribute("data-state", "live")
        expect(page.locator("#backfill-label")).to_have_text("backfill live")
        assert page.locator("#backfill-bar").evaluate("b => b.value") == 1
        expect(page.locator("#backfill-text")).to_contain_text("live: 2 witnesses replayed over the history from t1 = ")

        # the two witnesses of history, marked replayed
        status = page.locator("#match-status")
        expect(status).to_have_attribute("data-replayed", "2")
        replayed = page.locator("#matches tbody tr.replay")
        expect(replayed).to_have_count(2)
        expect(replayed.first.locator(".badge.replay")).to_have_text("replayed")
        expect(page.locator("#matches thead")).not_to_contain_text("replay")  # a mark, not a column
        shots("replayed")

        # a live event: its witnesses come after them, unmarked
        c.post_events([stock("IBM", 200.0, 100, 33900000)])
        wait_until(lambda: c.subscription("s1")["last_seq"] > 2)
        live = c.subscription("s1")["last_seq"] - 2
        expect(status).to_have_attribute("data-received", str(2 + live))
        expect(page.locator("#matches tbody tr:not(.replay)")).to_have_count(live)
        expect(page.locator("#matches tbody tr.replay")).to_have_count(2)
        expect(page.locator("#matches tbody tr").first).not_to_have_class("replay")  # newest first
        expect(box).to_have_attribute("data-state", "live")  # kept for the record
        expect(page.locator("#validation")).to_contain_text("registered as s1: it runs over the retained events")
        expect(page.locator("#graph svg.automaton g.node")).to_have_count(4)
        expect(page.locator("#subscriptions tbody tr[data-sid=s1] .badge.backfill")).to_have_count(0)  # live
        shots("live")


def test_a_running_backfill_shows_its_bar_badge_and_automaton_until_it_hands_over(server, page, shots, monkeypatch):
    """While the hand-over is held back (the engine never quiesces) the backfill reads what the
    live engine has released (five of the six quotes: the sixth is taken at the cut) and stays
    running: the bar, the list's badge and the automaton (no live instances yet: they are on
    the backfill's own engine) show it; let go, it hands over, its two witnesses come, marked."""
    held = [True]
    monkeypatch.setattr(server.daemon.backfills, "quiesce", lambda: not held[0])
    with CayugaClient(server.base_url) as c:
        _send_example(c)
        wait_until(lambda: c.preview({"cel": RISING}, "retained")["events"] == 6)
        sid = c.subscribe(cel=RISING, from_="retained")["id"]
        wait_until(lambda: c.subscription(sid)["backfill"]["events_done"] == 5)
        assert c.subscription(sid)["backfill"]["state"] == "running"
        page.goto(server.base_url + "/")
        row = page.locator(f"#subscriptions tbody tr[data-sid={sid}]")
        row.click()
        box = page.locator("#backfill")
        expect(box).to_have_attribute("data-state", "running")
        expect(page.locator("#backfill-label")).to_have_text("backfill 83%")
        expect(page.locator("#backfill-text")).to_have_text(
            "running over history: 5 of 6 events from t1 = 33000000, 0 witnesses so far")
        assert page.locator("#backfill-bar").evaluate("b => b.value") == 5 / 6
        expect(row.locator(".badge.backfill")).to_have_text("backfill 83%")
        expect(page.locator("#graph svg.automaton g.node")).to_have_count(4)  # drawn, no live instance counted
        expect(page.locator("#match-status")).to_contain_text("live")
        shots("running")
        held[0] = False
        expect(box).to_have_attribute("data-state", "live")
        expect(page.locator("#backfill-label")).to_have_text("backfill live")
        expect(row.locator(".badge.backfill")).to_have_count(0)
        expect(page.locator("#matches tbody tr.replay")).to_have_count(2)
        expect(page.locator("#backfill-text")).to_contain_text("live: 2 witnesses replayed")
        expect(page.locator("#graph-panel")).not_to_contain_text("removed")
        shots("live")
