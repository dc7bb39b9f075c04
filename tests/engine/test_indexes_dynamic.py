"""Subscriptions come and go while events flow over merged states (docs/design/semantics.md#indexes-and-state-merging):
a subscription added late starts empty and never inherits instances created
before it existed; removing one removes exactly its own work."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from air.engine import Engine
from tests.conftest import STOCK, air, examples
from tests.engine.test_indexes_support import random_automaton, run_config, stream, witnesses
from tests.engine.test_indexes import EVENTS, SPEC


def _alone(auto, owner, events):
    """What ``owner`` gets in an engine of its own fed only ``events``."""
    _, ems = run_config({"index": False, "merge": False}, [(owner, auto)], events)
    return witnesses(ems)


@settings(examples(2))
@example(pool=[(0, 1, 0, 0, 0, 0, 0, 0, 0, 1)], specs=[(0, 0, 40), (0, 3, 40)], values=[(0, 1, 1, 1, 0)] * 6,
         merge=True, index=True)  # the same automaton again, added after its first run began
@example(pool=[(1, 1, 1, 1, 0, 1, 0, 0, 0, 0)], specs=[(0, 0, 4), (0, 2, 40), (0, 1, 9)],
         values=[(0, p, 1, p % 2, 0) for p in (1, 2, 3, 4, 5, 1, 2, 3, 4, 5)], merge=True, index=True)
@given(pool=st.lists(SPEC, min_size=1, max_size=2),
       specs=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 40)), min_size=1, max_size=6),
       values=EVENTS, merge=st.booleans(), index=st.booleans())
def test_owners_added_and_removed_mid_stream_see_exactly_their_window(pool, specs, values, merge, index):
    """Each owner is added before event ``a`` and removed before event ``b``;
    it must get what it would get alone from ``events[a:b]``, even when added
    or removed inside an epoch and when its states are merged with older ones."""
    events = stream(values)
    plan = [(f"o{i}", random_automaton(pool[s % len(pool)]), min(a, len(events)), max(min(a, len(events)), min(b, len(events))))
            for i, (s, a, b) in enumerate(specs)]
    eng = Engine(merge=merge, index=index)
    eng.declare(STOCK)
    got = []
    eng.on_emit = got.append
    for i in range(len(events) + 1):
        for owner, auto, a, b in plan:
            if b == i and a < b:
                eng.remove(owner)
            if a == i and a < b:
                eng.add(auto, owner=owner)
        if i < len(events):
            eng.feed(events[i])
    eng.flush()
    together = witnesses(got)
    for owner, auto, a, b in plan:
        mine = {k: v for k, v in together.items() if k[0] == owner}
        assert mine == (_alone(auto, owner, events[a:b]) if a < b else {}), owner


def test_a_late_subscription_does_not_inherit_merged_instances():
    """T5 (any quote, then the next quote of the same name) loaded twice: the
    second copy shares every state, but the instance of the first event is
    not its own."""
    from tests.engine.test_semantics import S

    eng = Engine()
    eng.declare(STOCK)
    eng.add(air("T5.xml"), owner="early")
    emitted = []
    eng.on_emit = emitted.append
    eng.feed(S("IBM", 1, 1, 1))
    eng.close_epoch()
    eng.add(air("T5.xml"), owner="late")
    assert eng.plan_stats()["nodes"] == eng.plan_stats()["states"] // 2
    assert eng.instance_count("late") == 0 and eng.instances("late") == {"0/1": []}
    eng.feed(S("IBM", 2, 1, 2))
    eng.feed(S("IBM", 3, 1, 3))
    eng.flush()
    by_owner = sorted((e.owner, e.event.values[1], e.event.values[4]) for e in emitted)
    assert by_owner == [("early", 1.0, 2.0), ("early", 2.0, 3.0), ("late", 2.0, 3.0)]


def test_removing_one_owner_leaves_the_others_results_identical():
    from tests.conftest import stock_stream

    events = stock_stream(seed=9, n=40)
    files = ["T5.xml", "IBM_PAIR.xml", "T1.xml"]
    full = Engine()
    full.declare(STOCK)
    for f in files:
        full.add(air(f), owner=f)
        full.add(air(f), owner=f + "#copy")
    got = []
    full.on_emit = got.append
    for ev in events[:20]:
        full.feed(ev)
    for f in files:
        full.remove(f + "#copy")
    for ev in events[20:]:
        full.feed(ev)
    full.flush()
    together = witnesses(got)
    for f in files:
        assert {k: v for k, v in together.items() if k[0] == f} == _alone(air(f), f, events)
        assert {k: v for k, v in together.items() if k[0] == f + "#copy"} == _alone(air(f), f + "#copy",
                                                                                   events[:20])
    for f in files:
        full.remove(f)
    assert full.plan_stats()["nodes"] == 0 and full.instance_count() == 0


def test_random_automaton_generator_is_deterministic():
    spec = (1, 2, 1, 3, 0, 1, 4, 2, 5, 0)
    assert random_automaton(spec) == random_automaton(spec)
