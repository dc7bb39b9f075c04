"""Engine workers, row scaling (issue 32 item 2, server/workers/placement.py
and rows.py): with ``engine_workers: N`` a subscription with a partition key
(the README's Rising: per-symbol ``Name``) runs on every worker, each on the
symbols of its key group; each event goes to the worker of its symbol; the
witnesses of the workers are merged into one order before they are numbered.
Its witnesses are those of ``cayuga run`` (as a multiset), numbered alike by
two runs of the same input and by a run that was killed -9 and recovered; a
worker that gets other symbols' events for a subscription placed whole does
not feed them to its share of a row-scaled one."""

from __future__ import annotations

import io
import json
import time
from collections import Counter

import pytest

from air.cel import compile_cel
from air.engine import Engine, Event
from air.partitioning import key_group
from clients.client import CayugaClient
from clients.offline import run_offline
from clients.testing import RISING, ServerProcess, logged_witnesses, wait_until
from clients.testing.market import STOCK, increasing_cel, random_walk
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, kept_by_cap, make_settings, stock

#: placed whole (column scaling): a filter (no state), and a NEXT with no key (any symbol's rise)
EVERY = "SELECT Name, Price FROM FILTER{Volume >= 0}(Stock) PUBLISH Every"
DOUBLED = "SELECT Name, Name_1 AS Other FROM Stock NEXT{$2.Price > 1.3 * $1.Price} Stock PUBLISH Doubled"
#: placed whole with a constant route: its worker is sent only S00003's events (unless it needs others)
ONE = ("SELECT First, Price AS Last FROM (SELECT Price AS First, Price AS Last FROM FILTER{Name = 'S00003'}(Stock)) "
       "NEXT{$2.Name = 'S00003' AND $2.Price > 1.01 * $1.Last} Stock PUBLISH One")


def _events(n: int = 2400, symbols: int = 48, seed: int = 11) -> list[dict]:
    """A random walk, three ticks at each time (witnesses of several symbols, hence workers, in one epoch)."""
    return [stock(e.values[0], round(e.values[1], 4), e.values[2], i // 3)
            for i, e in enumerate(random_walk(symbols, n, seed=seed))]


def _offline(tmp_path, queries: dict[str, str], events: list[dict]) -> dict[str, Counter]:
    """``cayuga run``'s witnesses of each query, by the stream it publishes, as multisets."""
    files = []
    for name, q in queries.items():
        f = tmp_path / f"{name}.cel"
        f.write_text(q)
        files.append(str(f))
    data = "".join(json.dumps(e) + "\n" for e in events).encode()
    out: dict[str, Counter] = {}
    for w in run_offline([STOCK], files, io.BytesIO(data)).witnesses:
        out.setdefault(w["stream"], Counter())[json.dumps(w, sort_keys=True)] += 1
    return out


def _multiset(logged: list[tuple[int, str]]) -> Counter:
    return Counter(json.dumps(json.loads(body), sort_keys=True) for _n, body in logged)


def _serve(tmp_path, workers: int, queries: dict[str, str], events: list[dict]) -> dict:
    """Each subscription's numbered witnesses, where it runs, and the symbols of its instances per worker."""
    s = make_settings(tmp_path, time="event", engine_workers=workers)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = {name: c.subscribe(cel=q)["id"] for name, q in queries.items()}
        for i in range(0, len(events), 500):
            c.post_events(events[i:i + 500])
        d = srv.daemon
        wait_until(lambda: d.events_taken == len(events), what="every event through the workers")
        subs = {name: c.subscription(i) for name, i in ids.items()}
        got = {name: logged_witnesses(srv.base_url, i, subs[name]["last_seq"]) for name, i in ids.items()}
        symbols = {name: [sorted({next(v for v in inst.values if isinstance(v, str))
                                  for insts in link.call("instances", i, False).values() for inst in insts})
                          for link in d.links] for name, i in ids.items() if "row-scaled" in subs[name]["runs_on"]}
        counts = {name: [link.call("instance_count", ids[name]) for link in d.links] for name in symbols}
        # /health's instances per worker (at the next count): each worker's own, a row-scaled share on each
        own = [sum(link.call("counts")[0].values()) for link in d.links]
        wait_until(lambda: [w["instances"] for w in c.health()["workers"]] == own, what="/health's instances per worker")
        assert d.engine_error is None and all(sub["exact"] for sub in subs.values())
    return {"witnesses": got, "runs_on": {n: sub["runs_on"] for n, sub in subs.items()}, "symbols": symbols,
            "instances": counts}


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_rising_row_scaled_gives_cayuga_runs_witnesses_numbered_alike_by_two_runs(tmp_path, workers):
    events = _events()
    expected = _offline(tmp_path, {"rising": RISING}, events)["Rising"]
    assert sum(expected.values()) > 100
    first = _serve(tmp_path / "a", workers, {"rising": RISING}, events)
    second = _serve(tmp_path / "b", workers, {"rising": RISING}, events)
    assert _multiset(first["witnesses"]["rising"]) == expected
    assert [n for n, _w in first["witnesses"]["rising"]] == list(range(1, sum(expected.values()) + 1))
    assert second["witnesses"] == first["witnesses"]  # the same number for the same witness
    where = first["runs_on"]["rising"]
    if workers == 1:
        assert where == "worker 0"
    else:
        assert where == (f"workers {', '.join(map(str, range(workers)))}: row-scaled by Stock.Name, "
                         f"{workers} key groups (one per worker)")
        held = first["symbols"]["rising"]
        assert all(held) and all(key_group(sym, workers) == w for w, syms in enumerate(held) for sym in syms)
    assert_no_cayuga_threads()


def test_a_worker_feeds_a_row_scaled_subscription_only_its_own_symbols(tmp_path):
    """Beside Rising (row-scaled over two workers), a filter and a NEXT without a
    key are placed whole: the worker that runs them is sent every Stock event,
    and its share of Rising still sees only its own symbols' — its instances
    hold only those, their count is one engine's, and the witnesses are
    ``cayuga run``'s."""
    queries = {"rising": RISING, "every": EVERY, "doubled": DOUBLED, "one": ONE}
    events = _events(1500)
    expected = _offline(tmp_path, queries, events)
    got = _serve(tmp_path / "mixed", 2, queries, events)
    assert got["runs_on"]["rising"].startswith("workers 0, 1: row-scaled")
    assert {got["runs_on"][n] for n in ("every", "doubled", "one")} <= {"worker 0", "worker 1"}
    for name, stream in (("rising", "Rising"), ("every", "Every"), ("doubled", "Doubled"), ("one", "One")):
        assert _multiset(got["witnesses"][name]) == expected[stream], name
    held = got["symbols"]["rising"]
    assert all(key_group(sym, 2) == w for w, syms in enumerate(held) for sym in syms)
    assert sorted(held[0] + held[1]) == sorted({e["Name"] for e in events})
    for w in (0, 1):  # each worker's share holds what one engine fed only its symbols' events holds
        eng = Engine()
        eng.declare(STOCK)
        eng.add(compile_cel(RISING, [STOCK]).automata, "rising")
        for e in events:
            if key_group(e["Name"], 2) == w:
                eng.feed(Event("Stock", (e["Name"], e["Price"], e["Volume"]), e["t0"], e["t1"]))
        assert got["instances"]["rising"][w] == eng.instance_count("rising") > 0
    assert_no_cayuga_threads()


def _snapshotting(tmp_path, every: int) -> ServerProcess:
    """``cayuga serve`` with two workers, event time and a snapshot every ``every`` events (none by
    the clock), up, in a process of its own (to be killed -9)."""
    settings = {"CAYUGA_ENGINE_WORKERS": "2", "CAYUGA_TIME": "event", "CAYUGA_SNAPSHOT_SECONDS": "0",
                "CAYUGA_SNAPSHOT_EVENTS": str(every)}
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", settings)
    srv.start()
    try:
        srv.wait_up()
    except BaseException:
        srv.stop()
        raise
    return srv


def _wait_for_a_snapshot(tmp_path) -> None:
    snaps = tmp_path / "data" / "snapshots"
    wait_until(lambda: snaps.exists() and any(p.name.endswith(".w1") for p in snaps.iterdir()),
               what="a snapshot with worker 1's part")


def test_per_symbol_queries_of_one_shape_are_planned_once_and_routed_by_their_own_symbol(tmp_path, monkeypatch):
    """Queries of one shape whose symbol is written at every step (``increasing_cel``: a
    place a step holds it) are planned from the first one's plan, each routed by its own
    symbol; one of the same shape whose steps name two symbols is planned afresh (it has no
    route: it is sent both symbols' events); the witnesses are ``cayuga run``'s."""
    import server.workers.placement as placement_module

    planned = []
    real = placement_module.constant_route
    monkeypatch.setattr(placement_module, "constant_route", lambda autos, schemas: planned.append(1) or
                        real(autos, schemas))
    events = _events(1800, symbols=12)
    names = sorted({e["Name"] for e in events})[:8]
    queries = {name: increasing_cel(name, 3) for name in names}
    mixed = increasing_cel(names[0], 3).replace(f"$2.Name = '{names[0]}'", f"$2.Name = '{names[1]}'", 1)
    assert mixed != queries[names[0]]
    queries["mixed"] = mixed.replace(f"Up_{names[0]}", "Up_mixed")
    expected = _offline(tmp_path, queries, events)
    s = make_settings(tmp_path, time="event", engine_workers=2)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        ids = {names[0]: c.subscribe(cel=queries[names[0]])["id"]}
        first = len(planned)  # (the first of the shape: planned from its automata)
        assert first > 0
        ids.update(zip(names[1:], (sub["id"] for sub in c.subscribe_many([queries[n] for n in names[1:]]))))
        assert len(planned) == first  # the others: from its plan
        ids["mixed"] = c.subscribe(cel=queries["mixed"])["id"]
        assert len(planned) > first  # two symbols: planned afresh
        consts = srv.daemon.engine.placement.consts
        assert {n: consts.get(ids[n]) for n in names} == {n: ({"Stock": "Name"}, n) for n in names}
        assert ids["mixed"] not in consts
        c.post_events(events)
        wait_until(lambda: srv.daemon.events_taken == len(events), what="every event through the workers")
        got = {n: logged_witnesses(srv.base_url, i, c.subscription(i)["last_seq"]) for n, i in ids.items()}
    for name in [*names, "mixed"]:
        assert _multiset(got[name]) == expected.get(f"Up_{name}", Counter()), name
    assert sum(len(got[n]) for n in names) > 0 and got["mixed"]  # (it needs both symbols' events: sent both)
    assert_no_cayuga_threads()


def test_kill_9_with_a_row_scaled_subscription_loses_nothing_and_repeats_nothing(tmp_path):
    """``cayuga serve`` with two workers and Rising row-scaled, killed -9 after a
    snapshot and more events; the restart loads each worker's part, replays the
    journal after it, and the witness log holds ``cayuga run``'s witnesses once
    each, numbered as a run without the crash numbers them."""
    events = _events(3000)
    cut, more = 1200, 2100
    expected = _offline(tmp_path, {"rising": RISING}, events)["Rising"]
    reference = _serve(tmp_path / "ref", 2, {"rising": RISING}, events)["witnesses"]["rising"]
    srv = _snapshotting(tmp_path, cut)
    try:
        c = srv.http_client
        sid = c.post("/subscriptions", json={"cel": RISING}).json()["id"]
        assert c.get(f"/subscriptions/{sid}").json()["runs_on"].startswith("workers 0, 1: row-scaled")
        for lo, hi in ((0, cut), (cut, more)):
            for i in range(lo, hi, 300):
                assert c.post("/events", json=events[i:min(i + 300, hi)]).status_code < 300
            if lo == 0:  # the snapshot (every CAYUGA_SNAPSHOT_EVENTS) before the events after it
                _wait_for_a_snapshot(tmp_path)
        wait_until(lambda: c.get("/stats", params={"limit": 0}).json()["received"] == more, what="the events")
        srv.kill()
        srv.start()
        health = srv.wait_up()
        assert health["recovered"].get("snapshot") and health["recovered"].get("replayed_events", 0) > 0, \
            health["recovered"]
        c = srv.http_client
        for i in range(more, len(events), 300):
            assert c.post("/events", json=events[i:i + 300]).status_code < 300
        n = sum(expected.values())
        wait_until(lambda: c.get(f"/subscriptions/{sid}").json()["last_seq"] >= n, what="every witness")
        logged = logged_witnesses(srv.base_url, sid, n)
        sub = c.get(f"/subscriptions/{sid}").json()
        assert sub["last_seq"] == n and sub["exact"]
        assert _multiset(logged) == expected
        assert logged == reference
    finally:
        srv.stop()


def test_a_row_scaled_subscription_deleted_or_registered_after_the_snapshot_leaves_the_others_matches(tmp_path):
    """The recovery property test's finding at 2 workers: a row-scaled subscription
    deleted after the snapshot (and another registered after it) made the snapshot look
    "taken with other row-scaled subscriptions", and every subscription restarted
    without its partial matches (inexact, /health degraded). Only those placed both then
    and now are compared: after kill -9 the one that was there throughout keeps its
    partial matches and gives ``cayuga run``'s witnesses."""
    events = _events(1800)
    cut, more = 600, 1200
    gone, late = RISING.replace("1.05", "1.06").replace("Rising", "Gone"), RISING.replace("1.05", "1.04").replace(
        "Rising", "Late")
    expected = _offline(tmp_path, {"rising": RISING}, events)["Rising"]
    srv = _snapshotting(tmp_path, cut)
    try:
        c = srv.http_client
        sid = c.post("/subscriptions", json={"cel": RISING}).json()["id"]
        doomed = c.post("/subscriptions", json={"cel": gone}).json()["id"]
        assert "row-scaled" in c.get(f"/subscriptions/{doomed}").json()["runs_on"]
        for i in range(0, cut, 300):
            assert c.post("/events", json=events[i:i + 300]).status_code < 300
        _wait_for_a_snapshot(tmp_path)
        assert c.delete(f"/subscriptions/{doomed}").status_code == 204
        added = c.post("/subscriptions", json={"cel": late}).json()["id"]
        assert "row-scaled" in c.get(f"/subscriptions/{added}").json()["runs_on"]
        for i in range(cut, more, 300):
            assert c.post("/events", json=events[i:i + 300]).status_code < 300
        wait_until(lambda: c.get("/stats", params={"limit": 0}).json()["received"] == more, what="the events")
        srv.kill()
        srv.start()
        health = srv.wait_up()
        assert health["status"] == "ok" and health["recovered"].get("snapshot"), (health, srv.log_tail())
        c = srv.http_client
        for i in range(more, len(events), 300):
            assert c.post("/events", json=events[i:i + 300]).status_code < 300
        n = sum(expected.values())
        wait_until(lambda: c.get(f"/subscriptions/{sid}").json()["last_seq"] >= n, what="every witness")
        assert _multiset(logged_witnesses(srv.base_url, sid, n)) == expected
        assert c.get(f"/subscriptions/{sid}").json()["exact"] and c.get(f"/subscriptions/{added}").json()["exact"]
        assert "does not fit" not in srv.log_tail(10 ** 7)
    finally:
        srv.stop()


@pytest.mark.parametrize("before, after", [(2, 2), (1, 2), (2, 4)])
def test_a_restart_keeps_a_row_scaled_subscriptions_matches_or_says_it_did_not(tmp_path, before, after):
    """A snapshot of two workers holds each key group's instances in that worker's
    part: two workers again take them back exactly. Another worker count splits
    the symbols otherwise (instances are not moved between key groups): the
    subscription is marked inexact, and /health says why."""
    events = _events(1800)
    expected = _offline(tmp_path, {"rising": RISING}, events)["Rising"]
    data, half = tmp_path / "data", 900
    with RunningServer(make_settings(tmp_path, data_dir=data, time="event", engine_workers=before)) as srv:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            c.post_events(events[:half])
            wait_until(lambda: srv.daemon.events_taken == half, what="the first events")
    with RunningServer(make_settings(tmp_path, data_dir=data, time="event", engine_workers=after)) as srv:
        with CayugaClient(srv.base_url) as c:
            c.post_events(events[half:])
            wait_until(lambda: srv.daemon.events_taken == len(events), what="the rest")
            sub = c.subscription(sid)
            health = c.health()
        assert "row-scaled" in sub["runs_on"]
        logged = logged_witnesses(srv.base_url, sid, sub["last_seq"])
    if before == after:
        assert sub["exact"] and _multiset(logged) == expected
    else:
        assert not sub["exact"]
        assert "could not be loaded" in health["reason"] and "key groups" in health["reason"]
        assert sum(_multiset(logged).values()) < sum(expected.values())  # the first half's quotes were lost
    assert_no_cayuga_threads()


def test_a_cap_holds_for_a_row_scaled_subscription_as_a_whole(tmp_path):
    """``max_instances`` 50 on a subscription row-scaled over two workers: each worker
    holds 25 of it (at the check, 90% of that: the newest of its key group), so the
    subscription keeps at most 50 in all, as with one engine; the reason says how it
    was split. Its count after the cuts is both workers' (one before a count was
    taken, and one after), and its watcher is told once, of both cuts."""
    pairs = "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"
    s = make_settings(tmp_path, time="event", engine_workers=2)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=pairs, max_instances=50)["id"]
        assert "row-scaled" in c.subscription(sid)["runs_on"]
        names = [f"S{i}" for i in range(1, 257)]
        kept = kept_by_cap(names, 50, 2)
        assert len(kept) == 2 * int(25 * 0.9)
        with c.frames(sid, timeout=30) as frames:  # (no two quotes of one name: no witness, the notice first)
            wait_until(lambda: not srv.daemon.hub.idle, what="the watcher")
            c.post_events([stock(name, 1.0, 1, i) for i, name in enumerate(names, 1)])  # the check after the 256th
            note = json.loads(next(frames))
        assert note["control"] == "inexact" and note["instances_lost"] == 256 - len(kept)
        assert c.subscription(sid)["inexact"]["instances_lost"] == 256 - len(kept)
        assert c.subscription(sid)["instances"] == len(kept)
        for w, link in enumerate(srv.daemon.links):  # each holds the newest of its own key group (its last pending)
            held = {inst.values[0] for insts in link.call("instances", sid, True).values() for inst in insts}
            assert held == {k for k in kept if key_group(k, 2) == w}
        assert "its max_instances (50; 25 in each of the 2 engine workers" in c.subscription(sid)["inexact"]["reason"]
        # a second round once both shares were counted: 256 more, cut again in both workers
        budget, since = srv.daemon.budget, time.monotonic()
        wait_until(lambda: budget.counted_at > since, what="a count of both workers' shares")
        more = [f"T{i}" for i in range(1, 257)]
        kept_then = kept_by_cap([k for k in names if k in kept] + more, 50, 2)
        c.post_events([stock(name, 1.0, 1, 256 + i) for i, name in enumerate(more, 1)])
        wait_until(lambda: c.subscription(sid)["inexact"]["instances_lost"] == 2 * 256 - len(kept_then),
                   what="the second round's cuts")
        assert c.subscription(sid)["instances"] == len(kept_then)
    assert_no_cayuga_threads()


TWICE = "SELECT * FROM Rising NEXT{$1.Name = $2.Name} Rising PUBLISH Twice"
ANY_RISE = "SELECT * FROM Rising NEXT{$2.After > $1.After} Rising PUBLISH AnyRise"


def test_subscriptions_reading_a_row_scaled_ones_output_join_it_or_are_refused_and_removal_at_run_time(tmp_path):
    """One that reads Rising and keeps its key (per Name) is row-scaled with it,
    inside each worker (resubscription stays in one engine); one without the key
    would need every key group's Rising: refused, saying what to do. Deleting
    and registering again while events flow: the witnesses after it are those of
    ``cayuga run`` over the events after it."""
    events = _events(1800)
    first, rest = events[:900], events[900:]
    expected = _offline(tmp_path, {"rising": RISING, "twice": TWICE}, rest)
    s = make_settings(tmp_path, time="event", engine_workers=2)
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        d = srv.daemon
        rising = c.subscribe(cel=RISING)["id"]
        twice = c.subscribe(cel=TWICE)["id"]
        assert c.subscription(twice)["runs_on"] == c.subscription(rising)["runs_on"]
        assert "row-scaled by Stock.Name" in c.subscription(twice)["runs_on"]
        r = c.http.post("/subscriptions", json={"cel": ANY_RISE})
        assert r.status_code == 400 and "no partition key" in r.text and "row_scaling: off" in r.text, r.text
        c.post_events(first)
        wait_until(lambda: d.events_taken == len(first), what="the first events")
        c.unsubscribe(rising, cascade=True)
        assert [x["id"] for x in c.subscriptions()] == []
        assert [w["subscriptions"] for w in c.health()["workers"]] == [0, 0]
        ids = {"rising": c.subscribe(cel=RISING)["id"]}
        ids["twice"] = c.subscribe(cel=TWICE)["id"]
        c.post_events(rest)
        wait_until(lambda: d.events_taken == len(events), what="the rest")
        for name, stream in (("rising", "Rising"), ("twice", "Twice")):
            sub = c.subscription(ids[name])
            assert _multiset(logged_witnesses(srv.base_url, ids[name], sub["last_seq"])) == expected[stream], name
        assert [w["subscriptions"] for w in c.health()["workers"]] == [2, 2]
    assert_no_cayuga_threads()
