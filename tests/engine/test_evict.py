"""Engine.evict_oldest (the max_instances_per_subscription policy, issue 13):
cut anywhere — mid-epoch too — it removes exactly the oldest instances by the
documented key ``(t0, t1, state, position)``, the ones only the owner sees
first and shared ones (seen by another owner of a merged node) only when
asked; every node structure stays consistent (plain lists, AI buckets, sorted
buckets, the epoch's affected marks, pending lists, active flags), the engine
goes on without error, other owners keep their witnesses where nothing they
see was evicted, and export_state -> import_state after an eviction goes on
exactly like the evicted engine itself."""

from __future__ import annotations

import pickle

from hypothesis import event, given, settings
from hypothesis import strategies as st

from air.cel import compile_cel
from air.engine import Engine, Event
from air.engine import instance as slot  # (VALUES below is test_engine_state's strategy)
from tests.conftest import STOCK, examples
from tests.engine.test_engine_state import SORTED, SPECS, VALUES, _engine, _feed, _key, _uninterrupted
from tests.engine.test_indexes_sorted import sorted_automaton
from tests.engine.test_indexes_support import CONFIGS, random_automaton, stream


def _nodes(eng: Engine) -> list:
    out = {}
    for owner in eng.owners:
        for _ai, _sid, node in eng.holding(owner).states:
            out.setdefault(id(node), node)
    return list(out.values())


def check_consistent(eng: Engine) -> None:
    """White-box invariants of every node, and the public counts against a recount."""
    for node in _nodes(eng):
        insts = node.all_instances()
        assert node.count == len(insts)
        assert node.ndead == sum(1 for i in insts if i[slot.DEAD])
        if node.iq is not None:
            for b in node.buckets.values():
                assert len(b.keys) == len(b.cids) == len(b.insts) and len(b)
                assert b.keys == sorted(b.keys)
            if node.ndead:
                assert sorted(map(id, node.dead_keys)) == sorted(id(i) for i in insts if i[slot.DEAD])
        elif node.ai_ev >= 0:
            assert all(node.buckets.values())
        if node.stream is not None and not node.is_start:
            assert node.active == (node.count > 0)
    for owner in eng.owners:
        recount = sum(len(v) for v in eng.instances(owner, pending=True).values())
        assert eng.instance_count(owner) == recount


def model(eng: Engine, owner: str, keep: int, shared: bool) -> tuple[dict, dict]:
    """What evict_oldest must leave, computed from the nodes' own instance
    lists (checked against Engine.instances(owner, pending=True)): the
    instances to remove, and how many the owner keeps.

    This model is white-box on purpose: for random automata with merged
    nodes, AI and sorted indexes, which instances exist at a cut is the
    engine's whole semantics, and an independent account of it is a second
    engine (tests/cel/reference.py's job, not this test's). What it checks
    independently is the eviction rule applied to them. The engine-independent
    model is test_evict_oldest_matches_an_independent_model_of_the_query below,
    for a query whose instances can be worked out by hand."""
    h = eng.holding(owner)
    listed = eng.instances(owner, pending=True)
    gens = {o: eng.holding(o).gen for o in eng.owners}
    first: dict[int, int] = {}  # node -> index of the first of owner's states at it
    keys_of: dict[int, list[str]] = {}
    rows = []  # (sort key, shared, node id, instance)
    for ai, sid, node in h.states:
        if node.stream is None or node.is_start:
            continue
        key = f"{ai}/{sid}"
        keys_of.setdefault(id(node), []).append(key)
        if id(node) in first:
            continue
        si = first[id(node)] = len(first)
        mine = [i for i in node.all_instances() + node.pending if i[slot.BORN] >= h.gen]
        assert [(i[slot.VALUES], i[slot.T0], i[slot.T1]) for i in mine] == listed[key]
        others = [gens[o] for o in node.owners if o != owner]
        for pos, inst in enumerate(mine):
            rows.append(((inst[slot.T0], inst[slot.T1], si, pos), any(inst[slot.BORN] >= g for g in others), id(node), inst))
    seen = sum(len(v) for v in listed.values())
    order = sorted((r for r in rows if not r[1]), key=lambda r: r[0])
    if shared:
        order += sorted((r for r in rows if r[1]), key=lambda r: r[0])
    gone = []
    for r in order:
        if seen <= keep:
            break
        seen -= len(keys_of[r[2]])
        gone.append(r[3])
    return {id(i) for i in gone}, {"left": seen}


def _positions_kept(eng: Engine, owner: str, gone: set) -> dict:
    """owner's instances (pending too) per state key, without ``gone``, as instances() lists them."""
    h = eng.holding(owner)
    out = {}
    for ai, sid, node in h.states:
        if node.stream is None or node.is_start:
            continue
        out[f"{ai}/{sid}"] = [(i[slot.VALUES], i[slot.T0], i[slot.T1]) for i in node.all_instances() + node.pending
                              if i[slot.BORN] >= h.gen and id(i) not in gone]
    return out


OPS = st.tuples(st.integers(0, 6), st.sampled_from([0, 0, 1, 2, 3, 5, 8]), st.booleans(), st.booleans())


@settings(examples(3))
@given(specs=SPECS, sorted_specs=SORTED, values=VALUES, cut=st.integers(0, 40), op=OPS,
       config=st.sampled_from(sorted(CONFIGS)))
def test_evict_oldest_removes_exactly_the_oldest_and_the_engine_goes_on(specs, sorted_specs, values, cut, op,
                                                                          config):
    opts = CONFIGS[config]
    loads = [(f"o{i}", random_automaton(s)) for i, s in enumerate(specs)]
    loads += [(f"s{i}", sorted_automaton(*s)) for i, s in enumerate(sorted_specs)]
    who, keep, shared, dup = op
    if dup:  # a copy of the first automaton: merged with it, so they share instances
        loads.append(("dup", loads[0][1]))
    owner = loads[who % len(loads)][0]
    events = stream(values)
    cut = min(cut, len(events))

    expected = _uninterrupted(opts, loads, events)  # never evicted: other owners' witnesses to compare with

    eng = _engine(opts, loads)
    got: list = []
    _feed(eng, events[:cut], got)
    before = {o: _positions_kept(eng, o, set()) for o in eng.owners}
    gone, left = model(eng, owner, keep, shared)
    after_model = {o: _positions_kept(eng, o, gone) for o in eng.owners}
    n = eng.evict_oldest(owner, keep, shared=shared)
    assert n == len(gone)
    event("evicted" if n else "nothing to evict")
    assert eng.stats.evicted == n
    for o in eng.owners:
        assert eng.instances(o, pending=True) == after_model[o], o
    assert eng.instance_count(owner) == left["left"]
    if shared:
        assert eng.instance_count(owner) <= keep
    touched = {o for o in eng.owners if o != owner and after_model[o] != before[o]}
    if not shared:
        assert not touched  # only what the owner alone saw went
    elif touched:
        event("other owners lost shared instances")
    check_consistent(eng)

    saved = pickle.loads(pickle.dumps(eng.export_state()))
    cont: list = []
    _feed(eng, events[cut:], cont)
    eng.flush()
    check_consistent(eng)

    again = _engine(opts, loads)
    counts = again.import_state(saved)
    assert counts["skipped"] == 0 and counts["clashes"] == 0
    restored: list = []
    _feed(again, events[cut:], restored)
    again.flush()
    assert [_key(e) for e in restored] == [_key(e) for e in cont]

    # owners that lost nothing emit exactly what they would have without the eviction
    untouched = {o for o in eng.owners if o != owner and o not in touched}
    mine = [_key(e) for e in got + cont if e.owner in untouched]
    assert mine == [_key(e) for e in expected if e.owner in untouched]
    if n == 0:
        assert [_key(e) for e in got + cont] == [_key(e) for e in expected]


PAIRS = "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"


def _pairs():
    (auto,) = compile_cel(PAIRS, [STOCK]).automata
    return auto


def test_oldest_means_t0_then_t1_then_state_then_position():
    eng = Engine()
    eng.declare(STOCK)
    eng.add(_pairs(), owner="x")
    evs = [Event("Stock", (name, 1.0, 1), t0, t1) for name, t0, t1 in
           [("A", 5, 5), ("B", 3, 6), ("C", 3, 7), ("D", 9, 9)]]
    for ev in evs:
        eng.feed(ev)
    eng.flush()
    before = [i for v in eng.instances("x").values() for i in v]
    assert len(before) == 4
    assert eng.evict_oldest("x", 2) == 2
    left = sorted(i[1:] for v in eng.instances("x").values() for i in v)
    assert left == [(5, 5), (9, 9)]  # t0 3 went, the older t1 first
    assert eng.evict_oldest("x", 5) == 0
    got = eng.run([Event("Stock", ("B", 2.0, 1), 10, 10), Event("Stock", ("D", 2.0, 1), 11, 11)])
    assert [(em.event.t0, em.event.t1) for em in got] == [(9, 11)]  # B's instance went; D's is there
    check_consistent(eng)


def test_shared_instances_stay_unless_asked_and_then_other_owners_lose_them():
    auto = _pairs()
    eng = Engine()
    eng.declare(STOCK)
    eng.add(auto, owner="old")
    eng.feed(Event("Stock", ("A", 1.0, 1), 1, 1))  # born before "new": only "old" sees it
    eng.add(auto, owner="new")  # merged with "old"
    for t, name in ((2, "B"), (3, "C")):
        eng.feed(Event("Stock", (name, 1.0, 1), t, t))  # both see these
    eng.flush()
    assert eng.instance_count("old") == 3 and eng.instance_count("new") == 2
    assert eng.evict_oldest("old", 0) == 1  # the one only it saw; the shared ones stay
    assert eng.instance_count("old") == 2 and eng.instance_count("new") == 2
    assert eng.stats.evicted_shared == 0
    assert eng.evict_oldest("old", 1, shared=True) == 1  # now the oldest shared one, from both
    assert eng.instance_count("old") == 1 and eng.instance_count("new") == 1
    assert eng.stats.evicted_shared == 1
    check_consistent(eng)


# --------------------------------------------------------------------------- an independent model

def _pairs_model(steps: list) -> tuple[list, list]:
    """What PAIRS must emit and evict, from the query's meaning alone (not from
    the engine): each event opens an instance (its name, t0, t1); the next event
    of the same name completes every open instance of that name, emitting
    (name, instance t0, event t1). ``("evict", keep)`` drops the oldest open
    instances, by (t0, t1) then age, until ``keep`` are left. Returns the
    witnesses and, per eviction, how many went."""
    open_: list[tuple[str, int, int]] = []  # in the order they opened: oldest first at equal times
    witnesses, evicted = [], []
    for step in steps:
        if step[0] == "evict":
            keep = step[1]
            gone = sorted(range(len(open_)), key=lambda k: (open_[k][1], open_[k][2], k))[:max(len(open_) - keep, 0)]
            evicted.append(len(gone))
            open_ = [inst for k, inst in enumerate(open_) if k not in set(gone)]
            continue
        _, name, t = step
        witnesses += [(name, t0, t) for n, t0, _ in open_ if n == name]
        open_ = [inst for inst in open_ if inst[0] != name] + [(name, t, t)]
    return witnesses, evicted


STEPS = st.lists(st.one_of(st.tuples(st.just("event"), st.sampled_from("ABCDE")),
                           st.tuples(st.just("evict"), st.integers(0, 6))), max_size=40)


@settings(examples(2))
@given(raw=STEPS)
def test_evict_oldest_matches_an_independent_model_of_the_query(raw):
    """Against the model above, which knows the engine only through what it is
    given and what it emits: the same witnesses (name, t0, t1) in the same
    order, and each evict_oldest removes as many instances as the model's
    oldest-first rule does. Point events at rising times (no overlaps)."""
    steps = [("event", s[1], t) if s[0] == "event" else s for t, s in enumerate(raw, 1)]
    want_witnesses, want_evicted = _pairs_model(steps)
    eng = Engine()
    eng.declare(STOCK)
    eng.add(_pairs(), owner="x")
    got_witnesses, got_evicted = [], []
    for step in steps:
        if step[0] == "evict":
            got_evicted.append(eng.evict_oldest("x", step[1]))
            continue
        _, name, t = step
        for em in eng.run([Event("Stock", (name, 1.0, 1), t, t)]):
            got_witnesses.append((em.event.values[0], em.event.t0, em.event.t1))
    for em in eng.run([Event("Stock", ("flush", 1.0, 1), len(steps) + 1, len(steps) + 1)]):
        got_witnesses.append((em.event.values[0], em.event.t0, em.event.t1))
    assert got_evicted == want_evicted
    assert got_witnesses == want_witnesses
