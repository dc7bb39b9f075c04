"""The console in a real browser: a new user's first subscription (an error
marked, then the query's warning shown apart from errors), the offline
/docs, the console behind a token, and a burst of 10K witnesses."""

from __future__ import annotations

import threading

from clients.client import CayugaClient
from clients.testing import waiting
from tests.conftest import ROOT
from tests.server.conftest import kept_by_cap, stock
from tests.ui.conftest import expect

# The README's query, over three lines, with a typo on the second line.
QUERY = """SELECT Name, Price_1 AS Before, Price AS After
FROM Stock NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock
PUBLISH Rising"""
TYPO = QUERY.replace("$2.Price >=", "$2.Prise >=")
BOUNDED = QUERY.replace("1.05 * $1.Price", "1.05 * $1.Price AND DUR < 1 HOUR")


def wait_until(fn, timeout: float = 15.0) -> None:
    waiting.wait_until(fn, timeout, what=getattr(fn, "__name__", "the condition"))


def test_a_new_user_writes_registers_sees_the_automaton_and_its_matches(server, page, shots):
    page.goto(server.base_url + "/")
    expect(page.locator("#streams tbody tr[data-stream=Stock]")).to_be_visible()
    expect(page.locator("#health")).to_contain_text("ok")
    shots("open")

    # a typo: the error is marked at its line and column, with its message
    page.locator("#query").fill(TYPO)
    line2 = TYPO.split("\n")[1]
    column = line2.index("$2.Prise") + 1
    error = page.locator("#errors li.error")
    expect(error).to_have_count(1)
    expect(error).to_contain_text(f"line 2, column {column}: unknown attribute '$2.Prise'")
    mark = page.locator("#editor mark.error-mark")
    expect(mark).to_have_text("$2.Prise")
    expect(mark).to_have_attribute("data-line", "2")
    expect(mark).to_have_attribute("data-column", str(column))
    expect(page.locator("#editor .gutter b")).to_have_text("2")
    expect(page.locator("#register")).to_be_disabled()
    error_color = error.evaluate("li => getComputedStyle(li).color")
    shots("typo-marked")

    # with a time bound in NEXT{}: valid, nothing to warn of
    page.locator("#query").fill(BOUNDED)
    expect(page.locator("#validation")).to_have_text("✓ valid CEL; publishes Rising")
    expect(page.locator("#warnings li")).to_have_count(0)

    # fixed: valid, with a warning (the NEXT keeps quotes that never rise), and it registers all the same
    page.locator("#query").fill(QUERY)
    expect(page.locator("#validation")).to_contain_text("valid CEL; publishes Rising (1 warning below)")
    expect(page.locator("#editor mark.error-mark")).to_have_count(0)
    expect(page.locator("#errors li")).to_have_count(0)
    warning = page.locator("#warnings li.warning")
    expect(warning).to_have_count(1)
    next_column = line2.index("NEXT") + 1
    expect(warning).to_contain_text(f"line 2, column {next_column}: warning: NEXT keeps each partial match")
    expect(warning).to_contain_text("NEXT{... AND DUR < 1 HOUR}")
    assert warning.evaluate("li => getComputedStyle(li).color") != error_color  # not shown as an error
    mark = page.locator("#editor mark.warning-mark")
    expect(mark).to_have_text("NEXT")
    expect(mark).to_have_attribute("data-line", "2")
    expect(mark).to_have_attribute("data-column", str(next_column))
    expect(page.locator("#editor .gutter i.warning")).to_have_text("2")
    expect(page.locator("#register")).to_be_enabled()
    shots("fixed")
    page.locator("#sub-name").fill("rising")
    page.locator("#register").click()
    expect(page.locator("#subscriptions tbody tr[data-sid=s1]")).to_contain_text("Rising")
    expect(page.locator("#validation")).to_have_text("registered as s1")
    expect(page.locator("#warnings li.warning")).to_have_count(1)  # the registration's own warning

    # the automaton: three states, the filter loop with its predicate, the output stream
    graph = page.locator("#graph svg.automaton")
    expect(graph).to_be_visible()
    nodes = graph.locator("g.node")
    assert sorted(nodes.evaluate_all("ns => ns.map(n => n.dataset.key)")) == ["0/0", "0/1", "0/2", "out:Rising"]
    expect(graph.locator("g.node[data-key='0/1']")).to_contain_text("Price_1 float")
    expect(graph.locator("g.node[data-key='0/2']")).to_contain_text("After float")
    edges = graph.locator("g.edge").evaluate_all(
        "es => es.map(e => [e.dataset.kind, e.dataset.from, e.dataset.to, e.querySelector('text')?.textContent || ''])")
    assert sorted(edges) == sorted([
        ["forward", "0/0", "0/1", "TRUE"],
        ["filter", "0/1", "0/1", "EV.Name = NODE.Name_1AND EV.Price >= 1.05 * NODE.Price_1"],  # two tspans
        ["forward", "0/1", "0/2", "TRUE"],
        ["output", "0/2", "out:Rising", ""],
    ])
    expect(graph.locator("text.count[data-state='0/1']")).to_have_text("0 instances")
    shots("automaton")

    # the six events of the paper's example, sent from the page: two witnesses stream in
    expect(page.locator("#match-status")).to_contain_text("live")
    page.locator("#events-input").fill((ROOT / "examples" / "example9.jsonl").read_text())
    page.locator("#send-events").click()
    expect(page.locator("#send-result")).to_have_text("6 accepted, 0 rejected, 0 late")
    rows = page.locator("#matches tbody tr")
    expect(rows).to_have_count(2)
    got = rows.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert sorted(got) == sorted([["Rising", "33300000", "33840000", "IBM", "85", "91"],
                                  ["Rising", "33660000", "33840000", "IBM", "81", "91"]])
    expect(page.locator("#matches thead")).to_contain_text("Before")
    # the six events left six runs waiting at state 1 (the live count follows)
    expect(graph.locator("text.count[data-state='0/1']")).to_have_text("6 instances")
    expect(page.locator("#subscriptions tbody tr[data-sid=s1] td").nth(3)).to_have_text("6")
    shots("matches")


def test_docs_render_offline(server, page, shots):
    page.goto(server.base_url + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Cayuga")
    expect(page.locator(".swagger-ui .opblock-summary-path[data-path='/subscriptions/validate']")).to_be_visible()
    shots("docs")


def test_the_console_asks_for_the_token_and_uses_it(start_server, page, shots):
    srv = start_server(auth_tokens=["sekret"])
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(srv.base_url + "/")
    dialog = page.locator("dialog#login")
    expect(dialog).to_be_visible()
    shots("asks")
    page.locator("#token").fill("wrong")
    page.locator("#login-submit").click()
    expect(page.locator("#login-error")).to_have_text("That token was not accepted.")
    page.locator("#token").fill("sekret")
    page.locator("#login-submit").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#streams tbody tr[data-stream=Stock]")).to_be_visible()
    # REST (validate, register, events) and the WebSocket all carry the token
    page.locator("#example").click()
    expect(page.locator("#validation")).to_contain_text("valid CEL")
    page.locator("#register").click()
    expect(page.locator("#graph svg.automaton g.node")).to_have_count(4)
    expect(page.locator("#match-status")).to_contain_text("live")
    page.locator("#send-events").click()
    expect(page.locator("#matches tbody tr")).to_have_count(2)
    expect(page.locator("#match-status")).not_to_contain_text("disconnected")
    assert sockets and not [u for u in sockets if "token" in u or "sekret" in u], sockets  # in a subprotocol
    shots("authorised")
    # delete takes a second click
    delete = page.locator("#subscriptions tbody tr[data-sid=s1] button.delete")
    delete.click()
    expect(delete).to_have_text("sure?")
    delete.click()
    expect(page.locator("#subscriptions tbody tr")).to_have_count(0)
    expect(page.locator("#graph svg")).to_have_count(0)
    assert srv.daemon.subscriptions == {}


def test_a_burst_of_10k_witnesses_keeps_the_page_responsive_and_bounded(start_server, page, shots):
    n = 10_000
    srv = start_server(client_buffer=2 * n)
    with CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT * FROM FILTER{Volume > 0}(Stock) PUBLISH Every")["id"]
        page.goto(srv.base_url + "/")
        with page.expect_websocket() as opened:
            page.locator(f"#subscriptions tbody tr[data-sid={sid}]").click()
        assert f"/ws/subscriptions/{sid}?batch=500" in opened.value.url
        frames = []
        opened.value.on("framereceived", lambda frame: frames.append(len(frame)))
        wait_until(lambda: srv.daemon.hub.client_count == 1)
        sender = threading.Thread(target=c.post_events,
                                  args=([stock(f"N{i % 50}", float(i), 1 + i, i) for i in range(n)],))
        sender.start()
        try:
            # the page answers while the burst arrives: a script, a click, typing
            assert page.evaluate("() => 6 * 7") == 42
            page.locator("#pause").click()
            expect(page.locator("#pause")).to_have_text("Resume")
            page.locator("#pause").click()
            expect(page.locator("#pause")).to_have_text("Pause")
        finally:
            sender.join(60)
        status = page.locator("#match-status")
        expect(status).to_have_attribute("data-received", str(n), timeout=60_000)
        expect(status).to_contain_text("1000 kept (at most 1000)")
        assert len(frames) < n  # several witnesses to a message
        expect(page.locator("#matches tbody tr")).to_have_count(200)  # drawn: the newest 200
        expect(page.locator("#matches tbody tr").first).to_contain_text(f"{n - 1}")
        page.locator("#match-filter").fill('"N7"')  # Name N7 among the kept 1000: every 50th
        expect(page.locator("#matches tbody tr")).to_have_count(20)
        assert page.evaluate("() => 6 * 7") == 42
        shots("after-burst")
        assert c.health()["status"] == "ok"


def test_an_inexact_subscription_is_badged_in_the_list_and_over_its_matches(start_server, page, shots):
    """Issue 31: a subscription that lost partial matches (here its own cap) says
    so where a user looks: a badge in the subscriptions list (its title says how
    many), and over its live matches (the WebSocket's control message), never a row."""
    srv = start_server(time="event")
    with CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs",
                          max_instances=10)["id"]
        c.post_events([stock(f"S{i}", 1.0, 1, i) for i in range(1, 257)])  # the check after event 256 sheds
        lost = 256 - len(kept_by_cap([f"S{i}" for i in range(1, 257)], 10, c.health()["engine_workers"]))
        wait_until(lambda: (c.subscription(sid).get("inexact") or {}).get("instances_lost") == lost)
        page.goto(srv.base_url + "/")
        row = page.locator(f"#subscriptions tbody tr[data-sid={sid}]")
        badge = row.locator(".badge.inexact")
        expect(badge).to_have_text("inexact")
        expect(badge).to_have_attribute("title", f"lost {lost} partial matches when the server shed state: its "
                                                  "witnesses may lack some (see /health)")  # 247 with one engine
        expect(page.locator("#health")).to_contain_text("degraded · 1 inexact")
        row.click()
        over = page.locator("#match-inexact")
        expect(over).to_be_visible()
        expect(over).to_have_text("inexact since #0")
        c.post_events([stock("S256", 2.0, 1, 300)])  # a witness still comes, as a row; the notice never does
        expect(page.locator("#match-status")).to_contain_text("1 received")
        expect(page.locator("#matches tbody tr")).to_have_count(1)
        shots("inexact")


def test_a_broken_subscription_is_badged_with_why_and_what_to_do(start_server, page, shots):
    """Issue 33: a stored subscription that no longer compiles against the configuration (its
    stream was removed) is listed with a badge whose title says why and what to do; the health
    pill counts it; selecting it says so instead of drawing automata it does not have."""
    stock_schema = {"Name": "string", "Price": "float", "Volume": "int"}
    srv = start_server(streams={"Stock": stock_schema, "Trade": {"Sym": "string", "Qty": "int"}})
    with CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel="SELECT * FROM FILTER{Qty > 5} Trade PUBLISH Big")["id"]
    srv.stop()
    srv = start_server(streams={"Stock": stock_schema})  # the same data directory, without Trade
    page.goto(srv.base_url + "/")
    row = page.locator(f"#subscriptions tbody tr[data-sid={sid}]")
    badge = row.locator(".badge.broken")
    expect(badge).to_have_text("broken")
    expect(badge).to_have_attribute("title", "it reads stream Trade, which the configuration no longer declares "
                                              "(streams in config.yaml or CAYUGA_STREAMS); fix the configuration (the "
                                              "streams it reads, their types, its functions) and restart: it comes "
                                              "back by itself; or delete it")
    expect(page.locator("#health")).to_contain_text("degraded · 1 broken")
    row.click()
    expect(page.locator("#graph-title")).to_contain_text(f"{sid} is broken: it reads stream Trade")
    shots("broken")


def test_the_console_shows_only_what_the_token_may_do(start_server, page, shots):
    """Issue 38: a watch token sees the overview, the automaton and the matches, but no editor, no
    delete button, no test events and no metrics link; an ingest token sees only the box that sends
    events, and says why the rest is missing."""
    srv = start_server(auth_tokens=[{"name": "dashboard", "token": "dash", "scopes": ["watch"]},
                                    {"name": "feeder", "token": "feed", "scopes": ["ingest"]}, "adm"])
    with CayugaClient(srv.base_url, token="adm") as admin:
        sid = admin.subscribe(cel="SELECT * FROM Stock PUBLISH All")["id"]
        page.goto(srv.base_url + "/")
        page.locator("#token").fill("dash")
        page.locator("#login-submit").click()
        expect(page.locator("#whoami")).to_have_text("dashboard: watch")
        expect(page.locator(f"#subscriptions tbody tr[data-sid={sid}]")).to_be_visible()
        for hidden in ("#editor-panel", "#send-events", "a[href='/metrics']", "button.delete"):
            expect(page.locator(hidden)).to_be_hidden()
        page.locator(f"#subscriptions tbody tr[data-sid={sid}]").click()
        expect(page.locator("#match-status")).to_contain_text("live")
        admin.post_events([stock("IBM", 1.0, 1, 1)])
        expect(page.locator("#matches tbody tr")).to_have_count(1)
        shots("watch-only")
    page.locator("#logout").click()
    page.locator("#token").fill("feed")
    page.locator("#login-submit").click()
    expect(page.locator("#whoami")).to_have_text("feeder: ingest")
    expect(page.locator("#no-watch")).to_contain_text("The token feeder has no watch scope")
    for hidden in ("#editor-panel", "#subscriptions", "#matches-panel", "#charts"):
        expect(page.locator(hidden)).to_be_hidden()
    page.locator("#events-input").fill('{"stream": "Stock", "Name": "IBM", "Price": 2, "Volume": 2}')
    page.locator("#send-events").click()
    expect(page.locator("#send-result")).to_contain_text("1 accepted")
    shots("ingest-only")


def test_a_stopped_engine_worker_is_named_in_the_health_pill(start_server, page, shots):
    """Issue 32, stage 3: an engine worker killed until it is no longer started again is named
    in the health pill (with its subscription counted inexact); the pill's title gives each
    worker's figures: its state, events, instances, batches in flight, CPU and restarts."""
    import os
    import re
    import signal

    from server.observability.threadcpu import cpu_wait
    from server.workers.restart import MAX_DEATHS

    srv = start_server(engine_workers=1)
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        c.subscribe(cel="SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Up")
        # running: its CPU, and how long it waited for a core (where the kernel says: schedstat)
        page.goto(srv.base_url + "/")
        waits = r" \(\d+\.\d s waiting for a core\)" if cpu_wait("/proc/thread-self/schedstat") is not None else ""
        expect(page.locator("#health")).to_have_attribute("title", re.compile(
            rf"worker 0: running, \d+ events, \d+ instances, 0 batches in flight, \d+\.\d s CPU{waits}, 0 restarts"))
        for k in range(MAX_DEATHS):
            pid = d.links[0].process.pid
            os.kill(pid, signal.SIGKILL)
            if k < MAX_DEATHS - 1:
                wait_until(lambda: (w := c.health()["workers"][0])["state"] == "running" and w["pid"] != pid)
        wait_until(lambda: c.health()["workers"][0]["state"] == "stopped")
    page.goto(srv.base_url + "/")
    pill = page.locator("#health")
    expect(pill).to_contain_text("degraded · worker 0 stopped · 1 inexact")
    expect(pill).to_have_attribute("title", re.compile(
        r"worker 0: stopped, \d+ events, \d+ instances, 0 batches in flight, \? s CPU, 2 restarts"))
    shots("worker-stopped")
