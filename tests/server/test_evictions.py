"""Shedding under crash recovery (issues 13 and 31): a shedding happens at a
fixed point of the input (server/budget.py) and is recorded — (fed,
subscription, keep, reason) in the store — before it is applied, so a recovery
replaying the journal applies it again at the same point: the witnesses after
recovery are exactly those of the uninterrupted run, and the subscription is
still marked inexact. The crash is simulated by a stop without the shutdown
snapshot (the journal is then all a restart has after the last snapshot)."""

from __future__ import annotations

import time

import pytest

from clients.client import CayugaClient
from clients.testing import wait_until
from server.budget import CAP_CHECK_EVENTS, SHED_TO
from server.observability.counters import Count
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings, stock

PAIRS = "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"


def _key(em) -> tuple:
    return (em.owner, em.stream, em.event.values, em.event.t0, em.event.t1)


def _capture(srv: RunningServer, out: list) -> None:
    """Record every emission (engine thread) before the daemon starts restoring."""
    eng = srv.daemon.engine
    deliver = eng.on_emit

    def on_emit(em):
        out.append(_key(em))
        deliver(em)

    eng.on_emit = on_emit


def _wait(cond, what: str, timeout: float = 20) -> None:
    wait_until(cond, timeout, what)


def _crash(srv: RunningServer) -> None:
    srv.daemon.checkpoints.final = lambda: None  # no shutdown snapshot: as after kill -9
    srv.stop()


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_replay_applies_each_recorded_shedding_again_at_the_same_point(tmp_path, snapshot):
    # white-box: it captures the engine's own emissions (tests/server/test_workers.py has the worker's case)
    settings = make_settings(tmp_path, max_instances_per_subscription=5, snapshot_seconds=0,
                             snapshot_events=10_000_000, time="event", engine_workers=0)
    keep = int(5 * SHED_TO)
    first: list = []
    srv = RunningServer(settings)
    _capture(srv, first)
    srv.start()
    d = srv.daemon
    cut = 0
    try:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=PAIRS)["id"]
            # 300 open instances: at the check after the 256th event, all but the newest `keep` go
            c.post_events([stock(f"A{i}", 1.0, 1, i) for i in range(1, 301)])
            _wait(lambda: d.events_taken == 300, "fed")
            assert d.counters.get(Count.INSTANCES_EVICTED) == CAP_CHECK_EVENTS - keep
            if snapshot:  # a snapshot after the first shedding: the replay must not apply it again
                d.submit(lambda eng: d.checkpoints.take(time.monotonic())).result(timeout=10)
                _wait(lambda: not d.snapshotter.running, "snapshot")
                assert d.snapshotter.taken == 1
                cut = len(first)
            # A250..A299 again (those kept match), and 250 new names: a second shedding at event 512
            c.post_events([stock(f"A{i}", 2.0, 1, 50 + i) for i in range(250, 300)]
                          + [stock(f"B{i}", 2.0, 1, 400 + i) for i in range(1, 251)])
            c.post_events([stock(n, 3.0, 1, 700 + i) for i, n in enumerate(["A1", "A300", "B1", "B249", "B250"])])
            _wait(lambda: d.events_taken == 605, "fed")
            _wait(lambda: not d.witnesses.outbox, "delivered")
            assert d.counters.get(Count.INSTANCE_EVICTIONS) == 2
    finally:
        _crash(srv)
    decided = d.counters.get(Count.INSTANCE_EVICTIONS)
    lost = d.budget.inexact[sid].instances_lost

    second: list = []
    srv = RunningServer(settings)
    _capture(srv, second)
    srv.start()
    d = srv.daemon
    try:
        _wait(lambda: d.caught_up and d.events_taken == 605, "replay")
        _wait(lambda: len(second) >= len(first) - cut, "witnesses", timeout=10)
        assert d.recovered.get("replayed_events") == (605 - 300 if snapshot else 605)
        # applied again, not decided anew (a snapshot already holds the first)
        assert d.counters.get(Count.INSTANCE_EVICTIONS) == decided - (1 if snapshot else 0)
        with CayugaClient(srv.base_url) as c:
            sub = c.subscription(sid)
        assert sub["exact"] is False and sub["inexact"]["instances_lost"] == lost
        recorded = d.store.evictions()
        assert [(f, s) for _q, f, s, *_rest in recorded] == [(256, sid), (512, sid)][1 if snapshot else 0:]
        assert all("max_instances_per_subscription (5)" in r[4] for r in recorded)
        for n in (1, 2):  # once every kept snapshot includes them, the records go
            d.processing.changes += 1
            d.submit(lambda eng: d.checkpoints.take(time.monotonic())).result(timeout=10)
            _wait(lambda n=n: d.snapshotter.taken == n and not d.snapshotter.running, "snapshot")
        assert d.store.evictions() == []
    finally:
        srv.stop()
    expected = first[cut:]
    assert second == expected
    assert expected  # the replay had witnesses to compare
    assert_no_cayuga_threads()
