"""max_instances_per_subscription under crash recovery (issue 13): an
eviction happens at a wall-clock-dependent moment, so the server records it
— (fed, subscription, keep) in the store — and a recovery replaying the
journal applies it again at the same point: the witnesses after recovery are
exactly those of the uninterrupted run. The crash is simulated by a stop
without the shutdown snapshot (the journal is then all a restart has after
the last snapshot)."""

from __future__ import annotations

import time

import pytest

from clients.client import CayugaClient
from clients.testing import wait_until
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


def _evicted(d, n: int) -> None:
    _wait(lambda: d.counters.get(Count.INSTANCE_EVICTIONS) >= n, f"eviction {n}")


def _crash(srv: RunningServer) -> None:
    srv.daemon.checkpoints.final = lambda: None  # no shutdown snapshot: as after kill -9
    srv.stop()


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_replay_applies_each_recorded_eviction_again_at_the_same_point(tmp_path, snapshot):
    settings = make_settings(tmp_path, max_instances_per_subscription=5, snapshot_seconds=0,
                             snapshot_events=10_000_000)
    first: list = []
    srv = RunningServer(settings)
    _capture(srv, first)
    srv.start()
    d = srv.daemon
    fed = cut = 0
    try:
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=PAIRS)["id"]
            c.post_events([stock(f"A{i}", 1.0, 1, i) for i in range(1, 9)])  # 8 instances: 3 go
            fed += 8
            _evicted(d, 1)
            if snapshot:  # a snapshot after the first eviction: the replay must not apply it again
                d.submit(lambda eng: d.checkpoints.take(time.monotonic())).result(timeout=10)
                _wait(lambda: not d.snapshotter.running, "snapshot")
                assert d.snapshotter.taken == 1
                cut = len(first)
            # A1..A3 are gone; A4 matches; B1..B4 are new: 5 - 1 + 1 (A4's own new) + 4 = 9 -> 4 go
            c.post_events([stock("A1", 2.0, 1, 10), stock("A4", 2.0, 1, 11)]
                          + [stock(f"B{i}", 2.0, 1, 11 + i) for i in range(1, 5)])
            fed += 6
            _evicted(d, 2)
            c.post_events([stock(n, 3.0, 1, 20 + i) for i, n in enumerate(["A1", "A5", "A8", "B1", "B4", "A4"])])
            fed += 6
            _wait(lambda: d.events_taken == fed, "fed")
            _wait(lambda: not d.witnesses.outbox, "delivered")
            # a subscription near the limit is evicted after a batch once a tenth above it (here 6), and
            # at the next count down to it: wait for that, so that the recovery has nothing left to decide
            _wait(lambda: d.instance_count(sid) <= 5, "back at the limit")
    finally:
        _crash(srv)
    # read once the engine thread has stopped: a count pass that was under way when the
    # count above was read may still decide (and record) one more eviction before it ends
    evicted = d.counters.get(Count.INSTANCES_EVICTED)
    decided = d.counters.get(Count.INSTANCE_EVICTIONS)
    assert evicted >= 7

    second: list = []
    srv = RunningServer(settings)
    _capture(srv, second)
    srv.start()
    d = srv.daemon
    try:
        _wait(lambda: d.caught_up and d.events_taken == fed, "replay")
        _wait(lambda: len(second) >= len(first) - cut, "witnesses", timeout=10)
        assert d.recovered.get("replayed_events") == (fed - 8 if snapshot else fed)
        assert decided >= 2
        assert d.counters.get(Count.INSTANCE_EVICTIONS) == decided - (1 if snapshot else 0)  # applied again, not decided
        recorded = d.store.evictions()
        assert [(f, s, k) for _q, f, s, k in recorded][-1][1:] == (sid, 5)
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
