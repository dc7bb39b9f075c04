"""The state budget (issue 31, server/budget.py): memory for automaton state is
bounded in bytes, shedding happens at fixed points of the input (the same
events give the same witnesses and the same numbers on every run), and it is
never silent: /health, GET /subscriptions/{id}, /metrics, /stats, the
subscription's watchers (a control message) and ``cayuga watch`` (a line on
standard error) all say which subscription lost what, from which witness on."""

from __future__ import annotations

import json
import subprocess

from clients.client import CayugaClient
from clients.testing import cayuga_command, cayuga_env, logged_witnesses, wait_until
from clients.testing.market import RISING, STOCK, random_walk
from server.budget import CAP_CHECK_EVENTS, CHECK_EVENTS
from server.config import Settings
from tests.server.conftest import kept_by_cap, stock

PAIRS = "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"
#: keeps one instance per event for good: nothing ever satisfies its predicate
NEVER = "SELECT * FROM Stock NEXT{$1.Name = $2.Name AND $2.Price > 1000 * $1.Price} Stock PUBLISH Never"
HIGH = "SELECT * FROM FILTER{Price > 50}(Stock) PUBLISH High"
RISING_BOUNDED = RISING.replace("$1.Price}", "$1.Price AND DUR < 400}").replace("Rising", "RisingSoon")


def _metrics(base_url: str) -> dict[str, float]:
    with CayugaClient(base_url) as c:
        text = c.http.get("/metrics").text
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.splitlines()
                                        if line and not line.startswith("#"))}


def _ticks(n: int, symbols: int, seed: int) -> list[dict]:
    return [stock(e.values[0], e.values[1], e.values[2], e.t0) for e in random_walk(symbols, n, seed=seed,
                                                                                    down=0.01, up=0.01)]


def test_the_default_budget_is_a_share_of_memory_not_a_count():
    s = Settings()
    assert s.max_instances_per_subscription == 0  # no count limit by default
    assert s.max_state_bytes >= 256 << 20  # a share of the machine's memory: hundreds of MB at least
    assert CAP_CHECK_EVENTS < CHECK_EVENTS and CHECK_EVENTS % CAP_CHECK_EVENTS == 0


def test_a_cap_sheds_the_oldest_at_a_fixed_point_and_every_place_says_so(start_server):
    srv = start_server(time="event")
    d = srv.daemon
    notices: list[dict] = []
    with CayugaClient(srv.base_url) as c:
        capped = c.subscribe(cel=PAIRS, name="capped", max_instances=50)
        other = c.subscribe(cel=PAIRS.replace("Pairs", "Pairs2").replace("$2.Name}", "$2.Name AND $2.Price > 0}"))
        assert capped["exact"] and capped["limits"] == {"max_instances": 50, "max_state_bytes": None}
        # one engine keeps the newest 45 (S212..S256); N workers (PAIRS is row-scaled) the newest of
        # each key group, 90% of 50/N each (tests/server/conftest.py)
        workers = c.health()["engine_workers"]
        kept = kept_by_cap([f"S{i}" for i in range(1, CAP_CHECK_EVENTS + 1)], 50, workers)
        with c.watch(capped["id"], timeout=30, on_notice=notices.append) as matches:
            # 300 open instances; at the check after the 256th event, 256 > 50: the oldest go
            c.post_events([stock(f"S{i}", 1.0, 1, i) for i in range(1, 301)])
            wait_until(lambda: d.events_taken == 300, what="the events taken")
            oldest_kept = min(int(name[1:]) for name in kept)
            c.post_events([stock("S1", 2.0, 1, 301), stock(f"S{oldest_kept - 1}", 2.0, 1, 302),
                           stock(f"S{oldest_kept}", 2.0, 1, 303)])
            got = [next(matches)]
            wait_until(lambda: notices, what="the control message on the open watch")
        assert [(w["t0"], w["t1"]) for w in got] == [(oldest_kept, 303)]  # the older were shed, the oldest kept matched
        keep = len(kept)
        lost = CAP_CHECK_EVENTS - keep
        sub = c.subscription(capped["id"])
        assert sub["exact"] is False
        assert sub["inexact"]["instances_lost"] == lost and sub["inexact"]["since_seq"] == 0
        assert sub["inexact"]["since_events"] == CAP_CHECK_EVENTS and "max_instances (50" in sub["inexact"]["reason"]
        assert c.subscription(other["id"])["exact"] is True
        (note,) = notices  # one: later cuts within NOTICE_SECONDS are not told again (the count is in /health)
        assert note["control"] == "inexact" and note["subscription"] == capped["id"] and "lost" in note["message"]
        assert note["instances_lost"] == lost  # with N workers, once every worker's cut is in: all of them
        h = c.health()
        assert h["status"] == "degraded" and list(h["inexact"]) == [capped["id"]]
        assert f"{capped['id']} lost {lost} partial matches" in h["reason"]
        assert c.http.get("/readyz").status_code == 200  # still serving: only its results are affected
        m = _metrics(srv.base_url)
        assert m[f'cayuga_subscription_inexact{{subscription="{capped["id"]}"}}'] == 1
        assert m[f'cayuga_subscription_instances_shed_total{{subscription="{capped["id"]}"}}'] == lost
        assert m["cayuga_instances_evicted_total"] == lost
        assert c.http.get("/stats").json()["subscriptions"][capped["id"]]["inexact"] == lost
        late: list[dict] = []  # a watcher that connects later hears of it at once
        with c.watch(capped["id"], timeout=30, on_notice=late.append) as again:
            c.post_events([stock("S300", 3.0, 1, 304)])
            assert next(again)["t0"] == 300
        assert late and late[0]["instances_lost"] == lost
        c.unsubscribe(capped["id"])
        wait_until(lambda: c.health()["status"] == "ok", what="the mark gone with the subscription")


def test_cayuga_watch_says_it_on_standard_error_and_prints_only_witnesses(start_server):
    srv = start_server(time="event")
    with CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=PAIRS, max_state_bytes="8KB")["id"]
        c.post_events([stock(f"S{i}", 1.0, 1, i) for i in range(1, CAP_CHECK_EVENTS + 1)])
        wait_until(lambda: not c.subscription(sid)["exact"], what="the shedding")
        c.post_events([stock(f"S{CAP_CHECK_EVENTS}", 2.0, 1, CAP_CHECK_EVENTS + 1)])
        run = subprocess.run(cayuga_command("watch", sid, "--url", srv.base_url, "--from-start", "--count", "1"),
                             env=cayuga_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert [json.loads(line)["t0"] for line in run.stdout.splitlines()] == [CAP_CHECK_EVENTS]
    assert f"subscription {sid} lost" in run.stderr and "may lack some" in run.stderr


def _run_once(start_server, data_dir, events: list[dict], budget: int) -> tuple[dict, dict, dict]:
    srv = start_server(time="event", max_state_bytes=budget, data_dir=data_dir)
    d = srv.daemon
    with CayugaClient(srv.base_url) as c:
        ids = {q: c.subscribe(cel=q)["id"] for q in (NEVER, HIGH, RISING_BOUNDED)}
        with c.sender() as snd:
            snd.send_many(events)
        wait_until(lambda: d.events_taken == len(events) and not d.witnesses.outbox, what="the events processed")
        subs = {q: c.subscription(i) for q, i in ids.items()}
    got = {q: logged_witnesses(srv.base_url, i, subs[q]["last_seq"]) for q, i in ids.items()}
    srv.stop()
    return got, subs, {q: s["exact"] for q, s in subs.items()}


def test_the_budget_sheds_the_heaviest_the_same_way_on_every_run(start_server, tmp_path):
    """Three subscriptions under a 1 MB budget: NEVER keeps an instance per event
    for good, RisingSoon a bounded window (DUR < 400: its expired instances go),
    High none. Only NEVER is shed, at the same points on both runs: every
    subscription's witnesses and numbers are the same, and the two exact ones
    give exactly the engine's witnesses (``cayuga run``'s)."""
    events = _ticks(6 * CHECK_EVENTS, 100, seed=7)
    first, subs, exact = _run_once(start_server, tmp_path / "first", events, 1_000_000)
    second, _subs, exact2 = _run_once(start_server, tmp_path / "second", events, 1_000_000)
    assert exact == exact2 == {NEVER: False, HIGH: True, RISING_BOUNDED: True}
    assert subs[NEVER]["inexact"]["since_events"] % CHECK_EVENTS == 0
    assert first == second and all(first[q] for q in (HIGH, RISING_BOUNDED))
    from air.cel import compile_cel
    from air.engine import Engine, Event
    from air.formats import witness_dict

    eng = Engine()
    eng.declare(STOCK)
    for i, q in enumerate((HIGH, RISING_BOUNDED)):
        eng.add(compile_cel(q, {"Stock": STOCK}).automata, q)
    out: dict[str, list] = {HIGH: [], RISING_BOUNDED: []}
    eng.on_emit = lambda em: out[em.owner].append(witness_dict(em.stream, em.event, eng.schema(em.stream)))
    for e in events:
        eng.feed(Event("Stock", (e["Name"], e["Price"], e["Volume"]), e["t0"], e["t1"]))
    eng.flush()
    for q in (HIGH, RISING_BOUNDED):
        assert [json.loads(w) for _n, w in first[q]] == out[q]
        assert [n for n, _w in first[q]] == list(range(1, len(out[q]) + 1))


def test_cayuga_register_sets_the_caps(start_server, tmp_path):
    srv = start_server()
    query = tmp_path / "pairs.cel"
    query.write_text(PAIRS)
    run = subprocess.run(cayuga_command("register", str(query), "--url", srv.base_url, "--max-instances", "50",
                                        "--max-state-bytes", "1MiB"),
                         env=cayuga_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    sid = run.stdout.split()[0]
    with CayugaClient(srv.base_url) as c:
        assert c.subscription(sid)["limits"] == {"max_instances": 50, "max_state_bytes": 1 << 20}
        r = c.http.post("/subscriptions", json={"cel": PAIRS, "max_state_bytes": "lots"})
    assert r.status_code == 422 and "max_state_bytes: 'lots' is not a size" in r.json()["detail"]
