"""Where each subscription runs is stored (server/workers/placement.py's ``save``,
the store's ``placement`` table), so that a restart places it where its
snapshot's instances are; a registration's chunk of subscriptions is stored in
one transaction as the chunk ends, not one a subscription (which held the engine
thread, and so every worker's events, 0.47 ms a subscription)."""

from __future__ import annotations

import logging

from clients.client import CayugaClient
from server.durability.store import Store
from server.serve import RunningServer
from server.subscriptions.registry import INSTALL_CHUNK
from server.workers.placement import Placement
from tests.server.conftest import make_settings


def _place(p: Placement, sid: str) -> int:
    return p.place(sid, {"Stock"}, {f"Out{sid}"})


def test_placements_inside_saving_once_are_stored_once_as_it_ends():
    calls: list[list[tuple[str, int]]] = []
    p = Placement(2, save=calls.append)
    assert [_place(p, "a")] == [0] and calls == [[("a", 0)]]  # outside: at once, as before
    calls.clear()
    with p.saving_once():
        where = {sid: _place(p, sid) for sid in ("b", "c", "d")}
        with p.saving_once():  # (nested: stored when the outer one ends)
            where["e"] = _place(p, "e")
        p.remove("c")  # placed and removed inside: nothing to store of it
        assert calls == []
    assert calls == [[("b", where["b"]), ("d", where["d"]), ("e", where["e"])]]
    assert {where["b"], where["d"], where["e"]} == {0, 1}  # (dealt to the least loaded: both used)


def test_a_placement_that_cannot_be_stored_is_said_and_the_subscription_still_runs(caplog):
    def full(_placed):
        raise OSError(28, "No space left on device")

    p = Placement(2, save=full)
    with caplog.at_level(logging.WARNING, logger="server.workers.placement"), p.saving_once():
        workers = [_place(p, f"s{i}") for i in range(7)]
    assert sorted(p.worker_of) == [f"s{i}" for i in range(7)] and set(workers) == {0, 1}
    [rec] = [r for r in caplog.records if "could not be stored" in r.getMessage()]
    msg = rec.getMessage()
    assert "where 7 subscriptions run" in msg and "No space left" in msg and "s0 (worker" in msg and "..." in msg


def test_a_registered_batch_is_stored_where_it_runs_and_a_restart_keeps_it(tmp_path):
    """More than one chunk of subscriptions in one request, over two workers: each stored
    with the worker ``GET /subscriptions/{id}`` names, and placed there again after a restart."""
    n = INSTALL_CHUNK + 37
    data = tmp_path / "data"
    settings = make_settings(tmp_path, data_dir=data, engine_workers=2, row_scaling="off")
    queries = [f"SELECT * FROM FILTER{{Name = 'S{i}' AND Price > {i % 7}}}(Stock) PUBLISH Out{i}" for i in range(n)]
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        ids = [s["id"] for s in c.subscribe_many(queries)]
        runs_on = {sid: c.subscription(sid)["runs_on"] for sid in ids}
    assert set(runs_on.values()) == {"worker 0", "worker 1"}
    store = Store(data / "cayuga.sqlite3")
    try:
        stored = store.placements(2)
    finally:
        store.close()
    assert {sid: f"worker {stored.get(sid)}" for sid in ids} == runs_on
    with RunningServer(make_settings(tmp_path, data_dir=data, engine_workers=2, row_scaling="off")) as srv, \
            CayugaClient(srv.base_url) as c:
        assert {sid: c.subscription(sid)["runs_on"] for sid in ids} == runs_on
