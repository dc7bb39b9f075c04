"""Snapshots (server/durability/snapshot.py): the file format refuses what is torn or
corrupt and an older snapshot stands in; a running server forks one while
events flow, and a restart from it has the partial matches it held."""

from __future__ import annotations

import os

import pytest

from air.engine import Event
from clients.client import CayugaClient
from clients.testing import wait_until
from server.daemon import Daemon
from server.durability.journal import Journal
from server.durability.snapshot import MAGIC, SnapshotError, SnapshotFile, SnapshotStore, decode, encode
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, collect, make_settings, stock

STATE = {"version": 1, "fed": 7, "journal": 3, "values": [("IBM", 1.5, 2, True, None)] * 3}


def test_a_snapshot_reads_back_and_every_torn_or_flipped_byte_is_refused():
    data = encode(STATE)
    assert decode(data) == STATE
    for cut in range(len(data)):  # torn at every offset
        with pytest.raises(SnapshotError):
            decode(data[:cut])
    for i in range(len(MAGIC), len(data)):  # one flipped byte after the magic
        bad = bytearray(data)
        bad[i] ^= 0x40
        with pytest.raises(SnapshotError):
            decode(bytes(bad))


def test_the_newest_intact_snapshot_is_loaded_and_leftovers_are_cleaned(tmp_path):
    store = SnapshotStore(tmp_path, keep=2)
    store.write({**STATE, "fed": 1}, journal=10)
    kept = store.write({**STATE, "fed": 2}, journal=20)
    assert [f.journal for f in kept] == [20, 10]
    state, f = store.load_latest()
    assert state["fed"] == 2 and f.journal == 20
    newest = kept[0].path
    newest.write_bytes(newest.read_bytes()[:-5])  # torn: the older one stands in
    state, f = store.load_latest()
    assert state["fed"] == 1 and f.journal == 10 and store.corrupt == 1
    kept = store.write({**STATE, "fed": 3}, journal=30)
    assert [f.journal for f in kept] == [30, 20] and len(store.files()) == 2
    (tmp_path / "snapshot-0000000099-j00000000000000000099.tmp").write_bytes(b"half")
    assert not list(SnapshotStore(tmp_path).directory.glob("*.tmp"))


RISE = ("SELECT P1, Price AS P2 FROM (SELECT Price AS P1 FROM FILTER{Name = 'IBM'}(Stock)) "
        "NEXT{$2.Name = 'IBM' AND $2.Price > P1}(Stock) PUBLISH Rise")


def test_a_running_server_forks_snapshots_and_a_restart_keeps_its_partial_matches(tmp_path):
    settings = make_settings(tmp_path, snapshot_seconds=0.05, snapshot_events=1)
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        sid = c.subscribe(cel=RISE)["id"]
        c.post_events([stock("IBM", 10.0 + i, 1, i) for i in range(1, 4)])  # 3 rising: the last one waits
        d = srv.daemon
        before = d.snapshotter.taken
        def taken():  # one that holds the three events (one of before them may still be on its way)
            c.post_events([])  # nudge nothing: the engine thread forks between its loop turns
            if d.snapshotter.taken <= before or d.snapshotter.running:
                return False
            got = d.snapshots.load_latest()
            return got is not None and got[0]["fed"] == 3

        wait_until(taken, what=f"a snapshot (last error: {d.snapshotter.last_error})")
        assert d.snapshotter.failed == 0, d.snapshotter.last_error
        assert d.snapshotter.last_pause > 0  # measured, not judged: the fork returned
        state, _f = d.snapshots.load_latest()
        assert state["fed"] == 3 and sid in state["engine"]["owners"]
        # epoch 3 is still open: the instance of 12 was consumed by 13 (marked, deleted when the epoch
        # closes) and the instance of 13 is pending
        [node] = state["engine"]["nodes"]  # layout: air/engine/state.py
        assert [(i[0], i[4]) for i in node["installed"]] == [((12.0,), True)]  # (values, ..., affected)
        assert [p[0] for p in node["pending"]] == [(13.0,)]
        assert not [p for p in os.listdir(d.snapshots.directory) if p.endswith(".tmp")]
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        assert srv.daemon.recovered.get("instances") == 2
        with c.watch(sid, timeout=10) as m:
            c.post_events([stock("IBM", 99.0, 1, 10)])
            assert [w["P1"] for w in collect(m, 1)] == [13.0]
    assert_no_cayuga_threads()


def test_a_replay_is_exact_only_when_the_journal_holds_every_record_after_the_snapshot(tmp_path):
    d = Daemon(make_settings(tmp_path))
    assert not d.recovery.replayable(None)  # durability off: no journal
    d.recovery.journal = Journal(tmp_path / "j", "write", segment_bytes=4096)
    try:
        assert d.recovery.replayable(None)  # an empty journal: nothing to miss
        for i in range(200):
            d.recovery.journal.append([Event("Stock", ("A", 1.0, 1), i, i)] * 3)
        assert d.recovery.replayable(None)
        at = lambda pos: SnapshotFile(tmp_path / "x", 1, pos)  # noqa: E731
        d.recovery.journal.truncate_before(150)
        oldest = d.recovery.journal.oldest()
        assert 1 < oldest <= 150
        assert d.recovery.replayable(at(oldest - 1)) and d.recovery.replayable(at(199)) and d.recovery.replayable(at(200))
        assert not d.recovery.replayable(at(oldest - 2)) and not d.recovery.replayable(None)  # records it needs are gone
    finally:
        d.recovery.journal.close()
        d.store.close()
