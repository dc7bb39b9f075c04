"""A CEL subscription's stored binding (shape id and constants, beside its
text) restores it exactly as compiling its text would, without building its
automata (server/subscriptions/prepared.py, ShapeCache.bound, Engine.add_prepared); an old
store without bindings still restores (and gets them); a binding that can no
longer be vouched for (another compiler version, other functions or time
unit, a changed stream, constants that do not fit) means compiling the text."""

from __future__ import annotations

import json
import random
import sqlite3
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from air.cel.shapes import BoundQuery, ShapeCache
from air.cel import CelError, compile_cel
from air.engine import Engine, EngineError, Event
from clients.client import CayugaClient
from clients.testing import increasing_cel
from server.durability.store import Store
from server.serve import RunningServer
from server.subscriptions.prepared import Preparer
from tests.cel.corpus import STREAMS
from tests.cel.test_equivalence import events
from tests.cel.test_shapes import TEMPLATES, fill_template
from tests.conftest import examples
from tests.server.conftest import assert_no_cayuga_threads, collect, make_settings, stock


def _engine() -> Engine:
    eng = Engine()
    for s in STREAMS.values():
        eng.declare(s)
    return eng


def _witnesses(eng: Engine, evs) -> Counter:
    return Counter((em.owner, em.stream, em.kind, em.event.values, em.event.t0, em.event.t1) for em in eng.run(evs))


def _events() -> list[Event]:
    """The events of every mode of tests/cel/test_equivalence.py, one after the other."""
    out, base = [], 0
    for seed in range(4):
        evs = events(seed)
        out += [Event(e.stream, e.values, e.t0 + base, e.t1 + base) for e in evs]
        base += max(e.t1 for e in evs) + 10_000
    return out


def _restore(texts: list[tuple[str, str]], unit: float = 1.0):
    """Register ``texts`` (sid, CEL) into one engine as compiled, keep their
    bindings, then install them into a second engine from the bindings alone
    through a shape cache loaded from the first one's export (a restart)."""
    reg_cache, ref, prep = ShapeCache(), _engine(), Preparer()
    kept = []
    for sid, text in texts:
        try:
            own = compile_cel(text, ref.stream_view, name_prefix=sid, time_unit_ms=unit)
        except CelError:
            continue
        got, binding = reg_cache.compile_keyed(text, ref.stream_view, name_prefix=sid, time_unit_ms=unit)
        try:
            ref.add(own.automata, owner=sid)
        except EngineError as exc:
            kept.append((sid, text, own, binding, str(exc)))
            continue
        kept.append((sid, text, own, binding, None))
    cache = ShapeCache()
    cache.load(reg_cache.export(only_unsaved=False))
    fast = _engine()
    for sid, text, own, binding, error in kept:
        bq = None if binding is None else cache.bound(binding, fast.stream_view, name_prefix=sid,
                                                      time_unit_ms=unit)
        autos = own.automata if bq is None else bq
        if error is not None:
            with pytest.raises(EngineError) as info:
                prep.add(fast, autos, sid)
            assert str(info.value) == error
            continue
        assert prep.add(fast, autos, sid) == ref.holding(sid).published
        if bq is not None:
            assert bq.outputs == own.outputs and bq.reads() == {
                s.input_stream for a in own.automata for s in a.states if s.input_stream}
    return ref, fast, prep, kept


@settings(examples(0.4))
@given(st.integers(0, 10 ** 9), st.lists(st.sampled_from(TEMPLATES), min_size=1, max_size=3),
       st.sampled_from([1.0, 1000.0]))
def test_random_queries_restored_from_bindings_make_the_same_network_and_witnesses(seed, templates, unit):
    rnd = random.Random(seed)
    texts = [(f"s{k}", fill_template(rnd.choice(templates), rnd)) for k in range(14)]
    ref, fast, _prep, kept = _restore(texts, unit)
    assert fast.plan_stats() == ref.plan_stats()
    evs = events(seed % 4)
    want = _witnesses(ref, evs)
    assume(want)  # something to compare: an example whose queries match nothing shows nothing
    assert _witnesses(fast, evs) == want


def test_per_symbol_queries_are_installed_without_building_automata():
    texts = [("z", "SELECT Name FROM FILTER{Name = 'Z'}(Stock) PUBLISH Up_S1")]  # Up_S1 with another schema
    texts += [(f"s{k}", increasing_cel(f"S{k % 7}", 4)) for k in range(30)]  # symbols repeat
    texts += [(f"s{k}", increasing_cel(f"Q{k}", 4)) for k in range(30, 60)]
    ref, fast, prep, kept = _restore(texts)
    assert fast.plan_stats() == ref.plan_stats()
    errors = [k[0] for k in kept if k[4] is not None]
    assert errors == ["s1", "s8", "s15", "s22", "s29"]  # the engine's own error, from the built automata
    assert prep.prepared == 54 and prep.built == 2 + 5
    evs = _events()
    assert _witnesses(fast, evs) == _witnesses(ref, evs)


def test_constants_bound_equal_or_landing_beyond_static_atoms_get_plans_of_their_own():
    same = "FILTER{{Name = '{0}' AND Name = '{0}'}}(Stock)"  # one atom once bound
    texts = [("s1", "FILTER{Name = 'A' AND Name = 'B'}(Stock)"), ("s2", same.format("A")), ("s3", same.format("C")),
             ("s4", "FILTER{Name = 'D' AND Name = 'E'}(Stock)"),
             ("s5", "FILTER{DUR < 3 MIN AND Name = 'A'}(Stock)"), ("s6", "FILTER{DUR < 4 MIN AND Name = 'B'}(Stock)"),
             ("s7", "FILTER{DUR < 3 MIN AND Name = 'C'}(Stock)")]
    ref, fast, prep, _kept = _restore(texts)
    assert fast.plan_stats() == ref.plan_stats()
    # s1/s4 share a plan, s2/s3 (atoms merged) never use one, s5 and s7 share one (same duration), s6 has its own
    assert prep.prepared == 2 and prep.built == 5
    evs = _events()
    assert _witnesses(fast, evs) == _witnesses(ref, evs)


def test_a_binding_that_cannot_be_vouched_for_is_not_used():
    streams = dict(STREAMS)
    cache = ShapeCache()
    _, binding = cache.compile_keyed(increasing_cel("IBM", 3), streams, name_prefix="s1")
    assert isinstance(cache.bound(binding, streams, name_prefix="s1"), BoundQuery)
    shape_id, constants = binding
    values, names = json.loads(constants)
    for bad in (json.dumps([values[:-1], names]), json.dumps([[1] + values[1:], names]), "[", "{}",
                json.dumps([values, names + ["X"]])):
        assert cache.bound((shape_id, bad), streams, name_prefix="s1") is None
    assert cache.bound(("0" * 24, constants), streams, name_prefix="s1") is None
    assert cache.bound(binding, streams, name_prefix="s1", time_unit_ms=1000.0) is None
    assert cache.bound(binding, streams, name_prefix="s1", functions={"F": "int"}) is None
    assert cache.bound(binding, streams, name_prefix=None) is None
    from air.model import parse_stream_decl
    changed = {**streams, "Stock": parse_stream_decl("Stock(Name string, Price int, Volume int)")}
    assert cache.bound(binding, changed, name_prefix="s1") is None
    bq = cache.bound(binding, streams, name_prefix="s7")
    own = compile_cel(increasing_cel("IBM", 3), streams, name_prefix="s7")
    assert bq == own.automata and list(bq) == list(own.automata) and len(bq) == len(own.automata)


UP = ("SELECT Name, Price_1 AS Before, Price AS After FROM FILTER{{Name = '{s}'}}(Stock) "
      "NEXT{{$1.Name = $2.Name AND $2.Price > 1.05 * $1.Price}} Stock")


def _rows(path) -> list[tuple]:
    db = sqlite3.connect(str(path))
    try:
        return db.execute("SELECT id, shape, constants FROM subscriptions ORDER BY seq").fetchall()
    finally:
        db.close()


def test_a_restart_restores_from_bindings_and_an_old_store_gets_them(tmp_path, monkeypatch):
    import air.cel.shapes

    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        ids = [s["id"] for s in c.subscribe_many([UP.format(s=f"S{k}") for k in range(30)])]
        ids.append(c.subscribe(cel="SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Any")["id"])
        air_before = c.subscription(ids[3])["air"]
    db = next(tmp_path.rglob("cayuga.sqlite3"))
    rows = _rows(db)
    assert all(shape and json.loads(constants) for _id, shape, constants in rows)
    assert json.loads(rows[3][2]) == [["S3", 1.05], []]

    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        d = srv.daemon
        assert [s["id"] for s in c.subscriptions()] == ids
        assert d.preparer.prepared == 29 and d.preparer.built == 2  # a plan per shape, made from its first query
        assert isinstance(d.subscriptions[ids[7]].automata, BoundQuery)
        assert c.subscription(ids[3])["air"] == air_before  # built when read
        with c.watch(ids[7], timeout=10) as m:
            c.post_events([stock("S7", 1.0, 1, 1), stock("S7", 2.0, 1, 2)])
            assert collect(m, 1)[0] == {"stream": ids[7], "t0": 1, "t1": 2, "Name": "S7", "Before": 1.0,
                                        "After": 2.0}
        assert c.subscription(ids[7])["air"] == air_before.replace("S3", "S7").replace(ids[3], ids[7])

    # an old store: the columns are not there (nor the bindings); it restores from the text and gets them
    conn = sqlite3.connect(str(db))
    conn.executescript("""
        CREATE TABLE old AS SELECT seq, id, kind, text, name, created FROM subscriptions;
        DROP TABLE subscriptions;
        CREATE TABLE subscriptions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('cel', 'air')), text TEXT NOT NULL, name TEXT, created REAL NOT NULL);
        INSERT INTO subscriptions SELECT * FROM old; DROP TABLE old;""")
    conn.close()
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        assert [s["id"] for s in c.subscriptions()] == ids
        assert srv.daemon.preparer.prepared == 0
        assert c.subscription(ids[3])["air"] == air_before
    assert _rows(db) == rows
    with RunningServer(make_settings(tmp_path)) as srv:
        assert srv.daemon.preparer.prepared == 29

    # another compiler version: no stored binding is used; each is stored again under the new shape ids
    monkeypatch.setattr(air.cel.shapes, "COMPILER_VERSION", "cel-next")
    with RunningServer(make_settings(tmp_path)) as srv, CayugaClient(srv.base_url) as c:
        assert srv.daemon.preparer.prepared == 0
        assert srv.daemon.shapes.stats()["misses"] == 2
        assert c.subscription(ids[3])["air"] == air_before
    new_rows = _rows(db)
    assert [r[2] for r in new_rows] == [r[2] for r in rows] and all(a[1] != b[1] for a, b in zip(new_rows, rows))
    with RunningServer(make_settings(tmp_path)) as srv:
        assert srv.daemon.preparer.prepared == 29
    assert_no_cayuga_threads()


def test_store_adds_the_binding_columns_to_an_old_database(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE subscriptions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, "
                 "kind TEXT NOT NULL, text TEXT NOT NULL, name TEXT, created REAL NOT NULL)")
    conn.execute("INSERT INTO subscriptions (id, kind, text, name, created) VALUES ('s1', 'cel', 'x', NULL, 1.0)")
    conn.commit()
    conn.close()
    store = Store(path)
    try:
        (sub,) = store.subscriptions()
        assert (sub.id, sub.shape, sub.constants) == ("s1", None, None)
        store.save_bindings([(("abc", "[[],[]]"), "s1")])
        assert store.subscriptions()[0].shape == "abc"
    finally:
        store.close()
